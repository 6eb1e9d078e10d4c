"""The failed-login counts (jobs/api/auth.py) are out of reach of anything that can talk to Redis: under `make prod`
a job once read and deleted its own count there (unlimited guessing) and set another user's to 1000 (a lockout).
Here the cache is Redis, as production's was, and a client of it without jobsite's credentials does all of that
again: the counts do not move, and the lockout still works."""

import hashlib
import os

import pytest
import redis
from rest_framework.test import APIClient

from jobs.models import LoginFailure

TOKEN_URL = "/api/v1/auth/token/"


@pytest.fixture
def redis_client(settings):
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("REDIS_URL is not set")
    settings.JOBSITE_LOGIN_MAX_FAILURES = 3
    settings.JOBSITE_LOGIN_FAILURE_WINDOW_SECONDS = 300
    # The cache of production before: Redis, prefix "jobsite" (the counts' old home).
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url,
                                   "KEY_PREFIX": "jobsite"}}
    client = redis.Redis.from_url(url)
    yield client
    for key in client.scan_iter("jobsite:1:jobsite:login-failures:*"):
        client.delete(key)
    client.close()


def old_key(username: str, address: str = "127.0.0.1") -> str:
    digest = hashlib.sha256(f"{username}\x00{address}".encode()).hexdigest()
    return f"jobsite:1:jobsite:login-failures:{digest}"


def obtain(username: str, password: str):
    return APIClient().post(TOKEN_URL, {"username": username, "password": password}, format="json")


def wipe_every_login_key(client) -> None:
    for key in client.scan_iter("*login*"):
        client.delete(key)


@pytest.mark.django_db
def test_nothing_written_to_redis_locks_a_user_out(world, redis_client):
    redis_client.set(old_key("lin"), 1000)
    assert obtain("lin", "pw-lin").status_code == 200
    assert not LoginFailure.objects.exists()


@pytest.mark.django_db
def test_nothing_deleted_from_redis_resets_a_count(world, redis_client):
    for _ in range(3):
        assert obtain("bob", "wrong").status_code == 400
        wipe_every_login_key(redis_client)  # after each guess, as the job did
    assert obtain("bob", "pw-bob").status_code == 429  # locked all the same


@pytest.mark.django_db
def test_the_counts_are_rows_that_name_neither_user_nor_address(world, redis_client):
    assert obtain("bob", "wrong").status_code == 400
    assert obtain("bob", "wrong").status_code == 400
    (row,) = LoginFailure.objects.all()
    assert row.failures == 2
    assert "bob" not in row.key and row.key != old_key("bob").rsplit(":", 1)[1]  # an HMAC, not a plain hash
    assert not list(redis_client.scan_iter("*login*"))  # nothing of it in Redis
    assert obtain("bob", "pw-bob").status_code == 200  # a success clears the count
    assert not LoginFailure.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_failures_all_count(world, settings):
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    settings.JOBSITE_LOGIN_MAX_FAILURES = 100

    def fail(_):
        try:
            return obtain("pan", "wrong").status_code
        finally:
            connections.close_all()

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(fail, range(16))) == {400}
    assert LoginFailure.objects.get().failures == 16
