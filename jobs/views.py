"""Server-rendered pages: job list, submit form, job detail with events, attempts and logs, cancel, raw log;
a group's queue, cluster utilisation and GPU usage. Pages update live over WebSockets (``jobs.consumers``); the
partials they refetch then (rows, the detail's live parts, the queue and utilisation blocks) come from here too.

Views stay thin: reads go through ``jobs.selectors``, writes through ``jobs.services``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from . import list_arrays, logs, selectors, services, telemetry_selectors, usage_selectors
from .api import auth
from .choices import Phase, Resource
from .forms import JobFilterForm, JobSpecYamlForm, JobSubmitForm, initial_from_job
from .models import Attempt, Job
from .services import arrays as array_services
from .state_machine import COLOR_NAMES, PHASE_COLORS, Color, is_terminal

PAGE_SIZE = 50
LOG_TAIL_BYTES = 256 * 1024
# Most a "load earlier" request of the log viewer may ask for.
# Logs shown inline on the detail page (newest attempts first); older ones are linked only.
LOG_INLINE_MAX = 16
USAGE_DAYS_DEFAULT = 30
USAGE_DAYS_MAX = 366


def _visible_job(request: HttpRequest, pk: int) -> Job:
    return get_object_or_404(selectors.jobs_visible_to(request.user), pk=pk)


# --- login --------------------------------------------------------------------------------------------------


class LoginForm(AuthenticationForm):
    """Django's login form, refusing at once (before checking the password) a username locked out from this client."""

    def clean(self):
        if auth.login_locked(self.request, self.data.get("username")):
            raise ValidationError(
                auth.TOO_MANY_ATTEMPTS.format(wait=auth.login_lock_seconds()), code="too_many_attempts"
            )
        return super().clean()


class LoginView(auth_views.LoginView):
    """The login page; a locked-out username answers 429 with the form and its message."""

    form_class = LoginForm

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.has_error(NON_FIELD_ERRORS, code="too_many_attempts"):
            response.status_code = 429
            response["Retry-After"] = str(auth.login_lock_seconds())
        return response


# --- list ---------------------------------------------------------------------------------------------------


def _legend() -> list[dict]:
    """Colour → the phases shown in it, in the order of the lifecycle."""
    rows: dict[str, list[str]] = {}
    for phase, color in PHASE_COLORS.items():
        rows.setdefault(color, []).append(Phase(phase).label)
    rows.setdefault(Color.RED, []).append("errors (e.g. CrashLoopBackOff)")
    return [{"color": c, "color_name": COLOR_NAMES[c], "phases": ", ".join(p)} for c, p in rows.items()]


def _job_page(request: HttpRequest, group_ids: list[int] | None = None):
    # The API's query; filters not understood are left out.
    jobs = selectors.job_list(request.user, request.GET, group_ids=group_ids, collapse_arrays=True)[0]
    return selectors.JobPaginator(jobs, PAGE_SIZE).get_page(request.GET.get("page"))


def approximately(n: int) -> str:
    """An estimated count as people say it: 1234567 → "1.2 million", 123456 → "120,000"."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}".removesuffix(".0") + " million"
    digits = len(str(n))
    return f"{round(n, 2 - digits) if digits > 2 else n:,}"


@login_required
def job_list_page(request: HttpRequest) -> HttpResponse:
    group_rows = list(selectors.groups_of(request.user).order_by("name").values_list("pk", "name"))
    groups = [name for _, name in group_rows]
    filter_form = JobFilterForm(request.GET or None, groups=groups)
    page = _job_page(request, [pk for pk, _ in group_rows])
    selectors.with_queue_positions(page.object_list)  # derived, not stored
    list_arrays.with_array_rows(page.object_list)  # an array's row: its members counted per status
    filtered = any(request.GET.get(k) for k in ("group", "phase", "user", "q"))
    count_exact = page.paginator.count_exact
    return render(request, "jobs/job_list.html", {
        "page": page,
        "jobs": page.object_list,
        "filter_form": filter_form,
        "q": request.GET.get("q", ""),
        "count_exact": count_exact,
        "count_label": "" if count_exact else approximately(page.paginator.count),
        "filtered": filtered,
        "legend": _legend(),
        "nav_groups": groups,
    })


# --- submit -------------------------------------------------------------------------------------------------

@login_required
@require_http_methods(["GET", "POST"])
def submit_page(request: HttpRequest) -> HttpResponse:
    groups = list(selectors.groups_of(request.user).order_by("name"))
    if not groups:
        return render(request, "jobs/job_submit.html", {"no_groups": True})
    by_name = {g.name: g for g in groups}

    def form_for(group_name: str | None, **kwargs) -> JobSubmitForm:
        group = by_name.get(group_name or "", groups[0])
        return JobSubmitForm(user=request.user, group=group, groups=groups, **kwargs)

    clone_of = None
    yaml_form = JobSpecYamlForm(groups=groups)
    yaml_loaded = False
    if request.method == "POST" and "load_yaml" in request.POST:
        yaml_form = JobSpecYamlForm(request.POST, request.FILES, groups=groups)
        if yaml_form.is_valid():
            initial = yaml_form.cleaned_data["initial"]
            form = form_for(initial.get("group"), initial=initial)
            yaml_loaded = True
        else:
            form = form_for(None)
    elif request.method == "POST" and "refresh" not in request.POST:
        form = form_for(request.POST.get("group"), data=request.POST)
        form.is_valid()  # type checks first, then the service decides what may run
        try:
            spec = services.job_spec_validate(user=request.user, data=form.spec_data())
            plan = None
            if form.is_array and not (form.has_error("array") or form.has_error("sweep")):
                plan = array_services.array_plan_validate(spec=spec, **form.array_data())
            if form.is_valid():
                return _submitted(request, spec, plan)
        except ValidationError as exc:
            form.add_service_errors(exc.message_dict if hasattr(exc, "error_dict") else {"__all__": exc.messages})
    elif request.method == "POST":
        # Without JavaScript: "Update choices" re-renders the form for the chosen group, keeping what was typed.
        form = form_for(request.POST.get("group"), initial=request.POST.dict())
    elif request.GET.get("clone"):
        clone = request.GET["clone"]
        if not clone.isdigit():
            raise Http404("No such job.")
        clone_of = _visible_job(request, int(clone))
        form = form_for(clone_of.group.name, initial=initial_from_job(clone_of))
    else:
        initial = {k: v for k, v in request.GET.items() if k in JobSubmitForm.base_fields}
        form = form_for(request.GET.get("group"), initial=initial)

    context = {
        "form": form,
        "group": form.group,
        "quotas": selectors.quota_rows(form.group),
        "clone_of": clone_of,
        "yaml_form": yaml_form,
        "yaml_loaded": yaml_loaded,
        "nav_groups": [g.name for g in groups],
    }
    if request.htmx:
        return render(request, "jobs/_group_fields.html", context)
    return render(request, "jobs/job_submit.html", context)


def _submitted(request: HttpRequest, spec, plan) -> HttpResponse:
    """Make the job (or the array, with ``plan``) with what it waits for (``spec.after``); off to its page.
    ``ValidationError`` (a target that ended the other way meanwhile) leaves nothing made."""
    with transaction.atomic():  # a savepoint of its own: a refused dependency leaves the request usable
        if plan is not None:
            array = array_services.array_submit(user=request.user, spec=spec, plan=plan)
        else:
            job = services.job_submit(user=request.user, spec=spec)
    if plan is not None:
        messages.success(request, f"Array {array.pk} “{array.name}” of {array.size} jobs submitted to "
                                  f"{array.group.name}.")
        return redirect("jobs:array", pk=array.pk)
    messages.success(request, f"Job #{job.pk} “{job.name}” submitted to {job.group.name}.")
    return redirect("jobs:detail", pk=job.pk)


# --- detail -------------------------------------------------------------------------------------------------


@dataclass
class ReplicaLog:
    attempt: int
    rank: int
    url: str
    text: str | None = None  # None: no log file yet (or not read)
    start: int = 0
    end: int = 0
    size: int = 0
    inline: bool = True
    current: bool = False  # of the job's current attempt: followed live
    failed: bool = False  # the first replica of its attempt that failed (the attempt's exit code is its)
    exit_code: int | None = None  # the attempt's, shown with the failed replica
    open: bool = False  # shown unfolded when the page loads

    @property
    def truncated(self) -> bool:
        return self.start > 0


def _attempt_logs(job: Job, attempts: list[Attempt], *, read: bool = True) -> list[tuple[Attempt, list[ReplicaLog]]]:
    """Each attempt, newest first, with a viewer per replica. The newest attempt's replicas are unfolded; when a
    replica of it failed, only that one is (the log that says why, as ``jobctl logs --failed`` reads)."""
    result = []
    budget = LOG_INLINE_MAX
    for index, attempt in enumerate(sorted(attempts, key=lambda a: a.number, reverse=True)):
        replicas = []
        for rank in range(attempt.replicas):
            kwargs = {"pk": job.pk, "number": attempt.number, "rank": rank}
            failed = rank == attempt.failed_rank
            entry = ReplicaLog(attempt=attempt.number, rank=rank, url=reverse("jobs:log", kwargs=kwargs),
                               inline=budget > 0,
                               current=attempt.pk == job.current_attempt_id, failed=failed,
                               exit_code=attempt.exit_code if failed else None,
                               open=index == 0 and (attempt.failed_rank is None or failed))
            if entry.inline:
                budget -= 1
                window = logs.read_window(logs.log_path(attempt, rank), max_bytes=LOG_TAIL_BYTES) if read else None
                if window:
                    entry.text, entry.start, entry.end, entry.size = window.text, window.start, window.end, window.size
            replicas.append(entry)
        result.append((attempt, replicas))
    return result


def detail_context(user, job: Job, *, read_logs: bool = True) -> dict[str, Any]:
    """What the detail page's live parts (head, status, attempts, log viewers) are drawn from: for the page and for
    its socket (``jobs.live_detail.JobDetailConsumer``), which draws them again when the job changes."""
    selectors.with_queue_positions([job])  # derived, not stored
    attempts = list(job.attempts.order_by("number"))
    terminal = is_terminal(job.phase)
    can_act = selectors.job_can_act(user, job)
    return {
        "job": job,
        "terminal": terminal,
        "can_cancel": not terminal and can_act,
        "can_restart": terminal and job.phase != Phase.SUCCEEDED and can_act,
        "attempts": attempts,
        # Viewers drawn live are empty: they follow from the start of the file.
        "logs": _attempt_logs(job, attempts, read=read_logs),
        "log_tail_bytes": LOG_TAIL_BYTES,
    }


@login_required
def job_detail_page(request: HttpRequest, pk: int) -> HttpResponse:
    job = _visible_job(request, pk)
    live = request.GET.get("fragment") == "live"
    context = detail_context(request.user, job, read_logs=not live)
    if live:
        return render(request, "jobs/_detail_live.html", context)
    context["events"] = selectors.job_events(job)
    return render(request, "jobs/job_detail.html", context)


def _act(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    """Cancel, stop or restart a job: POST only, for its owner, its group's admins and superusers."""
    job = _visible_job(request, pk)
    if not selectors.job_can_act(request.user, job):
        raise PermissionDenied(f"Only the job's owner, an admin of its group or a superuser may {action} it.")
    try:
        if action == "restart":
            job = services.job_restart(job=job, by=request.user)
        else:
            job = services.job_cancel(job=job, by=request.user, stop=action == "stop")
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("jobs:detail", pk=job.pk)
    # Each message names its own action: a cancelled job is not said to be "stopped" (Stop is another button).
    ending = job.phase == Phase.TERMINATING
    if action == "restart":
        text = f"Job #{job.pk} restarted: back in the queue of {job.group.name}."
    elif action == "stop":
        text = (f"Job #{job.pk} is being stopped; you can restart it once it has stopped." if ending
                else f"Job #{job.pk} stopped; you can restart it.")
    else:
        text = f"Job #{job.pk} is being cancelled." if ending else f"Job #{job.pk} cancelled."
    messages.success(request, text)
    return redirect("jobs:detail", pk=job.pk)


@login_required
@require_POST
def cancel_action(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, "cancel")


@login_required
@require_POST
def stop_action(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, "stop")


@login_required
@require_POST
def restart_action(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, "restart")


def _replica_log_path(request: HttpRequest, pk: int, number: int, rank: int) -> tuple[Job, Path | None]:
    job = _visible_job(request, pk)
    attempt = get_object_or_404(Attempt, job=job, number=number)
    if rank >= attempt.replicas:
        raise Http404("No such replica.")
    return job, logs.log_path(attempt, rank)


@login_required
def replica_log_download(request: HttpRequest, pk: int, number: int, rank: int) -> StreamingHttpResponse:
    """The whole log of a replica as a download, streamed (never read into memory whole)."""
    job, path = _replica_log_path(request, pk, number, rank)
    content = logs.open_slice(path)
    if content is None:
        raise Http404("No log yet.")
    response = StreamingHttpResponse(content.body_for(request), content_type="text/plain; charset=utf-8")
    response["Content-Length"] = str(content.remaining)
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-attempt-{number}-replica-{rank}.log"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


# --- queue, utilisation, usage ------------------------------------------------------------------------------

RESOURCE_LABELS = {Resource.GPU: "GPU", Resource.CPU: "CPU", Resource.MEMORY: "Memory"}


def _bar(used: int, quota: int | None, limit: int | None) -> dict[str, Any]:
    """Widths (percent of the bar) of a usage bar with its quota and limit marks."""
    scale = max(used, quota or 0, limit or 0) or 1
    return {
        "used_pct": round(100 * used / scale, 2),
        "quota_pct": None if quota is None else round(100 * quota / scale, 2),
        "limit_pct": None if limit is None or limit == quota else round(100 * limit / scale, 2),
        "over": quota is not None and used > quota,
        "full": quota is not None and used >= quota and quota > 0,
    }


def quota_bars(rows: list[dict]) -> list[dict]:
    """GPU, CPU and memory of a group (``selectors.quota_rows(group, every_resource=True)``) with their bars."""
    return [{**row, "label": RESOURCE_LABELS[row["resource"]], **_bar(row["used"], row["quota"], row["limit"])}
            for row in rows]


def user_usage_rows(rows: list[dict]) -> list[dict]:
    """Per user: each resource with its bar against the user quota."""
    result = []
    for row in rows:
        cells = []
        for resource in Resource.values:
            quota = row["user_quota"].get(resource)
            used = row["used"].get(resource, 0)
            cells.append({"resource": resource, "used": used, "quota": quota, **_bar(used, quota, None)})
        result.append({"user": row["user"], "jobs": row["jobs"], "cells": cells})
    return result


@login_required
def queue_page(request: HttpRequest, name: str) -> HttpResponse:
    group = get_object_or_404(selectors.groups_of(request.user), name=name)
    page = Paginator(selectors.group_queue(group), PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "group": group,
        "page": page,
        "jobs": page.object_list,
        "quotas": quota_bars(selectors.quota_rows(group, every_resource=True)),
        "users": user_usage_rows(selectors.group_user_usage(group)),
        "resources": [RESOURCE_LABELS[r] for r in Resource.values],
    }
    if request.htmx:
        return render(request, "jobs/_queue_live.html", context)
    return render(request, "jobs/group_queue.html", context)


@login_required
def utilisation_page(request: HttpRequest) -> HttpResponse:
    # Other groups than the user's own show in aggregate only (no user or job names), here and in the live refresh.
    util = selectors.cluster_utilisation(request.user)
    heat = telemetry_selectors.node_gpu_heat(settings.JOBSITE_GPU_IDLE_UTIL)
    nodes = [{"name": n.name, "gpu_total": n.gpu_total, "gpu_used": n.gpu_used, "gpu_free": n.gpu_free,
              **_bar(n.gpu_used, n.gpu_total, None), "quota_pct": None, "heat": heat.get(n.name)}
             for n in util["nodes"]]
    total_bar = {**_bar(util["gpu_used"], util["gpu_total"], None), "quota_pct": None}
    groups = [{**g, **_bar(g["running_gpu"], g["gpu_quota"], None)} for g in util["groups"]]
    context = {"util": util, "nodes": nodes, "total_bar": total_bar, "groups": groups,
               "running": sum(g["running"] for g in groups), "queued": sum(g["queued"] for g in groups),
               "idle_util": settings.JOBSITE_GPU_IDLE_UTIL}
    if request.htmx:
        return render(request, "jobs/_utilisation_live.html", context)
    return render(request, "jobs/utilisation.html", context)


@login_required
def usage_page(request: HttpRequest) -> HttpResponse:
    days_arg = request.GET.get("days", "")
    days = min(max(int(days_arg), 1), USAGE_DAYS_MAX) if days_arg.isdigit() else USAGE_DAYS_DEFAULT
    by = "group" if request.GET.get("by") == "group" else "user"
    groups = list(selectors.groups_of(request.user).order_by("name").values_list("name", flat=True))
    group = request.GET.get("group") if request.GET.get("group") in groups else None
    until = timezone.localdate()
    since = until - timedelta(days=days - 1)
    rows = selectors.gpu_usage(request.user, since=since, until=until, group=group)

    per_day: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    by_pair: dict[tuple[str, str], float] = defaultdict(float)
    for row in rows:
        per_day[row[by]][row["day"]] += row["gpu_hours"]
        by_pair[(row["group"], row["user"])] += row["gpu_hours"]
    total = sum(by_pair.values())
    series = sorted(({"name": n, "values": dict(v), "total": sum(v.values())} for n, v in per_day.items()),
                    key=lambda s: (-s["total"], s["name"]))
    tele = usage_selectors.usage_telemetry(request.user, since=since, until=until, group=group,
                                           threshold=settings.JOBSITE_GPU_IDLE_UTIL)
    per = {name: usage_selectors.rollup(rows, tele, key) for name, key in (
        ("pair", lambda k: k[1:]), ("group", lambda k: k[1]), ("day", lambda k: k[0]), ("all", lambda k: None))}
    table = [{"group": g, "user": u, "hours": h, "share": 100 * h / total if total else 0, "f": per["pair"][(g, u)]}
             for (g, u), h in sorted(by_pair.items(), key=lambda kv: (-kv[1], kv[0]))]
    return render(request, "jobs/usage.html", {
        "days": days, "by": by, "group": group, "groups": groups, "since": since, "until": until,
        "day_list": [since + timedelta(days=i) for i in range(days)],
        "series": series, "table": table, "total": total, "all": per["all"].get(None),
        "by_group": sorted(per["group"].items(), key=lambda kv: (-kv[1].hours, kv[0])),
        "by_day": sorted(per["day"].items()), "idle_util": settings.JOBSITE_GPU_IDLE_UTIL,
        "day_choices": [7, 14, 30, 90, 365],
    })


# --- acting on the selected jobs of the list --------------------------------------------------------------------

BULK_MAX = 500


@login_required
@require_POST
def selected_jobs_action(request: HttpRequest) -> HttpResponse:
    """"Cancel selected" / "Stop selected" on the job list: each selected job on its own
    (``services.job_cancel_many``); the answer says how many were acted on and which were skipped and why. htmx
    gets the result block; without JavaScript, back to the list with the same as a message."""
    action = request.POST.get("action")
    ids = [int(i) for i in request.POST.getlist("ids") if i.isdigit()][:BULK_MAX]
    if action not in ("cancel", "stop"):
        summary, skipped, level = "Choose Cancel selected or Stop selected.", [], messages.ERROR
    elif not ids:
        summary, skipped, level = "Select the jobs to act on first.", [], messages.ERROR
    else:
        results = services.job_cancel_many(ids=ids, by=request.user, stop=action == "stop")
        done = sum(1 for r in results if r["ok"])
        skipped = [r for r in results if not r["ok"]]
        verb = "Stopped" if action == "stop" else "Cancelled"
        summary = f"{verb} {done} job{'' if done == 1 else 's'}."
        if skipped:
            summary += f" Skipped {len(skipped)}."
        level = messages.SUCCESS if not skipped else messages.WARNING if done else messages.ERROR
    if request.htmx:
        return render(request, "jobs/_bulk_result.html", {"summary": summary, "skipped": skipped, "level": level})
    text = " ".join([summary] + [f"#{r['id']}: {r['detail']}" for r in skipped])
    messages.add_message(request, level, text)
    back = request.POST.get("next", "")
    safe = url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure())
    return redirect(back if back and safe else reverse("jobs:list"))
