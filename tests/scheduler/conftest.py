"""Fixtures of the scheduler's end-to-end tests: one scheduler round at a chosen time, services as a request calls
them (after-commit effects run)."""

import pytest

from scheduler.passes import schedule_pass
from scheduler.sync import housekeeping, sync_jobs
from tests import waiting


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

    def reached():
        tick(**kw)
        job.refresh_from_db()
        return job.phase in phases

    waiting.wait_for(reached, timeout=timeout, message=lambda: f"one of {sorted(phases)}: job stayed {job.phase} "
                                                                f"({job.status}: {job.message})")
    return job
