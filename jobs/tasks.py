"""Celery tasks of production. Database work only: the cluster is the scheduler process's alone."""

from celery import shared_task

from . import services


@shared_task(ignore_result=True)
def release_backoff_task() -> None:
    """BACKOFF jobs whose delay is over go back to PENDING (the scheduler's loop runs the same clock)."""
    services.jobs_release_backoff()
