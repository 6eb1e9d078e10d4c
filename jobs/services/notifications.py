"""Notifications of job events: subscriptions, the outbox rows a transition makes for them, and the outbox's
sending side (claiming due rows under a lease, recording what came of a send).

How a notification travels:

1. ``notifications_on_transition`` runs inside the transition's transaction and adds one ``Notification`` row per
   subscription of the job's user that asked for this kind of change (at most one per subscription and event: the
   table's unique key). After commit it asks for a send (``jobs.tasks.notifications_dispatch``).
2. ``notifications_deliver_due`` (the Celery task, the periodic sweep, or the embedded thread of ``make run``)
   claims due rows with ``SELECT … FOR UPDATE SKIP LOCKED`` and, in the same short transaction, pushes each row's
   ``next_try_at`` a lease ahead (JOBSITE_NOTIFY_LEASE_SECONDS) and counts the try. No other worker takes a row while
   its lease runs, so two workers never send one row at once.
3. The send happens outside any transaction. Success marks the row SENT (sent_at) and records "Notified bob by
   webhook" on the job; a failure sets the next try with exponential backoff, or, after JOBSITE_NOTIFY_MAX_TRIES
   (or at once when retrying cannot help), marks it FAILED with a Warning event.

What is and is not guaranteed: a row marked SENT is never sent again, and one event makes at most one row per
subscription. A worker that dies after the receiver got the POST but before it marked the row SENT leaves the row
PENDING; when its lease ends the sweep sends it again, with the same delivery id (the ``X-Jobsite-Delivery`` header
and the body's ``delivery``), so the receiver sees a repeat it can recognise and drop. That window, between the
receiver's answer and one UPDATE, is the only way a receiver sees one notification twice; the lease is set well above
the send timeout, so a live worker finishes its send before another may take the row.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ..choices import TERMINAL_PHASES, EventType, NotificationState, NotifyChannel, NotifyEvent, Phase
from ..models import Job, JobEvent, Notification, NotificationSubscription
from ..prepared import Prepared
from .events import event_record

log = logging.getLogger(__name__)

# A user's subscriptions: read by every transition that may notify (compiled once).
SUBSCRIPTIONS = Prepared(lambda user_id: NotificationSubscription.objects.filter(user_id=user_id), user_id=int)

# When one change matches several kinds a subscription asked for, the message names the most specific.
KIND_ORDER = (NotifyEvent.FAILED, NotifyEvent.SUCCEEDED, NotifyEvent.ENDED, NotifyEvent.RUNNING)
BACKOFF_CAP_SECONDS = 3600


def notify_kinds(*, old_phase: str, new_phase: str) -> frozenset[str]:
    """The kinds of notification a phase change is (pure): ended (any terminal phase), succeeded, failed (FAILED or
    TIMED_OUT), running (RUNNING after preparing, i.e. after a wait in the queue; not a job seen again after its node
    was lost). ``idle_gpus`` is no phase change: the idle-GPU rule makes it (``jobs.services.telemetry``)."""
    kinds = set()
    if new_phase in TERMINAL_PHASES and old_phase not in TERMINAL_PHASES:
        kinds.add(NotifyEvent.ENDED)
        if new_phase == Phase.SUCCEEDED:
            kinds.add(NotifyEvent.SUCCEEDED)
        elif new_phase in (Phase.FAILED, Phase.TIMED_OUT):
            kinds.add(NotifyEvent.FAILED)
    if new_phase == Phase.RUNNING and old_phase == Phase.PREPARING:
        kinds.add(NotifyEvent.RUNNING)
    return frozenset(kinds)


def retry_delay(tries: int) -> timedelta:
    """Pure: how long after the ``tries``-th failed try the next one comes (base × 2^(tries-1), at most an hour)."""
    base = settings.JOBSITE_NOTIFY_BACKOFF_SECONDS
    return timedelta(seconds=min(base * 2 ** max(tries - 1, 0), BACKOFF_CAP_SECONDS))


# --- subscriptions -----------------------------------------------------------------------------------------------


def subscription_validate(*, user, channel: str, url: str = "", email: str = "", slack: bool = False,
                          events: Iterable[str] = ()) -> dict:
    """The subscription's fields, cleaned; ValidationError with a message per field otherwise. A webhook's host is
    resolved and checked against the address guard (``jobs.notify_delivery.webhook_target``)."""
    from ..notify_delivery import DeliveryError, webhook_target

    errors: dict[str, list[str]] = {}
    events = list(dict.fromkeys(events))
    unknown = [e for e in events if e not in NotifyEvent.values]
    if unknown:
        errors["events"] = [f"Unknown event {e!r}: one of {', '.join(NotifyEvent.values)}." for e in unknown]
    elif not events:
        errors["events"] = ["Choose at least one event."]
    url, email = (url or "").strip(), (email or "").strip()
    if channel == NotifyChannel.WEBHOOK:
        if not url:
            errors["url"] = ["A webhook needs a url."]
        elif len(url) > NotificationSubscription._meta.get_field("url").max_length:
            errors["url"] = ["The url is too long (500 characters at most)."]
        else:
            try:
                webhook_target(url)
            except DeliveryError as exc:
                errors["url"] = [str(exc)]
        email = ""
    elif channel == NotifyChannel.EMAIL:
        if not email and not user.email:
            errors["email"] = ["Your account has no email address: give one."]
        url, slack = "", False
    else:
        errors["channel"] = [f"One of {', '.join(NotifyChannel.values)}."]
    if errors:
        raise ValidationError(errors)
    return {"channel": channel, "url": url, "email": email, "slack": bool(slack),
            "events": [e for e in NotifyEvent.values if e in events]}


def subscription_create(*, user, channel: str, url: str = "", email: str = "", slack: bool = False,
                        events: Iterable[str] = ()) -> NotificationSubscription:
    """Subscribe ``user`` to events of their jobs (ValidationError with field messages, and nothing stored, if bad)."""
    fields = subscription_validate(user=user, channel=channel, url=url, email=email, slack=slack, events=events)
    return NotificationSubscription.objects.create(user=user, **fields)


def subscription_delete(*, user, subscription_id: int) -> bool:
    """Delete one of ``user``'s own subscriptions (and its unsent notifications); False if they have none by that id."""
    deleted, _ = NotificationSubscription.objects.filter(user=user, pk=subscription_id).delete()
    return bool(deleted)


# --- the outbox ---------------------------------------------------------------------------------------------------


def notifications_on_transition(*, job: Job, old_phase: str, event: JobEvent) -> None:
    """``job`` has just changed phase (inside its transition's transaction, ``event`` its trail's entry): queue a
    notification for each subscription that asked for this kind of change; send them after commit."""
    kinds = notify_kinds(old_phase=old_phase, new_phase=job.phase)
    if kinds:
        notifications_enqueue(job=job, event=event, kinds=kinds, at=event.time)


def notifications_enqueue(*, job: Job, event: JobEvent, kinds: frozenset[str], at: datetime) -> None:
    """Queue one notification of ``event`` per subscription of the job's user that asked for one of ``kinds`` (the
    first of them in KIND_ORDER, then any other), due ``at``; send them after commit."""
    order = (*KIND_ORDER, *sorted(kinds - set(KIND_ORDER)))
    rows = []
    for subscription in SUBSCRIPTIONS.all(user_id=job.user_id):
        kind = next((k for k in order if k in kinds and k in subscription.events), None)
        if kind:
            rows.append(Notification(subscription=subscription, job=job, event=event, kind=kind, next_try_at=at))
    if rows:
        Notification.objects.bulk_create(rows, ignore_conflicts=True)
        from ..tasks import notifications_dispatch

        transaction.on_commit(notifications_dispatch, robust=True)


def claim_size() -> int:
    """How many rows one claim takes: as many as the lease covers sent one after another, each at its slowest
    (connect and read timeouts, and a margin), so a live worker sends every row it took before its lease ends."""
    return max(1, int(settings.JOBSITE_NOTIFY_LEASE_SECONDS // (3 * settings.JOBSITE_NOTIFY_TIMEOUT_SECONDS)))


def notifications_claim(*, now: datetime | None = None, limit: int = 20) -> list[Notification]:
    """Take up to ``limit`` due rows for this worker: rows another transaction holds are skipped, and each taken row's
    ``next_try_at`` moves a lease ahead (so nobody else takes it meanwhile) and its ``tries`` counts this try."""
    now = now or timezone.now()
    lease_until = now + timedelta(seconds=settings.JOBSITE_NOTIFY_LEASE_SECONDS)
    with transaction.atomic():
        ids = list(Notification.objects.select_for_update(skip_locked=True)
                   .filter(state=NotificationState.PENDING, next_try_at__lte=now)
                   .order_by("next_try_at").values_list("pk", flat=True)[:limit])
        if not ids:
            return []
        Notification.objects.filter(pk__in=ids).update(tries=F("tries") + 1, next_try_at=lease_until)
    return list(Notification.objects.filter(pk__in=ids).order_by("pk").select_related(
        "subscription__user", "job__group", "job__user", "event__attempt"))


def _channel_words(notification: Notification) -> str:
    subscription = notification.subscription
    if subscription.channel == NotifyChannel.EMAIL:
        return "by email"
    return f"by webhook ({urlsplit(subscription.url).hostname})"


@transaction.atomic
def notification_mark_sent(*, notification: Notification, now: datetime | None = None) -> bool:
    """Record a send: SENT, and "Notified bob by webhook" on the job. False (nothing written) if the row was already
    settled by another worker."""
    now = now or timezone.now()
    updated = Notification.objects.filter(pk=notification.pk, state=NotificationState.PENDING).update(
        state=NotificationState.SENT, sent_at=now, last_error="")
    if updated:
        user = notification.subscription.user.get_username()
        event_record(job=notification.job, attempt=notification.event.attempt, reason="Notified",
                     message=f"Notified {user} {_channel_words(notification)} ({notification.kind})")
    return bool(updated)


@transaction.atomic
def notification_mark_failed(*, notification: Notification, error: str, permanent: bool = False,
                             now: datetime | None = None) -> str:
    """Record a failed try: the next try after the backoff, or FAILED with a Warning event once the tries are spent
    (or at once if ``permanent``). Returns the row's new state."""
    now = now or timezone.now()
    row = Notification.objects.select_for_update().filter(pk=notification.pk).first()
    if row is None or row.state != NotificationState.PENDING:
        return row.state if row else NotificationState.FAILED
    if permanent or row.tries >= settings.JOBSITE_NOTIFY_MAX_TRIES:
        row.state, row.last_error = NotificationState.FAILED, error[:2000]
        row.save(update_fields=["state", "last_error"])
        user = notification.subscription.user.get_username()
        event_record(job=notification.job, reason="NotifyFailed", type=EventType.WARNING,
                     message=f"Could not notify {user} {_channel_words(notification)} after {row.tries} "
                             f"{'try' if row.tries == 1 else 'tries'}: {error}"[:1000])
    else:
        row.next_try_at, row.last_error = now + retry_delay(row.tries), error[:2000]
        row.save(update_fields=["next_try_at", "last_error"])
    return row.state


def notifications_deliver_due(*, limit: int = 100) -> int:
    """Claim and send the due notifications, a few at a time, until none is due or ``limit`` were tried; returns
    how many were tried. Each send is outside any transaction."""
    from ..notify_delivery import DeliveryError, deliver

    tried = 0
    while tried < limit:
        batch = notifications_claim(limit=min(claim_size(), limit - tried))
        if not batch:
            break
        for notification in batch:
            tried += 1
            try:
                deliver(notification)
            except DeliveryError as exc:
                notification_mark_failed(notification=notification, error=str(exc), permanent=exc.permanent)
            except Exception as exc:  # a bug or an unexpected library error: a failed try, not a dead worker
                log.exception("sending notification %s failed", notification.pk)
                notification_mark_failed(notification=notification, error=f"{type(exc).__name__}: {exc}")
            else:
                notification_mark_sent(notification=notification)
    return tried
