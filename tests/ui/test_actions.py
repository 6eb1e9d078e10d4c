"""Stop, restart and the over-quota mark on the pages; the same actions through the API."""

import pytest
from django.urls import reverse

from jobs.choices import Phase
from jobs.models import GroupQuota
from scheduler.passes import schedule_pass

pytestmark = pytest.mark.django_db


def test_stop_then_restart_from_the_detail_page(client, submit, world):
    job = submit("bob", command="sleep 600")
    client.force_login(world.users["bob"])
    page = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert reverse("jobs:stop", args=[job.pk]) in page and reverse("jobs:restart", args=[job.pk]) not in page

    client.post(reverse("jobs:stop", args=[job.pk]))
    job.refresh_from_db()
    assert (job.phase, job.status) == (Phase.CANCELLED, "Stopped")
    page = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert reverse("jobs:restart", args=[job.pk]) in page

    client.post(reverse("jobs:restart", args=[job.pk]))
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.PENDING, "Restarted")


def test_another_member_cannot_stop_or_restart(client, submit, world):
    job = submit("bob", command="sleep 600")
    client.force_login(world.users["pan"])
    assert client.post(reverse("jobs:stop", args=[job.pk])).status_code == 403
    job.refresh_from_db()
    assert job.phase == Phase.SUBMITTED
    page = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert reverse("jobs:stop", args=[job.pk]) not in page


def test_restart_of_a_running_job_is_refused_with_a_message(client, submit, world):
    job = submit("bob", command="sleep 600")
    client.force_login(world.users["bob"])
    response = client.post(reverse("jobs:restart", args=[job.pk]), follow=True)
    assert "stop it first" in response.content.decode()
    job.refresh_from_db()
    assert job.phase == Phase.SUBMITTED


def test_over_quota_job_is_marked_in_list_detail_and_api(client, submit, world):
    quota = GroupQuota.objects.get(group=world.groups["phusers"], resource="gpu")
    quota.quota, quota.limit = 2, 8
    quota.save()
    job = submit("bob", "gpu-4", command="sleep 600", preemptible=True)
    schedule_pass()
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING and job.over_quota
    client.force_login(world.users["bob"])
    assert "over quota" in client.get(reverse("jobs:list")).content.decode()
    assert "over quota" in client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert client.get(f"/api/v1/jobs/{job.pk}/").json()["over_quota"] is True


def test_api_stop_and_restart(client, submit, world):
    job = submit("bob", command="sleep 600")
    client.force_login(world.users["bob"])
    body = client.post(f"/api/v1/jobs/{job.pk}/stop/").json()
    assert (body["phase"], body["status"]) == ("CANCELLED", "Stopped")
    body = client.post(f"/api/v1/jobs/{job.pk}/restart/").json()
    assert (body["phase"], body["reason"]) == ("PENDING", "Restarted")
    assert client.post(f"/api/v1/jobs/{job.pk}/restart/").status_code == 400
    client.force_login(world.users["pan"])
    assert client.post(f"/api/v1/jobs/{job.pk}/stop/").status_code == 403
