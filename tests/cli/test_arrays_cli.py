"""jobctl for arrays, dependencies and notifications, end to end against the live test server: submit --array /
--sweep / --after, get array/<id>, notify add / list / rm, and their usage errors and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.models import Job, JobArray, JobDependency, NotificationSubscription

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
SPEC = ["-g", "phusers", "--image", "base-notebook", "-t", "cpu-tiny", "--name", "train"]


@pytest.fixture
def cli(bob):
    """bob's jobctl, running this checkout's code (whatever the virtualenv's install points at)."""
    bob.env["PYTHONPATH"] = str(REPO)
    return bob


def submit(cli, *flags: str) -> dict:
    result = cli("submit", *SPEC, *flags, "-o", "json", "--", "echo $JOB_ARRAY_INDEX")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# --- arrays and sweeps (the array service and API) -----------------------------------------------------------


def test_submit_array_prints_the_array_and_its_members_count(cli):
    result = cli("submit", *SPEC, "--array", "0-4%2", "--", "echo $JOB_ARRAY_INDEX")

    assert result.returncode == 0, result.stderr
    array = JobArray.objects.get()
    assert (array.size, array.max_running) == (5, 2)
    assert f"array {array.pk} (train) submitted to phusers: 5 members, at most 2 at once" in result.stdout
    assert f"jobctl get array/{array.pk}" in result.stdout


def test_submit_sweep_sends_numbers_as_numbers(cli):
    array = submit(cli, "--sweep", "lr=1e-4,3e-4", "--sweep", "bs=32,64", "--array", "%2")

    assert array["size"] == 4 and array["max_running"] == 2
    assert JobArray.objects.get().sweep == {"lr": [0.0001, 0.0003], "bs": [32, 64]}
    assert [m["array_params"] for m in array["members"]] == [
        {"lr": lr, "bs": bs} for lr in (0.0001, 0.0003) for bs in (32, 64)]
    assert {m["name"] for m in array["members"]} >= {"train[lr=0.0001,bs=32]"}


def test_get_array_shows_its_counts_and_members(cli):
    array = submit(cli, "--array", "0-2")

    result = cli("get", f"array/{array['id']}", "--color", "never")

    assert result.returncode == 0, result.stderr
    assert "array of 3" in result.stdout and "Submitted 3" in result.stdout
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("ID"))
    assert "INDEX" in lines[header] and "STATUS" in lines[header]
    assert [line.split()[1] for line in lines[header + 1:]] == ["0", "1", "2"]
    data = cli.json("get", f"array/{array['id']}")
    assert [m["id"] for m in data["members"]] == [m["id"] for m in array["members"]]


def test_get_an_array_that_is_not_there_exits_4(cli):
    result = cli("get", "array/999999")
    assert result.returncode == 4


def test_a_bad_array_is_the_servers_field_error_and_nothing_is_made(cli):
    result = cli("submit", *SPEC, "--array", "9-x", "--", "true")
    assert result.returncode == 1
    assert result.stderr.startswith("array: ")
    assert not JobArray.objects.exists() and not Job.objects.exists()


@pytest.mark.parametrize("flags, message", [
    (["--sweep", "lr"], "--sweep 'lr': use NAME=VALUE,VALUE,..."),
    (["--sweep", "lr=1", "--sweep", "lr=2"], "--sweep lr is given twice"),
    (["--after", "12:maybe"], "--after '12:maybe': use ID, ID:ok|notok|any"),
    (["--after", "job/x"], "--after 'job/x'"),
])
def test_bad_flags_are_usage_errors(cli, flags, message):
    result = cli("submit", *SPEC, *flags, "--", "true")
    assert result.returncode == 2
    assert message in result.stderr
    assert not Job.objects.exists()


def test_get_takes_a_job_or_an_array_only(cli):
    result = cli("get", "thing/3")
    assert result.returncode == 2 and "give a job id (42) or an array (array/5)" in result.stderr


# --- dependencies ------------------------------------------------------------------------------------------------


def test_submit_after_a_job_and_an_array(cli):
    first = submit(cli)
    array = submit(cli, "--array", "0-1")

    job = submit(cli, "--after", str(first["id"]), "--after", f"array/{array['id']}:any")

    deps = {(d.on_job_id, d.on_array_id, d.when) for d in JobDependency.objects.filter(job_id=job["id"])}
    assert deps == {(first["id"], None, "ok"), (None, array["id"], "any")}
    assert Job.objects.get(pk=job["id"]).reason == "Dependency"


# --- notifications -------------------------------------------------------------------------------------------


def test_notify_add_list_rm(cli, settings, world):
    world.users["bob"].email = "bob@example.org"
    world.users["bob"].save(update_fields=["email"])
    settings.JOBSITE_NOTIFY_ALLOW_HOSTS = ["127.0.0.1"]  # a local receiver the admin allows
    result = cli("notify", "add", "--webhook", "http://127.0.0.1:9/x", "--slack", "--on", "ended,failed")
    assert result.returncode == 0, result.stderr
    sub = NotificationSubscription.objects.get()
    assert (sub.channel, sub.url, sub.slack, sub.events) == ("webhook", "http://127.0.0.1:9/x", True,
                                                             ["ended", "failed"])
    assert f"notification {sub.pk} added: ended, failed" in result.stdout

    result = cli("notify", "add", "--email", "--on", "running", "--on", "succeeded")
    assert result.returncode == 0, result.stderr
    mail = NotificationSubscription.objects.get(channel="email")
    assert sorted(mail.events) == ["running", "succeeded"]

    listed = cli("notify", "list")
    assert listed.returncode == 0, listed.stderr
    assert "http://127.0.0.1:9/x" in listed.stdout and "webhook (slack)" in listed.stdout
    assert (mail.email or "(your account's address)") in listed.stdout
    assert [s["id"] for s in cli.json("notify", "list")] == [sub.pk, mail.pk]

    removed = cli("notify", "rm", str(sub.pk))
    assert removed.returncode == 0 and f"notification {sub.pk} removed" in removed.stdout
    assert list(NotificationSubscription.objects.values_list("pk", flat=True)) == [mail.pk]
    assert cli("notify", "rm", str(sub.pk)).returncode == 4


@pytest.mark.parametrize("args, code, message", [
    (["notify", "add", "--webhook", "https://hooks.example.org/x", "--on", "nope"], 2, "--on 'nope': events are"),
    (["notify", "add", "--email", "--slack", "--on", "ended"], 2, "--slack is a webhook's body"),
    (["notify", "add", "--on", "ended"], 2, "one of the arguments --webhook --email is required"),
    (["notify", "add", "--webhook", "http://127.0.0.1:9/x", "--on", "ended"], 1, "url: "),
])
def test_notify_add_errors(cli, args, code, message):
    result = cli(*args)
    assert result.returncode == code
    assert message in result.stderr
    assert not NotificationSubscription.objects.exists()


def test_help_lists_the_new_commands(cli):
    result = cli("--help")
    assert "notify" in result.stdout and "array/ID" in result.stdout
    submit_help = cli("submit", "--help").stdout
    for flag in ("--array", "--sweep", "--after"):
        assert flag in submit_help
