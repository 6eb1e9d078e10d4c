"""The shape of a job's GPU telemetry in the API."""

from __future__ import annotations

from rest_framework import serializers


class GpuTimelineSerializer(serializers.Serializer):
    rank = serializers.IntegerField()
    node = serializers.CharField()
    gpu = serializers.CharField(help_text="The GPU as its node names it: index or UUID.")
    points = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField()),
        help_text="[epoch seconds, SM %, memory used bytes, memory total bytes, power W, temperature C], oldest "
                  "first: 10 s points for the last hour, 1 min points for the last day, 10 min points before.")


class GpuMetricsSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    attempt = serializers.IntegerField(allow_null=True, help_text="The attempt's number (?attempt=; default: "
                                                                  "the current one).")
    gpu_util_mean = serializers.FloatField(allow_null=True)
    gpu_samples = serializers.IntegerField()
    gpus_idle_since = serializers.DateTimeField(allow_null=True)
    telemetry = serializers.BooleanField(help_text="Whether any GPU reported figures (false on virtual GPUs).")
    gpus = GpuTimelineSerializer(many=True)
