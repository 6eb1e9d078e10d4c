"""API test helpers: clients authenticated with real tokens, and the URLs of the API."""

from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

JOBS_URL = "/api/v1/jobs/"


def job_url(job_id: int, action: str = "") -> str:
    return f"{JOBS_URL}{job_id}/" + (f"{action}/" if action else "")


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

