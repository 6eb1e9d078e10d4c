"""Who may see and act on a job: members see their groups' jobs, owners and group admins act, superusers do all.

Invisible jobs are 404 (never 403), visible jobs one may not act on are 403, anonymous requests are 401.
"""

import pytest

from jobs.choices import Phase, Role
from jobs.models import Job, JobEvent, Membership

from .conftest import job_url


@pytest.fixture
def group_admin(world, make_user):
    user = make_user("gadmin")
    Membership.objects.create(group=world.groups["phusers"], user=user, role=Role.ADMIN)
    return user


@pytest.fixture
def clients(world, client_for, anon, group_admin):
    return {
        "owner": client_for("bob"),
        "member": client_for("pan"),
        "group_admin": client_for(group_admin),
        "non_member": client_for("eve"),
        "superuser": client_for("admin"),
        "anonymous": anon,
    }


EXPECTED = {
    # actor: (retrieve, logs, cancel)
    "owner": (200, 200, 200),
    "member": (200, 200, 403),
    "group_admin": (200, 200, 200),
    "non_member": (404, 404, 404),
    "superuser": (200, 200, 200),
    "anonymous": (401, 401, 401),
}


@pytest.mark.django_db
@pytest.mark.parametrize("actor", EXPECTED)
def test_permission_matrix(submit, clients, actor):
    job = submit("bob")  # bob's pending job in phusers
    client = clients[actor]
    retrieve, logs, cancel = EXPECTED[actor]

    assert client.get(job_url(job.pk)).status_code == retrieve
    assert client.get(job_url(job.pk, "logs")).status_code == logs
    events_before = JobEvent.objects.filter(job=job).count()
    response = client.post(job_url(job.pk, "cancel"), format="json")
    assert response.status_code == cancel

    job.refresh_from_db()
    if cancel == 200:
        assert job.phase == Phase.CANCELLED
        data = response.json()
        assert (data["id"], data["phase"], data["status"], data["reason"]) == (
            job.pk, "CANCELLED", "Cancelled", "CancelledByUser"
        )
        assert data["color_name"] == "grey"
        assert data["events"][-1]["reason"] == "CancelledByUser"
        assert data["finished_at"]
    else:
        assert job.phase == Phase.SUBMITTED
        assert JobEvent.objects.filter(job=job).count() == events_before
        assert response.json()["detail"]


@pytest.mark.django_db
def test_member_sees_but_may_not_cancel_with_a_message(submit, client_for):
    job = submit("bob")
    response = client_for("pan").post(job_url(job.pk, "cancel"))
    assert response.status_code == 403
    assert "own jobs" in response.json()["detail"]


@pytest.mark.django_db
def test_jobs_of_another_group_do_not_exist_for_you(submit, client_for):
    job = submit("lin", group="research")
    pan = client_for("pan")  # in phusers only
    for response in (pan.get(job_url(job.pk)), pan.get(job_url(job.pk, "logs")),
                     pan.post(job_url(job.pk, "cancel"))):
        assert response.status_code == 404
    assert client_for("lin").get(job_url(job.pk)).status_code == 200


@pytest.mark.django_db
def test_admin_of_one_group_is_a_member_elsewhere(world, submit, client_for):
    Membership.objects.filter(user=world.users["lin"], group=world.groups["research"]).update(role=Role.ADMIN)
    phusers_job = submit("bob")
    research_job = submit("lin", group="research")
    lin = client_for("lin")
    assert lin.post(job_url(phusers_job.pk, "cancel")).status_code == 403
    assert lin.post(job_url(research_job.pk, "cancel")).status_code == 200


@pytest.mark.django_db
def test_cancel_an_ended_job_is_400(submit, client_for):
    job = submit("bob")
    bob = client_for("bob")
    assert bob.post(job_url(job.pk, "cancel")).status_code == 200
    events = JobEvent.objects.filter(job=job).count()

    response = bob.post(job_url(job.pk, "cancel"))
    assert response.status_code == 400
    assert "already ended" in response.json()["detail"]
    assert JobEvent.objects.filter(job=job).count() == events


@pytest.mark.django_db
def test_cancel_an_admitted_job_terminates_it(submit, client_for):
    from scheduler.passes import schedule_pass

    job = submit("bob", "gpu-1")
    schedule_pass()
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING

    response = client_for("bob").post(job_url(job.pk, "cancel"))
    assert response.status_code == 200
    assert response.json()["phase"] == "TERMINATING"
    assert Job.objects.get(pk=job.pk).termination_target == Phase.CANCELLED
