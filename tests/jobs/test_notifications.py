"""Notifications: which changes make outbox rows (at most one per subscription and event), the address guard as a
table, the claim's lease, and delivery to a local HTTP server (one POST per event, retries, giving up)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core import mail
from django.core.exceptions import ValidationError
from django.utils import timezone

from jobs import services
from jobs.choices import NotificationState, Phase
from jobs.models import Job, Notification, NotificationSubscription
from jobs.notify_delivery import DELIVERY_HEADER, address_refusal
from jobs.services.notifications import (
    notifications_claim,
    notifications_deliver_due,
    notifications_on_transition,
    notify_kinds,
    retry_delay,
    subscription_create,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db
fast = pytest.mark.fast

HOOK = "http://127.0.0.1:9/hook"  # allowed by the settings fixture below; nothing is sent to it in fast tests


@pytest.fixture(autouse=True)
def _notify_settings(settings):
    settings.JOBSITE_NOTIFY_ALLOW_HOSTS = ["127.0.0.1"]
    settings.JOBSITE_NOTIFY_MAX_TRIES = 3
    settings.JOBSITE_NOTIFY_BACKOFF_SECONDS = 30
    settings.JOBSITE_NOTIFY_TIMEOUT_SECONDS = 10
    settings.JOBSITE_NOTIFY_LEASE_SECONDS = 120
    settings.JOBSITE_BASE_URL = "https://jobs.example.org"


def subscribe(world, user="bob", **kw):
    kw.setdefault("channel", "webhook")
    if kw["channel"] == "webhook":
        kw.setdefault("url", HOOK)
    return subscription_create(user=world.users[user], **{"events": ["ended"], **kw})


def running(submit, **spec) -> Job:
    job = submit("bob", **spec)
    services.job_transition(job=job, phase=Phase.PENDING)
    services.job_admit(job=job, backend="sim", placement=[{"node": "n1"}])
    services.job_transition(job=job, phase=Phase.RUNNING)
    return job


def fail(job: Job) -> Job:
    services.job_transition(job=job, phase=Phase.FAILED, status="Error", reason="Error", exit_code=3)
    return job


# --- which changes are which kinds (pure) ---------------------------------------------------------------------


@fast
@pytest.mark.parametrize("old, new, kinds", [
    ("RUNNING", "SUCCEEDED", {"ended", "succeeded"}),
    ("RUNNING", "FAILED", {"ended", "failed"}),
    ("TERMINATING", "TIMED_OUT", {"ended", "failed"}),
    ("TERMINATING", "CANCELLED", {"ended"}),
    ("PENDING", "CANCELLED", {"ended"}),
    ("TERMINATING", "PREEMPTED", {"ended"}),
    ("PREPARING", "RUNNING", {"running"}),     # admitted from the queue, now running
    ("UNKNOWN", "RUNNING", set()),             # seen again after a lost node: no wait in the queue
    ("RUNNING", "RUNNING", set()),
    ("PENDING", "PREPARING", set()),
    ("FAILED", "PENDING", set()),              # a restart
])
def test_notify_kinds(old, new, kinds):
    assert notify_kinds(old_phase=old, new_phase=new) == kinds


@fast
def test_retry_delay_doubles_and_is_capped(settings):
    assert [retry_delay(n).total_seconds() for n in (1, 2, 3, 4)] == [30, 60, 120, 240]
    assert retry_delay(20) == timedelta(hours=1)


# --- the outbox ---------------------------------------------------------------------------------------------


@fast
def test_failed_transition_with_a_webhook_subscription_makes_exactly_one_row(world, submit,
                                                                              django_capture_on_commit_callbacks):
    sub = subscribe(world, events=["ended", "failed"])
    subscribe(world, user="pan", events=["ended"])  # another user's: not told of bob's jobs
    job = running(submit)
    with django_capture_on_commit_callbacks() as callbacks:
        fail(job)
    [row] = Notification.objects.all()
    assert (row.subscription, row.job, row.kind, row.state, row.tries) == (sub, job, "failed", "pending", 0)
    assert row.event.reason == "Error" and row.event.job == job
    assert any(getattr(c, "__name__", "") == "notifications_dispatch" for c in callbacks)


@fast
def test_the_same_event_again_does_not_make_a_second_row(world, submit):
    subscribe(world, events=["failed"])
    job = fail(running(submit))
    row = Notification.objects.get()
    notifications_on_transition(job=job, old_phase=Phase.RUNNING, event=row.event)  # the hook called twice
    assert Notification.objects.count() == 1


@fast
def test_running_after_pending_counts_as_running(world, submit):
    subscribe(world, events=["running"])
    job = running(submit)
    [row] = Notification.objects.all()
    assert (row.kind, row.job_id, row.event.job.phase) == ("running", job.pk, Phase.RUNNING)
    services.job_transition(job=job, phase=Phase.SUCCEEDED, exit_code=0)
    assert Notification.objects.count() == 1  # not subscribed to endings


@fast
def test_a_change_nobody_asked_for_makes_no_row(world, submit):
    subscribe(world, events=["succeeded"])
    fail(running(submit))
    assert not Notification.objects.exists()


@fast
def test_subscription_validation_names_the_fields_and_stores_nothing(world):
    bob = world.users["bob"]
    cases = [
        ({"channel": "webhook", "events": ["ended"]}, "url"),
        ({"channel": "webhook", "url": "ftp://example.org/x", "events": ["ended"]}, "url"),
        ({"channel": "webhook", "url": "http://10.1.2.3/hook", "events": ["ended"]}, "url"),
        ({"channel": "webhook", "url": HOOK, "events": ["exploded"]}, "events"),
        ({"channel": "webhook", "url": HOOK, "events": []}, "events"),
        ({"channel": "email", "events": ["ended"]}, "email"),  # bob has no address of his own
        ({"channel": "pigeon", "events": ["ended"]}, "channel"),
    ]
    for data, field in cases:
        with pytest.raises(ValidationError) as err:
            subscription_create(user=bob, **data)
        assert field in err.value.message_dict, (data, err.value.message_dict)
    assert not NotificationSubscription.objects.exists()
    sub = subscription_create(user=bob, channel="email", email="bob@example.org", events=["idle_gpus", "ended"])
    assert (sub.email, sub.events) == ("bob@example.org", ["ended", "idle_gpus"])


# --- the address guard (pure) ---------------------------------------------------------------------------------


def never_local(address: str) -> bool:
    return False


@fast
@pytest.mark.parametrize("host, addresses, allow, is_local, refused", [
    ("localhost", ["127.0.0.1"], [], never_local, "this machine"),
    ("127.0.0.1", ["127.0.0.1"], [], never_local, "this machine"),
    ("a", ["10.0.0.7"], [], never_local, "private"),
    ("a", ["172.16.0.1"], [], never_local, "private"),
    ("a", ["172.31.255.254"], [], never_local, "private"),
    ("a", ["192.168.1.10"], [], never_local, "private"),
    ("a", ["169.254.169.254"], [], never_local, "private"),  # link-local: cloud metadata
    ("a", ["::1"], [], never_local, "this machine"),
    ("a", ["fd12:3456::1"], [], never_local, "private"),     # unique-local fc00::/7
    ("a", ["fe80::1"], [], never_local, "private"),
    ("a", ["::ffff:10.0.0.1"], [], never_local, "private"),  # IPv4-mapped
    ("a", ["100.64.0.1"], [], never_local, "private"),       # shared address space
    ("a", ["0.0.0.0"], [], never_local, "private"),
    ("a", ["93.184.215.14", "10.0.0.1"], [], never_local, "private"),  # every address must pass
    ("hooks.example.org", ["93.184.215.14"], [], never_local, None),  # global
    ("hooks.example.org", ["2606:2800:21f:cb07::1"], [], never_local, None),
    ("me", ["93.184.215.14"], [], lambda a: True, "this machine"),  # a global address of this machine's
    ("hooks.lab", ["10.0.0.7"], ["hooks.lab"], never_local, None),  # allowed host
    ("HOOKS.lab.", ["10.0.0.7"], ["hooks.lab"], never_local, None),
    ("other.lab", ["10.0.0.7"], ["hooks.lab"], never_local, "private"),
    ("a", ["10.20.3.4"], ["10.20.0.0/16"], never_local, None),      # allowed CIDR
    ("a", ["10.21.3.4"], ["10.20.0.0/16"], never_local, "private"),
    ("a", ["127.0.0.1"], ["127.0.0.1"], never_local, None),         # an allowed address
    ("a", ["fd00::5"], ["fd00::/8"], never_local, None),
    ("a", [], [], never_local, "no address"),
])
def test_address_guard(host, addresses, allow, is_local, refused):
    reason = address_refusal(host, addresses, allow=allow, is_local=is_local)
    if refused is None:
        assert reason is None
    else:
        assert reason and refused in reason


# --- the claim and its lease -------------------------------------------------------------------------------------


@fast
def test_a_claimed_row_is_not_claimed_again_while_its_lease_runs(world, submit, settings):
    subscribe(world)
    fail(running(submit))
    now = timezone.now()
    [claimed] = notifications_claim(now=now)
    assert claimed.tries == 1
    assert notifications_claim(now=now + timedelta(seconds=119)) == []
    [again] = notifications_claim(now=now + timedelta(seconds=121))  # the worker that took it is presumed dead
    assert (again.pk, again.tries) == (claimed.pk, 2)


# --- delivery ---------------------------------------------------------------------------------------------------


class Receiver:
    """A local webhook receiver: records each POST (headers, JSON) and answers the next status of ``answers``
    (then 200)."""

    def __init__(self):
        self.posts: list[dict] = []
        self.answers: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                receiver.posts.append({"path": self.path, "headers": dict(self.headers),
                                       "body": json.loads(self.rfile.read(length))})
                status = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"nope" if status >= 400 else b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


def notified_events(job):
    return list(job.events.filter(reason__in=["Notified", "NotifyFailed"]).values_list("type", "message"))


def test_one_post_per_subscribed_event_with_the_job_in_its_body(world, submit, receiver):
    sub = subscribe(world, url=receiver.url, events=["running", "failed"])
    job = running(submit, name="train-lr")
    fail(job)
    assert notifications_deliver_due() == 2
    assert notifications_deliver_due() == 0  # nothing sent twice
    assert [p["body"]["event"] for p in receiver.posts] == ["running", "failed"]
    body = receiver.posts[1]["body"]
    assert {k: body[k] for k in ("id", "name", "phase", "status", "reason", "url", "group", "user")} == {
        "id": job.pk, "name": "train-lr", "phase": "FAILED", "status": "Error", "reason": "Error",
        "url": f"https://jobs.example.org/jobs/{job.pk}/", "group": "phusers", "user": "bob"}
    ids = [p["headers"][DELIVERY_HEADER] for p in receiver.posts]
    assert [p["body"]["delivery"] for p in receiver.posts] == ids and len(set(ids)) == 2
    assert set(Notification.objects.values_list("state", flat=True)) == {NotificationState.SENT}
    assert all(n.sent_at for n in Notification.objects.all())
    host = "by webhook (127.0.0.1)"
    assert notified_events(job) == [("Normal", f"Notified bob {host} (running)"),
                                    ("Normal", f"Notified bob {host} (failed)")]
    assert sub.outbox.count() == 2


def test_slack_body_is_text(world, submit, receiver):
    subscribe(world, url=receiver.url, events=["failed"], slack=True)
    job = fail(running(submit, name="eval"))
    notifications_deliver_due()
    [post] = receiver.posts
    assert set(post["body"]) == {"text"}
    assert f"Job #{job.pk} eval (phusers) failed" in post["body"]["text"]


def test_a_500_is_retried_after_the_backoff_then_sent(world, submit, receiver):
    subscribe(world, url=receiver.url, events=["failed"])
    job = fail(running(submit))
    receiver.answers = [500]
    notifications_deliver_due()
    row = Notification.objects.get()
    assert (row.state, row.tries) == ("pending", 1) and "500" in row.last_error
    assert row.next_try_at > timezone.now() + timedelta(seconds=25)  # the backoff: 30 s
    assert notifications_deliver_due() == 0
    Notification.objects.update(next_try_at=timezone.now())  # the backoff is over
    notifications_deliver_due()
    row.refresh_from_db()
    assert (row.state, row.tries, row.last_error) == ("sent", 2, "")
    assert len(receiver.posts) == 2 and len({p["headers"][DELIVERY_HEADER] for p in receiver.posts}) == 1
    assert [m for _, m in notified_events(job)] == ["Notified bob by webhook (127.0.0.1) (failed)"]


def test_failed_after_the_last_try_with_a_warning(world, submit, receiver):
    subscribe(world, url=receiver.url, events=["ended"])
    job = fail(running(submit))
    receiver.answers = [500, 503, 502]
    for _ in range(3):
        Notification.objects.update(next_try_at=timezone.now())
        notifications_deliver_due()
    row = Notification.objects.get()
    assert (row.state, row.tries) == ("failed", 3) and "502" in row.last_error
    Notification.objects.update(next_try_at=timezone.now())
    assert notifications_deliver_due() == 0 and len(receiver.posts) == 3
    [(kind, message)] = notified_events(job)
    assert kind == "Warning" and message.startswith("Could not notify bob by webhook (127.0.0.1) after 3 tries")


@fast
def test_a_refused_address_at_send_time_fails_at_once(world, submit, settings):
    subscribe(world, events=["failed"])  # allowed when subscribing
    settings.JOBSITE_NOTIFY_ALLOW_HOSTS = []  # and no more
    job = fail(running(submit))
    notifications_deliver_due()
    row = Notification.objects.get()
    assert (row.state, row.tries) == ("failed", 1) and "this machine" in row.last_error
    assert notified_events(job)[0][0] == "Warning"


@fast
def test_email_goes_to_the_users_address(world, submit):
    bob = world.users["bob"]
    bob.email = "bob@example.org"
    bob.save()
    subscribe(world, channel="email", events=["succeeded"])
    job = running(submit, name="prep")
    services.job_transition(job=job, phase=Phase.SUCCEEDED, exit_code=0)
    notifications_deliver_due()
    [message] = mail.outbox
    assert message.to == ["bob@example.org"]
    assert f"Job #{job.pk} prep (phusers) succeeded" in message.subject
    assert f"https://jobs.example.org/jobs/{job.pk}/" in message.body
    assert Notification.objects.get().state == "sent"
    assert notified_events(job) == [("Normal", "Notified bob by email (succeeded)")]


# --- the settings page ---------------------------------------------------------------------------------------


@fast
def test_page_lists_adds_and_deletes(world, login):
    client = login("bob")
    subscribe(world, user="pan")  # not bob's
    page = client.get("/notifications/").content.decode()
    assert "No subscriptions yet" in page and 'href="/notifications/"' in page  # the nav links to it
    r = client.post("/notifications/", {"channel": "webhook", "url": HOOK, "events": ["failed", "running"]})
    assert r.status_code == 302
    sub = NotificationSubscription.objects.get(user=world.users["bob"])
    assert sub.events == ["failed", "running"]
    page = client.get("/notifications/").content.decode()
    assert HOOK in page and "Failed, Running after a wait" in page and "Subscribed." in page
    other = NotificationSubscription.objects.get(user=world.users["pan"])
    assert client.post(f"/notifications/{other.pk}/delete/").status_code == 404
    assert client.post(f"/notifications/{sub.pk}/delete/").status_code == 302
    assert list(NotificationSubscription.objects.values_list("user__username", flat=True)) == ["pan"]


@fast
def test_page_shows_errors_inline_and_adds_nothing(world, login):
    client = login("bob")
    r = client.post("/notifications/", {"channel": "webhook", "url": "http://192.168.0.10/hook", "events": ["ended"]})
    page = r.content.decode()
    assert r.status_code == 400
    assert 'class="field has-error" id="field-url"' in page and "private" in page and "Nothing was added" in page
    r = client.post("/notifications/", {"channel": "email"})
    assert r.status_code == 400 and "This field is required." in r.content.decode()
    assert not NotificationSubscription.objects.exists()


# --- the embedded default: sent from a thread of this process after commit -------------------------------------


@pytest.mark.django_db(transaction=True)
def test_embedded_mode_sends_from_a_thread_after_commit(world, submit, receiver, settings):
    from jobs.tasks import inprocess_sender

    settings.JOBSITE_NOTIFY_INPROCESS = True
    subscribe(world, url=receiver.url, events=["failed"])
    try:
        job = fail(running(submit))
        wait_for(lambda: Notification.objects.filter(state="sent").exists(), timeout=60,
                 message="the notification sent by the embedded thread")
    finally:
        inprocess_sender.stop()
    assert [p["body"]["id"] for p in receiver.posts] == [job.pk]
    assert [m for _, m in notified_events(job)] == ["Notified bob by webhook (127.0.0.1) (failed)"]


@fast
def test_the_hook_costs_one_query_for_an_ending_and_none_for_other_changes(world, submit):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    job = fail(running(submit))
    event = job.events.last()
    with CaptureQueriesContext(connection) as queries:
        notifications_on_transition(job=job, old_phase=Phase.RUNNING, event=event)  # nobody subscribed
    assert len(queries) == 1
    job.phase = Phase.PREPARING  # admitted: no kind anyone may ask for
    with CaptureQueriesContext(connection) as queries:
        notifications_on_transition(job=job, old_phase=Phase.PENDING, event=event)
    assert len(queries) == 0
