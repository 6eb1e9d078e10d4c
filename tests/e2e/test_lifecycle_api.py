"""The lifecycle rules through the API of the embedded default (`make run`), with real processes and clocks."""

import pytest

from tests.waiting import wait_for

from .api import call

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def api(embedded_server):
    base = embedded_server
    tokens = {u: call(base, "POST", "/api/v1/auth/token/", {"username": u, "password": "smoke-pass"})["token"]
              for u in ("bob", "pan", "lin")}

    class Api:
        def submit(self, user, **spec):
            body = {"group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny", **spec}
            return call(base, "POST", "/api/v1/jobs/", body, token=tokens[user])

        def get(self, user, job):
            return call(base, "GET", f"/api/v1/jobs/{job['id']}/", token=tokens[user])

        def post(self, user, job, action):
            return call(base, "POST", f"/api/v1/jobs/{job['id']}/{action}/", {}, token=tokens[user])

        def wait(self, user, job, phases, timeout=60, check=None):
            seen = [job]

            def reached():
                seen.append(self.get(user, seen[-1]))
                return seen[-1]["phase"] in phases and (check is None or check(seen[-1])) and seen[-1]

            return wait_for(reached, timeout=timeout, interval=0.3, message=lambda: (
                f"one of {sorted(phases)}: job {seen[-1]['id']} stayed {seen[-1]['phase']} ({seen[-1]['status']}: "
                f"{seen[-1]['message']})"))

    return Api()


def test_exit_1_with_backoff_limit_2_makes_3_attempts_then_fails(api):
    job = api.submit("bob", command="echo attempt $JOB_ATTEMPT; exit 1", backoff_limit=2)
    job = api.wait("bob", job, {"FAILED"}, timeout=90)  # backoff 10 s, then 20 s
    assert (job["status"], job["exit_code"]) == ("Fail", 1)
    assert [a["number"] for a in job["attempts"]] == [1, 2, 3]
    assert "Error" in [e["reason"] for e in job["events"]]


def test_sleep_600_with_deadline_5_ends_timed_out(api):
    job = api.submit("bob", command="sleep 600", active_deadline_seconds=5)
    job = api.wait("bob", job, {"TIMED_OUT"}, timeout=40)
    assert job["status"] == "TimedOut" and job["color"] == "#afafaf"


def test_high_priority_preempts_low_priority_preemptible_job_which_runs_again(api):
    low = api.submit("pan", instance_type="gpu-4", command="sleep 600", preemptible=True, priority="low")
    api.wait("pan", low, {"RUNNING"})
    high = api.submit("bob", instance_type="gpu-4", command="sleep 3", priority="high")
    api.wait("bob", high, {"SUCCEEDED"}, timeout=60)
    low = api.wait("pan", low, {"RUNNING"}, timeout=60, check=lambda j: j["current_attempt"] == 2)
    assert any(e["reason"] == "Preempted" and f"#{high['id']}" in e["message"] for e in low["events"])
    first = low["attempts"][0]
    assert first["outcome"] == "Preempted"
    reasons = [e["reason"] for e in low["events"]]
    assert reasons.index("Preempted") < reasons.index("Terminated") < len(reasons) - 1  # then back in the queue
    api.post("pan", low, "cancel")


def test_stopped_job_restarts_as_attempt_2(api):
    job = api.submit("lin", command="sleep 600")
    api.wait("lin", job, {"RUNNING"})
    api.post("lin", job, "stop")
    job = api.wait("lin", job, {"CANCELLED"}, timeout=20)
    assert job["status"] == "Stopped"
    api.post("lin", job, "restart")
    job = api.wait("lin", job, {"RUNNING"})
    assert job["current_attempt"] == 2
    api.post("lin", job, "cancel")
    api.wait("lin", job, {"CANCELLED"}, timeout=20)


def test_pending_job_reason_names_the_quota_with_numbers(api):
    holder = api.submit("bob", instance_type="gpu-4", command="sleep 600")
    api.wait("bob", holder, {"RUNNING"})
    waiting = api.submit("pan", instance_type="gpu-2", command="true")
    waiting = api.wait("pan", waiting, {"PENDING"}, check=lambda j: j["reason"] == "GroupQuota")
    assert waiting["message"] == "waiting for group GPU quota of phusers: 4 GPU used of 4 GPU, asks 2 GPU"
    assert waiting["queue_position"] == 1
    api.post("bob", holder, "cancel")
    api.wait("pan", waiting, {"SUCCEEDED"}, timeout=40)


def test_a_failing_rank_retries_the_attempt_and_jobctl_shows_its_log(api, embedded_server, tmp_path):
    """Issue's done-when: rank 1 exits 5, backoff_limit 2 → 3 attempts, FAILED, exit 5, named; logs --failed."""
    from tests.cli.conftest import JOBCTL, Jobctl

    job = api.submit("bob", replicas=2, backoff_limit=2,
                     command='if [ "$RANK" = 1 ]; then echo "rank 1 gives up"; exit 5; fi; sleep 600')
    job = api.wait("bob", job, {"FAILED"}, timeout=120)  # backoff 10 s, then 20 s
    assert (job["status"], job["exit_code"]) == ("Fail", 5)
    assert "rank 1 exited with code 5" in job["message"]
    assert [(a["number"], a["failed_rank"], a["exit_code"]) for a in job["attempts"]] == [(n, 1, 5) for n in (1, 2, 3)]
    jobctl = Jobctl(embedded_server, tmp_path)
    assert jobctl("login", "--username", "bob", "--password", "smoke-pass").returncode == 0, JOBCTL
    failed = jobctl("logs", str(job["id"]), "--failed")
    assert failed.returncode == 0 and failed.stdout.strip() == "rank 1 gives up", failed.stderr
    assert jobctl("logs", str(job["id"]), "--rank", "0").stdout == ""  # rank 0 only slept
