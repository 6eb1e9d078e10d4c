"""API serializers: type checks of what clients send (the rules live in ``jobs.services``) and what they get back.

No serializer writes: the submit view hands ``JobSubmitSerializer.validated_data`` to ``job_spec_validate`` and
``job_submit``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs import limits, vocabularies
from jobs.choices import JobType, Priority, Role
from jobs.models import Attempt, Image, InstanceType, Job, JobEvent
from jobs.selectors import job_events, with_queue_positions

# --- input --------------------------------------------------------------------------------------------------


@extend_schema_field({
    "oneOf": [
        {"type": "string", "enum": [label for _, label in Priority.choices]},
        {"type": "integer", "enum": list(Priority.values)},
    ],
    "description": "low, normal or high (or 0, 50, 100); shown as the name.",
})
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


@extend_schema_field({
    "type": "object",
    "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "number"}]},
    "description": "Environment variables, NAME: value (numbers are kept as strings).",
})
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


class StrictCharField(serializers.CharField):
    """A JSON string only: DRF's CharField would turn ``5`` or ``true`` into text."""

    default_error_messages = {"not_a_string": "Give a string, not {kind}."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("not_a_string", kind=_json_kind(data))
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON whole number only: DRF's IntegerField would take ``"5"``, ``5.0`` or ``true``."""

    default_error_messages = {"not_an_integer": "Give a whole number, not {kind}."}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("not_an_integer", kind=_json_kind(data))
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """``true`` or ``false`` only: DRF's BooleanField would take ``"yes"``, ``"0"`` or ``1``."""

    default_error_messages = {"not_a_boolean": "Give true or false, not {kind}."}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("not_a_boolean", kind=_json_kind(data))
        return data


def _json_kind(data: Any) -> str:
    """How a value reads in a message: 'a number (5)', 'a list', ..."""
    if data is None:
        return "null"
    if isinstance(data, bool):
        return f"a boolean ({str(data).lower()})"
    if isinstance(data, int | float):
        return f"a number ({str(data)[:20]})"
    if isinstance(data, str):
        return f"a string ({data[:20]!r})"
    if isinstance(data, Mapping):
        return "an object"
    if isinstance(data, list | tuple):
        return "a list"
    return type(data).__name__


class StrictSerializer(serializers.Serializer):
    """Names every field of the body it does not know, with the other errors; accepts only an object."""

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


class JobSubmitSerializer(StrictSerializer):
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


# --- output: jobs -------------------------------------------------------------------------------------------


class ResourceAmountsSerializer(serializers.Serializer):
    gpu = serializers.IntegerField(help_text="GPUs")
    cpu = serializers.IntegerField(help_text="CPU in millicores")
    memory = serializers.IntegerField(help_text="Memory in bytes")


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = ["number", "node", "started_at", "running_at", "ended_at", "exit_code", "failed_rank", "outcome",
                  "gpu_seconds"]
        read_only_fields = fields


class ReplicaLogSerializer(serializers.Serializer):
    replica = serializers.IntegerField()
    size = serializers.IntegerField(allow_null=True, help_text="Bytes in the log so far; null when there is none.")


class AttemptDetailSerializer(AttemptSerializer):
    """An attempt with its replicas and the size of each replica's log (``GET /jobs/{id}/attempts/``)."""

    logs = serializers.SerializerMethodField()

    class Meta(AttemptSerializer.Meta):
        fields = [*AttemptSerializer.Meta.fields, "replicas", "gpu", "backend", "launched_at", "logs"]
        read_only_fields = fields

    @extend_schema_field(ReplicaLogSerializer(many=True))
    def get_logs(self, attempt: Attempt) -> list[dict]:
        from .queries import attempt_logs

        return attempt_logs(attempt)


class EventSerializer(serializers.ModelSerializer):
    attempt = serializers.SerializerMethodField()

    class Meta:
        model = JobEvent
        fields = ["time", "type", "reason", "message", "attempt"]
        read_only_fields = fields

    def get_attempt(self, event: JobEvent) -> int | None:
        return event.attempt.number if event.attempt_id else None


VOCABULARY_FIELDS = ("vocabulary_status", "vocabulary_code")


class JobListSerializer(serializers.ListSerializer):
    """Jobs with their queue positions derived (one query for the whole page) before each is serialized."""

    def to_representation(self, data: Any) -> list[dict[str, Any]]:
        return super().to_representation(with_queue_positions(data.all() if hasattr(data, "all") else data))


class JobSerializer(serializers.ModelSerializer):
    """A job in lists. Needs ``group, user, image, instance_type, current_attempt`` selected with it.

    With ``context["vocabulary"]`` (``?vocabulary=mcli`` etc.) it adds ``vocabulary_status`` and, for ModelArts,
    ``vocabulary_code``.
    """

    group = serializers.CharField(source="group.name", read_only=True)
    user = serializers.CharField(source="user.get_username", read_only=True)
    image = serializers.CharField(source="image.name", read_only=True)
    instance_type = serializers.CharField(source="instance_type.name", read_only=True)
    priority = PriorityField(read_only=True)
    request = serializers.SerializerMethodField()
    color = serializers.CharField(read_only=True)
    color_name = serializers.CharField(read_only=True)
    current_attempt = serializers.SerializerMethodField()
    vocabulary_status = serializers.CharField(
        read_only=True, help_text="Only with ?vocabulary=: the status in that scheduler's words."
    )
    vocabulary_code = serializers.IntegerField(
        read_only=True, help_text="Only with ?vocabulary=modelarts: ModelArts' numeric status code."
    )

    class Meta:
        model = Job
        fields = [
            "id", "name", "group", "user", "image", "instance_type", "command", "env", "replicas", "job_type",
            "priority", "preemptible", "backoff_limit", "active_deadline_seconds", "ttl_seconds_after_finished",
            "request", "phase", "status", "color", "color_name", "reason", "message", "exit_code",
            "queue_position", "estimated_start", "estimate_basis", "over_quota", "created_at", "admitted_at",
            "started_at", "finished_at", "current_attempt", *VOCABULARY_FIELDS,
        ]
        read_only_fields = fields
        list_serializer_class = JobListSerializer
        extra_kwargs = {
            "estimated_start": {"help_text": "Pending: when the scheduler expects it to start; null when it does not "
                                             "expect it within 30 days (or the job is not pending)."},
            "estimate_basis": {"help_text": "What estimated_start assumes: 'deadlines' (every job runs to its "
                                            "deadline), 'history' (jobs run as long as similar recent ones did); "
                                            "empty without an estimate."},
        }

    @extend_schema_field(ResourceAmountsSerializer)
    def get_request(self, job: Job) -> dict[str, int]:
        """Per replica."""
        return {"gpu": job.gpu, "cpu": job.cpu_millicores, "memory": job.memory_bytes}

    def get_current_attempt(self, job: Job) -> int | None:
        return job.current_attempt.number if job.current_attempt_id else None

    def to_representation(self, job: Job) -> dict[str, Any]:
        if not isinstance(self.parent, JobListSerializer):  # alone: its queue position is derived here
            with_queue_positions([job])
        data = super().to_representation(job)  # the vocabulary fields are skipped: Job has no such attributes
        vocabulary = self.context.get("vocabulary")
        if vocabulary:
            shown = vocabularies.to_vocabulary(vocabulary, job.phase, job.status)
            data["vocabulary_status"] = shown.status
            if shown.code is not None:
                data["vocabulary_code"] = shown.code
        return data


class JobDetailSerializer(JobSerializer):
    """A job with its attempts and its events (oldest first)."""

    attempts = AttemptSerializer(many=True, read_only=True)
    events = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "attempts", "events"]
        read_only_fields = fields

    @extend_schema_field(EventSerializer(many=True))
    def get_events(self, job: Job) -> list[dict]:
        return EventSerializer(job_events(job), many=True).data


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


# --- output: groups, queues, utilisation, usage -------------------------------------------------------------


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


# --- output: vocabularies -----------------------------------------------------------------------------------


class VocabularyRowSerializer(serializers.Serializer):
    phase = serializers.CharField()
    status = serializers.CharField(help_text="Exact status, 'Prefix*' or '*' (any other status of the phase).")
    runai = serializers.CharField(help_text="'=' means our status as it is.")
    kueue = serializers.CharField()
    mcli = serializers.CharField()
    modelarts = serializers.IntegerField()
    modelarts_name = serializers.CharField()
    primehub = serializers.CharField()
    note = serializers.CharField()


class VocabulariesSerializer(serializers.Serializer):
    vocabularies = serializers.DictField(child=serializers.CharField(), help_text="name → display name")
    aliases = serializers.DictField(child=serializers.CharField())
    rows = VocabularyRowSerializer(many=True, help_text="Ours → theirs.")
    reverse = serializers.DictField(
        child=serializers.DictField(child=serializers.CharField()), help_text="vocabulary → {their status: our phase}"
    )

