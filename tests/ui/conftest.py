"""Helpers of the web UI tests."""

from __future__ import annotations

import re

import pytest

from jobs import services
from jobs.choices import Phase
from jobs.models import Job


def field_block(html: str, name: str) -> str:
    """The HTML of one form field's block (label, widget, errors, help), to check an error sits next to it."""
    match = re.search(rf'<div class="field[^"]*" id="field-{name}">', html)
    assert match, f"no field {name}"
    following = re.search(r'<div class="field[ "]', html[match.end():])
    return html[match.start(): match.end() + following.start()] if following else html[match.start():]


@pytest.fixture
def make_pending():
    """Move a submitted job to PENDING, as a scheduling pass would (its queue position is derived when read)."""

    def do(job: Job, reason: str = "GroupQuota", message: str = "") -> Job:
        services.job_transition(job=job, phase=Phase.PENDING, reason=reason, message=message)
        job.refresh_from_db()
        return job

    return do


@pytest.fixture
def make_admitted(make_pending):
    """A job with an attempt in PREPARING on the local backend (nothing is launched)."""

    def do(job: Job):
        make_pending(job)
        attempt = services.job_admit(job=Job.objects.get(pk=job.pk), backend="local",
                                     placement=[{"node": "local"} for _ in range(job.replicas)])
        job.refresh_from_db()
        return job, attempt

    return do
