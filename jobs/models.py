"""Models of groups, quotas, instance types, images, jobs (and arrays, dependencies), attempts, events and
notifications.

Writes happen in ``jobs.services`` only; reads that need permission filtering live in ``jobs.selectors``.
"""

from __future__ import annotations

import posixpath

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from .choices import (
    QUEUED_PHASES,
    RESOURCE_PHASES,
    DependencyWhen,
    EventType,
    JobType,
    NotificationState,
    NotifyChannel,
    NotifyEvent,
    Phase,
    Priority,
    Resource,
    Role,
)
from .state_machine import color_for, color_name

slug_validator = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "Use lowercase letters, digits and '-', starting and ending alphanumeric."
)


class Group(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    display_name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    queue_stopped = models.BooleanField(
        default=False, help_text="While stopped, the group's pending jobs are inadmissible and nothing is admitted."
    )
    volume_path = models.CharField(max_length=500, blank=True, help_text="Group volume mounted into every job.")
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="job_groups")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    group = models.ForeignKey(Group, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["group", "user"], name="membership_unique_group_user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.group} ({self.role})"


class GroupQuota(models.Model):
    """Per group and resource: the guaranteed quota, an optional borrowing limit and the per-user quota.

    An empty quota means unlimited for that resource; an empty limit means the limit is the quota.
    """

    group = models.ForeignKey(Group, on_delete=models.CASCADE, related_name="quotas")
    resource = models.CharField(max_length=10, choices=Resource.choices)
    quota = models.PositiveBigIntegerField(null=True, blank=True, help_text="Guaranteed to the group.")
    limit = models.PositiveBigIntegerField(null=True, blank=True, help_text="Borrowing ceiling, at least the quota.")
    user_quota = models.PositiveBigIntegerField(null=True, blank=True, help_text="Most one user may hold.")

    class Meta:
        ordering = ["group", "resource"]
        constraints = [
            models.UniqueConstraint(fields=["group", "resource"], name="groupquota_unique_group_resource"),
            models.CheckConstraint(
                condition=Q(limit__isnull=True) | Q(quota__isnull=True) | Q(limit__gte=models.F("quota")),
                name="groupquota_limit_gte_quota",
                violation_error_message="The limit must be at least the quota.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.group} {self.resource}"


class InstanceType(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    display_name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    gpu = models.PositiveIntegerField(default=0)
    cpu_millicores = models.PositiveIntegerField(default=1000)
    memory_bytes = models.PositiveBigIntegerField(default=1 << 30)
    node_selector = models.JSONField(default=dict, blank=True)
    tolerations = models.JSONField(default=list, blank=True)
    gpu_resource = models.CharField(
        max_length=100, blank=True,
        help_text="Kubernetes: the extended resource its GPUs are requested as, e.g. nvidia.com/mig-1g.10gb for a "
                  "MIG slice. Empty: the installation's default (nvidia.com/gpu).")
    capabilities = models.JSONField(
        default=list, blank=True,
        help_text="Kubernetes: Linux capabilities its containers keep (all others are dropped), e.g. [\"IPC_LOCK\"] "
                  "for InfiniBand. Only admins set these.")
    groups = models.ManyToManyField(Group, blank=True, related_name="instance_types")

    class Meta:
        ordering = ["gpu", "name"]

    def __str__(self) -> str:
        return self.name

    @property
    def request(self) -> dict[str, int]:
        return {Resource.GPU: self.gpu, Resource.CPU: self.cpu_millicores, Resource.MEMORY: self.memory_bytes}


def local_root_validator(value: str) -> None:
    """An environment's directory: absolute, normalised, not the root of the machine."""
    if not value.startswith("/") or value.rstrip("/") == "" or value != posixpath.normpath(value):
        raise ValidationError("Give an absolute, normalised directory such as /srv/envs/torch (not /).")


class Image(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    url = models.CharField(max_length=500, help_text="Image reference, e.g. registry/repo:tag.")
    local_root = models.CharField(
        max_length=500, blank=True, validators=[local_root_validator],
        help_text="Local backend: the environment a job of this image runs in, an absolute directory of the machine "
                  "(a virtualenv, a conda prefix, or an unpacked root filesystem). Shown read-only in the job's "
                  "sandbox with its bin/ first on PATH. Empty: the machine's own system.")
    description = models.TextField(blank=True)
    groups = models.ManyToManyField(Group, blank=True, related_name="images")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Job(models.Model):
    # spec
    name = models.CharField(max_length=128)
    # No index of their own: job_group_newest and job_user_newest lead with them (each index is written by every
    # insert and by every transition, which changes the indexed phase).
    group = models.ForeignKey(Group, on_delete=models.PROTECT, related_name="jobs", db_index=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs", db_index=False)
    image = models.ForeignKey(Image, on_delete=models.PROTECT, related_name="jobs")
    image_url = models.CharField(max_length=500)
    instance_type = models.ForeignKey(InstanceType, on_delete=models.PROTECT, related_name="jobs")
    # per-replica request, copied from the instance type at submission
    gpu = models.PositiveIntegerField(default=0)
    cpu_millicores = models.PositiveIntegerField(default=0)
    memory_bytes = models.PositiveBigIntegerField(default=0)
    command = models.TextField()
    env = models.JSONField(default=dict, blank=True)
    replicas = models.PositiveSmallIntegerField(default=1)
    job_type = models.CharField(max_length=12, choices=JobType.choices, default=JobType.TRAINING)
    priority = models.SmallIntegerField(choices=Priority.choices, default=Priority.NORMAL)
    preemptible = models.BooleanField(default=False)
    backoff_limit = models.PositiveSmallIntegerField(default=6)
    active_deadline_seconds = models.PositiveIntegerField(default=86400)
    ttl_seconds_after_finished = models.PositiveIntegerField(default=7 * 86400)
    # state (written by jobs.services.job_transition only)
    phase = models.CharField(max_length=12, choices=Phase.choices, default=Phase.SUBMITTED)
    status = models.CharField(max_length=40, default="Submitted")
    reason = models.CharField(max_length=60, blank=True)
    message = models.TextField(blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start = models.DateTimeField(
        null=True, blank=True, help_text="Pending: when the scheduler expects it to start (empty: not within 30 days)."
    )
    estimate_basis = models.CharField(
        max_length=10, blank=True, help_text="What the estimate assumes: 'deadlines' (every job runs to its deadline) "
        "or 'history' (jobs run as long as similar recent ones did)."
    )
    termination_target = models.CharField(max_length=12, choices=Phase.choices, blank=True)
    over_quota = models.BooleanField(default=False, help_text="Runs beyond its group's quota: preempted first.")
    retry_at = models.DateTimeField(null=True, blank=True)
    current_attempt = models.ForeignKey(  # indexed where set (job_current_attempt)
        "Attempt", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    # times
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    queued_at = models.DateTimeField(help_text="FIFO key: submission time, kept across requeues.")
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    terminating_since = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="End + TTL: when its leftovers are deleted.")
    cleaned_at = models.DateTimeField(null=True, blank=True, help_text="Working directories/pods deleted (TTL).")
    # A member of an array or sweep (JobArray): its index in it and, for a sweep, its parameters.
    array = models.ForeignKey("JobArray", null=True, blank=True, on_delete=models.CASCADE, related_name="members",
                              db_index=False)  # indexed where set (job_array_member)
    array_index = models.PositiveIntegerField(null=True, blank=True)
    array_params = models.JSONField(default=dict, blank=True)
    # Waits for jobs it depends on (JobDependency rows not yet satisfied): out of its group's queue until then.
    dependency_wait = models.BooleanField(default=False)
    # Ports its replicas serve, reached through the site: [{"name": "jupyter", "port": 8888}].
    ports = models.JSONField(default=list, blank=True)
    # GPU telemetry: since when its GPUs have stayed under the idle threshold (empty: busy, or no telemetry).
    gpus_idle_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["group", "-id"], name="job_group_newest"),
            models.Index(fields=["user", "-id"], name="job_user_newest"),
            models.Index(fields=["phase", "-id"], name="job_phase_newest"),
            models.Index(fields=["group", "phase", "-id"], name="job_group_phase_newest"),
            models.Index(
                fields=["group", "-priority", "queued_at", "id"],
                condition=Q(phase__in=sorted(QUEUED_PHASES)),
                name="job_queue_order",
            ),
            models.Index(
                fields=["group", "user"], condition=Q(phase__in=sorted(RESOURCE_PHASES)), name="job_holding"
            ),
            models.Index(fields=["expires_at"], condition=Q(cleaned_at__isnull=True), name="job_ttl_due"),
            # Most jobs are in no array, and a waiting job has no attempt: those rows are not in these indexes.
            models.Index(fields=["array"], condition=Q(array__isnull=False), name="job_array_member"),
            models.Index(fields=["current_attempt"], condition=Q(current_attempt__isnull=False),
                         name="job_current_attempt"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    @property
    def color(self) -> str:
        return color_for(self.phase, self.status)

    @property
    def color_name(self) -> str:
        return color_name(self.phase, self.status)

    @property
    def request(self) -> dict[str, int]:
        """Per-replica request."""
        return {Resource.GPU: self.gpu, Resource.CPU: self.cpu_millicores, Resource.MEMORY: self.memory_bytes}

    @property
    def total_request(self) -> dict[str, int]:
        return {k: v * self.replicas for k, v in self.request.items()}


class Attempt(models.Model):
    """One try of a job: a launch of all its replicas. Retries, requeues and restarts each make a new one."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    replicas = models.PositiveSmallIntegerField()
    gpu = models.PositiveIntegerField(default=0, help_text="GPUs per replica.")
    backend = models.CharField(max_length=20)
    node = models.CharField(max_length=200, blank=True)
    placement = models.JSONField(
        default=dict, blank=True, help_text="Where each replica runs: {rank: {node, devices}}."
    )
    backend_data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    launched_at = models.DateTimeField(null=True, blank=True, help_text="Handed to the backend (claimed once).")
    started_at = models.DateTimeField(null=True, blank=True, help_text="Entered PREPARING.")
    running_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True, help_text="Left TERMINATING or ended.")
    exit_code = models.IntegerField(null=True, blank=True)
    failed_rank = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The first replica that failed; the attempt's exit code is its."
    )
    outcome = models.CharField(max_length=60, blank=True)
    gpu_seconds = models.FloatField(default=0)
    # GPU telemetry: mean SM utilisation (0-100) over its samples, and GPU-seconds weighted by it.
    gpu_util_mean = models.FloatField(null=True, blank=True)
    gpu_util_seconds = models.FloatField(default=0, help_text="GPU-seconds × mean utilisation: utilised GPU-seconds.")
    gpu_samples = models.PositiveIntegerField(default=0, help_text="Telemetry samples behind gpu_util_mean.")

    class Meta:
        ordering = ["job", "number"]
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="attempt_unique_job_number")]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.number}"


class JobEvent(models.Model):
    """Append-only: what happened to a job, the job's `describe`."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.CASCADE, related_name="events")
    time = models.DateTimeField(auto_now_add=True)
    type = models.CharField(max_length=8, choices=EventType.choices, default=EventType.NORMAL)
    reason = models.CharField(max_length=60)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["job", "id"]
        indexes = [models.Index(fields=["job", "id"], name="event_job_order")]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.type} {self.reason}"


class GpuSeries(models.Model):
    """One GPU's telemetry for an attempt at one resolution (10 s, 60 s or 600 s points) over one stretch of time
    from ``start`` (1 min, 10 min or 6 h: ``jobs.services.telemetry.LEVELS``), as a short list of points
    [epoch seconds, SM %, memory used bytes, memory total bytes, power W, temperature C]."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="gpu_series")
    rank = models.PositiveSmallIntegerField(default=0)
    node = models.CharField(max_length=200, blank=True)
    gpu = models.CharField(max_length=64, help_text="The GPU as its node names it: index or UUID.")
    resolution = models.PositiveIntegerField(help_text="Seconds per point.")
    start = models.BigIntegerField(default=0, help_text="Epoch seconds where the row's stretch of time begins.")
    points = models.JSONField(default=list)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["attempt", "rank", "gpu", "resolution", "start"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "rank", "gpu", "resolution", "start"], name="gpu_series_unique"),
        ]
        indexes = [models.Index(fields=["resolution", "start"], name="gpu_series_age")]  # the rows to fold

    def __str__(self) -> str:
        return f"{self.attempt} rank {self.rank} gpu {self.gpu} @{self.resolution}s"


class GpuUsage(Attempt):
    """GPU-hours per day, group and user, read from attempts: a proxy for its admin page."""

    class Meta:
        proxy = True
        verbose_name = "GPU usage"
        verbose_name_plural = "GPU usage"


class Node(models.Model):
    """A node of the cluster as the scheduler last saw it. Only the scheduler writes these rows (from its backend);
    pages and the API read them, so they never call the cluster and work while its API is down."""

    backend = models.CharField(max_length=20)
    name = models.CharField(max_length=253)
    # Resources the node limits, as the admission check counts them: gpu, cpu (millicores), memory (bytes).
    allocatable = models.JSONField(default=dict)
    updated_at = models.DateTimeField(help_text="When the scheduler last recorded a change of the node.")

    class Meta:
        ordering = ["backend", "name"]
        constraints = [models.UniqueConstraint(fields=["backend", "name"], name="node_backend_name")]

    def __str__(self) -> str:
        return self.name


class JobArray(models.Model):
    """Jobs made by one submission: an index range (``array: "0-99%8"``) or a parameter grid (``sweep``). Each
    member is a Job of its own that queues like any job; ``max_running`` (the ``%K``) bounds how many of them
    hold resources at once."""

    name = models.CharField(max_length=128)
    group = models.ForeignKey(Group, on_delete=models.PROTECT, related_name="arrays")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="job_arrays")
    indices = models.CharField(max_length=200, blank=True, help_text='The array as submitted, e.g. "0-99%8".')
    sweep = models.JSONField(default=dict, blank=True, help_text="Parameter name → the values it sweeps over.")
    size = models.PositiveIntegerField()
    max_running = models.PositiveIntegerField(null=True, blank=True, help_text="At most this many members at once.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["group", "-id"], name="array_group_newest")]

    def __str__(self) -> str:
        return f"array {self.pk} {self.name}"


class JobDependency(models.Model):
    """``job`` may start only once ``on_job`` (or every member of ``on_array``) ended as ``when`` asks."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependencies")
    on_job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.CASCADE, related_name="dependents")
    on_array = models.ForeignKey(JobArray, null=True, blank=True, on_delete=models.CASCADE, related_name="dependents")
    when = models.CharField(max_length=6, choices=DependencyWhen.choices, default=DependencyWhen.OK)
    satisfied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(on_job__isnull=False, on_array__isnull=True)
                           | Q(on_job__isnull=True, on_array__isnull=False)),
                name="dependency_on_one",
            ),
        ]
        indexes = [models.Index(fields=["job"], condition=Q(satisfied_at__isnull=True), name="dependency_unmet")]

    def __str__(self) -> str:
        target = f"#{self.on_job_id}" if self.on_job_id else f"array {self.on_array_id}"
        return f"#{self.job_id} after {target} {self.when}"


class NotificationSubscription(models.Model):
    """A user asks to be told of events of their jobs, by email or by webhook."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notify_subscriptions")
    channel = models.CharField(max_length=10, choices=NotifyChannel.choices)
    url = models.URLField(max_length=500, blank=True, help_text="Webhook: where the JSON is POSTed.")
    email = models.EmailField(blank=True, help_text="Email: where to send (the user's own address if blank).")
    slack = models.BooleanField(default=False, help_text="Webhook: a Slack-compatible body ({'text': ...}).")
    events = models.JSONField(default=list, help_text="NotifyEvent values.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.user} by {self.channel}"


class Notification(models.Model):
    """The outbox: one row per job event and subscription, made in the transaction of the change it tells of, sent
    by the worker after commit and retried with backoff. The unique constraint makes it at most once."""

    subscription = models.ForeignKey(NotificationSubscription, on_delete=models.CASCADE, related_name="outbox")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="notifications")
    event = models.ForeignKey("JobEvent", on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=12, choices=NotifyEvent.choices)
    state = models.CharField(max_length=8, choices=NotificationState.choices, default=NotificationState.PENDING)
    tries = models.PositiveSmallIntegerField(default=0)
    next_try_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["subscription", "event"], name="notification_once")]
        indexes = [models.Index(fields=["next_try_at"], condition=Q(state="pending"), name="notification_due")]

    def __str__(self) -> str:
        return f"{self.kind} of #{self.job_id} by {self.subscription.channel}: {self.state}"


class SubmitKey(models.Model):
    """An `Idempotency-Key` a user sent with a submit: the same key again within `SUBMIT_KEY_TTL` answers the job it
    made instead of making another. The unique constraint makes concurrent submits with one key make one job."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the request's body, canonical JSON.")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="submitkey_user_key")]
        indexes = [models.Index(fields=["created_at"], name="submitkey_created")]

    def __str__(self) -> str:
        return f"{self.key} → #{self.job_id}"


class LoginFailure(models.Model):
    """Failed logins of one username from one client address within a window (``jobs.api.auth``). Kept in the
    database, which only jobsite's own role can write, and never in Redis: nothing a job might reach can read,
    reset or raise the counts. ``key`` is an HMAC of the username and the address under ``SECRET_KEY``, so the
    table holds neither."""

    key = models.CharField(max_length=64, unique=True)
    failures = models.PositiveIntegerField(default=0)
    window_ends_at = models.DateTimeField(help_text="The window starts at the first failure; later ones keep it.")

    class Meta:
        indexes = [models.Index(fields=["window_ends_at"], name="loginfailure_window_ends")]

    def __str__(self) -> str:
        return f"{self.failures} until {self.window_ends_at:%Y-%m-%d %H:%M:%S}"
