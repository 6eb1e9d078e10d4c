"""What the jobs resource shows: a job in lists and in detail (with its status in another scheduler's words on
request), its attempts with their replicas' log sizes, and its events."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs import vocabularies
from jobs.dependency_selectors import JobDependencies, dependencies_in_hand, job_dependencies
from jobs.models import Attempt, Job, JobEvent
from jobs.selectors import job_events, with_queue_positions

from .fields import FieldsBuiltOnce, PriorityField, ResourceAmountsSerializer


class AttemptSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
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
        from ..queries import attempt_logs

        return attempt_logs(attempt)


class EventSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
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


class JobSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
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
            "ports", "request", "phase", "status", "color", "color_name", "reason", "message", "exit_code",
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


class DependencySerializer(serializers.Serializer):
    job = serializers.IntegerField(required=False, help_text="The job it waits for (or array).")
    array = serializers.IntegerField(required=False, help_text="The array it waits for (every member to end).")
    when = serializers.ChoiceField(choices=["ok", "notok", "any"])
    satisfied = serializers.BooleanField()


class JobDetailSerializer(JobSerializer):
    """A job with its attempts, its events (oldest first) and its dependencies both ways."""

    attempts = AttemptSerializer(many=True, read_only=True)
    events = serializers.SerializerMethodField()
    after = serializers.SerializerMethodField()
    waited_by = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "attempts", "events", "after", "waited_by"]
        read_only_fields = fields

    def _dependencies(self, job: Job) -> JobDependencies:
        """Both lists from one query, kept for the second field."""
        if getattr(job, "_dependencies_shown", None) is None:
            recorded = getattr(job, "dependencies_recorded", None)
            if recorded is not None:  # just submitted: its rows are in hand, and nothing can wait for it yet
                job._dependencies_shown = dependencies_in_hand(recorded)
            else:
                viewer = getattr(self.context.get("request"), "user", None)
                job._dependencies_shown = job_dependencies(job, viewer if viewer and viewer.is_authenticated
                                                           else None)
        return job._dependencies_shown

    @extend_schema_field(DependencySerializer(many=True))
    def get_after(self, job: Job) -> list[dict]:
        """What it waits for: each job or array, when, and whether that is met."""
        return [{d.kind: d.id, "when": d.when, "satisfied": d.satisfied} for d in self._dependencies(job).after]

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField()))
    def get_waited_by(self, job: Job) -> list[int]:
        """The jobs that wait for this one (or for its array) that the caller may see."""
        return list(dict.fromkeys(d.id for d in self._dependencies(job).waited_by))

    @extend_schema_field(EventSerializer(many=True))
    def get_events(self, job: Job) -> list[dict]:
        recorded = getattr(job, "events_recorded", None)  # just submitted: its one event is in hand
        return EventSerializer(job_events(job) if recorded is None else recorded, many=True).data
