"""Fixtures of the scheduler's end-to-end tests: one scheduler round at a chosen time, services as a request calls
them (after-commit effects run)."""

import time

import pytest

from scheduler.passes import schedule_pass
from scheduler.sync import housekeeping, sync_jobs


@pytest.fixture
def clock(django_capture_on_commit_callbacks):
    """tick(now=...) runs one scheduler round at a given time, with after-commit effects executed."""

    def tick(now=None, backend=None):
        with django_capture_on_commit_callbacks(execute=True):
            schedule_pass(backend=backend, now=now)
            sync_jobs(backend=backend, now=now)
            housekeeping(backend=backend, now=now)

    return tick


@pytest.fixture
def act(django_capture_on_commit_callbacks):
    """Call a service as a request would: its after-commit effects (SIGTERM, ...) run."""

    def call(service, **kw):
        with django_capture_on_commit_callbacks(execute=True):
            return service(**kw)

    return call


def wait_for(job, phases, tick, timeout=30.0, **kw):
    """Run scheduler rounds (``tick``, with ``kw``) until ``job`` is in one of ``phases``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tick(**kw)
        job.refresh_from_db()
        if job.phase in phases:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job stayed {job.phase} ({job.status}: {job.message}) for {timeout} s")
