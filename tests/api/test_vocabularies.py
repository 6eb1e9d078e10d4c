"""The status vocabularies table (jobs/vocabularies.py), its API and its generated page."""

import pytest

from jobs import vocabularies as v
from jobs.choices import Phase
from jobs.services import DEFAULT_STATUS

from .conftest import API

# Statuses a job shows, per phase (DESIGN.md §2 and what the backends write).
STATUSES = {
    Phase.SUBMITTED: ["Submitted"],
    Phase.INADMISSIBLE: ["Inadmissible"],
    Phase.PENDING: ["Pending"],
    Phase.BACKOFF: ["Error"],
    Phase.PREPARING: ["ContainerCreating", "PodInitializing", "Init:1/2", "Init:Error", "Init:CrashLoopBackOff",
                      "ErrImagePull", "ImagePullBackOff", "Pending", "Something:New"],
    Phase.RUNNING: ["Running", "CrashLoopBackOff"],
    Phase.TERMINATING: ["Terminating"],
    Phase.SUCCEEDED: ["Succeeded"],
    Phase.FAILED: ["Fail", "ContainerCannotRun"],
    Phase.CANCELLED: ["Cancelled", "Stopped", "Deleted"],
    Phase.TIMED_OUT: ["TimedOut"],
    Phase.PREEMPTED: ["Preempted"],
    Phase.UNKNOWN: ["Unknown"],
}
CASES = [(p, s) for p, statuses in STATUSES.items() for s in statuses]


def test_every_phase_has_a_catch_all_row():
    for phase in Phase:
        assert any(r.phase == phase and r.status == "*" for r in v.ROWS), phase
        assert v.row_for(phase, DEFAULT_STATUS[phase]).phase == phase
    for phase in Phase:  # the catch-all is the last row of its phase
        rows = [r for r in v.ROWS if r.phase == phase]
        assert rows[-1].status == "*" and all(r.status != "*" for r in rows[:-1])


@pytest.mark.parametrize("phase,status", CASES)
@pytest.mark.parametrize("vocabulary", list(v.VOCABULARIES))
def test_both_ways_stay_consistent(vocabulary, phase, status):
    shown = v.to_vocabulary(vocabulary, phase, status)
    reverse_key = shown.code if vocabulary == v.MODELARTS else shown.status
    back = v.from_vocabulary(vocabulary, reverse_key)  # every status we show is one they have
    assert v.consistent(phase, back), (vocabulary, phase, status, shown, back)


def test_every_documented_status_maps_back():
    assert sorted(v.REVERSE[v.MODELARTS]) == list(range(22)) == sorted(v.MODELARTS_CODES)
    assert set(v.REVERSE[v.KUEUE]) == {"Submitted", "Inadmissible", "Pending", "Admitted", "Succeeded", "Failed"}
    assert set(v.REVERSE[v.MCLI]) == {"PENDING", "QUEUED", "STARTING", "RUNNING", "TERMINATING", "COMPLETED",
                                      "STOPPED", "FAILED"}
    assert set(v.REVERSE[v.PRIMEHUB]) == {"pending", "preparing", "running", "succeeded", "failed", "cancelled"}
    for row in v.ROWS:  # what we show forward is known backward
        assert row.kueue in v.REVERSE[v.KUEUE] and row.mcli in v.REVERSE[v.MCLI]
        assert row.primehub in v.REVERSE[v.PRIMEHUB] and row.modelarts in v.MODELARTS_CODES
        assert row.runai == v.SAME or row.runai in v.REVERSE[v.RUNAI]


@pytest.mark.parametrize(
    "vocabulary,status,phase",
    [("runai", "Init:3/4", Phase.PREPARING), ("runai", "Deleted", Phase.CANCELLED), ("runai", "Error", Phase.BACKOFF),
     ("jobq", "Admitted", Phase.RUNNING), ("kueue", "Inadmissible", Phase.INADMISSIBLE),
     ("mcli", "queued", Phase.PENDING), ("mcli", "STOPPED", Phase.CANCELLED), ("mcli", "COMPLETED", Phase.SUCCEEDED),
     ("modelarts", 8, Phase.RUNNING), ("modelarts", "14", Phase.UNKNOWN), ("modelarts", "JOBSTAT_KILLING",
                                                                         Phase.TERMINATING),
     ("primehub", "Preparing", Phase.PREPARING)],
)
def test_from_theirs_to_ours(vocabulary, status, phase):
    assert v.from_vocabulary(vocabulary, status) == phase


@pytest.mark.parametrize(
    "vocabulary,phase,status,expected",
    [("runai", Phase.PREPARING, "Init:1/2", "Init:1/2"), ("runai", Phase.SUBMITTED, "Submitted", "Pending"),
     ("runai", Phase.CANCELLED, "Stopped", "Deleted"), ("mcli", Phase.PREPARING, "ErrImagePull", "STARTING"),
     ("mcli", Phase.TIMED_OUT, "TimedOut", "STOPPED"), ("kueue", Phase.PENDING, "Pending", "Submitted"),
     ("primehub", Phase.UNKNOWN, "Unknown", "running"), ("modelarts", Phase.UNKNOWN, "Unknown", "JOBSTAT_LOST")],
)
def test_from_ours_to_theirs(vocabulary, phase, status, expected):
    assert v.to_vocabulary(vocabulary, phase, status).status == expected


def test_unknown_vocabulary_and_status():
    with pytest.raises(v.UnknownVocabulary):
        v.normalise("slurm")
    with pytest.raises(KeyError):
        v.from_vocabulary("mcli", "SLEEPING")
    with pytest.raises(KeyError):
        v.from_vocabulary("modelarts", 22)


def test_committed_doc_is_the_generated_one():
    assert v.DOC_PATH.exists(), "run: python -m jobs.vocabularies --write"
    assert v.DOC_PATH.read_text(encoding="utf-8") == v.render_markdown(), (
        "docs/status-vocabularies.md is stale: run python -m jobs.vocabularies --write"
    )
    assert v.main(["--check"]) == 0


def test_doc_lists_every_row_and_code():
    text = v.render_markdown()
    for code, name in v.MODELARTS_CODES.items():
        assert f"| {code} {name} |" in text
    assert text.count("\n| ") >= len(v.ROWS) + sum(len(t) for t in v.REVERSE.values())


@pytest.mark.django_db
def test_vocabularies_endpoint(world, client_for):
    data = client_for("bob").get(API + "vocabularies/").json()
    assert set(data["vocabularies"]) == set(v.VOCABULARIES)
    assert len(data["rows"]) == len(v.ROWS)
    assert data["reverse"]["modelarts"]["13"] == "CANCELLED"
    assert data["rows"][0] == {"phase": "SUBMITTED", "status": "*", "runai": "Pending", "kueue": "Submitted",
                               "mcli": "PENDING", "modelarts": 4, "modelarts_name": "JOBSTAT_SUBMIT_TRYING",
                               "primehub": "pending", "note": v.ROWS[0].note}
