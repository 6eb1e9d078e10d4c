"""The socket of one job's detail page (``ws/jobs/<id>/``): the page follows its job whatever its phase.

One code path draws the page's live parts for the first frame (on connect, on a reconnect, after the channel layer
was away: ``jobs.catchup``) and for every change: the head, status and attempts again from the page's templates
(for this user: the actions offered depend on who looks), the events after the last one the page shows, and a
viewer for each replica log the page does not have yet (empty: it follows its log from the start over
``ws/jobs/<id>/logs/``). The page says what it has in the socket's query string (``static/js/pages.js``):
``after=<the last event id shown>&logs=<attempt-rank,...>``, so a page drawn before an attempt existed gets its
viewers even when the attempt started before the socket opened.

The GPU card is drawn with the rest, and alone when the scheduler has stored a sampling round of the job's GPUs
(``jobs.services.telemetry.gpus_changed_publish`` → the hub → ``hub_gpus``): at most once a round.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import HttpRequest, QueryDict
from django.middleware.csrf import get_token
from django.template.loader import render_to_string

from . import selectors
from .consumers import _CoalescingConsumer, _OneJobMixin, with_oob
from .models import Job, JobEvent

LIVE_PARTS = ("jobs/_detail_head.html", "jobs/_detail_status.html", "jobs/_detail_attempts.html")
MAX_EVENTS_PER_FRAME = 500
GPUS = -1  # the key under which "the GPU readings changed" waits for the next frame (no job has it)


def gpu_card(job: Job) -> str:
    """The GPU card (``jobs/_detail_gpus.html``: server-drawn SVG charts) as an out-of-band swap; empty for a job
    without GPUs."""
    html = render_to_string("jobs/_detail_gpus.html", {"job": job}).strip()
    return with_oob(html) if html else ""


def shown_logs(value: str | None) -> set[str] | None:
    """The viewers a page says it shows (``"2-0,1-0"``), or None when it does not say."""
    if value is None:
        return None
    names = (name.split("-") for name in value.split(",") if name)
    return {f"{int(a)}-{int(r)}" for a, r, *rest in names if not rest and a.isdigit() and r.isdigit()}


def csrf_token_of(scope: dict[str, Any]) -> str | None:
    """A form token for the page's own CSRF cookie (masked afresh, as a page draws it), so that the actions of a head
    drawn by the socket post as those of the page did; None without a cookie."""
    secret = scope.get("cookies", {}).get(settings.CSRF_COOKIE_NAME)
    if not secret:
        return None
    request = HttpRequest()
    request.META["CSRF_COOKIE"] = secret
    return get_token(request)


class JobDetailConsumer(_OneJobMixin, _CoalescingConsumer):
    """``ws/jobs/<id>/?after=<event id>&logs=<viewers>``: the detail page, live from the moment it opens."""

    async def connect(self) -> None:
        self.job_id = int(self.scope["url_route"]["kwargs"]["pk"])
        query = QueryDict(self.scope.get("query_string", b"").decode("latin-1"))
        after = query.get("after", "")
        self.last_event = int(after) if after.isdigit() else None
        self.viewers = shown_logs(query.get("logs"))  # None: not told; the page has those of now
        self.failed: set[str] | None = None  # marked failed on the page: all of them once, on the first frame
        await super().connect()

    async def catch_up(self, since: datetime | None = None) -> list[str]:
        return await database_sync_to_async(self.draw)()

    async def frame(self, items: dict[int, dict[str, Any]]) -> list[str]:
        if items.keys() == {GPUS}:  # only new GPU readings: the GPU card alone
            return await database_sync_to_async(self.draw_gpus)()
        return await database_sync_to_async(self.draw)()

    def hub_gpus(self) -> None:
        """The hub heard that the job's GPU readings changed (a sampling round): the card is drawn again with the
        next frame, once however many rounds came meanwhile."""
        self.hub_push({GPUS: {"id": GPUS, "at": time.time()}})

    def draw_gpus(self) -> list[str]:
        _, job = self._job()
        return [self.new_gpu_card(job)] if job is not None else []

    def new_gpu_card(self, job: Job) -> str:
        """The GPU card, unless it is the one this socket sent last (a change of the job's status leaves it be)."""
        html = gpu_card(job)
        if html == getattr(self, "gpu_html", None):
            return ""
        self.gpu_html = html
        return html

    def _job(self) -> tuple[Any, Job | None]:
        """The socket's user and the job, if that user may still see it."""
        user = get_user_model().objects.filter(pk=self.user_id, is_active=True).first()
        return user, user and selectors.jobs_visible_to(user).filter(pk=self.job_id).first()

    def draw(self) -> list[str]:
        """The frames that bring the page up to date: its live parts, the viewers and failure marks it lacks, the
        events after the last one it has."""
        from .views import detail_context

        user, job = self._job()
        if job is None:
            return []
        context = {**detail_context(user, job, read_logs=False), "csrf_token": csrf_token_of(self.scope)}
        pieces = [with_oob(render_to_string(template, context)) for template in LIVE_PARTS]
        pieces.append(self.new_gpu_card(job))
        replicas = {f"{r.attempt}-{r.rank}": r for _, rs in context["logs"] for r in rs}  # newest attempt first
        if self.viewers is None:
            self.viewers = set(replicas)
        new = [r for name, r in replicas.items() if name not in self.viewers]
        if new:
            html = "".join(render_to_string("jobs/_log_viewer.html", {**context, "r": r}) for r in new)
            pieces.append(f'<div hx-swap-oob="afterbegin:#logs-list">{html}</div>')
            self.viewers |= set(replicas)
        # A replica shown that turned out to be the first of its attempt to fail: its mark (the page's script then
        # unfolds it; the viewer, with the lines it holds, stays). A new viewer comes with its mark.
        failed = {name for name, r in replicas.items() if r.failed}
        for name in sorted(failed - (self.failed or set()) - {f"{r.attempt}-{r.rank}" for r in new}):
            pieces.append(with_oob(render_to_string("jobs/_log_failed_mark.html", {"r": replicas[name]})))
        self.failed = failed
        return ["".join(pieces), *self.new_events()]

    def new_events(self) -> list[str]:
        """Rows of the events after the last one the page shows (not told: those from now on)."""
        if self.last_event is None:
            self.last_event = JobEvent.objects.filter(job_id=self.job_id).order_by("-id").values_list(
                "id", flat=True).first() or 0
            return []
        events = list(JobEvent.objects.filter(job_id=self.job_id, pk__gt=self.last_event)
                      .select_related("attempt").order_by("id")[:MAX_EVENTS_PER_FRAME])
        if not events:
            return []
        rows = "".join(render_to_string("jobs/_event_row.html", {"event": e}) for e in events)
        frames = ['<tr id="no-events" hx-swap-oob="delete"></tr>'] if self.last_event == 0 else []
        self.last_event = events[-1].pk
        return [*frames, f'<tbody hx-swap-oob="beforeend:#events tbody">{rows}</tbody>']
