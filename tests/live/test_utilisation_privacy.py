"""The utilisation pages show a group's users only to its members and to staff; everyone else sees that group in
aggregate (GPUs used of its quota, running and pending jobs): on the page, in the live refresh and in the API."""

from __future__ import annotations

import json
import re

import pytest
from channels.db import database_sync_to_async as db
from django.urls import reverse
from rest_framework.test import APIClient

from .conftest import admitted, pending

pytestmark = pytest.mark.django_db

UTIL_API = "/api/v1/utilisation/"
IN_YOUR_GROUPS = 'By user <span class="muted">in your groups</span>'


@pytest.fixture
def busy(world, submit):
    """bob runs "secret-train" (2 GPUs) in phusers, pan waits with "secret-eval"; eve runs "eve-job" in other."""
    running, _ = admitted(submit("bob", "gpu-2", name="secret-train"))
    waiting = pending(submit("pan", "gpu-4", name="secret-eval"), 1)
    own, _ = admitted(submit("eve", name="eve-job", group="other"))
    return running, waiting, own


def page(login, username: str, **headers) -> str:
    response = login(username).get(reverse("jobs:utilisation"), **headers)
    assert response.status_code == 200
    return response.content.decode()


def group_row(html: str, group: str) -> list[str]:
    row = re.search(rf'<tr data-group="{group}">(.*?)</tr>', html, re.S)
    assert row, f"no row for {group}"
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)]


def test_a_non_member_sees_other_groups_in_aggregate_only(login, busy):
    running, waiting, _ = busy
    for html in (page(login, "eve"), page(login, "eve", HTTP_HX_REQUEST="true")):  # the page and its live refresh
        assert group_row(html, "phusers")[:5] == ["phusers", "2", "4", "1", "1"]  # GPUs used, quota, running, pending
        for name in ("bob", "pan", "secret-train", "secret-eval"):
            assert not re.search(rf"\b{name}\b", html), name
        assert f"/jobs/{running.pk}/" not in html and f"/jobs/{waiting.pk}/" not in html
        assert f'href="{reverse("jobs:queue", args=["phusers"])}"' not in html  # no link into a queue not theirs
        assert ">eve</td>" in html  # their own group's users, as before
        assert IN_YOUR_GROUPS in html


def test_members_and_staff_see_the_users(login, busy, make_user, world):
    html = page(login, "bob")
    assert ">bob</td>" in html and ">pan</td>" in html
    assert ">eve</td>" not in html  # eve's group is not bob's
    assert group_row(html, "other")[:5] == ["other", "0", "—", "1", "0"]  # in aggregate: no GPU quota, 1 running

    world.users["staffer"] = make_user("staffer", is_staff=True)
    for staff in ("admin", "staffer"):
        html = page(login, staff)
        assert ">bob</td>" in html and ">pan</td>" in html and ">eve</td>" in html, staff
        assert IN_YOUR_GROUPS not in html


def api_get(user) -> dict:
    client = APIClient()
    client.force_authenticate(user)
    response = client.get(UTIL_API)
    assert response.status_code == 200
    return response.json()


def test_the_api_answers_the_same(busy, world):
    eve = api_get(world.users["eve"])
    assert [u["user"] for u in eve["users"]] == ["eve"]
    groups = {g["group"]: g for g in eve["groups"]}
    assert groups["phusers"] == {"group": "phusers", "member": False, "gpu_quota": 4, "running": 1,
                                 "running_gpu": 2, "queued": 1, "queued_gpu": 4}
    assert groups["other"]["member"] is True
    assert "bob" not in json.dumps(eve) and "secret" not in json.dumps(eve)

    admin = api_get(world.users["admin"])
    assert {u["user"] for u in admin["users"]} == {"bob", "pan", "eve"}
    assert all(g["member"] for g in admin["groups"])


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_live_message_carries_no_names(ws, world, submit, login):
    eve, connected = await ws("/ws/utilisation/", world.users["eve"])
    assert connected
    await db(submit)("bob", name="secret-live")
    message = await eve.receive_from(timeout=10)  # "something changed": the page then refetches its view
    assert "secret-live" not in message and not re.search(r"\bbob\b", message)
    html = await db(page)(login, "eve", HTTP_HX_REQUEST="true")
    assert "secret-live" not in html and not re.search(r"\bbob\b", html)
    assert group_row(html, "phusers")[4] == "1"  # the new job, counted as pending
