"""Fixtures of the exec tests: a running sandboxed job of the local backend, and the logins a WebSocket or request
carries (jobctl's token, the browser's session cookie); the embedded server of `make run` (tests/e2e) for the tests
that drive jobctl and the browser from outside."""

import pytest
from asgiref.sync import SyncToAsync
from django.db import connections
from django.test import Client
from rest_framework.authtoken.models import Token

from jobs.choices import Phase
from scheduler.backend_factory import get_backend
from tests.e2e.conftest import embedded_server  # noqa: F401
from tests.scheduler.conftest import wait_for


@pytest.fixture
def sandboxed(settings):
    settings.JOBSITE_LOCAL_SANDBOX = "bwrap"
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    get_backend.cache_clear()
    yield
    SyncToAsync.single_thread_executor.submit(connections.close_all).result()


@pytest.fixture
def tick():
    from scheduler.passes import schedule_pass
    from scheduler.sync import sync_jobs

    def run(**kw):
        schedule_pass()
        sync_jobs()

    return run


@pytest.fixture
def running(submit, tick):
    """A job of bob's that sleeps, Running; stopped at the end."""
    started = []

    def start(command: str = "sleep 600", **spec):
        job = submit("bob", command=command, **spec)
        started.append(job)
        return wait_for(job, {Phase.RUNNING}, tick, timeout=60)

    yield start
    for job in started:
        get_backend().stop(job_id=job.pk, attempt_number=1, replicas=1, force=True)


def token_headers(user) -> list[tuple[bytes, bytes]]:
    key = Token.objects.get_or_create(user=user)[0].key
    return [(b"host", b"testserver"), (b"origin", b"http://testserver"), (b"authorization", f"Token {key}".encode())]


def cookie_headers(user) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    return [(b"host", b"testserver"), (b"origin", b"http://testserver"), (b"cookie", cookie)]


