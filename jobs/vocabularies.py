"""Our job states in the words of other schedulers: Run:ai, Kueue/jobq, mcli, ModelArts and PrimeHub.

One table, both ways:

* ``ROWS`` maps our (phase, status) to each vocabulary. A row's status is an exact status, a prefix ending in
  ``*`` (``Init:*``) or ``*`` alone (any other status of that phase); the first matching row of a phase wins.
* ``REVERSE`` maps each vocabulary's statuses to our phase.

``?vocabulary=NAME`` on the API and ``docs/status-vocabularies.md`` both read these tables. The page is generated:

    python -m jobs.vocabularies --write    # rewrite docs/status-vocabularies.md
    python -m jobs.vocabularies --check    # exit 1 if the committed page is stale

Pure: no database and no Django settings needed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from .choices import RESOURCE_PHASES, TERMINAL_PHASES, Phase

RUNAI = "runai"
KUEUE = "kueue"
MCLI = "mcli"
MODELARTS = "modelarts"
PRIMEHUB = "primehub"

VOCABULARIES: dict[str, str] = {
    RUNAI: "Run:ai",
    KUEUE: "Kueue / jobq",
    MCLI: "mcli",
    MODELARTS: "ModelArts",
    PRIMEHUB: "PrimeHub",
}
# Other spellings accepted by ``?vocabulary=``.
ALIASES = {"jobq": KUEUE, "run:ai": RUNAI, "run-ai": RUNAI, "mosaicml": MCLI}

MODELARTS_CODES: dict[int, str] = {
    0: "JOBSTAT_UNKNOWN",
    1: "JOBSTAT_INIT",
    2: "JOBSTAT_IMAGE_CREATING",
    3: "JOBSTAT_IMAGE_FAILED",
    4: "JOBSTAT_SUBMIT_TRYING",
    5: "JOBSTAT_SUBMIT_FAILED",
    6: "JOBSTAT_DELETE_FAILED",
    7: "JOBSTAT_WAITING",
    8: "JOBSTAT_RUNNING",
    9: "JOBSTAT_KILLING",
    10: "JOBSTAT_COMPLETED",
    11: "JOBSTAT_FAILED",
    12: "JOBSTAT_KILLED",
    13: "JOBSTAT_CANCELED",
    14: "JOBSTAT_LOST",
    15: "JOBSTAT_SCALING",
    16: "JOBSTAT_SUBMIT_MODEL_FAILED",
    17: "JOBSTAT_DEPLOY_SERVICE_FAILED",
    18: "JOBSTAT_CHECK_INIT",
    19: "JOBSTAT_CHECK_RUNNING",
    20: "JOBSTAT_CHECK_RUNNING_COMPLETED",
    21: "JOBSTAT_CHECK_FAILED",
}

# Run:ai's column: "=" shows our status as it is (our statuses are Run:ai's, including Init:<a>/<b>).
SAME = "="

P = Phase


@dataclass(frozen=True)
class Row:
    phase: Phase
    status: str  # exact, "Prefix*" or "*"
    runai: str
    kueue: str
    mcli: str
    modelarts: int
    primehub: str
    note: str = ""

    def matches(self, phase: str, status: str) -> bool:
        if self.phase != phase:
            return False
        if self.status == "*":
            return True
        if self.status.endswith("*"):
            return status.startswith(self.status[:-1])
        return status == self.status


ROWS: tuple[Row, ...] = (
    Row(P.SUBMITTED, "*", "Pending", "Submitted", "PENDING", 4, "pending",
        "not yet looked at by a scheduling pass"),
    Row(P.INADMISSIBLE, "*", "Pending", "Inadmissible", "PENDING", 7, "pending",
        "queue stopped, or larger than any node or quota; re-evaluated when they change"),
    Row(P.PENDING, "*", "Pending", "Submitted", "QUEUED", 7, "pending",
        "in its group's queue, with a reason and a position; Kueue's Submitted is the state that competes "
        "for quota"),
    Row(P.BACKOFF, "*", "Error", "Submitted", "QUEUED", 7, "pending",
        "a training attempt exited non-zero; waits, then queues again (Kueue: requeued)"),
    Row(P.PREPARING, "ContainerCreating", SAME, "Admitted", "STARTING", 1, "preparing"),
    Row(P.PREPARING, "PodInitializing", SAME, "Admitted", "STARTING", 1, "preparing"),
    Row(P.PREPARING, "Init:*", SAME, "Admitted", "STARTING", 1, "preparing",
        "Init:<a>/<b>, Init:Error, Init:CrashLoopBackOff"),
    Row(P.PREPARING, "ErrImagePull", SAME, "Admitted", "STARTING", 1, "preparing",
        "still retrying the pull; fails as FailedImagePull after a grace period"),
    Row(P.PREPARING, "ImagePullBackOff", SAME, "Admitted", "STARTING", 1, "preparing"),
    Row(P.PREPARING, "*", "ContainerCreating", "Admitted", "STARTING", 1, "preparing",
        "also a pod not yet placed on a node (status Pending): it already holds the job's quota"),
    Row(P.RUNNING, "CrashLoopBackOff", SAME, "Admitted", "RUNNING", 8, "running",
        "interactive job restarting in place"),
    Row(P.RUNNING, "*", "Running", "Admitted", "RUNNING", 8, "running"),
    Row(P.TERMINATING, "*", "Terminating", "Admitted", "TERMINATING", 9, "running",
        "cancel, stop, preemption or timeout; still holds its resources"),
    Row(P.SUCCEEDED, "*", "Succeeded", "Succeeded", "COMPLETED", 10, "succeeded"),
    Row(P.FAILED, "ContainerCannotRun", SAME, "Failed", "FAILED", 11, "failed"),
    Row(P.FAILED, "*", "Fail", "Failed", "FAILED", 11, "failed",
        "backoff limit spent, image pull failed, requeue limit exceeded, node lost..."),
    Row(P.CANCELLED, "*", "Deleted", "Failed", "STOPPED", 13, "cancelled",
        "Cancelled, Stopped (restartable) and Deleted (interactive closed); jobq has no cancelled state"),
    Row(P.TIMED_OUT, "*", "TimedOut", "Failed", "STOPPED", 12, "failed",
        "active_deadline_seconds reached"),
    Row(P.PREEMPTED, "*", "Preempted", "Failed", "STOPPED", 12, "failed",
        "interactive preemptible job evicted (training jobs go back to PENDING instead)"),
    Row(P.UNKNOWN, "*", "Unknown", "Admitted", "RUNNING", 14, "running",
        "node unresponsive; resources held until it returns or the grace period ends"),
)

# Theirs → our phase. Every status each vocabulary documents is here.
REVERSE: dict[str, dict[str | int, Phase]] = {
    RUNAI: {
        "Pending": P.PENDING,
        "ContainerCreating": P.PREPARING,
        "PodInitializing": P.PREPARING,
        "Init:<a>/<b>": P.PREPARING,
        "Init:Error": P.PREPARING,
        "Init:CrashLoopBackOff": P.PREPARING,
        "ErrImagePull": P.PREPARING,
        "ImagePullBackOff": P.PREPARING,
        "Running": P.RUNNING,
        "CrashLoopBackOff": P.RUNNING,
        "Terminating": P.TERMINATING,
        "Error": P.BACKOFF,
        "Succeeded": P.SUCCEEDED,
        "Fail": P.FAILED,
        "ContainerCannotRun": P.FAILED,
        "Deleted": P.CANCELLED,
        "TimedOut": P.TIMED_OUT,
        "Preempted": P.PREEMPTED,
        "Unknown": P.UNKNOWN,
    },
    KUEUE: {
        "Submitted": P.PENDING,
        "Inadmissible": P.INADMISSIBLE,
        "Pending": P.PREPARING,  # quota reserved, admission checks running: jobsite admits in one step
        "Admitted": P.RUNNING,
        "Succeeded": P.SUCCEEDED,
        "Failed": P.FAILED,
    },
    MCLI: {
        "PENDING": P.SUBMITTED,
        "QUEUED": P.PENDING,
        "STARTING": P.PREPARING,
        "RUNNING": P.RUNNING,
        "TERMINATING": P.TERMINATING,
        "COMPLETED": P.SUCCEEDED,
        "STOPPED": P.CANCELLED,
        "FAILED": P.FAILED,
    },
    MODELARTS: {
        0: P.UNKNOWN,
        1: P.PREPARING,
        2: P.PREPARING,
        3: P.FAILED,
        4: P.SUBMITTED,
        5: P.FAILED,
        6: P.UNKNOWN,
        7: P.PENDING,
        8: P.RUNNING,
        9: P.TERMINATING,
        10: P.SUCCEEDED,
        11: P.FAILED,
        12: P.CANCELLED,
        13: P.CANCELLED,
        14: P.UNKNOWN,
        15: P.RUNNING,
        16: P.FAILED,
        17: P.FAILED,
        18: P.SUBMITTED,
        19: P.SUBMITTED,
        20: P.SUBMITTED,
        21: P.FAILED,
    },
    PRIMEHUB: {
        "pending": P.PENDING,
        "preparing": P.PREPARING,
        "running": P.RUNNING,
        "succeeded": P.SUCCEEDED,
        "failed": P.FAILED,
        "cancelled": P.CANCELLED,
    },
}


@dataclass(frozen=True)
class VocabularyStatus:
    vocabulary: str
    status: str
    code: int | None = None  # ModelArts only


class UnknownVocabulary(ValueError):
    pass


def normalise(name: str) -> str:
    """The canonical name of a vocabulary (``jobq`` → ``kueue``); raises UnknownVocabulary."""
    key = (name or "").strip().lower()
    key = ALIASES.get(key, key)
    if key not in VOCABULARIES:
        raise UnknownVocabulary(f"Unknown vocabulary '{name}': use one of {', '.join(VOCABULARIES)}.")
    return key


def row_for(phase: str, status: str) -> Row:
    for row in ROWS:
        if row.matches(phase, status):
            return row
    raise KeyError(f"no vocabulary row for phase {phase}")  # every phase has a "*" row: tested


def to_vocabulary(vocabulary: str, phase: str, status: str) -> VocabularyStatus:
    """Our (phase, status) as ``vocabulary`` shows it."""
    vocabulary = normalise(vocabulary)
    row = row_for(phase, status)
    if vocabulary == MODELARTS:
        return VocabularyStatus(vocabulary, MODELARTS_CODES[row.modelarts], row.modelarts)
    value = getattr(row, vocabulary)
    return VocabularyStatus(vocabulary, status if value == SAME else value)


def from_vocabulary(vocabulary: str, status: str | int) -> Phase:
    """The phase of ours a status of ``vocabulary`` corresponds to. Raises KeyError for an unknown status.

    ModelArts takes the numeric code or the JOBSTAT_ name; Run:ai takes any Init:<a>/<b>.
    """
    vocabulary = normalise(vocabulary)
    table = REVERSE[vocabulary]
    if vocabulary == MODELARTS:
        if isinstance(status, str) and not status.strip().isdigit():
            codes = {name: code for code, name in MODELARTS_CODES.items()}
            status = codes[status.strip().upper()]
        return table[int(status)]
    text = str(status).strip()
    if vocabulary == RUNAI and text.startswith("Init:") and text not in table:
        return table["Init:<a>/<b>"]
    if vocabulary == MCLI:
        text = text.upper()
    elif vocabulary == PRIMEHUB:
        text = text.lower()
    return table[text]


def consistent(phase: str, other: str) -> bool:
    """A round trip through a vocabulary may coarsen a phase, but never across these lines."""
    return (phase in TERMINAL_PHASES) == (other in TERMINAL_PHASES) and (
        (phase in RESOURCE_PHASES) == (other in RESOURCE_PHASES)
    )


# --- the generated page ---------------------------------------------------------------------------------------

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "status-vocabularies.md"


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _runai_cell(row: Row) -> str:
    if row.runai != SAME:
        return row.runai
    return "the same Init:… status" if row.status == "Init:*" else row.status


def render_markdown() -> str:
    """docs/status-vocabularies.md, from ``ROWS`` and ``REVERSE``."""
    out = [
        "# Job statuses in other schedulers' words",
        "",
        "<!-- Generated by `python -m jobs.vocabularies --write` from jobs/vocabularies.py: do not edit. -->",
        "",
        "A jobsite job has a phase (the state machine) and a status (what Run:ai would show). The API shows any",
        "job in another scheduler's vocabulary with `?vocabulary=NAME` on `GET /api/v1/jobs/` and",
        "`GET /api/v1/jobs/{id}/` (`vocabulary_status`, plus `vocabulary_code` for ModelArts); the CLI with",
        "`jobctl list --vocabulary NAME` and `jobctl get ID --vocabulary NAME`.",
        "",
        "Names: " + ", ".join(f"`{k}` ({v})" for k, v in VOCABULARIES.items())
        + "; also " + ", ".join(f"`{a}` = `{k}`" for a, k in ALIASES.items()) + ".",
        "",
        "## From jobsite to theirs",
        "",
        "A status of `*` is any other status of that phase; `Init:*` any status starting with `Init:`. The first",
        "matching row of a phase applies.",
        "",
        "| phase | status | Run:ai | Kueue / jobq | mcli | ModelArts | PrimeHub | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in ROWS:
        modelarts = f"{row.modelarts} {MODELARTS_CODES[row.modelarts]}"
        cells = [row.phase.value, f"`{row.status}`", _runai_cell(row), row.kueue, row.mcli, modelarts, row.primehub,
                 row.note]
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    out += ["", "## From theirs to jobsite", ""]
    for key, title in VOCABULARIES.items():
        out += [f"### {title} (`{key}`)", "", "| their status | our phase |", "|---|---|"]
        for status, phase in REVERSE[key].items():
            shown = f"{status} {MODELARTS_CODES[status]}" if key == MODELARTS else str(status)
            out.append(f"| {_cell(shown)} | {phase.value} |")
        out.append("")
    out += [
        "## Notes",
        "",
        "- A round trip (ours → theirs → ours) may land on a coarser phase (Kueue's `Admitted` covers PREPARING,",
        "  RUNNING, TERMINATING and UNKNOWN), but never changes whether the job has ended or holds resources.",
        "- Kueue/jobq's `Submitted` is the state in which a workload competes for quota, which is our PENDING;",
        "  its `Pending` (quota reserved, admission checks running) has no jobsite counterpart because jobsite",
        "  admits in one step, so it is read back as PREPARING.",
        "- GPU usage is counted as mcli counts it: from entering PREPARING (mcli STARTING) to leaving TERMINATING.",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.vocabularies", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"write {DOC_PATH.name} under docs/")
    group.add_argument("--check", action="store_true", help="exit 1 if the committed page differs")
    args = parser.parse_args(argv)
    text = render_markdown()
    if args.write:
        DOC_PATH.parent.mkdir(parents=True, exist_ok=True)
        DOC_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {DOC_PATH}")
    elif args.check:
        current = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else ""
        if current != text:
            print(f"{DOC_PATH} is out of date: run python -m jobs.vocabularies --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
