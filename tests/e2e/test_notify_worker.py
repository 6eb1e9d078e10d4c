"""The real Celery worker (with beat, as `make prod` runs it) sends the outbox: a webhook reaches a local receiver,
and a worker killed (SIGKILL) while the receiver holds its POST is, once started again, followed by a send with the
same delivery id: the row ends SENT with one "Notified" event, and the receiver sees one delivery id (the held POST
and its repeat; the repeat is the documented at-least-once window of jobs.services.notifications)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from jobs import services
from jobs.choices import Phase
from jobs.models import Notification
from jobs.notify_delivery import DELIVERY_HEADER
from jobs.services.notifications import subscription_create
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 5


class HoldingReceiver:
    """Records each POST; with ``hold`` set, keeps the first one unanswered until ``release`` (or a minute)."""

    def __init__(self, hold: bool = False):
        self.posts: list[dict] = []
        self.first = threading.Event()
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                receiver.posts.append({"delivery": self.headers.get(DELIVERY_HEADER),
                                       "body": json.loads(self.rfile.read(length))})
                if hold and len(receiver.posts) == 1:
                    receiver.first.set()
                    receiver.release.wait(60)
                try:
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:  # the worker that sent it is gone
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def celery_worker(tmp_path: Path, name: str):
    """`celery worker --beat` as run-prod.sh starts it, on this test's database and Redis, in its own process group."""
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "jobsite.settings",
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/"
                        f"{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "SECRET_KEY": settings.SECRET_KEY,
        "JOBSITE_INSTALLATION_ID": settings.JOBSITE_INSTALLATION_ID,  # the same Celery keys as this process
        "JOBSITE_VAR_DIR": str(tmp_path / "var"),
        "JOBSITE_NOTIFY_ALLOW_HOSTS": "127.0.0.1",
        "JOBSITE_NOTIFY_LEASE_SECONDS": str(LEASE_SECONDS),
        "JOBSITE_NOTIFY_SWEEP_SECONDS": "1",
        "JOBSITE_BASE_URL": "https://jobs.example.org",
    }
    log_path = tmp_path / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "jobsite", "worker", "--beat", "--loglevel", "INFO",
             "--concurrency", "1", "--without-gossip", "--without-mingle", "--schedule",
             str(tmp_path / f"{name}-beat-schedule")],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def failed_job(submit) -> object:
    job = submit("bob", name="train")
    services.job_transition(job=job, phase=Phase.PENDING)
    services.job_admit(job=job, backend="sim", placement=[{"node": "n1"}])
    services.job_transition(job=job, phase=Phase.RUNNING)
    services.job_transition(job=job, phase=Phase.FAILED, status="Error", reason="Error", exit_code=1)
    return job


def notified(job) -> list[str]:
    return list(job.events.filter(reason="Notified").values_list("message", flat=True))


@pytest.fixture
def settings_for_worker(settings):
    settings.JOBSITE_NOTIFY_ALLOW_HOSTS = ["127.0.0.1"]
    settings.JOBSITE_NOTIFY_INPROCESS = False  # the worker sends, as in production


def test_the_worker_sends_a_webhook_after_commit(world, submit, tmp_path, settings_for_worker):
    receiver = HoldingReceiver()
    try:
        with celery_worker(tmp_path, "worker"):
            subscription_create(user=world.users["bob"], channel="webhook", url=receiver.url, events=["failed"])
            job = failed_job(submit)
            row = Notification.objects.get()
            wait_for(lambda: Notification.objects.get().state == "sent", timeout=120,
                     message=lambda: f"the notification sent ({Notification.objects.get().__dict__}); worker log:\n"
                                     + (tmp_path / "worker.log").read_text()[-3000:])
        [post] = receiver.posts
        assert post["delivery"] == post["body"]["delivery"] and post["delivery"].endswith(f"-{row.pk}")
        assert (post["body"]["id"], post["body"]["phase"], post["body"]["event"]) == (job.pk, "FAILED", "failed")
        assert notified(job) == ["Notified bob by webhook (127.0.0.1) (failed)"]
    finally:
        receiver.close()


def test_a_worker_killed_mid_send_is_followed_by_one_delivery_id(world, submit, tmp_path, settings_for_worker):
    receiver = HoldingReceiver(hold=True)
    try:
        with celery_worker(tmp_path, "first") as first:
            subscription_create(user=world.users["bob"], channel="webhook", url=receiver.url, events=["ended"])
            job = failed_job(submit)
            wait_for(receiver.first.is_set, timeout=120,
                     message=lambda: "the first POST; worker log:\n" + (tmp_path / "first.log").read_text()[-3000:])
            os.killpg(first.pid, signal.SIGKILL)  # mid-send: the receiver has the POST and has not answered
            first.wait(timeout=30)
        receiver.release.set()
        row = Notification.objects.get()
        assert (row.state, row.tries) == ("pending", 1) and notified(job) == []
        with celery_worker(tmp_path, "second"):
            # The lease of the killed worker runs out, then the beat's sweep takes the row and sends it again.
            wait_for(lambda: Notification.objects.get().state == "sent", timeout=120,
                     message=lambda: "the notification sent; worker log:\n"
                                     + (tmp_path / "second.log").read_text()[-3000:])
        row.refresh_from_db()
        assert row.tries == 2
        assert len(receiver.posts) == 2  # the held POST and its repeat
        assert {p["delivery"] for p in receiver.posts} == {f"jobsite-{settings.JOBSITE_INSTALLATION_ID}-{row.pk}"}
        assert notified(job) == ["Notified bob by webhook (127.0.0.1) (ended)"]
    finally:
        receiver.close()
