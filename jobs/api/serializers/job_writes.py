"""What the jobs resource's writes take and answer: a submission (and a clone's changes) checked for types and
bounds, and a bulk cancel with its per-job results.

No serializer writes: the submit view hands ``JobSubmitSerializer.validated_data`` to ``job_spec_validate`` and
``job_submit``; membership, allowed images/types, env names and quotas are the service's rules.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from jobs import limits
from jobs.choices import JobType
from jobs.dependencies import AFTER_MAX

from .arrays import SweepField
from .fields import (
    EnvField,
    FieldsBuiltOnce,
    PriorityField,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
)


class JobSubmitSerializer(FieldsBuiltOnce, StrictSerializer):
    """Types and bounds of a submission. Membership, allowed images/types, env names and quotas: the service."""

    name = StrictCharField(required=False, allow_blank=True, max_length=limits.NAME_MAX)
    group = StrictCharField(max_length=63)
    image = StrictCharField(max_length=63)
    instance_type = StrictCharField(max_length=63)
    command = StrictCharField(trim_whitespace=False)
    env = EnvField(required=False)
    replicas = StrictIntegerField(required=False, min_value=1, max_value=limits.REPLICAS_MAX)
    job_type = serializers.ChoiceField(choices=JobType.choices, required=False)
    priority = PriorityField(required=False)
    preemptible = StrictBooleanField(required=False)
    backoff_limit = StrictIntegerField(
        required=False, allow_null=True, min_value=0, max_value=limits.BACKOFF_LIMIT_MAX
    )
    active_deadline_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=limits.ACTIVE_DEADLINE_MAX
    )
    ttl_seconds_after_finished = StrictIntegerField(
        required=False, allow_null=True, min_value=0, max_value=limits.TTL_MAX
    )
    array = StrictCharField(
        required=False, max_length=200,
        help_text='Makes an array of member jobs: indices "0-99", "1,3,5-7", "0-15:4", with "%K" to run at most K '
                  'at once ("0-99%8"; with a sweep only "%K"). The answer is then the array (`/arrays/{id}/`).',
    )
    sweep = SweepField(required=False)
    after = serializers.ListField(
        child=serializers.DictField(), required=False, max_length=AFTER_MAX,
        help_text='Start only after these end: [{"job": 12, "when": "ok"}, {"array": 5, "when": "any"}]; when is '
                  "ok (succeeded, the default), notok (ended without succeeding) or any (ended), as Slurm's "
                  "afterok/afternotok/afterany. Until then the job waits Pending with reason Dependency; it ends "
                  "Cancelled (DependencyNeverSatisfied) when one can never be met.",
    )
    ports = serializers.ListField(
        child=serializers.DictField(), required=False, max_length=8,
        help_text='Ports its replicas serve, opened through the site at /jobs/{id}/ports/{port}/ (rank 0; ?rank=N): '
                  '[{"name": "jupyter", "port": 8888}]; 1 to 65535, unique, names as Kubernetes port names; at most '
                  "8. The job gets JOB_BASE_URL, the first one's path (serve under it).",
    )

    def validate_command(self, value: str) -> str:
        if len(value.encode()) > limits.COMMAND_MAX_BYTES:
            raise serializers.ValidationError(
                f"The command is longer than {limits.COMMAND_MAX_BYTES // 1024} KiB."
            )
        return value


class JobCloneSerializer(JobSubmitSerializer):
    """Optional changes to the cloned spec; every field may be left out (an empty body clones as is)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        for name in ("array", "sweep"):  # a clone is one job
            self.fields.pop(name, None)
        for field in self.fields.values():
            field.required = False


BULK_MAX = 500


class BulkCancelSerializer(StrictSerializer):
    ids = serializers.ListField(
        child=StrictIntegerField(min_value=1, max_value=2**63 - 1), min_length=1, max_length=BULK_MAX,
        help_text=f"Ids of the jobs to cancel (1 to {BULK_MAX}; repeats are done once).",
    )
    stop = StrictBooleanField(
        required=False, default=False, help_text="Stop (restartable, status Stopped) instead of cancel."
    )


class BulkCancelResultSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    ok = serializers.BooleanField(help_text="Cancelled (or being terminated) by this request.")
    status_code = serializers.IntegerField(help_text="What cancelling this job alone would have answered.")
    detail = serializers.CharField()
    phase = serializers.CharField(allow_null=True, help_text="The job's phase afterwards; null if not visible.")
    status = serializers.CharField(allow_null=True)


class BulkCancelResponseSerializer(serializers.Serializer):
    ok = serializers.BooleanField(help_text="Every job was cancelled.")
    cancelled = serializers.IntegerField()
    failed = serializers.IntegerField()
    results = BulkCancelResultSerializer(many=True)
