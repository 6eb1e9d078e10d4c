"""Security headers: a Content-Security-Policy on every response (and pages that live with it), HTTPS-only
behaviour when JOBSITE_HTTPS says the site is served over HTTPS."""

import json
import os
import re
import subprocess
import sys

import pytest
from django.test import Client

from tests.test_settings_production import ROOT

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/login/", "/admin/login/", "/api/v1/jobs/", "/api/docs/", "/api/schema/"])
def test_every_response_carries_the_content_security_policy(path):
    response = Client().get(path)
    policy = response.headers.get("Content-Security-Policy", "")
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "object-src 'none'" in policy


def test_pages_run_no_inline_script(world, client):
    client.force_login(world.users["bob"])
    for path in ("/", "/submit/", "/groups/phusers/queue/", "/utilisation/", "/api/docs/"):
        html = client.get(path).content.decode()
        inline = [s for s in re.findall(r"<script\b([^>]*)>", html) if "src=" not in s and "json" not in s]
        assert not inline, (path, inline)


def test_the_api_docs_load_their_init_script_from_a_url(client):
    html = client.get("/api/docs/").content.decode()
    scripts = re.findall(r'<script src="([^"]+)"', html)
    init = [s for s in scripts if not s.startswith("/static/")]
    assert init, scripts
    response = client.get(init[0])
    assert response.status_code == 200 and "SwaggerUIBundle" in response.content.decode()


def https_settings(**extra: str) -> dict:
    code = ("import json; from django.conf import settings as s; print(json.dumps([getattr(s, n, None) for n in "
            "('SECURE_HSTS_SECONDS', 'SECURE_SSL_REDIRECT', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE')]))")
    dropped = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "PYTEST_VERSION")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**env, "DJANGO_SETTINGS_MODULE": "jobsite.settings", **extra})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_https_turns_on_hsts_secure_cookies_and_the_redirect():
    assert https_settings(JOBSITE_HTTPS="true") == [365 * 86400, True, True, True]
    assert https_settings() == [0, False, False, False]  # make run and make prod serve plain HTTP here
