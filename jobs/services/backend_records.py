"""What the scheduler records of its backends' work, none of it a status change: an attempt's launch claimed once and
what the backend needs to find it again, the replica that failed it, in-place restarts, a finished job's cleanup, and
the nodes a backend has.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..models import Attempt, Job, JobEvent, Node
from ..prepared import Prepared
from ..prepared_writes import update_row
from ..rules import fmt_duration
from .events import event_record


def attempt_claim_launch(*, attempt: Attempt, now: datetime | None = None) -> bool:
    """Claim the launch of an attempt: True for exactly one caller (the pass's after-commit hook or a sync)."""
    return update_row(Attempt, attempt.pk, {"launched_at": now or timezone.now()}, where_null=("launched_at",)) == 1


def attempt_record_launch(*, attempt: Attempt, backend_data: dict[str, Any]) -> None:
    """Keep what the backend needs to find the attempt's processes or pods again."""
    attempt.backend_data = backend_data
    update_row(Attempt, attempt.pk, {"backend_data": backend_data})


# The job's row, locked (its id only): what orders two schedulers recording the same start.
JOB_ROW_LOCKED = Prepared(lambda pk: Job.objects.select_for_update().filter(pk=pk).values_list("pk", flat=True),
                          pk=int)
# Which of these attempts have their "Started" event.
STARTED_OF = Prepared(lambda attempts: JobEvent.objects.filter(attempt_id__in=attempts, reason="Started")
                      .values_list("attempt_id", flat=True), attempts=list)


@transaction.atomic(savepoint=False)  # inside a sync round's transaction: no savepoint of its own
def attempt_record_started(*, job: Job, attempt: Attempt, at: datetime | None = None) -> bool:
    """The attempt's "Started" event, written once, when a sync first sees its replicas running; False when it
    was there already. A scheduler that has just lost the leadership may sync the job a moment longer than the one
    that took over (its lock's connection was cut: the database let the other take the lock before this one's
    next round noticed): the job's row lock orders the two, and the second finds the first's event (each statement
    reads what was committed before it)."""
    JOB_ROW_LOCKED.all(pk=job.pk)
    if STARTED_OF.all(attempts=[attempt.pk]):
        return False
    event_record(job=job, attempt=attempt, reason="Started", at=at,
                 message=f"Started {attempt.replicas} replica(s)" + (f" on {attempt.node}" if attempt.node else ""))
    return True


def attempt_record_failure(*, attempt: Attempt, rank: int) -> None:
    """Remember the replica that failed the attempt (the first to fail): its log is the one to read."""
    if attempt.failed_rank is None:
        attempt.failed_rank = rank
        Attempt.objects.filter(pk=attempt.pk, failed_rank__isnull=True).update(failed_rank=rank)


def attempt_count_restart(*, attempt: Attempt) -> int:
    """One more in-place restart of an interactive attempt; returns how many so far."""
    restarts = attempt.backend_data.get("restarts", 0) + 1
    attempt_record_launch(attempt=attempt, backend_data={**attempt.backend_data, "restarts": restarts})
    return restarts


def job_mark_cleaned(*, job_id: int, now: datetime) -> None:
    """The job's working directories or pods are gone (TTL); its row, events and logs stay."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id, cleaned_at__isnull=True).first()
        if job is None:
            return
        job.cleaned_at = now
        job.save(update_fields=["cleaned_at"])
        event_record(job=job, reason="CleanedUp", message=(
            f"Working directories and pods deleted {fmt_duration(job.ttl_seconds_after_finished)} after the end "
            "(ttl_seconds_after_finished); the logs are kept"))


# A backend's nodes as last recorded (name, allocatable): read by every pass and every node check.
NODES_OF = Prepared(lambda backend: Node.objects.filter(backend=backend).values_list("name", "allocatable"),
                    backend=str)


def nodes_record(*, backend: str, nodes: dict[str, dict[str, int]], now: datetime | None = None) -> None:
    """What the scheduler read of its backend's nodes (name -> allocatable): rows of nodes gone are deleted, new
    and changed ones written (nothing is written when nothing changed). Pages and admission read these rows
    instead of calling the cluster."""
    known = dict(NODES_OF.all(backend=backend))
    if known == nodes:
        return
    now = now or timezone.now()
    with transaction.atomic():
        Node.objects.filter(backend=backend).exclude(name__in=list(nodes)).delete()
        changed = [Node(backend=backend, name=name, allocatable=allocatable, updated_at=now)
                   for name, allocatable in nodes.items() if known.get(name) != allocatable]
        # Two passes at once may both write: the second one's insert becomes an update.
        Node.objects.bulk_create(changed, update_conflicts=True, unique_fields=["backend", "name"],
                                 update_fields=["allocatable", "updated_at"])
