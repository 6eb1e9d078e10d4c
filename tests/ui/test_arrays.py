"""Arrays in the web UI: the job list shows an array as one row (counts per status, a bar in the status colours,
at its first member's place), a member's change re-renders that row once, and the array's page lists its members
with the actions on the whole array."""

from __future__ import annotations

import re

import pytest
from django.http import QueryDict
from django.urls import reverse

from jobs import catchup, live_publisher, selectors
from jobs.models import Job, JobArray

pytestmark = pytest.mark.django_db

LIST = reverse("jobs:list")


@pytest.fixture
def make_array(world, submit):
    """make_array("bob", 5, name="train") → a JobArray whose members are jobs submitted through the service."""

    def do(username: str, size: int, name: str = "train", sweep: dict | None = None, max_running: int | None = None,
           **spec) -> JobArray:
        user = world.users[username]
        array = JobArray.objects.create(name=name, group=world.groups["phusers"], user=user, size=size,
                                        indices="" if sweep else f"0-{size - 1}", sweep=sweep or {},
                                        max_running=max_running)
        for i in range(size):
            job = submit(username, name=name, **spec)
            params = {"lr": i} if sweep else {}
            Job.objects.filter(pk=job.pk).update(array=array, array_index=i, array_params=params,
                                                 name=f"{name}[{i}]")
        return array

    return do


def rows(html: str) -> list[str]:
    """The list's rows, in order: "job-N" for a job, "array-N" for an array."""
    found = re.findall(r'<tr id="job-(\d+)" data-job="\d+"(?: data-array="(\d+)")?', html)
    return [f"array-{a}" if a else f"job-{j}" for j, a in found]


def test_an_array_is_one_row_at_its_first_members_place(login, submit, make_array, make_pending):
    before = submit("bob", name="before")
    array = make_array("bob", 5)
    for member in array.members.all():
        make_pending(member)
    after = submit("pan", name="after")

    html = login("bob").get(LIST).content.decode()

    assert rows(html) == [f"job-{after.pk}", f"array-{array.pk}", f"job-{before.pk}"]
    first = array.members.order_by("id").first()
    row = re.search(rf'<tr id="job-{first.pk}".*?</tr>', html, re.S).group(0)
    assert "train" in row and "array of 5" in row
    assert 'data-status="Pending"' in row and "Pending <b>5</b>" in row
    assert f'href="{reverse("jobs:array", args=[array.pk])}"' in row
    assert re.search(r'<span class="badge-orange" style="width: 100.00%">', row)
    assert "train[1]" not in html  # the members are on the array's page, not in the list


def test_the_rows_counts_and_bar_follow_its_members(login, make_array, make_pending, make_admitted):
    array = make_array("bob", 5, sweep={"lr": [1, 2, 3, 4, 5]}, max_running=2)
    members = list(array.members.order_by("id"))
    for member in members[2:]:
        make_pending(member)
    make_admitted(members[0])
    make_admitted(members[1])

    html = login("bob").get(LIST).content.decode()

    row = re.search(rf'<tr id="job-{members[0].pk}".*?</tr>', html, re.S).group(0)
    assert "sweep of 5, 2 at once" in row
    assert "Pending <b>3</b>" in row and "Preparing <b>2</b>" in row
    # The bar: the lifecycle's order (waiting first), each colour's share of the array.
    assert re.findall(r'<span class="badge-(\w+)" style="width: ([\d.]+)%">', row) == [
        ("orange", "60.00"), ("green", "40.00")]
    assert 'aria-label="Pending 3 · Preparing 2"' in row


def test_the_list_with_arrays_has_no_n_plus_one(login, submit, make_array, client, django_assert_max_num_queries):
    for i in range(4):
        make_array("bob", 5, name=f"sweep{i}")
        submit("pan")
    login("bob")
    # session + user + groups + count + page + queue positions + the arrays + their counts
    with django_assert_max_num_queries(8):
        html = client.get(LIST).content.decode()
    assert len(rows(html)) == 8


def test_filters_count_an_array_once(login, make_array, make_pending):
    array = make_array("bob", 3)
    for member in array.members.all():
        make_pending(member)
    page = selectors.job_list(login("bob") and array.user, QueryDict("user=bob"), collapse_arrays=True)[0]
    assert [j.array_id for j in page] == [array.pk]
    assert selectors.job_list(array.user, QueryDict(""))[0].count() == 3  # the API's list keeps every member


def test_a_members_change_renders_its_arrays_row_once(make_array, make_pending):
    array = make_array("bob", 4)
    members = list(array.members.order_by("id"))
    make_pending(members[2])

    items = live_publisher.render_rows([members[2].pk, members[3].pk])

    assert [item["id"] for item in items] == [members[0].pk]  # the row's place: the first member
    assert f'data-array="{array.pk}"' in items[0]["row"]
    assert "Pending <b>1</b>" in items[0]["row"] and "Submitted <b>3</b>" in items[0]["row"]


def test_the_catch_up_draws_the_array_row(world, make_array):
    array = make_array("bob", 3)
    first = array.members.order_by("id").first()
    ids, html = catchup.list_page(world.users["bob"].pk, "", 1, set(), None)
    assert ids == {first.pk}
    assert f'data-array="{array.pk}"' in html


# --- the array's page -----------------------------------------------------------------------------------------


def test_the_array_page_lists_its_members_with_their_statuses(login, make_array, make_pending):
    array = make_array("bob", 3, sweep={"lr": [0.1, 0.2, 0.3]})
    members = list(array.members.order_by("array_index"))
    make_pending(members[1])

    html = login("pan").get(reverse("jobs:array", args=[array.pk])).content.decode()

    assert "sweep of 3" in html and "lr=0.1,0.2,0.3" in html
    assert [int(i) for i in re.findall(r'<tr id="job-(\d+)"', html)] == [m.pk for m in members]
    assert "train[0]" in html and "train[2]" in html
    assert "Submitted <b>2</b>" in html and "Pending <b>1</b>" in html
    assert "badge badge-orange" in html  # each member's status badge
    assert "Cancel all" not in html  # pan may see bob's array, not act on it


def test_the_owner_sees_the_array_actions(login, make_array):
    array = make_array("bob", 2)
    html = login("bob").get(reverse("jobs:array", args=[array.pk])).content.decode()
    for action in ("stop", "cancel"):
        assert f'action="{reverse("jobs:array_action", args=[array.pk, action])}"' in html
    assert "restart-failed" not in html  # none failed


def test_an_array_of_another_group_is_not_found(login, make_array):
    array = make_array("bob", 2)
    assert login("eve").get(reverse("jobs:array", args=[array.pk])).status_code == 404
    response = login("eve").post(reverse("jobs:array_action", args=[array.pk, "cancel"]))
    assert response.status_code == 404
    assert not array.members.exclude(phase="SUBMITTED").exists()


def test_another_member_may_not_act_on_the_array(login, make_array):
    array = make_array("bob", 2)
    response = login("pan").post(reverse("jobs:array_action", args=[array.pk, "cancel"]))
    assert response.status_code == 403
    assert not array.members.exclude(phase="SUBMITTED").exists()


def test_cancel_all_cancels_the_unfinished_members(login, make_array, make_pending):
    array = make_array("bob", 3)
    for member in array.members.all():
        make_pending(member)

    response = login("bob").post(reverse("jobs:array_action", args=[array.pk, "cancel"]), follow=True)

    assert set(array.members.values_list("phase", flat=True)) == {"CANCELLED"}
    html = response.content.decode()
    assert f"Array {array.pk} “train”: 3 members cancelled." in html
    assert "Cancelled <b>3</b>" in html


def test_restart_failed_with_none_failed_says_so_and_changes_nothing(login, make_array):
    array = make_array("bob", 2)
    response = login("bob").post(reverse("jobs:array_action", args=[array.pk, "restart-failed"]), follow=True)
    assert "has no failed member to restart" in response.content.decode()
    assert set(array.members.values_list("phase", flat=True)) == {"SUBMITTED"}


# --- the submit form's array, sweep and after fields ----------------------------------------------------------

SUBMIT = reverse("jobs:submit")


def form_data(**over) -> dict:
    data = {"name": "train", "group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny",
            "command": "echo $JOB_ARRAY_INDEX", "env": "", "replicas": "1", "job_type": "training",
            "priority": "normal", "timeout": "", "retries": "", "array": "", "sweep": "", "after": ""}
    data.update(over)
    return data


def test_parse_sweep_reads_numbers_as_numbers():
    from jobs.forms import parse_sweep

    assert parse_sweep("lr=1e-4, 3e-4\n# a comment\n\nbs=32,64\nopt=adam,sgd") == {
        "lr": [0.0001, 0.0003], "bs": [32, 64], "opt": ["adam", "sgd"]}


@pytest.mark.parametrize("text, message", [
    ("lr", "Line 1 (lr): expected name=value"),
    ("lr=1\nlr=2", "Line 2: lr is swept twice."),
])
def test_parse_sweep_names_the_line_it_cannot_read(text, message):
    from django import forms

    from jobs.forms import parse_sweep

    with pytest.raises(forms.ValidationError) as err:
        parse_sweep(text)
    assert message in err.value.messages[0]


def test_the_form_offers_array_sweep_and_after(login):
    html = login("bob").get(SUBMIT).content.decode()
    for name in ("array", "sweep", "after"):
        assert f'id="field-{name}"' in html
    assert 'placeholder="e.g. 0-9%2"' in html


def test_an_array_submit_makes_the_array_and_opens_its_page(login):
    response = login("bob").post(SUBMIT, form_data(array="0-4%2"))

    array = JobArray.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("jobs:array", args=[array.pk])
    assert (array.size, array.max_running, array.indices) == (5, 2, "0-4%2")
    assert sorted(array.members.values_list("name", flat=True)) == [f"train[{i}]" for i in range(5)]
    page = login("bob").get(response["Location"]).content.decode()
    assert "of 5 jobs submitted to phusers" in page and "array of 5, at most 2 at once" in page


def test_a_sweep_submit_makes_one_job_per_combination(login):
    response = login("bob").post(SUBMIT, form_data(sweep="lr=1e-4,3e-4\nbs=32,64", array="%2"))

    array = JobArray.objects.get()
    assert response["Location"] == reverse("jobs:array", args=[array.pk])
    assert array.sweep == {"lr": [0.0001, 0.0003], "bs": [32, 64]} and array.max_running == 2
    assert {tuple(sorted(m.items())) for m in array.members.values_list("array_params", flat=True)} == {
        (("bs", bs), ("lr", lr)) for lr in (0.0001, 0.0003) for bs in (32, 64)}


@pytest.mark.parametrize("over, field, message", [
    ({"array": "9-0"}, "array", ""),
    ({"array": "0-4", "sweep": "lr=1,2"}, "array", "only a limit"),
    ({"sweep": "lr"}, "sweep", "expected name=value"),
    ({"sweep": "bad name=1,2"}, "sweep", "is not a sweep name"),
    ({"after": "twelve"}, "after", "is not a dependency"),
])
def test_bad_array_sweep_or_after_is_an_error_next_to_its_field(login, over, field, message):
    from .conftest import field_block

    response = login("bob").post(SUBMIT, form_data(**over))

    assert response.status_code == 200
    block = field_block(response.content.decode(), field)
    assert "field-errors" in block and message in block
    assert not JobArray.objects.exists() and not Job.objects.exists()


def test_a_job_submitted_after_another_waits_for_it(login, submit):
    first = submit("bob")
    response = login("bob").post(SUBMIT, form_data(after=f"{first.pk}:ok"))

    job = Job.objects.exclude(pk=first.pk).get()
    assert response["Location"] == reverse("jobs:detail", args=[job.pk])
    assert (job.phase, job.reason, job.dependency_wait) == ("PENDING", "Dependency", True)


def test_an_array_submitted_after_a_job_waits_for_it(login, submit):
    first = submit("bob")
    login("bob").post(SUBMIT, form_data(array="0-1", after=f"{first.pk}"))
    assert set(JobArray.objects.get().members.values_list("reason", flat=True)) == {"Dependency"}


def test_after_a_job_that_is_not_there_is_an_error_next_to_after(login):
    from .conftest import field_block

    response = login("bob").post(SUBMIT, form_data(after="999999:any", array="0-2"))

    assert "There is no job 999999 that you can see." in field_block(response.content.decode(), "after")
    assert not Job.objects.exists() and not JobArray.objects.exists()
