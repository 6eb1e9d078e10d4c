"""Choices of the jobs app: phases (with their state groups), job types, priorities, resources, roles."""

from django.db import models


class Phase(models.TextChoices):
    SUBMITTED = "SUBMITTED", "Submitted"
    INADMISSIBLE = "INADMISSIBLE", "Inadmissible"
    PENDING = "PENDING", "Pending"
    BACKOFF = "BACKOFF", "Backoff"
    PREPARING = "PREPARING", "Preparing"
    RUNNING = "RUNNING", "Running"
    TERMINATING = "TERMINATING", "Terminating"
    SUCCEEDED = "SUCCEEDED", "Succeeded"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"
    TIMED_OUT = "TIMED_OUT", "Timed out"
    PREEMPTED = "PREEMPTED", "Preempted"
    UNKNOWN = "UNKNOWN", "Unknown"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED, Phase.TIMED_OUT, Phase.PREEMPTED})
# Phases whose jobs count against quotas and node capacity.
RESOURCE_PHASES = frozenset({Phase.PREPARING, Phase.RUNNING, Phase.TERMINATING, Phase.UNKNOWN})
# Phases in which the scheduler considers a job for admission.
QUEUED_PHASES = frozenset({Phase.SUBMITTED, Phase.PENDING, Phase.INADMISSIBLE})


class JobType(models.TextChoices):
    TRAINING = "training", "Training"
    INTERACTIVE = "interactive", "Interactive"


class Priority(models.IntegerChoices):
    LOW = 0, "low"
    NORMAL = 50, "normal"
    HIGH = 100, "high"


class Resource(models.TextChoices):
    GPU = "gpu", "GPU"
    CPU = "cpu", "CPU (millicores)"
    MEMORY = "memory", "Memory (bytes)"


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    ADMIN = "admin", "Admin"


class EventType(models.TextChoices):
    NORMAL = "Normal", "Normal"
    WARNING = "Warning", "Warning"


class DependencyWhen(models.TextChoices):
    """When a dependency is met, as Slurm's afterok / afternotok / afterany."""

    OK = "ok", "Succeeded"
    NOTOK = "notok", "Ended without succeeding"
    ANY = "any", "Ended"


class NotifyChannel(models.TextChoices):
    EMAIL = "email", "Email"
    WEBHOOK = "webhook", "Webhook"


class NotifyEvent(models.TextChoices):
    """What a user may be told about their jobs."""

    ENDED = "ended", "Ended (any way)"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    RUNNING = "running", "Running after a wait"
    IDLE_GPUS = "idle_gpus", "GPUs idle"


class NotificationState(models.TextChoices):
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"  # gave up after the last retry
