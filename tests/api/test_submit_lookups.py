"""What a submit is checked against is kept between submits (jobs.services.submit_lookups), and every change of it
counts for the next submit: an admin's, a change through the ORM, another process's (the shared version key)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobs import services
from jobs.choices import Resource
from jobs.models import GroupQuota, Membership
from jobs.services import submit_lookups
from tests.admin.test_admin import gpu_quota_row, group_form_data

from .conftest import JOBS_URL

pytestmark = pytest.mark.django_db(transaction=True)  # outside a transaction, as a request runs: lookups are kept

GOOD = {"group": "phusers", "image": "base-notebook", "instance_type": "gpu-1", "command": "python train.py"}
LOOKUP_TABLES = ("jobs_group", "jobs_membership", "jobs_image", "jobs_instancetype", "jobs_groupquota")


def lookup_reads(client) -> list[str]:
    """Submit GOOD (201 expected) and return the statements that read what a submit is checked against."""
    with CaptureQueriesContext(connection) as queries:
        response = client.post(JOBS_URL, GOOD, format="json")
    assert response.status_code == 201, response.json()
    return [q["sql"] for q in queries.captured_queries
            if q["sql"].startswith("SELECT") and any(f'FROM "{t}' in q["sql"] for t in LOOKUP_TABLES)]


@pytest.fixture
def bob(world, client_for):
    """bob's client, after a submit: what his submits are checked against is kept."""
    client = client_for("bob")
    assert lookup_reads(client)  # read once
    assert lookup_reads(client) == []  # kept
    return client


def refused(client, field: str) -> str:
    response = client.post(JOBS_URL, GOOD, format="json")
    assert response.status_code == 400, response.json()
    return " ".join(response.json()["errors"][field])


def test_an_admin_removing_a_membership_refuses_the_next_submit(world, bob, client):
    client.force_login(world.users["admin"])
    membership = Membership.objects.get(user=world.users["bob"], group=world.groups["phusers"])

    response = client.post(reverse("admin:jobs_membership_delete", args=[membership.pk]), {"post": "yes"})

    assert response.status_code == 302
    assert "not a member" in refused(bob, "group")


def test_an_admin_taking_an_image_from_the_group_refuses_the_next_submit(world, bob, client):
    client.force_login(world.users["admin"])
    group = world.groups["phusers"]

    response = client.post(reverse("admin:jobs_group_change", args=[group.pk]),
                           group_form_data(group, [gpu_quota_row(group)], images=[]))

    assert response.status_code == 302, response.content.decode()[:2000]
    assert "not allowed" in refused(bob, "image")


def test_an_admin_lowering_a_quota_refuses_the_next_submit(world, bob, client):
    client.force_login(world.users["admin"])
    group = world.groups["phusers"]

    response = client.post(reverse("admin:jobs_group_change", args=[group.pk]),
                           group_form_data(group, [gpu_quota_row(group, quota=0, user_quota=0)]))

    assert response.status_code == 302, response.content.decode()[:2000]
    assert "can never run" in refused(bob, "instance_type")


def _quota_to_zero(world):
    q = GroupQuota.objects.get(group=world.groups["phusers"], resource=Resource.GPU)
    q.quota = q.user_quota = 0
    q.save()


def _rename_group(world):
    group = world.groups["phusers"]
    group.name = "renamed"
    group.save()


@pytest.mark.parametrize("change, field, says", [
    (lambda w: Membership.objects.filter(user=w.users["bob"]).delete(), "group", "not a member"),
    (lambda w: w.groups["phusers"].members.remove(w.users["bob"]), "group", "not a member"),
    (_rename_group, "group", "Unknown group"),
    (lambda w: w.image.groups.remove(w.groups["phusers"]), "image", "not allowed"),
    (lambda w: w.groups["phusers"].images.clear(), "image", "not allowed"),
    (lambda w: w.groups["phusers"].instance_types.remove(w.types["gpu-1"]), "instance_type", "not allowed"),
    (lambda w: w.types["gpu-1"].groups.set([]), "instance_type", "not allowed"),
    (_quota_to_zero, "instance_type", "can never run"),
], ids=["membership deleted", "member removed", "group renamed", "image's groups", "group's images",
        "group's instance types", "instance type's groups", "quota"])
def test_every_change_through_the_orm_counts_for_the_next_submit(world, bob, change, field, says):
    change(world)
    assert says in refused(bob, field)


def _drop_membership_without_signals(world) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM jobs_membership WHERE user_id = %s", [world.users["bob"].pk])


def test_a_change_another_process_made_is_seen_through_the_shared_version_key(world, bob):
    _drop_membership_without_signals(world)  # no signal here: the other process bumped the key
    submit_lookups.cache.set(submit_lookups.VERSION_KEY, "changed by another process")

    assert "not a member" in refused(bob, "group")


def test_nothing_is_kept_longer_than_max_age(world, bob, monkeypatch):
    _drop_membership_without_signals(world)  # a change no signal reports (raw SQL, QuerySet.update)
    monkeypatch.setattr(submit_lookups, "MAX_AGE", 0.0)

    assert "not a member" in refused(bob, "group")


def test_without_a_readable_cache_every_submit_reads_the_database(world, client_for, monkeypatch):
    def down(*args, **kwargs):
        raise ConnectionError("redis is down")

    monkeypatch.setattr(submit_lookups.cache, "get", down)
    bob = client_for("bob")
    assert lookup_reads(bob)
    assert lookup_reads(bob)  # nothing kept
    _drop_membership_without_signals(world)
    assert "not a member" in refused(bob, "group")


def test_inside_a_transaction_nothing_kept_is_used_nor_what_is_read_kept(world, bob):
    user = world.users["bob"]
    with pytest.raises(ValidationError, match="not a member"), transaction.atomic():
        _drop_membership_without_signals(world)  # uncommitted: only this transaction sees it
        try:
            services.job_spec_validate(user=user, data=dict(GOOD))
        finally:
            transaction.set_rollback(True)

    assert Membership.objects.filter(user=user).exists()  # rolled back
    assert lookup_reads(bob) == []  # still kept from before, and right
