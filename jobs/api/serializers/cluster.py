"""What the cluster resource shows: utilisation now (per node, group and user) and GPU-hours per day."""

from __future__ import annotations

from rest_framework import serializers


class NodeSerializer(serializers.Serializer):
    name = serializers.CharField()
    gpu_total = serializers.IntegerField()
    gpu_used = serializers.IntegerField()
    gpu_free = serializers.IntegerField()


class UserUtilisationSerializer(serializers.Serializer):
    user = serializers.CharField()
    running = serializers.IntegerField()
    running_gpu = serializers.IntegerField()
    queued = serializers.IntegerField()
    queued_gpu = serializers.IntegerField()


class GroupUtilisationSerializer(serializers.Serializer):
    group = serializers.CharField()
    member = serializers.BooleanField(help_text="Whether you see this group's users (a member, or staff).")
    gpu_quota = serializers.IntegerField(allow_null=True, help_text="null: no GPU quota (unlimited).")
    running = serializers.IntegerField()
    running_gpu = serializers.IntegerField()
    queued = serializers.IntegerField()
    queued_gpu = serializers.IntegerField()


class UtilisationSerializer(serializers.Serializer):
    gpu_total = serializers.IntegerField()
    gpu_used = serializers.IntegerField()
    gpu_free = serializers.IntegerField()
    nodes = NodeSerializer(many=True)
    groups = GroupUtilisationSerializer(many=True, help_text="Every group with running or queued jobs, in aggregate.")
    users = UserUtilisationSerializer(
        many=True, help_text="Running and queued jobs and GPUs per user, in your groups only (all for staff)."
    )


class UsageRowSerializer(serializers.Serializer):
    day = serializers.DateField()
    group = serializers.CharField()
    user = serializers.CharField()
    gpu_hours = serializers.FloatField()


class UsageSerializer(serializers.Serializer):
    since = serializers.DateField()
    until = serializers.DateField()
    group = serializers.CharField(allow_null=True)
    user = serializers.CharField(allow_null=True)
    total_gpu_hours = serializers.FloatField()
    rows = UsageRowSerializer(many=True, help_text="GPU-hours per day, group and user.")
