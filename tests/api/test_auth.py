"""Tokens, anonymous access and the API's URLs."""

import pytest
from django.urls import reverse

from .conftest import JOBS_URL, job_url

TOKEN_URL = "/api/v1/auth/token/"


def test_urls_are_named():
    assert reverse("api:job-list") == JOBS_URL
    assert reverse("api:job-detail", kwargs={"pk": 7}) == job_url(7)
    assert reverse("api:job-logs", kwargs={"pk": 7}) == job_url(7, "logs")
    assert reverse("api:job-cancel", kwargs={"pk": 7}) == job_url(7, "cancel")
    assert reverse("api:token") == TOKEN_URL


@pytest.mark.django_db
def test_token_obtain_and_use(world, anon):
    response = anon.post(TOKEN_URL, {"username": "bob", "password": "pw-bob"}, format="json")
    assert response.status_code == 200
    token = response.json()["token"]
    assert token

    again = anon.post(TOKEN_URL, {"username": "bob", "password": "pw-bob"}, format="json")
    assert again.json()["token"] == token

    anon.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert anon.get(JOBS_URL).status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body",
    [
        {"username": "bob", "password": "wrong"},
        {"username": "nobody", "password": "pw-nobody"},
        {"username": "bob"},
        {},
    ],
)
def test_token_bad_credentials(world, anon, body):
    response = anon.post(TOKEN_URL, body, format="json")
    assert response.status_code == 400
    data = response.json()
    assert set(data) == {"detail", "errors"}
    assert data["detail"]
    messages = [m for msgs in data["errors"].values() for m in msgs]
    assert all(isinstance(m, str) and m for m in messages)


@pytest.mark.django_db
def test_bad_token_is_401(world, anon):
    anon.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    response = anon.get(JOBS_URL)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "method,path",
    [
        ("get", "list"),
        ("post", "list"),
        ("get", "detail"),
        ("get", "logs"),
        ("post", "cancel"),
        ("get", "missing"),
    ],
)
def test_anonymous_gets_401_everywhere(submit, anon, method, path):
    job = submit("bob")
    url = {
        "list": JOBS_URL,
        "detail": job_url(job.pk),
        "logs": job_url(job.pk, "logs"),
        "cancel": job_url(job.pk, "cancel"),
        "missing": job_url(job.pk + 1000),
    }[path]
    response = getattr(anon, method)(url, format="json") if method == "post" else anon.get(url)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    assert "detail" in response.json()
