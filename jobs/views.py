"""Server-rendered pages: job list, submit form, job detail with events, attempts and logs, cancel, raw log.

Views stay thin: reads go through ``jobs.selectors``, writes through ``jobs.services``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from . import logs, selectors, services
from .choices import Phase
from .filtersets import JobFilterSet
from .forms import JobFilterForm, JobSubmitForm, initial_from_job
from .models import Attempt, Job
from .state_machine import COLOR_NAMES, PHASE_COLORS, Color, is_terminal

PAGE_SIZE = 50
LOG_TAIL_BYTES = 256 * 1024
# Logs shown inline on the detail page (newest attempts first); older ones are linked only.
LOG_INLINE_MAX = 16
REFRESH_SECONDS = 5


def _visible_job(request: HttpRequest, pk: int) -> Job:
    return get_object_or_404(selectors.jobs_visible_to(request.user), pk=pk)


# --- list ---------------------------------------------------------------------------------------------------


def _legend() -> list[dict]:
    """Colour → the phases shown in it, in the order of the lifecycle."""
    rows: dict[str, list[str]] = {}
    for phase, color in PHASE_COLORS.items():
        rows.setdefault(color, []).append(Phase(phase).label)
    rows.setdefault(Color.RED, []).append("errors (e.g. CrashLoopBackOff)")
    return [{"color": c, "color_name": COLOR_NAMES[c], "phases": ", ".join(p)} for c, p in rows.items()]


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    visible = selectors.jobs_visible_to(request.user)
    filterset = JobFilterSet(request.GET or None, queryset=visible)
    groups = list(selectors.groups_of(request.user).order_by("name").values_list("name", flat=True))
    filter_form = JobFilterForm(request.GET or None, groups=groups)
    page = Paginator(filterset.qs, PAGE_SIZE).get_page(request.GET.get("page"))
    filtered = any(request.GET.get(k) for k in ("group", "phase", "user"))
    return render(request, "jobs/job_list.html", {
        "page": page,
        "jobs": page.object_list,
        "filter_form": filter_form,
        "filtered": filtered,
        "legend": _legend(),
        "refresh_seconds": REFRESH_SECONDS,
    })


# --- submit -------------------------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def job_submit(request: HttpRequest) -> HttpResponse:
    groups = list(selectors.groups_of(request.user).order_by("name"))
    if not groups:
        return render(request, "jobs/job_submit.html", {"no_groups": True})
    by_name = {g.name: g for g in groups}

    def form_for(group_name: str | None, **kwargs) -> JobSubmitForm:
        group = by_name.get(group_name or "", groups[0])
        return JobSubmitForm(user=request.user, group=group, groups=groups, **kwargs)

    clone_of = None
    if request.method == "POST" and "refresh" not in request.POST:
        form = form_for(request.POST.get("group"), data=request.POST)
        form.is_valid()  # type checks first, then the service decides what may run
        try:
            spec = services.job_spec_validate(user=request.user, data=form.spec_data())
        except ValidationError as exc:
            form.add_service_errors(exc.message_dict if hasattr(exc, "error_dict") else {"__all__": exc.messages})
        else:
            if form.is_valid():
                job = services.job_submit(user=request.user, spec=spec)
                messages.success(request, f"Job #{job.pk} “{job.name}” submitted to {job.group.name}.")
                return redirect("jobs:detail", pk=job.pk)
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
    }
    if request.htmx:
        return render(request, "jobs/_group_fields.html", context)
    return render(request, "jobs/job_submit.html", context)


# --- detail -------------------------------------------------------------------------------------------------


@dataclass
class ReplicaLog:
    rank: int
    url: str
    text: str | None = None  # None: no log file yet
    size: int = 0
    truncated: bool = False
    inline: bool = True


def _attempt_logs(job: Job, attempts: list[Attempt]) -> list[tuple[Attempt, list[ReplicaLog]]]:
    result = []
    budget = LOG_INLINE_MAX
    for attempt in sorted(attempts, key=lambda a: a.number, reverse=True):
        replicas = []
        for rank in range(attempt.replicas):
            url = reverse("jobs:log", kwargs={"pk": job.pk, "number": attempt.number, "rank": rank})
            entry = ReplicaLog(rank=rank, url=url, inline=budget > 0)
            if entry.inline:
                budget -= 1
                tail = logs.read_tail(logs.log_path(attempt, rank), LOG_TAIL_BYTES)
                if tail:
                    entry.text, entry.size, entry.truncated = tail.text, tail.size, tail.truncated
            replicas.append(entry)
        result.append((attempt, replicas))
    return result


@login_required
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = _visible_job(request, pk)
    attempts = list(job.attempts.order_by("number"))
    terminal = is_terminal(job.phase)
    can_act = selectors.job_can_act(request.user, job)
    return render(request, "jobs/job_detail.html", {
        "job": job,
        "terminal": terminal,
        "can_cancel": not terminal and can_act,
        "can_restart": terminal and job.phase != Phase.SUCCEEDED and can_act,
        "events": selectors.job_events(job),
        "attempts": attempts,
        "logs": _attempt_logs(job, attempts),
        "log_tail_bytes": LOG_TAIL_BYTES,
        "refresh_seconds": REFRESH_SECONDS,
    })


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
    if action == "restart":
        messages.success(request, f"Job #{job.pk} is back in the queue of {job.group.name}.")
    elif job.phase == Phase.TERMINATING:
        messages.success(request, f"Job #{job.pk} is being stopped.")
    else:
        messages.success(request, f"Job #{job.pk} {'stopped' if action == 'stop' else 'cancelled'}.")
    return redirect("jobs:detail", pk=job.pk)


@login_required
@require_POST
def job_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, "cancel")


@login_required
@require_POST
def job_stop(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, "stop")


@login_required
@require_POST
def job_restart(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, "restart")


@login_required
def job_log(request: HttpRequest, pk: int, number: int, rank: int) -> FileResponse:
    job = _visible_job(request, pk)
    attempt = get_object_or_404(Attempt, job=job, number=number)
    if rank >= attempt.replicas:
        raise Http404("No such replica.")
    path = logs.log_path(attempt, rank)
    try:
        f = path.open("rb") if path else None
    except (FileNotFoundError, NotADirectoryError):
        f = None
    if f is None:
        raise Http404("No log yet.")
    response = FileResponse(f, content_type="text/plain; charset=utf-8",
                            filename=f"job-{job.pk}-attempt-{number}-replica-{rank}.log")
    response["X-Content-Type-Options"] = "nosniff"
    return response
