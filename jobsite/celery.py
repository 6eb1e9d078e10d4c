import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")

app = Celery("jobsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Database work only: passes, sync and everything that talks to the cluster run in the scheduler process.
app.conf.beat_schedule = {
    "release-backoff": {"task": "jobs.tasks.release_backoff_task", "schedule": 15.0},
}
