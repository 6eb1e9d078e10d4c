"""schemathesis against the generated OpenAPI schema, in process through the Django WSGI app.

Every operation gets generated requests (valid and invalid) with a real token; each response must not be a 5xx and
must match the schema: documented status code, content type, headers and body.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from rest_framework.authtoken.models import Token
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from jobs.choices import Role
from jobs.logs import log_path
from jobs.models import Job, JobArray, Membership, NotificationSubscription
from scheduler.passes import schedule_pass

pytestmark = [pytest.mark.slow]

MAX_EXAMPLES = 20
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@pytest.fixture
def wsgi_app(db):
    """The project's WSGI app on the test transaction: Django must not close the connection between requests."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.fixture
def existing(world, submit):
    """Something to find: bob's jobs in phusers (one admitted with a log, one waiting, one an array's member), bob
    admin of phusers, a notification subscription of his. ``id`` is the job's; the other resources' ids by path."""
    running = submit("bob", "gpu-1", replicas=2)
    submit("bob", "gpu-4")
    member = submit("bob", "gpu-1")
    array = JobArray.objects.create(name="sweep", group=member.group, user=member.user, size=1)
    Job.objects.filter(pk=member.pk).update(array=array, array_index=0)
    subscription = NotificationSubscription.objects.create(user=member.user, channel="email", events=["ended"])
    schedule_pass()
    running.refresh_from_db()
    path = log_path(running.current_attempt, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("epoch 1\nepoch 2 ✓\n".encode() * 50)
    Membership.objects.filter(user=world.users["bob"]).update(role=Role.ADMIN)
    return {"id": running.pk, "name": "phusers", "/api/v1/arrays/": {"id": array.pk},
            "/api/v1/notifications/": {"id": subscription.pk}}


@pytest.fixture
def api_schema(wsgi_app, existing):
    return schemathesis.openapi.from_wsgi("/api/schema/", wsgi_app)


@pytest.fixture
def token(world):
    return Token.objects.get_or_create(user=world.users["bob"])[0].key


def _runs() -> list[tuple[str, str]]:
    """(operation, mode) pairs, from the schema generator at collection time (no request, no database)."""
    from drf_spectacular.generators import SchemaGenerator

    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    runs = []
    for path, item in paths.items():
        for method, op in item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            label = f"{method.upper()} {path}"
            runs.append((label, "valid"))
            if op.get("parameters") or op.get("requestBody"):  # else there is nothing to make invalid
                runs.append((label, "invalid"))
            if "{" in path:
                runs.append((label, "existing"))
    return runs


@pytest.mark.parametrize("label,mode", _runs())
def test_api_conforms_to_its_schema(api_schema, existing, token, label, mode):
    """``valid``/``invalid``: schemathesis' positive and negative requests; ``existing``: valid requests about
    a job and a group that exist (random ids and names would mostly find nothing)."""
    [operation] = [r.ok() for r in api_schema.get_all_operations() if r.ok().label == label]
    headers = {"Authorization": f"Token {token}"}
    kwargs = {"generation_mode": GenerationMode.NEGATIVE if mode == "invalid" else GenerationMode.POSITIVE}
    if mode == "existing":
        names = {p.name for p in operation.path_parameters}
        kwargs["path_parameters"] = {k: v for k, v in existing.items() if k in names}
        for prefix, ids in existing.items():
            if label.split(" ", 1)[1].startswith(prefix):
                kwargs["path_parameters"].update(ids)
    statuses = []

    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(**kwargs))
    def check(case):
        response = case.call_and_validate(headers=headers, checks=CHECKS)
        statuses.append(response.status_code)

    check()
    if mode == "existing" and operation.method.upper() == "GET":
        assert 200 in statuses, f"{label} never answered 200 about an existing object: {sorted(set(statuses))}"
