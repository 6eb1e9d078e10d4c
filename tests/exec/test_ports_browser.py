"""A job's port in a real Chromium against the embedded server of `make run` (reached at 127.0.0.1): the job page's
Open link leads to the port's own host, j<id>-p<port>.ports.localhost (the default ports' domain: browsers resolve
*.localhost to this machine), where the job's page runs without the site's cookies and cannot read the site."""

import pytest

from tests import waiting
from tests.browser import chromium
from tests.e2e.api import call

from .test_jobctl_exec import wait_phase

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.slow]

SERVER = ("mkdir -p site/jobs/$JOB_ID/ports/8888 && echo '<p>hello from the job</p>' > site/jobs/$JOB_ID/ports/8888/"
          "index.html && exec python3 -m http.server 8888 --bind 127.0.0.1 --directory site")

# Run in the job's page: what it can reach of the site with the visitor's login.
PROBE = """async (site) => {
  const out = {cookies: document.cookie};
  try { out.site = (await fetch(site + "/api/v1/jobs/", {credentials: "include"})).status; }
  catch (e) { out.site = "refused"; }
  out.here = (await fetch("/api/v1/jobs/")).status;
  return out;
}"""


def test_the_open_link_serves_the_port_from_its_own_host(embedded_server):
    base = embedded_server
    port = base.rsplit(":", 1)[1]
    token = call(base, "POST", "/api/v1/auth/token/", {"username": "bob", "password": "smoke-pass"})["token"]
    job = call(base, "POST", "/api/v1/jobs/", {"name": "web", "group": "phusers", "image": "base-notebook",
                                               "instance_type": "cpu-tiny", "command": SERVER,
                                               "ports": [{"name": "web", "port": 8888}]}, token=token)
    wait_phase(base, token, job["id"], {"RUNNING"})
    try:
        with chromium() as browser:
            page = browser.new_page()
            page.goto(base + "/login/")
            page.fill("input[name=username]", "bob")
            page.fill("input[name=password]", "smoke-pass")
            page.click("button[type=submit], input[type=submit]")
            page.wait_for_url(lambda url: "/login/" not in url, timeout=60_000)
            page.goto(f"{base}/jobs/{job['id']}/")
            own = f"http://j{job['id']}-p8888.ports.localhost:{port}/jobs/{job['id']}/ports/8888/"
            tabs = []

            def opened_the_jobs_page():  # the server in the job may still be starting: open again until it answers
                with page.context.expect_page() as opened:
                    page.click("[data-port-open='8888']")
                tabs.append(opened.value)
                tabs[-1].wait_for_load_state(timeout=60_000)
                return "hello from the job" in tabs[-1].content()

            waiting.wait_for(opened_the_jobs_page, timeout=120, interval=1,
                             message=lambda: f"the job's page at {tabs[-1].url}: {tabs[-1].content()[:300]}")
            app = tabs[-1]
            assert app.url == own, app.url
            assert "hello from the job" in app.content()
            probe = app.evaluate(PROBE, base)
            assert probe == {"cookies": "", "site": "refused", "here": 404}, probe
    finally:
        call(base, "POST", f"/api/v1/jobs/{job['id']}/cancel/", {}, token=token)
