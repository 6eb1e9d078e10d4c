"""The admin of jobs and their events, read-only: rows change only through ``jobs.services``; a superuser may delete
an ended job."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from jobs.choices import TERMINAL_PHASES
from jobs.models import Attempt, Job, JobEvent
from jobs.state_machine import Color


def status_badge(phase: str, status: str, color: str):
    text = "#000" if color in (Color.GREY, Color.LIGHT_GREY) else "#fff"
    return format_html(
        '<span class="job-status" title="{}" style="background:{};color:{};padding:1px 7px;border-radius:8px;'
        'white-space:nowrap">{}</span>',
        phase,
        color,
        text,
        status,
    )


class ReadOnlyMixin:
    """Shown, never edited: rows change only through jobs.services."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class AttemptInline(ReadOnlyMixin, admin.TabularInline):
    model = Attempt
    fields = ["number", "replicas", "gpu", "backend", "node", "started_at", "running_at", "ended_at", "exit_code",
              "outcome", "gpu_seconds"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False


class CappedEventFormSet(forms.BaseInlineFormSet):
    """The latest events only, oldest first: a crash-looping job can have thousands."""

    limit = 200

    def get_queryset(self):
        if not hasattr(self, "_capped"):
            latest = super().get_queryset().order_by("-id")[: self.limit]
            self._capped = list(reversed(list(latest)))
        return self._capped


class JobEventInline(ReadOnlyMixin, admin.TabularInline):
    model = JobEvent
    formset = CappedEventFormSet
    fields = ["time", "attempt_number", "type", "reason", "message"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    verbose_name_plural = f"events (latest {CappedEventFormSet.limit})"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("attempt")

    @admin.display(description="attempt")
    def attempt_number(self, event: JobEvent):
        return event.attempt.number if event.attempt_id else "-"


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "group", "user", "status_badge", "phase", "reason", "created_at"]
    list_display_links = ["id", "name"]
    list_filter = ["phase", "job_type", "group"]
    list_select_related = ["group", "user"]
    search_fields = ["name", "user__username"]
    search_help_text = "Name, username, or a job id (123 or #123)."
    show_full_result_count = False
    list_per_page = 50
    inlines = [AttemptInline, JobEventInline]
    fieldsets = [
        ("Spec", {"fields": [
            "name", "group", "user", "job_type", "image", "image_url", "instance_type", "replicas",
            ("gpu", "cpu_millicores", "memory_bytes"), "command", "env", "priority", "preemptible",
            "backoff_limit", "active_deadline_seconds", "ttl_seconds_after_finished",
        ]}),
        ("State", {"fields": [
            "phase", "status_badge", "reason", "message", "exit_code", "queue_position", "termination_target",
            "retry_at", "current_attempt", "all_events",
        ]}),
        ("Times", {"fields": [
            "created_at", "updated_at", "queued_at", "admitted_at", "started_at", "terminating_since",
            "finished_at", "cleaned_at",
        ]}),
    ]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Job._meta.fields] + ["status_badge", "all_events"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        # Superusers only, and only ended jobs: a live job has processes or pods that a row delete would orphan.
        if not (request.user.is_active and request.user.is_superuser):
            return False
        return obj is None or obj.phase in TERMINAL_PHASES

    def get_deleted_objects(self, objs, request):
        deleted, model_count, perms_needed, protected = super().get_deleted_objects(objs, request)
        # Attempts and events go with their job; their own admins forbid deleting them one by one.
        perms_needed = set()
        live = [job for job in objs if job.phase not in TERMINAL_PHASES]
        protected = list(protected) + [f"{job} is {job.get_phase_display().lower()}: cancel it first" for job in live]
        return deleted, model_count, perms_needed, protected

    def get_search_results(self, request, queryset, search_term):
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip().removeprefix("#")
        if term.isdigit():
            results = results | queryset.filter(pk=int(term))
        return results, may_have_duplicates

    @admin.display(description="status")
    def status_badge(self, job: Job):
        return status_badge(job.phase, job.status, job.color)

    @admin.display(description="events")
    def all_events(self, job: Job):
        url = reverse("admin:jobs_jobevent_changelist") + "?" + urlencode({"job__id__exact": job.pk})
        return format_html('<a href="{}">All events of job #{}</a>', url, job.pk)


@admin.register(JobEvent)
class JobEventAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["time", "job", "type", "reason", "message"]
    list_filter = ["type"]
    list_select_related = ["job"]
    search_fields = ["reason"]
    search_help_text = "Reason, or a job id (123 or #123)."
    show_full_result_count = False
    ordering = ["-id"]
    fields = ["time", "job", "attempt", "type", "reason", "message"]
    readonly_fields = fields

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip().removeprefix("#")
        if term.isdigit():  # a job id: the events of that job (indexed), not a reason containing digits
            return queryset.filter(job_id=int(term)), False
        return super().get_search_results(request, queryset, search_term)
