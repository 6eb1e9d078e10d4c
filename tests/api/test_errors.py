"""One error shape everywhere: {"detail": "...", "errors": {field path: [messages]}}."""

import pytest
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions

from jobs.api.exceptions import error_body, exception_handler, flatten_errors
from jobs.models import Job, JobEvent
from jobs.state_machine import InvalidTransition

from .conftest import JOBS_URL, assert_error_shape, job_url


def test_flatten_nested_detail_into_paths():
    detail = {
        "replicas": ["Too many."],
        "env": {"A": ["Bad."], "non_field_errors": ["Whole env is bad."]},
        "ids": {3: ["A valid integer is required."]},
        "items": [{}, {"name": ["Required."]}],
        "non_field_errors": ["Everything is wrong."],
    }
    assert flatten_errors(detail) == {
        "replicas": ["Too many."],
        "env.A": ["Bad."],
        "env": ["Whole env is bad."],
        "ids.3": ["A valid integer is required."],
        "items.1.name": ["Required."],
        "": ["Everything is wrong."],
    }


@pytest.mark.parametrize(
    "data,expected",
    [
        ({"detail": "Not found."}, {"detail": "Not found.", "errors": {}}),
        ({"replicas": ["Too many."]}, {"detail": "replicas: Too many.", "errors": {"replicas": ["Too many."]}}),
        (["Plain message."], {"detail": "Plain message.", "errors": {}}),
        ({"non_field_errors": ["Bad login."]}, {"detail": "Bad login.", "errors": {}}),
        ({"a": ["x"], "b": ["y"]}, {"detail": "Invalid input: a: x; b: y", "errors": {"a": ["x"], "b": ["y"]}}),
    ],
)
def test_error_body(data, expected):
    assert error_body(data) == expected


@pytest.mark.parametrize(
    "exc,status",
    [
        (DjangoValidationError("Job #1 has already ended."), 400),
        (DjangoValidationError({"group": ["Unknown group."]}), 400),
        (InvalidTransition("CANCELLED", "RUNNING"), 409),
        (exceptions.NotFound(), 404),
        (exceptions.PermissionDenied(), 403),
        (RuntimeError("a bug"), 500),
    ],
)
def test_handler_gives_the_shape_for_every_exception(exc, status):
    response = exception_handler(exc, {"view": None})
    assert response.status_code == status
    assert set(response.data) == {"detail", "errors"} and response.data["detail"]


@pytest.mark.django_db
def test_http_errors_have_the_shape(world, submit, client_for, anon):
    job = submit("bob")
    bob = client_for("bob")
    assert_error_shape(anon.get(JOBS_URL), 401)
    assert_error_shape(client_for("pan").post(job_url(job.pk, "cancel")), 403)
    assert_error_shape(client_for("eve").get(job_url(job.pk)), 404)
    assert_error_shape(bob.delete(job_url(job.pk)), 405)
    assert_error_shape(bob.get(JOBS_URL, {"phase": "NAPPING"}), 400, "phase")
    assert_error_shape(bob.get(JOBS_URL, {"created_after": "yesterday"}), 400, "created_after")
    assert_error_shape(bob.get(JOBS_URL, {"page": 99}), 404)
    assert_error_shape(bob.post(JOBS_URL, "group=x", content_type="text/csv"), 415)
    assert_error_shape(bob.get(JOBS_URL, HTTP_ACCEPT="image/png"), 406)
    assert_error_shape(bob.post(JOBS_URL, "x" * (2 << 20), content_type="application/json"), 413)
    data = assert_error_shape(bob.post(JOBS_URL, {"group": "phusers", "replicas": "many"}, format="json"), 400,
                              "image", "instance_type", "command", "replicas")
    assert "Invalid input" in data["detail"]


@pytest.mark.django_db
def test_unknown_api_paths_are_json_404s(world, client_for, anon):
    for client in (client_for("bob"), anon):
        data = assert_error_shape(client.get("/api/v1/no-such-thing/"), 404)
        assert "/api/v1/no-such-thing/" in data["detail"]
        assert_error_shape(client.post("/api/v1/jobs/1/explode/"), 404)
    assert client_for("bob").get("/api/v1/jobs").status_code == 301  # APPEND_SLASH still redirects


@pytest.mark.django_db
def test_bad_bodies_write_nothing(world, submit, client_for):
    job = submit("bob")
    before = Job.objects.count(), JobEvent.objects.count()
    bob = client_for("bob")
    for response in (
        bob.post(JOBS_URL, {"group": "phusers", "image": "base-notebook", "instance_type": "gpu-1",
                            "command": "true", "unexpected": 1}, format="json"),
        bob.post(JOBS_URL, '{"group": ', content_type="application/json"),
        bob.post(JOBS_URL, "[1, 2]", content_type="application/json"),
        bob.post(JOBS_URL + "cancel/", {"ids": "all"}, format="json"),
        bob.post(job_url(job.pk, "clone"), {"replicas": 0}, format="json"),
        bob.post(job_url(job.pk, "clone"), {"instance_type": "gpu-4", "replicas": 2}, format="json"),
    ):
        assert response.status_code == 400, response.json()
        assert set(response.json()) == {"detail", "errors"}
    assert (Job.objects.count(), JobEvent.objects.count()) == before
