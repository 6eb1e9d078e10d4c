"""The submit form: choices per group (htmx and without JS), the happy path, errors next to fields, clone."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from jobs.choices import Priority
from jobs.forms import parse_env
from jobs.models import InstanceType, Job

from .conftest import field_block

pytestmark = pytest.mark.django_db

SUBMIT = reverse("jobs:submit")


def valid(**over) -> dict:
    data = {
        "name": "", "group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny",
        "command": "echo hello", "env": "", "replicas": "1", "job_type": "training", "priority": "normal",
        "timeout": "", "retries": "",
    }
    data.update(over)
    return data


@pytest.fixture
def research_only(world):
    it = InstanceType.objects.create(name="research-only", gpu=8, cpu_millicores=64000, memory_bytes=256 << 30)
    it.groups.add(world.groups["research"])
    return it


def options(html: str, name: str) -> list[str]:
    select = re.search(rf'<select name="{name}"[^>]*>(.*?)</select>', html, re.S)
    assert select, f"no select {name}"
    return re.findall(r'<option value="([^"]*)"', select.group(1))


def selected(html: str, name: str) -> str | None:
    select = re.search(rf'<select name="{name}"[^>]*>(.*?)</select>', html, re.S)
    found = re.search(r'<option value="([^"]*)"[^>]* selected>', select.group(1))
    return found.group(1) if found else None


# --- the form -----------------------------------------------------------------------------------------------


def test_form_offers_the_users_groups_and_their_choices(login, client, research_only):
    html = login("bob").get(SUBMIT).content.decode()
    assert options(html, "group") == ["phusers"]
    assert options(html, "image") == ["base-notebook"]
    assert options(html, "instance_type") == ["cpu-tiny", "gpu-1", "gpu-2", "gpu-4"]
    assert options(html, "priority") == ["low", "normal", "high"]
    assert selected(html, "priority") == "normal"
    assert options(html, "job_type") == ["training", "interactive"]
    assert 'hx-get="/jobs/new/"' in html and 'hx-select="#group-fields"' in html


def test_form_shows_the_groups_quota(login, client, world):
    html = login("bob").get(SUBMIT).content.decode()
    assert "Quota of phusers" in html


def test_htmx_group_switch_shows_only_that_groups_instance_types(login, client, research_only):
    login("lin")
    research = client.get(SUBMIT, {"group": "research"}, headers={"HX-Request": "true"})
    html = research.content.decode()
    assert research.status_code == 200
    assert "<html" not in html  # only the fragment that hx-select picks
    assert html.strip().startswith('<div id="group-fields"')
    assert "research-only" in options(html, "instance_type")
    assert "Quota of research" in html

    phusers = client.get(SUBMIT, {"group": "phusers"}, headers={"HX-Request": "true"}).content.decode()
    assert "research-only" not in phusers
    assert options(phusers, "instance_type") == ["cpu-tiny", "gpu-1", "gpu-2", "gpu-4"]


def test_group_switch_keeps_a_choice_still_allowed(login, client, world):
    login("lin")
    html = client.get(SUBMIT, {"group": "research", "instance_type": "gpu-2"},
                      headers={"HX-Request": "true"}).content.decode()
    assert selected(html, "instance_type") == "gpu-2"


def test_group_switch_ignores_groups_of_others(login, client, research_only):
    html = login("bob").get(SUBMIT, {"group": "research"}, headers={"HX-Request": "true"}).content.decode()
    assert "research-only" not in html
    assert "Quota of phusers" in html


def test_group_switch_without_js(login, client, research_only):
    login("lin")
    response = client.post(SUBMIT, valid(group="research", command="echo kept", refresh="1"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" in html
    assert selected(html, "group") == "research"
    assert "research-only" in options(html, "instance_type")
    assert "echo kept</textarea>" in html
    assert 'class="field-errors"' not in html
    assert Job.objects.count() == 0


def test_user_without_groups_is_told(client, make_user):
    client.force_login(make_user("loner"))
    html = client.get(SUBMIT).content.decode()
    assert "not a member of any group" in html
    assert 'id="submit-form"' not in html


# --- happy path ---------------------------------------------------------------------------------------------


def test_submit_creates_the_job_and_redirects(login, client, world):
    response = login("bob").post(SUBMIT, valid(
        name="my-run", instance_type="gpu-1", command="python train.py\n", env="LR=0.1\n\n# comment\nEPOCHS=3",
        replicas="2", job_type="training", priority="high", timeout="3600", retries="2",
    ))
    job = Job.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("jobs:detail", kwargs={"pk": job.pk})
    assert (job.name, job.group.name, job.user.username, job.instance_type.name) == ("my-run", "phusers", "bob",
                                                                                      "gpu-1")
    assert job.command == "python train.py\n"
    assert job.env == {"LR": "0.1", "EPOCHS": "3"}
    assert job.replicas == 2
    assert job.priority == Priority.HIGH
    assert job.active_deadline_seconds == 3600
    assert job.backoff_limit == 2
    assert job.phase == "SUBMITTED"
    page = client.get(response["Location"]).content.decode()
    assert f"Job #{job.pk} “my-run” submitted to phusers." in page


def test_submit_blank_optional_fields_get_defaults(login, client, settings, world):
    login("bob").post(SUBMIT, valid(command="python -m train"))
    job = Job.objects.get()
    assert job.name == "python"
    assert job.active_deadline_seconds == settings.JOBSITE_DEFAULT_ACTIVE_DEADLINE_SECONDS
    assert job.backoff_limit == settings.JOBSITE_DEFAULT_BACKOFF_LIMIT
    assert job.priority == Priority.NORMAL
    assert job.env == {}


@pytest.mark.parametrize("label,value", [("low", Priority.LOW), ("normal", Priority.NORMAL),
                                         ("high", Priority.HIGH)])
def test_priority_labels_map_to_values(login, client, world, label, value):
    login("bob").post(SUBMIT, valid(priority=label))
    assert Job.objects.get().priority == value


def test_retries_zero_is_kept(login, client, world):
    login("bob").post(SUBMIT, valid(retries="0"))
    assert Job.objects.get().backoff_limit == 0


# --- errors next to the field, nothing written --------------------------------------------------------------


@pytest.mark.parametrize(
    "user,over,field,message",
    [
        ("bob", {"instance_type": "gpu-80x"}, "instance_type", "Unknown instance type &#x27;gpu-80x&#x27;."),
        ("bob", {"instance_type": "research-only"}, "instance_type",
         "Instance type &#x27;research-only&#x27; is not allowed in group &#x27;phusers&#x27;."),
        ("bob", {"image": "nope"}, "image", "Unknown image &#x27;nope&#x27;."),
        ("bob", {"env": "GOOD=1\n1BAD=x"}, "env", "Line 2 (1BAD=x): &#x27;1BAD&#x27; is not a valid variable name"),
        ("bob", {"env": "1BAD=x"}, "env", "Line 1 (1BAD=x)"),
        ("bob", {"env": "NOEQUALS"}, "env", "Line 1 (NOEQUALS): expected KEY=VALUE."),
        ("bob", {"env": "A=1\nA=2"}, "env", "Line 2: A is set twice."),
        ("bob", {"env": "RANK=3"}, "env", "&#x27;RANK&#x27; is set by jobsite"),
        ("bob", {"command": ""}, "command", "Enter a command."),
        ("bob", {"command": "   \n  "}, "command", "Enter a command."),
        ("bob", {"command": "x" * (64 * 1024 + 1)}, "command", "longer than 64 KiB"),
        ("lin", {"group": "research", "instance_type": "gpu-4", "replicas": "2"}, "replicas",
         "This job can never run: it asks 8 GPU, more than the user GPU quota 4 GPU in research."),
        ("bob", {"replicas": "0"}, "replicas", "greater than or equal to 1"),
        ("bob", {"replicas": "two"}, "replicas", "Enter a whole number."),
        ("bob", {"timeout": "-5"}, "timeout", "greater than or equal to 1"),
        ("bob", {"retries": "1000"}, "retries", "less than or equal to 100"),
        ("bob", {"group": "research"}, "group", "You are not a member of group &#x27;research&#x27;."),
        ("bob", {"name": "x" * 129}, "name", "at most 128 characters"),
        ("bob", {"priority": "urgent"}, "priority", "Select a valid choice."),
    ],
)
def test_bad_input_shows_error_next_to_the_field(login, client, research_only, user, over, field, message):
    response = login(user).post(SUBMIT, valid(**over))
    assert response.status_code == 200
    html = response.content.decode()
    block = field_block(html, field)
    assert 'class="field has-error' in block
    assert message in block, block
    assert "fix the fields marked below" in html
    assert Job.objects.count() == 0


def test_errors_keep_what_was_typed(login, client, world):
    html = login("bob").post(SUBMIT, valid(command="", env="1BAD=x", name="keep-me")).content.decode()
    assert 'value="keep-me"' in html
    assert "1BAD=x</textarea>" in html
    # Both the form's and the service's errors are shown at once.
    assert "Enter a command." in field_block(html, "command")
    assert "Line 1" in field_block(html, "env")
    assert Job.objects.count() == 0


def test_parse_env():
    assert parse_env("A=1\r\nB= spaced = \n\n# c\n C=x") == {"A": "1", "B": " spaced = ", "C": "x"}


# --- clone ----------------------------------------------------------------------------------------------------


def test_clone_prefills_the_form(login, client, submit):
    job = submit("lin", "gpu-2", group="research", name="orig", command="python train.py --x 1",
                 env={"A": "1", "B": "two"}, replicas=2, job_type="interactive", priority=Priority.HIGH,
                 active_deadline_seconds=600, backoff_limit=1)
    login("lin")
    html = client.get(SUBMIT, {"clone": job.pk}).content.decode()
    assert f"Cloned from <a href=\"{reverse('jobs:detail', kwargs={'pk': job.pk})}\">#{job.pk} orig</a>" in html
    assert selected(html, "group") == "research"
    assert selected(html, "instance_type") == "gpu-2"
    assert selected(html, "image") == "base-notebook"
    assert selected(html, "job_type") == "interactive"
    assert selected(html, "priority") == "high"
    assert 'name="name" value="orig"' in html
    assert ">\npython train.py --x 1</textarea>" in html
    assert ">\nA=1\nB=two</textarea>" in html
    assert 'name="replicas" value="2"' in html
    assert 'name="timeout" value="600"' in html
    assert 'name="retries" value="1"' in html


def test_clone_submits_the_same_spec(login, client, submit):
    orig = submit("bob", "gpu-1", command="python a.py", env={"K": "v"}, priority=Priority.LOW, replicas=3)
    login("bob")
    client.get(SUBMIT, {"clone": orig.pk})
    client.post(SUBMIT, valid(name=orig.name, instance_type="gpu-1", command="python a.py", env="K=v",
                              replicas="3", priority="low", timeout=str(orig.active_deadline_seconds),
                              retries=str(orig.backoff_limit)))
    clone = Job.objects.exclude(pk=orig.pk).get()
    fields = ["name", "group_id", "image_id", "instance_type_id", "command", "env", "replicas", "job_type",
              "priority", "active_deadline_seconds", "backoff_limit"]
    assert {f: getattr(clone, f) for f in fields} == {f: getattr(orig, f) for f in fields}


def test_clone_of_invisible_job_is_404(login, client, submit):
    job = submit("eve", group="other")
    assert login("bob").get(SUBMIT, {"clone": job.pk}).status_code == 404
    assert client.get(SUBMIT, {"clone": "abc"}).status_code == 404
