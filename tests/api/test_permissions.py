"""Who may see and act on a job: members see their groups' jobs, owners and group admins act, superusers do all.

Invisible jobs are 404 (never 403), visible jobs one may not act on are 403, anonymous requests are 401.
"""

import pytest

from jobs.choices import Phase, Role
from jobs.models import Job, JobEvent, Membership

from .conftest import job_url

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


# --- every endpoint × every actor ---------------------------------------------------------------------------

ACTOR_ORDER = ("anonymous", "non_member", "member", "group_admin", "owner", "superuser")
SEE = (401, 404, 200, 200, 200, 200)  # read a job of phusers, or phusers itself
ACT = (401, 404, 403, 200, 200, 200)  # change bob's job
ANY = (401, 200, 200, 200, 200, 200)  # anything signed in

MATRIX = {
    # name: (method, path (with {job} and {group}), body, expected per actor in ACTOR_ORDER)
    "list jobs": ("get", "/api/v1/jobs/", None, ANY),
    "submit": ("post", "/api/v1/jobs/", {"group": "phusers", "image": "base-notebook",
                                         "instance_type": "cpu-tiny", "command": "true"},
               (401, 400, 201, 201, 201, 201)),  # eve is not in phusers: a field error, not a 403
    "retrieve": ("get", "/api/v1/jobs/{job}/", None, SEE),
    "events": ("get", "/api/v1/jobs/{job}/events/", None, SEE),
    "attempts": ("get", "/api/v1/jobs/{job}/attempts/", None, SEE),
    "logs": ("get", "/api/v1/jobs/{job}/logs/", None, SEE),
    "log search": ("get", "/api/v1/jobs/{job}/logs/search/?q=x", None, SEE),
    "raw log": ("get", "/api/v1/jobs/{job}/logs/raw/?download=true", None, SEE),
    "clone": ("post", "/api/v1/jobs/{job}/clone/", {}, (401, 404, 201, 201, 201, 201)),
    "cancel": ("post", "/api/v1/jobs/{job}/cancel/", None, ACT),
    "stop": ("post", "/api/v1/jobs/{job}/stop/", None, ACT),
    "restart": ("post", "/api/v1/jobs/{stopped}/restart/", None, ACT),
    "bulk cancel": ("post", "/api/v1/jobs/cancel/", {"ids": ["{job}"]}, ANY),
    "list groups": ("get", "/api/v1/groups/", None, ANY),
    "group": ("get", "/api/v1/groups/phusers/", None, SEE),
    "queue": ("get", "/api/v1/groups/phusers/queue/", None, SEE),
    "instance types": ("get", "/api/v1/groups/phusers/instance-types/", None, SEE),
    "images": ("get", "/api/v1/groups/phusers/images/", None, SEE),
    "utilisation": ("get", "/api/v1/utilisation/", None, ANY),
    "usage": ("get", "/api/v1/usage/", None, ANY),
    "vocabularies": ("get", "/api/v1/vocabularies/", None, ANY),
}


def _fill(value, ids):
    if isinstance(value, str):
        return value.format(**ids)
    if isinstance(value, dict):
        return {k: _fill(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [int(_fill(v, ids)) for v in value]
    return value


def _state():
    return sorted(Job.objects.values_list("id", "phase", "status")), JobEvent.objects.count()


@pytest.mark.django_db
@pytest.mark.parametrize("actor", ACTOR_ORDER)
@pytest.mark.parametrize("endpoint", MATRIX)
def test_every_endpoint_for_every_actor(world, submit, clients, endpoint, actor):
    from jobs import services

    job = submit("bob")
    stopped = submit("bob")
    services.job_cancel(job=stopped, by=world.users["bob"], stop=True)
    method, path, payload, expected = MATRIX[endpoint]
    ids = {"job": job.pk, "stopped": stopped.pk}
    before = _state()

    client = clients[actor]
    url = _fill(path, ids)
    if method == "get":
        response = client.get(url)
    else:
        response = client.post(url, _fill(payload, ids), format="json")

    status = expected[ACTOR_ORDER.index(actor)]
    assert response.status_code == status, response.content[:300]
    if status >= 400:
        data = response.json()
        assert set(data) == {"detail", "errors"} and data["detail"]
        assert _state() == before  # nothing written
    if endpoint == "bulk cancel" and status == 200:
        [result] = response.json()["results"]
        per_job = {"non_member": 404, "member": 403}.get(actor, 200)
        assert (result["id"], result["status_code"], result["ok"]) == (job.pk, per_job, per_job == 200)
