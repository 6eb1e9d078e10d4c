"""Template helpers of the web UI: the status badge and human-readable amounts and durations."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html

from jobs.choices import Phase
from jobs.estimate_text import estimate_text
from jobs.rules import fmt_duration

register = template.Library()


@register.inclusion_tag("jobs/_badge.html")
def status_badge(job) -> dict:
    """A coloured pill with the status text; the phase is in the title (colour is never the only signal)."""
    return {
        "status": job.status or Phase(job.phase).label,
        "phase_label": Phase(job.phase).label,
        "color": job.color,
        "color_name": job.color_name,
    }


@register.filter
def seconds(value) -> str:
    """86400 → "1d", 5400 → "1h 30m"; empty stays empty."""
    if value is None or value == "":
        return ""
    return fmt_duration(float(value))


def _span(start: datetime | None, end: datetime | None) -> float | None:
    if start is None:
        return None
    return ((end or timezone.now()) - start).total_seconds()


@register.filter
def job_duration(job) -> str:
    """Time since admission (holding resources), until the job ended; "—" while it has not been admitted."""
    start = job.admitted_at or job.started_at
    span = _span(start, job.finished_at if job.finished_at and start and job.finished_at >= start else None)
    return "—" if span is None else fmt_duration(span)


@register.filter
def attempt_duration(attempt) -> str:
    span = _span(attempt.started_at, attempt.ended_at)
    return "—" if span is None else fmt_duration(span)


@register.filter
def gpu_seconds(attempt) -> str:
    """GPU-seconds of an attempt: stored once it ended, counted up to now while it holds resources."""
    value = attempt.gpu_seconds
    if attempt.ended_at is None and attempt.started_at is not None:
        value = attempt.gpu * attempt.replicas * max(_span(attempt.started_at, None) or 0, 0)
    return f"{value:,.0f}"


@register.filter
def cpu(millicores) -> str:
    if millicores is None:
        return ""
    millicores = int(millicores)
    return f"{millicores / 1000:g}" if millicores % 100 == 0 else f"{millicores}m"


@register.filter
def memory(amount) -> str:
    if amount is None:
        return ""
    amount = int(amount)
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if amount >= size:
            return f"{amount / size:.4g} {unit}"
    return f"{amount} B"


@register.filter
def quota_amount(value, resource: str) -> str:
    """A quota value in the unit of its resource; empty means unlimited."""
    if value is None:
        return "unlimited"
    if resource == "gpu":
        return str(value)
    if resource == "cpu":
        return cpu(value)
    return memory(value)


@register.filter
def nbytes(size) -> str:
    return memory(size) if size else "0 B"


@register.filter
def iso(value) -> str:
    """A datetime as ISO 8601 (for data attributes the live pages compare and count from); empty stays empty."""
    return value.isoformat() if value else ""


@register.filter
def timestamp(value, precision: str = "seconds"):
    """A moment as ``<time>`` in UTC, said so in the text; static/js/nav.js shows it in the reader's time zone and
    keeps UTC in the title. ``precision``: "seconds" or "minutes". None → "—"."""
    if not value:
        return "—"
    utc = value.astimezone(UTC)
    shown = f"{utc:%Y-%m-%d %H:%M:%S}" if precision == "seconds" else f"{utc:%Y-%m-%d %H:%M}"
    return format_html('<time datetime="{}" data-local="{}" title="{} UTC">{} UTC</time>',
                       utc.isoformat(), precision, f"{utc:%Y-%m-%d %H:%M:%S}", shown)


@register.simple_tag
def first_invalid(form, names: str = "") -> str:
    """The name of the first field with an error in the order the page shows them (``names``, space-separated;
    fields not named follow in the form's order), for its autofocus; "" when there is none."""
    if not getattr(form, "is_bound", False) or not form.errors:
        return ""
    shown = names.split()
    order = shown + [name for name in form.fields if name not in shown]
    return next((name for name in order if name in form.errors), "")


@register.filter
def autofocus(field):
    """A form field's widget with ``autofocus`` (the first invalid field after a failed submit)."""
    return field.as_widget(attrs={"autofocus": True})


@register.simple_tag(takes_context=True)
def queue_groups(context) -> list[str]:
    """Names of the groups whose queue the user may open (the nav's Queue menu). Views that already have them
    pass ``nav_groups``; otherwise one query per request."""
    if "nav_groups" in context:
        return context["nav_groups"]
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return []
    cached = getattr(request, "_jobsite_nav_groups", None)
    if cached is None:
        from jobs.selectors import groups_of

        cached = list(groups_of(user).order_by("name").values_list("name", flat=True))
        request._jobsite_nav_groups = cached
    return cached


@register.filter
def percent(value, digits: int = 0) -> str:
    return f"{float(value or 0):.{int(digits)}f}"


@register.filter
def estimate(job) -> str:
    """A pending job's estimated start, as the live messages say it (jobs.estimate_text)."""
    return estimate_text(job.phase, job.queue_position, job.estimated_start, job.estimate_basis)
