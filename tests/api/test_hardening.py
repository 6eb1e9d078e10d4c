"""Passwords, API tokens (expiry, revocation, password change) and failed-login limits."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import SetPasswordForm
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from jobs.models import LoginFailure

from .conftest import JOBS_URL

TOKEN_URL = "/api/v1/auth/token/"
LOGIN_URL = "/login/"


@pytest.fixture(autouse=True)
def _limits(settings):
    settings.JOBSITE_LOGIN_MAX_FAILURES = 3  # the counts are rows of the test database: fresh in every test
    settings.JOBSITE_LOGIN_FAILURE_WINDOW_SECONDS = 300


def obtain(client, username="bob", password="pw-bob", **extra):
    return client.post(TOKEN_URL, {"username": username, "password": password}, format="json", **extra)


def with_token(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


# --- passwords ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("password", ["password", "12345678", "83920174", "short"])
def test_weak_passwords_are_refused(password):
    with pytest.raises(ValidationError):
        validate_password(password)


@pytest.mark.django_db
def test_setting_a_weak_password_in_a_form_is_refused(world):
    bob = world.users["bob"]
    form = SetPasswordForm(bob, {"new_password1": "password", "new_password2": "password"})
    assert not form.is_valid()
    assert "new_password2" in form.errors
    form = SetPasswordForm(bob, {"new_password1": "plum-orbit-47", "new_password2": "plum-orbit-47"})
    assert form.is_valid(), form.errors


def test_the_demo_password_passes_the_validators():
    from jobs.management.commands.seed_demo import DEFAULT_PASSWORD

    validate_password(DEFAULT_PASSWORD)


@pytest.mark.django_db
def test_seed_demo_users_log_in_with_the_demo_password(monkeypatch):
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    call_command("seed_demo", stdout=open("/dev/null", "w"))
    response = obtain(APIClient(), "bob", "jobsite-demo")
    assert response.status_code == 200, response.content


# --- tokens ---------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_token_answer_says_when_it_expires(world, settings):
    settings.JOBSITE_API_TOKEN_TTL_SECONDS = 3600
    body = obtain(APIClient()).json()
    token = Token.objects.get(key=body["token"])
    assert body["expires_at"].startswith((token.created + timedelta(seconds=3600)).strftime("%Y-%m-%dT%H:%M"))


@pytest.mark.django_db
def test_each_request_reads_its_own_token_and_refuses_an_unknown_one_or_an_inactive_user(world):
    """The token is read from SQL compiled once (jobs.prepared): each key finds its own user, every time."""
    tokens = {name: Token.objects.create(user=world.users[name]).key for name in ("bob", "eve")}
    groups = {"bob": {"phusers"}, "eve": {"other"}}  # what each may see
    for name in ("bob", "eve", "bob", "eve"):
        answer = with_token(tokens[name]).get("/api/v1/groups/").json()["results"]
        assert {g["name"] for g in answer} == groups[name]
    response = with_token("0" * 40).get(JOBS_URL)
    assert (response.status_code, response.json()["detail"]) == (401, "Invalid token.")
    get_user_model().objects.filter(username="eve").update(is_active=False)
    response = with_token(tokens["eve"]).get(JOBS_URL)
    assert (response.status_code, response.json()["detail"]) == (401, "User inactive or deleted.")
    assert with_token(tokens["bob"]).get(JOBS_URL).status_code == 200


@pytest.mark.django_db
def test_an_expired_token_is_401_with_a_clear_message_and_login_issues_a_new_one(world, settings):
    settings.JOBSITE_API_TOKEN_TTL_SECONDS = 3600
    old = obtain(APIClient()).json()["token"]
    assert with_token(old).get(JOBS_URL).status_code == 200

    Token.objects.filter(key=old).update(created=timezone.now() - timedelta(seconds=3601))
    response = with_token(old).get(JOBS_URL)
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]

    new = obtain(APIClient()).json()["token"]
    assert new != old
    assert with_token(new).get(JOBS_URL).status_code == 200
    assert with_token(old).get(JOBS_URL).status_code == 401


@pytest.mark.django_db
def test_a_valid_token_is_answered_again_until_it_expires(world):
    assert obtain(APIClient()).json()["token"] == obtain(APIClient()).json()["token"]


@pytest.mark.django_db
def test_delete_revokes_the_callers_token(world):
    token = obtain(APIClient()).json()["token"]
    client = with_token(token)
    response = client.delete(TOKEN_URL)
    assert response.status_code == 204
    assert not Token.objects.filter(key=token).exists()
    assert client.get(JOBS_URL).status_code == 401
    assert client.delete(TOKEN_URL).status_code == 401


@pytest.mark.django_db
def test_delete_leaves_other_users_tokens(world):
    bob = obtain(APIClient()).json()["token"]
    pan = obtain(APIClient(), "pan", "pw-pan").json()["token"]
    assert with_token(bob).delete(TOKEN_URL).status_code == 204
    assert with_token(pan).get(JOBS_URL).status_code == 200


@pytest.mark.django_db
def test_anonymous_delete_is_401(world):
    assert APIClient().delete(TOKEN_URL).status_code == 401


@pytest.mark.django_db
def test_a_password_change_ends_the_token(world):
    token = obtain(APIClient()).json()["token"]
    bob = get_user_model().objects.get(username="bob")
    bob.set_password("a-new-long-passphrase")
    bob.save()
    assert with_token(token).get(JOBS_URL).status_code == 401
    assert obtain(APIClient(), password="a-new-long-passphrase").status_code == 200


@pytest.mark.django_db
def test_saving_a_user_without_a_new_password_keeps_the_token(world):
    token = obtain(APIClient()).json()["token"]
    bob = get_user_model().objects.get(username="bob")
    bob.first_name = "Bob"
    bob.save()
    bob.last_login = timezone.now()
    bob.save(update_fields=["last_login"])
    assert with_token(token).get(JOBS_URL).status_code == 200


# --- failed logins --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_token_endpoint_is_locked_after_repeated_failures(world):
    client = APIClient()
    for _ in range(3):
        assert obtain(client, password="wrong").status_code == 400
    response = obtain(client)  # even the right password, while locked
    assert response.status_code == 429
    assert "Too many failed login attempts" in response.json()["detail"]
    assert int(response["Retry-After"]) > 0
    # Another user, or the same user from another address, is not locked.
    assert obtain(client, "pan", "pw-pan").status_code == 200
    assert obtain(client, REMOTE_ADDR="10.0.0.9").status_code == 200


@pytest.mark.django_db
def test_a_successful_login_clears_the_count(world):
    client = APIClient()
    for _ in range(2):
        assert obtain(client, password="wrong").status_code == 400
    assert obtain(client).status_code == 200
    for _ in range(2):
        assert obtain(client, password="wrong").status_code == 400
    assert obtain(client).status_code == 200


@pytest.mark.django_db
def test_login_page_is_locked_after_repeated_failures(world, client):
    for _ in range(3):
        response = client.post(LOGIN_URL, {"username": "bob", "password": "wrong"})
        assert response.status_code == 200
    response = client.post(LOGIN_URL, {"username": "bob", "password": "pw-bob"})
    assert response.status_code == 429
    assert b"Too many failed login attempts" in response.content
    assert "_auth_user_id" not in client.session
    # The lock is shared with the API: the same username from the same address.
    assert obtain(APIClient()).status_code == 429


@pytest.mark.django_db
def test_login_page_still_logs_in(world, client):
    response = client.post(LOGIN_URL, {"username": "bob", "password": "pw-bob"})
    assert response.status_code == 302
    assert client.session["_auth_user_id"] == str(world.users["bob"].pk)


@pytest.mark.django_db
def test_the_lock_ends_with_its_window(world, settings):
    client = APIClient()
    for _ in range(3):
        obtain(client, password="wrong")
    assert obtain(client).status_code == 429
    # The window's end.
    LoginFailure.objects.update(window_ends_at=timezone.now() - timedelta(seconds=1))
    assert obtain(client).status_code == 200
