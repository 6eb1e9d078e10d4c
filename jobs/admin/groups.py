"""The admin of groups: members, quotas with what is in use, allowed images and instance types, stopping and
resuming a queue; and memberships on their own."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import Count

from jobs.choices import Resource
from jobs.models import Group, GroupQuota, Membership
from jobs.rules import fmt_amount
from jobs.selectors import group_usage

from .forms import GroupAdminForm, GroupQuotaForm
from .scheduling_pass import request_pass_after_commit


class MembershipInline(admin.TabularInline):
    model = Membership
    fields = ["user", "role"]
    autocomplete_fields = ["user"]
    extra = 0

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("user", "group")


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
        request_pass_after_commit()

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        request_pass_after_commit()

    @admin.action(description="Stop the queue of the selected groups", permissions=["change"])
    def stop_queue(self, request, queryset):
        self._set_queue_stopped(request, queryset, True)

    @admin.action(description="Resume the queue of the selected groups", permissions=["change"])
    def resume_queue(self, request, queryset):
        self._set_queue_stopped(request, queryset, False)

    def _set_queue_stopped(self, request, queryset, stopped: bool) -> None:
        # queue_stopped is configuration, not job state: a plain update, then a pass re-evaluates the queues.
        count = Group.objects.filter(pk__in=queryset.values("pk")).update(queue_stopped=stopped)
        request_pass_after_commit()
        verb = "Stopped" if stopped else "Resumed"
        self.message_user(request, f"{verb} the queue of {count} group(s).", messages.SUCCESS)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "group", "role"]
    list_filter = ["role", "group"]
    list_select_related = ["user", "group"]
    search_fields = ["user__username", "group__name"]
    autocomplete_fields = ["user", "group"]
