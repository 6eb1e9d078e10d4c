"""API test helpers: clients authenticated with real tokens, the actors of the permission matrix, the URLs."""

from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from jobs.choices import Role
from jobs.models import Membership

API = "/api/v1/"
JOBS_URL = "/api/v1/jobs/"
ACTORS = ["anonymous", "non_member", "member", "group_admin", "owner", "superuser"]


def job_url(job_id: int, action: str = "") -> str:
    return f"{JOBS_URL}{job_id}/" + (f"{action}/" if action else "")


def group_url(name: str, action: str = "") -> str:
    return f"{API}groups/{name}/" + (f"{action}/" if action else "")


def body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def assert_error_shape(response, status: int, *fields: str) -> dict:
    """The API's one error shape, naming ``fields`` (field paths) when given."""
    assert response.status_code == status, body(response)[:500]
    data = response.json()
    assert set(data) == {"detail", "errors"}, data
    assert isinstance(data["detail"], str) and data["detail"]
    assert isinstance(data["errors"], dict)
    for path, messages in data["errors"].items():
        assert isinstance(path, str) and path
        assert messages and all(isinstance(m, str) and m for m in messages)
    for field in fields:
        assert field in data["errors"], data
    return data


@pytest.fixture
def client_for(world):
    """client_for("bob"): an APIClient sending bob's token; client_for(user) for users made in the test."""

    def make(user) -> APIClient:
        if isinstance(user, str):
            user = world.users[user]
        token, _ = Token.objects.get_or_create(user=user)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        return client

    return make


@pytest.fixture
def anon() -> APIClient:
    return APIClient()


@pytest.fixture
def group_admin(world, make_user):
    """gadmin: an admin of phusers (and of nothing else)."""
    user = make_user("gadmin")
    Membership.objects.create(group=world.groups["phusers"], user=user, role=Role.ADMIN)
    return user


@pytest.fixture
def clients(world, client_for, anon, group_admin):
    """The permission matrix's actors, about bob's jobs in phusers: eve is in another group, pan is bob's
    teammate, gadmin administers phusers, admin is a superuser."""
    return {
        "owner": client_for("bob"),
        "member": client_for("pan"),
        "group_admin": client_for(group_admin),
        "non_member": client_for("eve"),
        "superuser": client_for("admin"),
        "anonymous": anon,
    }
