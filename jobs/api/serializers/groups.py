"""What the groups resource shows: a group's quotas and usage, what each user holds, its queue, and the instance
types and images it allows."""

from __future__ import annotations

from rest_framework import serializers

from jobs.choices import Role
from jobs.models import Image, InstanceType

from .fields import PriorityField, ResourceAmountsSerializer


class QuotaSerializer(serializers.Serializer):
    resource = serializers.ChoiceField(choices=["gpu", "cpu", "memory"])
    quota = serializers.IntegerField(allow_null=True, help_text="Guaranteed to the group; null: unlimited.")
    limit = serializers.IntegerField(allow_null=True, help_text="Borrowing ceiling; null: the quota.")
    user_quota = serializers.IntegerField(allow_null=True, help_text="Most one user may hold; null: unlimited.")
    used = serializers.IntegerField(help_text="Held by the group's jobs now.")
    used_by_me = serializers.IntegerField(help_text="Held by your jobs in the group now.")


class GroupSerializer(serializers.Serializer):
    name = serializers.CharField()
    display_name = serializers.CharField()
    description = serializers.CharField()
    queue_stopped = serializers.BooleanField()
    role = serializers.ChoiceField(choices=Role.choices, allow_null=True,
                                   help_text="Your role; null for a superuser who is not a member.")
    quotas = QuotaSerializer(many=True)
    usage = ResourceAmountsSerializer(help_text="Held by the group's jobs now.")
    my_usage = ResourceAmountsSerializer(help_text="Held by your jobs in the group now.")
    running_jobs = serializers.IntegerField()
    queued_jobs = serializers.IntegerField()


class UserUsageSerializer(serializers.Serializer):
    user = serializers.CharField()
    jobs = serializers.IntegerField()
    used = ResourceAmountsSerializer()
    user_quota = serializers.DictField(child=serializers.IntegerField(allow_null=True),
                                       help_text="Per resource; null: unlimited.")


class GroupDetailSerializer(GroupSerializer):
    users = UserUsageSerializer(many=True, help_text="What each user holds in the group now, busiest first.")


class QueueEntrySerializer(serializers.Serializer):
    rank = serializers.IntegerField(help_text="1-based place in the queue (priority, then submission time).")
    queue_position = serializers.IntegerField(
        allow_null=True, help_text="The scheduler's position among the waiting (PENDING) jobs."
    )
    id = serializers.IntegerField()
    name = serializers.CharField()
    user = serializers.CharField()
    instance_type = serializers.CharField()
    replicas = serializers.IntegerField()
    request = ResourceAmountsSerializer(help_text="Whole job (all replicas).")
    priority = PriorityField()
    preemptible = serializers.BooleanField()
    phase = serializers.CharField()
    status = serializers.CharField()
    color = serializers.CharField()
    reason = serializers.CharField()
    message = serializers.CharField()
    queued_at = serializers.DateTimeField()
    estimated_start = serializers.DateTimeField(
        allow_null=True, help_text="When the scheduler expects it to start; null: not within 30 days (or unknown)."
    )
    estimate_basis = serializers.CharField(help_text="'deadlines' or 'history'; empty without an estimate.")


class InstanceTypeSerializer(serializers.ModelSerializer):
    cpu = serializers.IntegerField(source="cpu_millicores", help_text="millicores")
    memory = serializers.IntegerField(source="memory_bytes", help_text="bytes")

    class Meta:
        model = InstanceType
        fields = ["name", "display_name", "description", "gpu", "cpu", "memory"]
        read_only_fields = fields


class ImageSerializer(serializers.ModelSerializer):
    class Meta:
        model = Image
        fields = ["name", "url", "description"]
        read_only_fields = fields
