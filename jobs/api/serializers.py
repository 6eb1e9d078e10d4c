"""API serializers: type checks of a submission (the rules live in ``jobs.services``) and job representations.

No serializer writes: the submit view hands ``JobSubmitSerializer.validated_data`` to ``job_spec_validate`` and
``job_submit``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

from jobs import limits
from jobs.choices import JobType, Priority
from jobs.models import Attempt, Job, JobEvent
from jobs.selectors import job_events

# --- input --------------------------------------------------------------------------------------------------


class PriorityField(serializers.Field):
    """``"low" | "normal" | "high"`` or their values ``0 | 50 | 100``; shown as the name."""

    default_error_messages = {
        "invalid": "'{input}' is not a priority: use low, normal or high (or 0, 50, 100).",
    }

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool):
            self.fail("invalid", input=data)
        if isinstance(data, int) and data in Priority.values:
            return data
        if isinstance(data, str):
            text = data.strip().lower()
            for value, label in Priority.choices:
                if text in (label, str(value)):
                    return value
        self.fail("invalid", input=str(data)[:40])

    def to_representation(self, value: int) -> str | int:
        return Priority(value).label if value in Priority.values else value


class EnvField(serializers.Field):
    """An object of NAME: value. Values may be strings or numbers (kept as strings)."""

    default_error_messages = {
        "not_an_object": "Give environment variables as an object of NAME: value.",
        "too_many": f"Use at most {limits.ENV_MAX_VARS} environment variables.",
        "not_a_string": "The value of '{name}' must be a string.",
        "too_long": f"The value of '{{name}}' is longer than {limits.ENV_VALUE_MAX_BYTES // 1024} KiB.",
    }

    def to_internal_value(self, data: Any) -> dict[str, str]:
        if not isinstance(data, Mapping):
            self.fail("not_an_object")
        if len(data) > limits.ENV_MAX_VARS:
            self.fail("too_many")
        env = {}
        for key, value in data.items():
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                self.fail("not_a_string", name=key)
            value = str(value)
            if len(value.encode()) > limits.ENV_VALUE_MAX_BYTES:
                self.fail("too_long", name=key)
            env[str(key)] = value
        # Names and reserved names are checked by jobs.services.job_spec_validate.
        return env

    def to_representation(self, value: dict) -> dict:
        return value


class JobSubmitSerializer(serializers.Serializer):
    """Types and bounds of a submission. Membership, allowed images/types, env names and quotas: the service."""

    name = serializers.CharField(required=False, allow_blank=True, max_length=limits.NAME_MAX)
    group = serializers.CharField(max_length=63)
    image = serializers.CharField(max_length=63)
    instance_type = serializers.CharField(max_length=63)
    command = serializers.CharField(trim_whitespace=False)
    env = EnvField(required=False)
    replicas = serializers.IntegerField(required=False, min_value=1, max_value=limits.REPLICAS_MAX)
    job_type = serializers.ChoiceField(choices=JobType.choices, required=False)
    priority = PriorityField(required=False)
    preemptible = serializers.BooleanField(required=False)
    backoff_limit = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=limits.BACKOFF_LIMIT_MAX
    )
    active_deadline_seconds = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=limits.ACTIVE_DEADLINE_MAX
    )
    ttl_seconds_after_finished = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=limits.TTL_MAX
    )

    def validate_command(self, value: str) -> str:
        if len(value.encode()) > limits.COMMAND_MAX_BYTES:
            raise serializers.ValidationError(
                f"The command is longer than {limits.COMMAND_MAX_BYTES // 1024} KiB."
            )
        return value

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        unknown = {}
        if isinstance(data, Mapping):
            unknown = {str(key): ["Unknown field."] for key in data if key not in self.fields}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if unknown and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **unknown}) from exc
            raise
        if unknown:
            raise serializers.ValidationError(unknown)
        return value


# --- output -------------------------------------------------------------------------------------------------


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = ["number", "node", "started_at", "running_at", "ended_at", "exit_code", "outcome", "gpu_seconds"]
        read_only_fields = fields


class EventSerializer(serializers.ModelSerializer):
    attempt = serializers.SerializerMethodField()

    class Meta:
        model = JobEvent
        fields = ["time", "type", "reason", "message", "attempt"]
        read_only_fields = fields

    def get_attempt(self, event: JobEvent) -> int | None:
        return event.attempt.number if event.attempt_id else None


class JobSerializer(serializers.ModelSerializer):
    """A job in lists. Needs ``group, user, image, instance_type, current_attempt`` selected with it."""

    group = serializers.CharField(source="group.name", read_only=True)
    user = serializers.CharField(source="user.get_username", read_only=True)
    image = serializers.CharField(source="image.name", read_only=True)
    instance_type = serializers.CharField(source="instance_type.name", read_only=True)
    priority = PriorityField(read_only=True)
    request = serializers.SerializerMethodField()
    color = serializers.CharField(read_only=True)
    color_name = serializers.CharField(read_only=True)
    current_attempt = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id", "name", "group", "user", "image", "instance_type", "command", "env", "replicas", "job_type",
            "priority", "preemptible", "backoff_limit", "active_deadline_seconds", "ttl_seconds_after_finished",
            "request", "phase", "status", "color", "color_name", "reason", "message", "exit_code",
            "queue_position", "over_quota", "created_at", "admitted_at", "started_at", "finished_at",
            "current_attempt",
        ]
        read_only_fields = fields

    def get_request(self, job: Job) -> dict[str, int]:
        return {"gpu": job.gpu, "cpu": job.cpu_millicores, "memory": job.memory_bytes}

    def get_current_attempt(self, job: Job) -> int | None:
        return job.current_attempt.number if job.current_attempt_id else None


class JobDetailSerializer(JobSerializer):
    """A job with its attempts and its events (oldest first)."""

    attempts = AttemptSerializer(many=True, read_only=True)
    events = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "attempts", "events"]
        read_only_fields = fields

    def get_events(self, job: Job) -> list[dict]:
        return EventSerializer(job_events(job), many=True).data
