"""Every write of the jobs app. Views, API views and the scheduler call these; nothing else changes a job.

One module per kind of write, all of them reachable from here (``from jobs import services``):

- ``transitions``: ``job_transition``, the one place a job's phase/status changes (state machine, event, attempt
  closed when resources are released, side effects after commit), and ``job_terminate``
- ``events``: ``event_record``, the job's event trail
- ``submission``: checking a submission and creating the job, with its `Idempotency-Key`
- ``actions``: what users do to jobs (cancel, stop, restart; many at once)
- ``scheduling``: what the scheduler does to jobs (admit, preempt, retry or fail, release from backoff)
- ``waiting``: the bulk writes of a scheduling pass to waiting jobs (messages, blocked reasons, estimates)
- ``backend_records``: what the scheduler records of its backends (launch claims, failed ranks, cleanup, nodes)
"""

from .actions import CANNOT_ACT, job_cancel, job_cancel_many, job_restart
from .backend_records import (
    attempt_claim_launch,
    attempt_count_restart,
    attempt_record_failure,
    attempt_record_launch,
    attempt_record_started,
    job_mark_cleaned,
    nodes_record,
)
from .events import event_record
from .scheduling import EXIT_FAILURES, job_admit, job_preempt, job_retry_or_fail, jobs_release_backoff
from .submission import (
    SUBMIT_KEY_TTL,
    JobSpec,
    SubmitKeyReused,
    SubmitKeyTaken,
    job_spec_validate,
    job_submit,
    job_submit_is_one_statement,
    job_submitted_with,
)
from .transitions import (
    DEFAULT_STATUS,
    UNSET,
    WARNING_REASONS,
    WARNING_STATUSES,
    job_locked,
    job_terminate,
    job_transition,
    terminated_status,
)
from .waiting import BLOCKED_REASON, job_estimate_update, job_queue_behind_update, job_queue_info_update

__all__ = [
    "BLOCKED_REASON", "CANNOT_ACT", "DEFAULT_STATUS", "EXIT_FAILURES", "SUBMIT_KEY_TTL", "UNSET", "WARNING_REASONS",
    "WARNING_STATUSES", "JobSpec", "SubmitKeyReused", "SubmitKeyTaken", "attempt_claim_launch",
    "attempt_count_restart", "attempt_record_failure", "attempt_record_launch", "attempt_record_started",
    "event_record", "job_admit", "job_cancel", "job_cancel_many", "job_estimate_update", "job_locked",
    "job_mark_cleaned", "job_preempt", "job_queue_behind_update", "job_queue_info_update", "job_restart",
    "job_retry_or_fail", "job_spec_validate", "job_submit", "job_submit_is_one_statement", "job_submitted_with",
    "job_terminate", "job_transition", "jobs_release_backoff", "nodes_record", "terminated_status",
]
