"""The OpenAPI schema (drf-spectacular) at /api/schema/ and Swagger UI at /api/docs/, served without internet."""

from __future__ import annotations

import os
import re

import pytest
import yaml
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.validation import validate_schema

from tests.browser import chromium

SCHEMA_URL = "/api/schema/"
METHODS = {"get", "post", "put", "patch", "delete"}


@pytest.fixture
def schema(client):
    response = client.get(SCHEMA_URL, HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def _api_routes() -> list[str]:
    """Every URL pattern under /api/v1/, as an OpenAPI path (``pk`` is shown as ``id``, as drf-spectacular does)."""
    found = []

    def walk(patterns, prefix):
        for p in patterns:
            text = prefix + str(p.pattern)
            if isinstance(p, URLResolver):
                walk(p.url_patterns, text)
            elif isinstance(p, URLPattern) and p.name != "not-found":
                found.append(text)

    walk(get_resolver().url_patterns, "")
    paths = []
    for text in found:
        path = "/" + text.replace("^", "").replace("$", "").replace("\\.", ".")
        path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", path)
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", path).replace("{pk}", "{id}")
        if path.startswith("/api/v1/"):
            paths.append(path)
    return paths


def test_the_schema_is_valid_openapi_3(schema):
    assert schema["openapi"].startswith("3.")
    validate_schema(schema)


def test_every_api_url_is_in_the_schema(schema):
    routes = _api_routes()
    assert len(routes) >= 19
    missing = sorted(set(routes) - set(schema["paths"]))
    assert not missing, f"URL patterns without an operation in the schema: {missing}"
    assert set(schema["paths"]) == set(routes)


def test_every_operation_is_described_with_its_errors(schema):
    operations = [(path, method, op) for path, item in schema["paths"].items() for method, op in item.items()
                  if method in METHODS]
    assert len(operations) >= 20
    for path, method, op in operations:
        where = f"{method.upper()} {path}"
        assert op.get("summary"), where
        assert op["operationId"], where
        codes = set(op["responses"])
        assert codes & {"200", "201", "204"}, where
        assert {"400", "404"} <= codes, where
        if path != "/api/v1/auth/token/":
            assert "401" in codes and op.get("security"), where
        for code, response in op["responses"].items():
            if code.startswith("4"):
                refs = {c["schema"].get("$ref") for c in response["content"].values()}
                assert refs == {"#/components/schemas/Error"}, (where, code)
    error = schema["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"detail", "errors"}


def test_parameters_and_bodies_are_documented(schema):
    paths = schema["paths"]
    list_params = {p["name"] for p in paths["/api/v1/jobs/"]["get"]["parameters"]}
    assert {"group", "user", "phase", "status", "job_type", "created_after", "created_before", "q", "page",
            "page_size", "vocabulary"} <= list_params
    submit = paths["/api/v1/jobs/"]["post"]["requestBody"]["content"]
    assert {"application/json", "application/yaml", "text/yaml"} <= set(submit)
    body = schema["components"]["schemas"]["JobSubmitRequest"]
    assert body["additionalProperties"] is False
    assert set(body["required"]) == {"group", "image", "instance_type", "command"}
    logs = paths["/api/v1/jobs/{id}/logs/"]["get"]
    assert {"replica", "attempt", "tail_bytes", "start", "end"} <= {p["name"] for p in logs["parameters"]}
    assert "text/plain" in logs["responses"]["200"]["content"]
    assert {"X-Log-Size", "X-Log-Start", "X-Log-End", "X-Job-Finished"} <= set(logs["responses"]["200"]["headers"])
    usage = {p["name"] for p in paths["/api/v1/usage/"]["get"]["parameters"]}
    assert usage == {"since", "until", "group", "user"}
    job = schema["components"]["schemas"]["Job"]
    assert {"vocabulary_status", "vocabulary_code"} <= set(job["properties"])
    assert not {"vocabulary_status", "vocabulary_code"} & set(job["required"])


def test_schema_as_yaml_too(client):
    response = client.get(SCHEMA_URL)
    assert response.status_code == 200
    assert yaml.safe_load(response.content)["info"]["title"] == "jobsite API"


def test_swagger_ui_is_served_locally(client):
    response = client.get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "cdn." not in html and "https://" not in html
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    for asset in assets:
        asset_response = client.get(asset)
        assert asset_response.status_code == 200, asset
        if hasattr(asset_response, "close"):
            asset_response.close()


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_swagger_ui_lists_every_operation_in_a_browser(live_server):
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from django.test import Client

    schema = Client().get(SCHEMA_URL, HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    expected = sum(1 for item in schema["paths"].values() for m in item if m in METHODS)
    with chromium() as browser:
        page = browser.new_page()
        page.goto(live_server.url + "/api/docs/")
        page.wait_for_selector(".opblock", timeout=15_000)
        assert page.locator(".opblock").count() == expected
        assert page.locator("text=/api/v1/jobs/{id}/logs/").count() >= 1
