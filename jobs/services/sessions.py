"""Sessions into a running job (exec, terminal): who may open one, and the trail and counts they leave.

Only those who see the job (members of its group, superusers) may get in; anyone else is told the job does not
exist, as for the job itself. A job that is not Running has no replica to enter. Each session ends with one event
on the job's trail (who, what, how long, how it ended) and counts in ``/metrics``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from prometheus_client import Counter, Gauge

from ..choices import Phase
from ..models import Attempt, Job
from ..selectors import jobs_visible_to
from .events import event_record

SESSIONS = Counter("jobsite_job_sessions", "Sessions opened into running jobs, by kind (exec, port).", ["kind"])
OPEN_SESSIONS = Gauge("jobsite_job_sessions_open", "Sessions into running jobs open now, by kind.", ["kind"],
                      multiprocess_mode="livesum")  # several web processes: the sum over those alive
REFUSED = Counter("jobsite_job_sessions_refused", "Sessions refused (not_found, not_running, bad_rank, ...).",
                  ["reason"])
for _kind in ("exec", "port"):
    SESSIONS.labels(_kind)
    OPEN_SESSIONS.labels(_kind)
for _reason in ("not_found", "not_running", "bad_rank", "bad_command"):
    REFUSED.labels(_reason)


class SessionRefused(Exception):
    """Why a session cannot open: ``status`` as HTTP says it (404, 409, 400) and a message for the user."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message
        REFUSED.labels(reason).inc()


@dataclass(frozen=True)
class Target:
    """The replica a session enters."""

    job: Job
    attempt: Attempt
    rank: int

    @property
    def backend_root(self) -> str:
        return str((self.attempt.backend_data or {}).get("root", ""))


def session_target(*, user: AbstractBaseUser, job_id: int, rank: int = 0) -> Target:
    """The running replica ``rank`` of job ``job_id`` that ``user`` may enter; SessionRefused otherwise."""
    job = jobs_visible_to(user).filter(pk=job_id).first() if user.is_authenticated else None
    if job is None:
        raise SessionRefused(404, "not_found", "No such job.")
    attempt = job.current_attempt
    if job.phase != Phase.RUNNING or attempt is None:
        raise SessionRefused(409, "not_running", f"Job {job.pk} is {job.get_phase_display()}, not Running: "
                                                 "there is no replica to enter.")
    if not 0 <= rank < attempt.replicas:
        raise SessionRefused(400, "bad_rank", f"Job {job.pk} has replicas 0 to {attempt.replicas - 1}, "
                                              f"not {rank}.")
    return Target(job=job, attempt=attempt, rank=rank)


def session_still_running(target: Target) -> bool:
    """Whether the session's attempt is still the job's, and Running."""
    return Job.objects.filter(pk=target.job.pk, phase=Phase.RUNNING, current_attempt=target.attempt).exists()


def session_opened(kind: str = "exec") -> None:
    SESSIONS.labels(kind).inc()
    OPEN_SESSIONS.labels(kind).inc()


def session_record(*, target: Target, user: AbstractBaseUser, command: list[str], tty: bool, seconds: float,
                   exit_code: int | None, ended: str, kind: str = "exec") -> None:
    """The trail's event of one session that has ended (``ended``: how: exited, closed, idle, job ended, error)."""
    OPEN_SESSIONS.labels(kind).dec()
    how = f"exit code {exit_code}" if exit_code is not None else ended
    what = "a terminal" if tty else "a command"
    event_record(job=target.job, attempt=target.attempt, reason="Exec",
                 message=f"{user.get_username()} ran {what} in replica {target.rank}: {shlex.join(command)} "
                         f"({seconds:.0f} s, {how})")


def port_target(*, user: AbstractBaseUser, job_id: int, port: int, rank: int = 0) -> Target:
    """The running replica whose declared ``port`` ``user`` may open; a port the job does not declare is not found."""
    target = session_target(user=user, job_id=job_id, rank=rank)
    if port not in {p.get("port") for p in target.job.ports or [] if isinstance(p, dict)}:
        raise SessionRefused(404, "not_found", f"Job {job_id} declares no port {port}.")
    return target


def port_session_record(*, target: Target, user: AbstractBaseUser, port: int, what: str, seconds: float) -> None:
    """The trail's event of one WebSocket opened to a job's port (plain HTTP requests are not events: a page makes
    dozens)."""
    OPEN_SESSIONS.labels("port").dec()
    event_record(job=target.job, attempt=target.attempt, reason="PortSession",
                 message=f"{user.get_username()} opened {what} to port {port} of replica {target.rank} "
                         f"({seconds:.0f} s)")
