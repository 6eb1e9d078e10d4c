"""The notifications resource: subscribe (201, or 400 naming the field), list your own, delete your own (another
user's is a 404)."""

from __future__ import annotations

import pytest

from jobs.models import NotificationSubscription

from .conftest import assert_error_shape

pytestmark = [pytest.mark.fast, pytest.mark.django_db]

URL = "/api/v1/notifications/"


@pytest.fixture(autouse=True)
def _allow(settings):
    settings.JOBSITE_NOTIFY_ALLOW_HOSTS = ["127.0.0.1", "10.20.0.0/16"]


def test_subscribe_list_and_delete(client_for, world):
    bob = client_for("bob")
    r = bob.post(URL, {"channel": "webhook", "url": "http://127.0.0.1:8080/hook", "events": ["failed", "ended"],
                       "slack": True}, format="json")
    assert r.status_code == 201, r.json()
    created = r.json()
    assert {k: created[k] for k in ("channel", "url", "slack", "events")} == {
        "channel": "webhook", "url": "http://127.0.0.1:8080/hook", "slack": True, "events": ["ended", "failed"]}
    r = bob.post(URL, {"channel": "email", "email": "bob@example.org", "events": ["succeeded"]}, format="json")
    assert r.status_code == 201
    client_for("pan").post(URL, {"channel": "webhook", "url": "http://10.20.0.9/x", "events": ["ended"]},
                           format="json")
    listed = bob.get(URL).json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [s["channel"] for s in rows] == ["webhook", "email"]  # bob's own only
    assert bob.delete(f"{URL}{created['id']}/").status_code == 204
    assert list(NotificationSubscription.objects.filter(user=world.users["bob"]).values_list("channel", flat=True)) \
        == ["email"]


def test_another_users_subscription_is_a_404_and_stays(client_for, world):
    sub = NotificationSubscription.objects.create(user=world.users["pan"], channel="email", email="p@example.org",
                                                  events=["ended"])
    assert_error_shape(client_for("bob").delete(f"{URL}{sub.pk}/"), 404)
    assert NotificationSubscription.objects.filter(pk=sub.pk).exists()
    assert_error_shape(client_for("bob").delete(f"{URL}999999/"), 404)


@pytest.mark.parametrize("data, field", [
    ({"channel": "webhook", "events": ["ended"]}, "url"),
    ({"channel": "webhook", "url": "file:///etc/passwd", "events": ["ended"]}, "url"),
    ({"channel": "webhook", "url": "gopher://127.0.0.1/", "events": ["ended"]}, "url"),
    ({"channel": "webhook", "url": "http://localhost.:9/hook", "events": ["ended"]}, "url"),
    ({"channel": "webhook", "url": "http://192.168.1.1/hook", "events": ["ended"]}, "url"),
    ({"channel": "webhook", "url": "http://169.254.169.254/latest/", "events": ["ended"]}, "url"),
    ({"channel": "webhook", "url": "http://[::1]:80/hook", "events": ["ended"]}, "url"),
    ({"channel": "webhook", "url": "http://10.21.0.1/hook", "events": ["ended"]}, "url"),  # outside the allowed CIDR
    ({"channel": "webhook", "url": "http://127.0.0.1/hook", "events": ["ended", "exploded"]}, "events.1"),
    ({"channel": "webhook", "url": "http://127.0.0.1/hook", "events": []}, "events"),
    ({"channel": "email", "events": ["ended"]}, "email"),  # bob's account has no address
    ({"channel": "email", "email": "not-an-address", "events": ["ended"]}, "email"),
    ({"channel": "sms", "events": ["ended"]}, "channel"),
])
def test_bad_input_is_a_400_naming_the_field_and_stores_nothing(client_for, world, data, field):
    assert_error_shape(client_for("bob").post(URL, data, format="json"), 400, field)
    assert not NotificationSubscription.objects.exists()


def test_allowed_host_and_cidr_and_a_global_address_are_accepted(client_for, world):
    bob = client_for("bob")
    for url in ("http://10.20.1.2/hook", "https://93.184.215.14/hook"):
        assert bob.post(URL, {"channel": "webhook", "url": url, "events": ["ended"]}, format="json").status_code == 201


def test_anonymous_is_refused(anon):
    assert anon.get(URL).status_code in (401, 403)
