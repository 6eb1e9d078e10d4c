"""Celery tasks of production: the same functions the embedded loop calls."""

from celery import shared_task

from .passes import schedule_pass
from .sync import housekeeping, sync_jobs


@shared_task(ignore_result=True)
def schedule_pass_task() -> None:
    schedule_pass()


@shared_task(ignore_result=True)
def sync_task() -> None:
    sync_jobs()


@shared_task(ignore_result=True)
def housekeeping_task() -> None:
    housekeeping()
