"""jobctl end to end: login, submit -f, list, get, describe, logs -f, cancel, errors and exit codes."""

from __future__ import annotations

import json
import stat
import time
import urllib.error
import urllib.request

import pytest
import yaml
from rest_framework.authtoken.models import Token

from jobs import services
from jobs.choices import Phase
from jobs.logs import log_path
from jobs.models import Attempt, Job
from scheduler.passes import schedule_pass
from scheduler.sync import housekeeping, sync_jobs
from tests.waiting import wait_for

from .conftest import free_port

pytestmark = pytest.mark.django_db(transaction=True)

JOB_YAML = """\
name: hello
group: phusers
image: base-notebook
instance_type: gpu-1
command: |
  echo hello
  sleep 1
  echo "rank $RANK of $WORLD_SIZE"
  echo bye
env:
  EPOCHS: 3
"""


def tick() -> None:
    schedule_pass()
    sync_jobs()
    housekeeping()


def submit_file(cli, tmp_path, text: str = JOB_YAML) -> int:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    result = cli("submit", "-f", str(path), "-o", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["id"]


# --- login ------------------------------------------------------------------------------------------------------


def test_login_stores_the_token_for_the_owner_only(jobctl, world):
    result = jobctl("login", "-u", "bob", "-p", "pw-bob")
    assert result.returncode == 0, result.stderr
    assert "Logged in" in result.stderr and "bob" in result.stderr

    config = json.loads(jobctl.config_file.read_text())
    assert config["current"] == jobctl.url
    assert config["servers"][jobctl.url] == {"username": "bob", "token": Token.objects.get(user__username="bob").key}
    assert stat.S_IMODE(jobctl.config_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(jobctl.config_file.parent.stat().st_mode) == 0o700


def test_login_prompts_when_not_given(jobctl):
    result = jobctl("login", input="bob\npw-bob\n")
    assert result.returncode == 0, result.stderr
    assert jobctl.config_file.exists()


def test_login_with_a_wrong_password(jobctl):
    result = jobctl("login", "-u", "bob", "-p", "nope")
    assert result.returncode == 1
    assert "Unable to log in" in result.stderr
    assert "Traceback" not in result.stderr
    assert not jobctl.config_file.exists()


def test_not_logged_in_says_how_to(jobctl):
    result = jobctl("list")
    assert result.returncode == 1
    assert "jobctl login" in result.stderr


def test_logout(bob):
    [entry] = json.loads(bob.config_file.read_text())["servers"].values()
    token = entry["token"]
    result = bob("logout")
    assert result.returncode == 0
    assert "token revoked" in result.stderr
    assert bob("list").returncode == 1
    # The token is revoked on the server too: a saved copy of it is of no use.
    request = urllib.request.Request(bob.url + "/api/v1/jobs/", headers={"Authorization": f"Token {token}"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(request, timeout=10)
    assert exc.value.code == 401


# --- submit, list, get, describe ---------------------------------------------------------------------------------


def test_submit_file_list_and_get(bob, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB_YAML)
    result = bob("submit", "-f", str(path))
    assert result.returncode == 0, result.stderr
    job = Job.objects.get()
    assert f"job {job.pk} (hello) submitted to phusers" in result.stdout
    assert (job.user.username, job.env, job.instance_type.name) == ("bob", {"EPOCHS": "3"}, "gpu-1")

    listing = bob("list")
    assert listing.returncode == 0, listing.stderr
    header, row = listing.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "GROUP", "USER", "STATUS", "GPUS", "AGE", "INFO"]
    assert row.split()[:6] == [str(job.pk), "hello", "phusers", "bob", "Submitted", "1"]
    assert "\x1b[" not in listing.stdout  # not a terminal: no colours

    data = bob.json("get", str(job.pk))
    assert (data["id"], data["name"], data["phase"], data["status"]) == (job.pk, "hello", "SUBMITTED", "Submitted")
    assert yaml.safe_load(bob("get", str(job.pk), "-o", "yaml").stdout)["id"] == job.pk
    assert [j["id"] for j in bob.json("list")] == [job.pk]

    shown = bob("get", str(job.pk)).stdout
    assert "Status:" in shown and "Submitted" in shown


def test_submit_with_flags_and_a_command_after_dashes(bob):
    result = bob("submit", "-g", "phusers", "--image", "base-notebook", "-t", "cpu-tiny", "--name", "args",
                 "-e", "A=1", "--priority", "high", "--", "python3", "-c", "print('a b')")
    assert result.returncode == 0, result.stderr
    job = Job.objects.get()
    assert (job.name, job.command, job.env, job.priority) == ("args", "python3 -c 'print('\"'\"'a b'\"'\"')'",
                                                              {"A": "1"}, 100)


def test_file_fields_can_be_overridden_by_flags(bob, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB_YAML)
    assert bob("submit", "-f", str(path), "--name", "other", "-e", "LR=0.1").returncode == 0
    job = Job.objects.get()
    assert (job.name, job.env) == ("other", {"EPOCHS": "3", "LR": "0.1"})


def test_describe_shows_spec_attempts_and_events(bob, tmp_path):
    job_id = submit_file(bob, tmp_path)
    schedule_pass()
    result = bob("describe", str(job_id))
    assert result.returncode == 0, result.stderr
    for text in ("Spec", "Image:", "base-notebook", "Command:", "echo hello", "EPOCHS=3", "Attempts", "Events",
                 "Submitted by bob to phusers", "Admitted"):
        assert text in result.stdout, text
    data = bob.json("describe", str(job_id))
    assert data["attempts"][0]["number"] == 1 and data["events"][0]["reason"] == "Submitted"


def test_list_filters_and_vocabulary(bob, submit):
    a = submit("bob", name="first")
    b = submit("pan", name="second")
    assert [j["id"] for j in bob.json("list", "--user", "pan")] == [b.pk]
    assert [j["id"] for j in bob.json("list", "-q", "first")] == [a.pk]
    assert [j["id"] for j in bob.json("list", "--phase", "SUBMITTED", "--limit", "1")] == [b.pk]
    assert len(bob.json("list", "--all")) == 2

    table = bob("list", "--vocabulary", "modelarts").stdout
    assert "MODELARTS" in table.splitlines()[0] and "4 JOBSTAT_SUBMIT_TRYING" in table
    data = bob.json("get", str(a.pk), "--vocabulary", "mcli")
    assert data["vocabulary_status"] == "PENDING"


def test_colours_follow_the_ui_and_no_color(bob, submit):
    submit("bob")
    orange = "\x1b[38;2;253;134;8mSubmitted\x1b[0m"  # the UI's #fd8608
    assert orange in bob("list", "--color", "always").stdout
    assert "\x1b[" not in bob("list", "--color", "auto").stdout  # a pipe is not a terminal
    assert "\x1b[" not in bob("list", "--color", "never").stdout
    assert "\x1b[" not in bob("list", env={"NO_COLOR": "1"}).stdout


# --- logs ---------------------------------------------------------------------------------------------------------


def test_logs_of_a_replica(bob, submit):
    job = submit("bob", "gpu-1", replicas=2)
    schedule_pass()
    job.refresh_from_db()
    for rank, text in ((0, "rank zero\n"), (1, "rank one\n")):
        path = log_path(job.current_attempt, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    assert bob("logs", str(job.pk)).stdout == "rank zero\n"
    assert bob("logs", str(job.pk), "--replica", "1").stdout == "rank one\n"
    assert bob("logs", str(job.pk), "--replica", "1", "--attempt", "1", "--tail", "4").stdout == "one\n"
    missing = bob("logs", str(job.pk), "--replica", "5")
    assert (missing.returncode, missing.stdout) == (4, "")
    assert "Replica 5 does not exist" in missing.stderr

    services.job_transition(job=job, phase=Phase.SUCCEEDED, exit_code=0)  # ended: -f prints what is left and stops
    assert bob("logs", "-f", str(job.pk), "--tail", "4", "--replica", "1").stdout == "one\n"
    assert bob("logs", "-f", str(job.pk)).stdout == "rank zero\n"


def test_logs_follow_a_running_job_until_it_ends(bob, tmp_path):
    job_id = submit_file(bob, tmp_path)
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as sink:
        follower = bob.popen("logs", "-f", str(job_id), "--interval", "0.2", stderr=sink)
    try:
        deadline = time.monotonic() + 20
        while "waiting for job" not in errors.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)  # it follows the job while it is still queued...
        deadline = time.monotonic() + 60
        while follower.poll() is None and time.monotonic() < deadline:
            tick()  # admit, launch the real process, observe it
            time.sleep(0.2)
        assert follower.poll() is not None, "jobctl logs -f did not stop when the job ended"
        out, _ = follower.communicate(timeout=10)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    err = errors.read_text()
    assert follower.returncode == 0, err
    assert out == "hello\nrank 0 of 1\nbye\n"  # ...and while it runs, until it ends
    assert Job.objects.get(pk=job_id).phase == Phase.SUCCEEDED
    assert f"waiting for job {job_id} to start (SUBMITTED)" in err


def write_replica_logs(attempt, texts: dict[int, str]) -> None:
    for rank, text in texts.items():
        path = log_path(attempt, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def fail_attempt(job: Job, rank: int, exit_code: int, phase: str = Phase.FAILED) -> None:
    """The first replica of the job's current attempt to fail is ``rank``: what the scheduler writes."""
    Attempt.objects.filter(pk=job.current_attempt_id).update(failed_rank=rank, exit_code=exit_code)
    services.job_transition(job=Job.objects.get(pk=job.pk), phase=phase, exit_code=exit_code)


def wait_for_text(path, text: str, process, seconds: float = 30) -> None:
    def came() -> bool:
        if text in path.read_text():
            return True
        assert process.poll() is None, f"jobctl ended early: {path.read_text()}"
        return False

    wait_for(came, timeout=seconds, message=lambda: f"{text!r}: {path.read_text()}")


@pytest.fixture
def two_ranks(submit):
    """A job of two replicas admitted once (nothing launched), with a log per rank."""
    job = submit("bob", "gpu-1", replicas=2)
    services.job_transition(job=job, phase=Phase.PENDING)
    services.job_admit(job=Job.objects.get(pk=job.pk), backend="local", placement=[{"node": "local"}] * 2)
    job.refresh_from_db()
    write_replica_logs(job.current_attempt, {0: "rank zero\n", 1: "rank one: CUDA error\n"})
    return job


def test_logs_by_rank(bob, two_ranks):
    job_id = str(two_ranks.pk)
    assert bob("logs", job_id, "--rank", "1").stdout == "rank one: CUDA error\n"
    assert bob("logs", job_id, "--replica", "1").stdout == "rank one: CUDA error\n"  # the old name still works
    assert bob("logs", job_id, "--rank", "0", "--attempt", "1").stdout == "rank zero\n"
    missing = bob("logs", job_id, "--rank", "2")
    assert (missing.returncode, missing.stdout) == (4, "")
    assert "Replica 2 does not exist" in missing.stderr

    services.job_transition(job=Job.objects.get(pk=two_ranks.pk), phase=Phase.SUCCEEDED, exit_code=0)
    assert bob("logs", "-f", job_id, "--rank", "1", "--tail", "6").stdout == "error\n"


def test_logs_of_the_first_failed_rank(bob, two_ranks):
    job_id = str(two_ranks.pk)
    none_yet = bob("logs", job_id, "--failed")
    assert (none_yet.returncode, none_yet.stdout, none_yet.stderr) == (4, "", "No replica of attempt 1 failed.\n")

    fail_attempt(two_ranks, rank=1, exit_code=3)
    result = bob("logs", job_id, "--failed")
    assert (result.returncode, result.stdout) == (0, "rank one: CUDA error\n")
    assert bob("logs", job_id, "--failed", "--attempt", "1", "--tail", "6").stdout == "error\n"
    followed = bob("logs", "-f", job_id, "--failed")  # the job has ended: what the log holds, then stop
    assert (followed.returncode, followed.stdout) == (0, "rank one: CUDA error\n")
    assert "--- attempt 1: replica 1 failed first ---" in followed.stderr


def test_logs_follow_waits_for_a_rank_to_fail_across_attempts(bob, two_ranks, tmp_path):
    job = two_ranks
    fail_attempt(job, rank=1, exit_code=3, phase=Phase.BACKOFF)  # attempt 1 failed; the job will retry
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as sink:
        follower = bob.popen("logs", "-f", str(job.pk), "--failed", "--interval", "0.1", stderr=sink)
    try:
        wait_for_text(errors, "--- attempt 1: replica 1 failed first ---", follower)
        services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.PENDING)
        second = services.job_admit(job=Job.objects.get(pk=job.pk), backend="local",
                                    placement=[{"node": "local"}, {"node": "local"}])
        write_replica_logs(second, {0: "attempt 2 rank zero: NCCL timeout\n", 1: "attempt 2 rank one\n"})
        wait_for_text(errors, f"waiting for a replica of job {job.pk} to fail (attempt 2, PREPARING)", follower)
        fail_attempt(Job.objects.get(pk=job.pk), rank=0, exit_code=1)
        out, _ = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 0, errors.read_text()
    assert out == "rank one: CUDA error\nattempt 2 rank zero: NCCL timeout\n"
    assert "--- attempt 2: replica 0 failed first ---" in errors.read_text()


def test_logs_follow_failed_when_no_rank_failed(bob, two_ranks):
    services.job_transition(job=Job.objects.get(pk=two_ranks.pk), phase=Phase.SUCCEEDED, exit_code=0)
    result = bob("logs", "-f", str(two_ranks.pk), "--failed", "--interval", "0.1")
    assert (result.returncode, result.stdout) == (4, "")
    assert result.stderr.endswith("No replica of attempt 1 failed.\n")


def test_rank_and_failed_together_is_a_usage_error(bob, two_ranks):
    for extra in (["--rank", "1"], ["--replica", "0"]):
        result = bob("logs", str(two_ranks.pk), "--failed", *extra)
        assert (result.returncode, result.stdout) == (2, "")
        assert "error: argument --rank/--replica: not allowed with argument --failed" in result.stderr
    assert "--failed" in bob("logs", "--help").stdout


def test_describe_and_get_show_the_failed_rank(bob, two_ranks):
    fail_attempt(two_ranks, rank=1, exit_code=3)
    describe = bob("describe", str(two_ranks.pk))
    assert describe.returncode == 0, describe.stderr
    lines = describe.stdout.splitlines()
    header = next(line for line in lines if line.startswith("#"))
    assert header.split()[:8] == ["#", "NODE", "STARTED", "ENDED", "OUTCOME", "EXIT", "FAILED", "RANK"]
    row = lines[lines.index(header) + 1].split()
    assert (row[0], row[5], row[6]) == ("1", "3", "1")
    assert "Failed rank:" in describe.stdout
    shown = bob("get", str(two_ranks.pk)).stdout
    assert "Failed rank:" in shown and f"jobctl logs {two_ranks.pk} --failed" in shown
    assert bob.json("describe", str(two_ranks.pk))["attempts"][0]["failed_rank"] == 1


# --- actions ----------------------------------------------------------------------------------------------------


def test_cancel_and_cancel_again(bob, submit):
    job = submit("bob")
    result = bob("cancel", str(job.pk))
    assert result.returncode == 0, result.stderr
    assert f"job {job.pk}" in result.stdout and "Cancelled" in result.stdout
    assert Job.objects.get(pk=job.pk).phase == Phase.CANCELLED

    again = bob("cancel", str(job.pk))
    assert again.returncode == 1
    assert again.stderr.strip() == f"Job #{job.pk} has already ended (Cancelled)."


def test_cancel_several(bob, submit):
    mine = [submit("bob"), submit("bob")]
    theirs = submit("pan")
    result = bob("cancel", str(mine[0].pk), str(mine[1].pk), str(theirs.pk))
    assert result.returncode == 1
    assert f"job {theirs.pk}: not cancelled" in result.stdout
    assert {j.phase for j in Job.objects.filter(user__username="bob")} == {Phase.CANCELLED}
    assert Job.objects.get(pk=theirs.pk).phase == Phase.SUBMITTED


def test_stop_restart_and_clone(bob, submit):
    job = submit("bob", name="orig")
    assert bob("stop", str(job.pk)).returncode == 0
    assert Job.objects.get(pk=job.pk).status == "Stopped"
    assert bob("restart", str(job.pk)).returncode == 0
    assert Job.objects.get(pk=job.pk).phase == Phase.PENDING
    clone = bob.json("clone", str(job.pk), "--name", "copy")
    assert clone["name"] == "copy" and clone["id"] != job.pk


def test_queue_groups_util_usage(bob, submit):
    submit("bob", "gpu-4", name="holder")
    schedule_pass()
    waiting = submit("pan", "gpu-1", name="waiter")
    schedule_pass()

    queue = bob("queue", "phusers")
    assert queue.returncode == 0, queue.stderr
    assert "waiter" in queue.stdout and "GroupQuota" in queue.stdout
    assert bob.json("queue", "phusers")[0]["id"] == waiting.pk
    assert bob("queue", "research").returncode == 4  # not bob's group

    groups = bob("groups")
    assert "phusers" in groups.stdout and "4/4" in groups.stdout
    assert "bob" in bob("groups", "phusers").stdout

    util = bob("util")
    assert util.returncode == 0 and "4 used, 4 free of 8" in util.stdout
    usage = bob.json("usage")
    assert usage["rows"][0]["user"] == "bob"
    assert bob("usage", "--since", "tomorrow").returncode == 1


def test_get_and_queue_show_the_estimated_start(bob, submit, estimates_each_pass):
    from datetime import datetime, timedelta

    from django.utils import timezone

    from scheduler.estimate import step_time
    t0 = timezone.now()
    submit("bob", "gpu-4", name="holder", active_deadline_seconds=20 * 86400)
    schedule_pass(now=t0)
    waiting = submit("pan", "gpu-4", name="waiter", active_deadline_seconds=20 * 86400)
    behind = submit("lin", "gpu-1", name="behind")  # after 40 days
    schedule_pass(now=t0)
    start = step_time(t0, t0 + timedelta(days=20)).astimezone()
    shown = f"{start:%Y-%m-%d %H:%M} at the latest (by deadlines)"
    assert start.date() != datetime.now().astimezone().date()

    get = bob("get", str(waiting.pk))
    assert get.returncode == 0, get.stderr
    assert any(line.split(None, 2)[:2] == ["Est.", "start:"] and line.endswith(shown)
               for line in get.stdout.splitlines()), get.stdout
    assert "not within 30 days" in bob("get", str(behind.pk)).stdout

    queue = bob("queue", "phusers")
    assert queue.returncode == 0, queue.stderr
    header, *rows = queue.stdout.splitlines()
    assert "EST. START" in header
    assert shown in next(r for r in rows if "waiter" in r)
    assert "not within 30 days" in next(r for r in rows if "behind" in r)


# --- errors and exit codes ----------------------------------------------------------------------------------------


def test_a_400_is_printed_plainly_with_exit_1(bob, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("group: phusers\nimage: base-notebook\ninstance_type: gpu-1\ncommand: ''\nreplicas: 0\ngpus: 2\n")
    result = bob("submit", "-f", str(path))
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert "replicas: Ensure this value is greater than or equal to 1." in lines
    assert "gpus: Unknown field." in lines
    assert "command: This field may not be blank." in lines
    assert "{" not in result.stderr and "Traceback" not in result.stderr
    assert Job.objects.count() == 0


def test_invalid_yaml_and_rules_of_the_group(bob, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("group: phusers\nimage: [base\n")
    result = bob("submit", "-f", str(path))
    assert result.returncode == 1
    assert "YAML parse error at line" in result.stderr

    path.write_text(JOB_YAML.replace("gpu-1", "gpu-4").replace("name: hello", "replicas: 2"))
    result = bob("submit", "-f", str(path))
    assert result.returncode == 1
    assert result.stderr.startswith("replicas: This job can never run")


def test_connection_refused_is_exit_3(jobctl):
    result = jobctl("list", "--server", f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 3
    assert "cannot connect" in result.stderr


def test_jobsite_url_is_used(bob):
    result = bob("list", env={"JOBSITE_URL": f"http://127.0.0.1:{free_port()}"})
    assert result.returncode == 3


def test_not_found_is_exit_4(bob):
    result = bob("get", "999999")
    assert result.returncode == 4
    assert "No job 999999" in result.stderr


def test_usage_errors_are_exit_2(bob, tmp_path):
    assert bob("list", "--bogus").returncode == 2
    assert bob("get", "not-a-number").returncode == 2
    assert bob("submit").returncode == 2
    missing = bob("submit", "-f", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    assert bob("submit", "-g", "phusers", "-e", "NOEQUALS", "-c", "true").returncode == 2
    assert bob("list", "--", "extra").returncode == 2


def test_help_documents_exit_codes(jobctl):
    result = jobctl("--help")
    assert result.returncode == 0
    for text in ("exit codes:", "0  success", "1  the server refused", "2  usage error", "3  cannot connect",
                 "4  not found", "JOBSITE_URL", "NO_COLOR", "--output"):
        assert text in result.stdout, text
    for command in ("login", "submit", "list", "get", "describe", "logs", "cancel", "stop", "restart", "clone",
                    "queue", "util", "usage"):
        assert command in result.stdout


def test_one_word_after_dashes_is_a_shell_command_that_runs_as_such(bob):
    """`jobctl submit -- 'echo a; exit 3'` (issue 22.7: it ran as one word, exit 127): the job runs the shell
    command and ends FAILED with its exit code."""
    from scheduler.passes import schedule_pass
    from scheduler.sync import sync_jobs

    result = bob("submit", "-g", "phusers", "--image", "base-notebook", "-t", "cpu-tiny", "--backoff-limit", "0",
                 "--", "echo a; exit 3")
    assert result.returncode == 0, result.stderr
    job = Job.objects.get()
    assert job.command == "echo a; exit 3"
    deadline = time.monotonic() + 60
    while job.phase not in (Phase.SUCCEEDED, Phase.FAILED) and time.monotonic() < deadline:
        schedule_pass()
        sync_jobs()
        job.refresh_from_db()
        time.sleep(0.1)
    assert (job.phase, job.exit_code) == (Phase.FAILED, 3), job.message
