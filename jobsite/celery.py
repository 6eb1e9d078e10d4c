import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")

app = Celery("jobsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.conf.beat_schedule = {
    "schedule-pass": {"task": "scheduler.tasks.schedule_pass_task", "schedule": 10.0},
    "housekeeping": {"task": "scheduler.tasks.housekeeping_task", "schedule": 15.0},
}
