"""The Celery app of the worker and beat (`make prod`): its settings are Django's CELERY_* ones; the beat's schedule
holds the database clocks and the notification outbox's sweep."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")

app = Celery("jobsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Database work and outgoing notifications only: passes, sync and everything that talks to the cluster run in the
# scheduler process.
app.conf.beat_schedule = {
    "release-backoff": {"task": "jobs.tasks.release_backoff_task", "schedule": 15.0},
}


@app.on_after_configure.connect
def _notification_sweep(sender, **kwargs):
    """The outbox's sweep, every JOBSITE_NOTIFY_SWEEP_SECONDS (read once the settings are loaded)."""
    from django.conf import settings

    sender.conf.beat_schedule["notifications-sweep"] = {
        "task": "jobs.tasks.notifications_send_task", "schedule": settings.JOBSITE_NOTIFY_SWEEP_SECONDS,
    }
