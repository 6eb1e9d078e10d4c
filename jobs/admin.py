"""Django admin of jobsite: groups with their members, quotas and allowed images/instance types; instance types and
images; jobs and their events, read-only (jobs change only through ``jobs.services``)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.contrib.admin.widgets import FilteredSelectMultiple
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import Group as PermissionGroup
from django.db import transaction
from django.db.models import Count
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode

from . import selectors
from .choices import TERMINAL_PHASES, Resource
from .models import Attempt, GpuUsage, Group, GroupQuota, Image, InstanceType, Job, JobEvent, Membership
from .rules import fmt_amount
from .selectors import group_usage
from .state_machine import Color
from .wakeup import request_pass

GIB = 1 << 30

admin.site.site_header = "jobsite administration"
admin.site.site_title = "jobsite admin"
admin.site.index_title = "Groups, quotas, instance types, images and jobs"

# Django's own permission groups are not used (a team is a jobsite Group, joined through a membership; staff get
# permissions one by one): hidden, so the admin has one "Groups", jobsite's. The user page loses its groups field.
admin.site.unregister(PermissionGroup)
admin.site.unregister(get_user_model())


@admin.register(get_user_model())
class SiteUserAdmin(UserAdmin):
    """Django's user admin without the unused permission groups."""

    list_filter = tuple(f for f in UserAdmin.list_filter if f != "groups")
    filter_horizontal = tuple(f for f in UserAdmin.filter_horizontal if f != "groups")
    fieldsets = tuple((title, {**options, "fields": tuple(f for f in options["fields"] if f != "groups")})
                      for title, options in UserAdmin.fieldsets)


def _request_pass_after_commit() -> None:
    """Quotas, queues and instance types feed admission: ask for a scheduling pass once the change is committed."""
    transaction.on_commit(request_pass)


# --- groups ---------------------------------------------------------------------------------------------------------


class MembershipInline(admin.TabularInline):
    model = Membership
    fields = ["user", "role"]
    autocomplete_fields = ["user"]
    extra = 0

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("user", "group")


class GroupQuotaForm(forms.ModelForm):
    class Meta:
        model = GroupQuota
        fields = ["resource", "quota", "limit", "user_quota"]

    def clean(self):
        cleaned = super().clean()
        quota, limit = cleaned.get("quota"), cleaned.get("limit")
        if quota is not None and limit is not None and limit < quota:
            resource = cleaned.get("resource") or ""
            shown = (lambda v: fmt_amount(resource, v)) if resource else str
            self.add_error(
                "limit",
                f"The limit ({shown(limit)}) must be at least the quota ({shown(quota)}): it is the borrowing "
                "ceiling above the guaranteed quota. Leave it empty to make the limit equal to the quota.",
            )
        return cleaned


class GroupQuotaInline(admin.TabularInline):
    model = GroupQuota
    form = GroupQuotaForm
    fields = ["resource", "quota", "limit", "user_quota", "meaning", "in_use"]
    readonly_fields = ["meaning", "in_use"]
    extra = 0

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("group")

    def get_formset(self, request, obj=None, **kwargs):
        # The group's usage, read once and memoised on the group, for every row's in_use() and the summary.
        self._usage = _usage_of(obj) if obj is not None and obj.pk else {}
        return super().get_formset(request, obj, **kwargs)

    @admin.display(description="in use")
    def in_use(self, quota: GroupQuota) -> str:
        if not quota.pk or not quota.resource:
            return "-"
        return fmt_amount(quota.resource, getattr(self, "_usage", {}).get(quota.resource, 0))

    @admin.display(description="as saved")
    def meaning(self, quota: GroupQuota) -> str:
        if not quota.pk or not quota.resource:
            return "-"
        r = quota.resource
        limit = quota.limit if quota.limit is not None else quota.quota
        return (
            f"quota {fmt_amount(r, quota.quota)}, limit {fmt_amount(r, limit)}, "
            f"per user {fmt_amount(r, quota.user_quota)}"
        )


class GroupAdminForm(forms.ModelForm):
    """The group, plus the images and instance types its members may use (their M2M lives on those models)."""

    images = forms.ModelMultipleChoiceField(
        Image.objects.all(), required=False, widget=FilteredSelectMultiple("images", is_stacked=False),
        help_text="Images the group's members may run.",
    )
    instance_types = forms.ModelMultipleChoiceField(
        InstanceType.objects.all(), required=False,
        widget=FilteredSelectMultiple("instance types", is_stacked=False),
        help_text="Instance types the group's members may request.",
    )

    class Meta:
        model = Group
        fields = ["name", "display_name", "description", "queue_stopped", "volume_path"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["images"].initial = list(self.instance.images.values_list("pk", flat=True))
            self.fields["instance_types"].initial = list(self.instance.instance_types.values_list("pk", flat=True))

    def _save_m2m(self):
        super()._save_m2m()
        self.instance.images.set(self.cleaned_data["images"])
        self.instance.instance_types.set(self.cleaned_data["instance_types"])


def _usage_of(group: Group) -> dict[str, int]:
    if getattr(group, "usage", None) is None:
        group.usage = group_usage([group])[group.pk]
    return group.usage


class GroupChangeList(ChangeList):
    def get_results(self, request):
        super().get_results(request)
        # Usage and GPU quota of every group on the page in one query each, instead of per row.
        groups = list(self.result_list)  # evaluates (and caches) the page's queryset
        usage = group_usage(groups)
        gpu_quota = dict(
            GroupQuota.objects.filter(group__in=groups, resource=Resource.GPU).values_list("group_id", "quota")
        )
        for group in groups:
            group.usage = usage[group.pk]
            group.gpu_quota = gpu_quota.get(group.pk)


@admin.register(Group)
class GroupAdmin(admin.ModelAdmin):
    form = GroupAdminForm
    list_display = ["name", "display_name", "members_count", "queue_stopped", "gpu_used_quota"]
    list_display_links = ["name"]
    list_filter = ["queue_stopped"]
    search_fields = ["name", "display_name"]
    readonly_fields = ["usage_summary", "created_at"]
    fieldsets = [
        (None, {"fields": ["name", "display_name", "description", "volume_path"]}),
        ("Queue", {"fields": ["queue_stopped", "usage_summary"]}),
        ("Allowed", {"fields": ["images", "instance_types"]}),
        (None, {"fields": ["created_at"]}),
    ]
    inlines = [GroupQuotaInline, MembershipInline]
    actions = ["stop_queue", "resume_queue"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(members_count=Count("memberships", distinct=True))

    def get_changelist(self, request, **kwargs):
        return GroupChangeList

    @admin.display(description="members", ordering="members_count")
    def members_count(self, group: Group) -> int:
        return group.members_count

    @admin.display(description="GPU used / quota")
    def gpu_used_quota(self, group: Group) -> str:
        if not hasattr(group, "gpu_quota"):  # outside the changelist
            group.gpu_quota = group.quotas.filter(resource=Resource.GPU).values_list("quota", flat=True).first()
        used = _usage_of(group)[Resource.GPU]
        return f"{fmt_amount(Resource.GPU, used)} / {fmt_amount(Resource.GPU, group.gpu_quota)}"

    @admin.display(description="in use now")
    def usage_summary(self, group: Group) -> str:
        if not group.pk:
            return "-"
        usage = _usage_of(group)
        return ", ".join(fmt_amount(r, usage[r]) for r in Resource.values)

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        _request_pass_after_commit()

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        _request_pass_after_commit()

    @admin.action(description="Stop the queue of the selected groups", permissions=["change"])
    def stop_queue(self, request, queryset):
        self._set_queue_stopped(request, queryset, True)

    @admin.action(description="Resume the queue of the selected groups", permissions=["change"])
    def resume_queue(self, request, queryset):
        self._set_queue_stopped(request, queryset, False)

    def _set_queue_stopped(self, request, queryset, stopped: bool) -> None:
        # queue_stopped is configuration, not job state: a plain update, then a pass re-evaluates the queues.
        count = Group.objects.filter(pk__in=queryset.values("pk")).update(queue_stopped=stopped)
        _request_pass_after_commit()
        verb = "Stopped" if stopped else "Resumed"
        self.message_user(request, f"{verb} the queue of {count} group(s).", messages.SUCCESS)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "group", "role"]
    list_filter = ["role", "group"]
    list_select_related = ["user", "group"]
    search_fields = ["user__username", "group__name"]
    autocomplete_fields = ["user", "group"]


# --- instance types and images ---------------------------------------------------------------------------------------


class InstanceTypeForm(forms.ModelForm):
    """CPU in cores and memory in GiB, stored as millicores and bytes."""

    cpu_cores = forms.DecimalField(
        label="CPU (cores)", min_value=Decimal("0.001"), max_digits=10, decimal_places=3,
        help_text="Per replica; 0.5 = 500 millicores.",
    )
    memory_gib = forms.DecimalField(  # no rounding: any byte count shows exactly and saves back unchanged
        label="Memory (GiB)", min_value=Decimal("0.001"), help_text="Per replica; 0.5 = 512 MiB."
    )

    class Meta:
        model = InstanceType
        fields = ["name", "display_name", "description", "gpu", "node_selector", "tolerations"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["cpu_cores"].initial = (Decimal(self.instance.cpu_millicores) / 1000).normalize()
        self.fields["memory_gib"].initial = (Decimal(self.instance.memory_bytes) / GIB).normalize()

    def clean_node_selector(self):
        value = self.cleaned_data.get("node_selector") or {}
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise forms.ValidationError('A JSON object of label to value, e.g. {"gpu-type": "a100"}.')
        return value

    def clean_tolerations(self):
        value = self.cleaned_data.get("tolerations") or []
        if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
            raise forms.ValidationError(
                'A JSON list of Kubernetes tolerations, e.g. [{"key": "nvidia.com/gpu", "operator": "Exists"}].'
            )
        return value

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("cpu_cores") is not None:
            self.instance.cpu_millicores = int(cleaned["cpu_cores"] * 1000)
        if cleaned.get("memory_gib") is not None:
            self.instance.memory_bytes = int(cleaned["memory_gib"] * GIB)
        return cleaned


@admin.register(InstanceType)
class InstanceTypeAdmin(admin.ModelAdmin):
    form = InstanceTypeForm
    list_display = ["name", "display_name", "gpu", "cpu", "memory", "node_selector", "tolerations"]
    search_fields = ["name", "display_name"]
    fieldsets = [
        (None, {"fields": ["name", "display_name", "description"]}),
        ("Per replica", {"fields": ["gpu", "cpu_cores", "memory_gib"]}),
        ("Kubernetes", {"fields": ["node_selector", "tolerations"]}),
        ("Allowed for", {"fields": ["groups"]}),
    ]
    filter_horizontal = ["groups"]

    @admin.display(description="CPU", ordering="cpu_millicores")
    def cpu(self, it: InstanceType) -> str:
        return fmt_amount(Resource.CPU, it.cpu_millicores)

    @admin.display(description="memory", ordering="memory_bytes")
    def memory(self, it: InstanceType) -> str:
        return fmt_amount(Resource.MEMORY, it.memory_bytes)

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        _request_pass_after_commit()


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ["name", "url", "local_root"]
    search_fields = ["name", "url"]
    fields = ["name", "url", "local_root", "description", "groups"]
    filter_horizontal = ["groups"]


# --- jobs (read-only) -----------------------------------------------------------------------------------------------


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


@admin.register(GpuUsage)
class GpuUsageAdmin(admin.ModelAdmin):
    """GPU-hours per group, per user and per day over the last N days (``?days=``), read-only."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_staff

    def changelist_view(self, request, extra_context=None):
        try:
            days = min(max(int(request.GET.get("days", 30)), 1), 366)
        except ValueError:
            days = 30
        until = timezone.localdate()
        since = until - timedelta(days=days - 1)
        rows = selectors.gpu_usage(request.user, since=since, until=until,
                                   group=request.GET.get("group") or None)
        by_group: dict[str, float] = {}
        by_user: dict[tuple[str, str], float] = {}
        by_day: dict = {}
        for r in rows:
            by_group[r["group"]] = by_group.get(r["group"], 0) + r["gpu_hours"]
            by_user[(r["group"], r["user"])] = by_user.get((r["group"], r["user"]), 0) + r["gpu_hours"]
            by_day[r["day"]] = by_day.get(r["day"], 0) + r["gpu_hours"]
        context = {
            **self.admin_site.each_context(request),
            "title": f"GPU usage, last {days} days",
            "opts": self.model._meta,
            "days": days,
            "since": since,
            "until": until,
            "by_group": sorted(by_group.items(), key=lambda kv: -kv[1]),
            "by_user": sorted(((g, u, h) for (g, u), h in by_user.items()), key=lambda t: -t[2]),
            "by_day": sorted(by_day.items()),
            "total": sum(by_group.values()),
        }
        return TemplateResponse(request, "admin/jobs/gpu_usage.html", context)
