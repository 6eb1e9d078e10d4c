"""GET /utilisation/ and /usage/ (GPU-hours per day, group and user)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import services
from jobs.choices import Phase
from scheduler.passes import schedule_pass

from .conftest import API, assert_error_shape

UTIL_URL = API + "utilisation/"
USAGE_URL = API + "usage/"


@pytest.mark.django_db
def test_utilisation(world, submit, client_for):
    submit("bob", "gpu-2")
    submit("lin", "gpu-1", group="research")
    submit("pan", "gpu-4")  # waits
    schedule_pass()
    data = client_for("lin").get(UTIL_URL).json()  # a member of phusers: sees its users
    assert (data["gpu_total"], data["gpu_used"], data["gpu_free"]) == (8, 3, 5)
    assert data["nodes"] == [{"name": "local", "gpu_total": 8, "gpu_used": 3, "gpu_free": 5}]
    users = {u["user"]: u for u in data["users"]}
    assert (users["bob"]["running"], users["bob"]["running_gpu"]) == (1, 2)
    assert (users["pan"]["queued"], users["pan"]["queued_gpu"]) == (1, 4)


@pytest.fixture
def usage_world(world, submit):
    t0 = timezone.now().replace(hour=10, minute=0, second=0, microsecond=0) - timedelta(days=1)
    done = submit("bob", "gpu-2")
    schedule_pass(now=t0)
    done.refresh_from_db()
    services.job_transition(job=done, phase=Phase.SUCCEEDED, exit_code=0, now=t0 + timedelta(hours=3))
    other = submit("lin", "gpu-1", group="research")
    schedule_pass(now=t0)
    other.refresh_from_db()
    services.job_transition(job=other, phase=Phase.SUCCEEDED, exit_code=0, now=t0 + timedelta(hours=2))
    return t0


@pytest.mark.django_db
def test_usage_per_day_group_and_user(usage_world, client_for):
    day = usage_world.date().isoformat()
    data = client_for("lin").get(USAGE_URL).json()
    assert {(r["day"], r["group"], r["user"]): r["gpu_hours"] for r in data["rows"]} == {
        (day, "phusers", "bob"): 6.0, (day, "research", "lin"): 2.0}
    assert data["total_gpu_hours"] == 8.0
    assert data["until"] == timezone.localdate().isoformat()
    assert data["since"] == (timezone.localdate() - timedelta(days=29)).isoformat()

    assert client_for("bob").get(USAGE_URL).json()["total_gpu_hours"] == 6.0  # not in research
    assert client_for("lin").get(USAGE_URL, {"group": "research"}).json()["total_gpu_hours"] == 2.0
    assert client_for("lin").get(USAGE_URL, {"user": "bob"}).json()["total_gpu_hours"] == 6.0
    assert client_for("lin").get(USAGE_URL, {"since": timezone.localdate().isoformat()}).json()["rows"] == []
    assert client_for("eve").get(USAGE_URL).json()["rows"] == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "params,field",
    [({"since": "yesterday"}, "since"), ({"until": "2024-13-01"}, "until"),
     ({"since": "2024-02-01", "until": "2024-01-01"}, "since"),
     ({"since": "2020-01-01", "until": "2024-01-01"}, "since"),
     ({"group": "a\x00"}, "group")],
)
def test_usage_bad_parameters(world, client_for, params, field):
    assert_error_shape(client_for("bob").get(USAGE_URL, params), 400, field)


@pytest.mark.django_db
def test_usage_at_the_edges_of_the_calendar(world, client_for):
    for params in ({"until": "0001-01-05"}, {"since": "9999-12-31", "until": "9999-12-31"}):
        assert client_for("bob").get(USAGE_URL, params).status_code == 200
