"""The Terminal section of a running job's page, in a real Chromium against the embedded server of `make run`:
xterm.js on the exec WebSocket, authenticated by the session; a shell inside the job answers."""

import pytest

from tests.browser import chromium
from tests.e2e.api import call

from .test_jobctl_exec import wait_phase

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.slow]


@pytest.mark.parametrize("width, height, name", [(390, 844, "phone"), (1280, 900, "desktop")])
def test_the_browser_terminal_runs_a_shell_in_the_job(embedded_server, width, height, name):
    base = embedded_server
    token = call(base, "POST", "/api/v1/auth/token/", {"username": "bob", "password": "smoke-pass"})["token"]
    job = call(base, "POST", "/api/v1/jobs/", {"name": "terminal", "group": "phusers", "image": "base-notebook",
                                               "instance_type": "cpu-tiny", "command": "sleep 600"}, token=token)
    wait_phase(base, token, job["id"], {"RUNNING"})
    try:
        with chromium() as browser:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(base + "/login/")
            page.fill("input[name=username]", "bob")
            page.fill("input[name=password]", "smoke-pass")
            page.click("button[type=submit], input[type=submit]")
            page.wait_for_url(lambda url: "/login/" not in url, timeout=60_000)
            page.goto(f"{base}/jobs/{job['id']}/")
            page.click("[data-terminal-open]")
            page.wait_for_selector("[data-terminal-state]:has-text('Connected')", timeout=60_000)
            rows = page.locator("[data-terminal] .xterm-rows")
            page.wait_for_function("el => el.textContent.includes('$')", arg=rows.element_handle(),
                                   timeout=60_000)  # the shell's prompt
            page.locator("[data-terminal] .xterm-helper-textarea").focus()
            page.keyboard.type("echo job=$JOB_ID\n")
            page.wait_for_function(
                "([el, text]) => el.textContent.includes(text)",
                arg=[rows.element_handle(), f"job={job['id']}"], timeout=60_000)
            page.locator("[data-terminal-section]").scroll_into_view_if_needed()
            page.screenshot(path=f"/tmp/term-{name}.png", full_page=False)
            assert f"job={job['id']}" in rows.text_content()
    finally:
        call(base, "POST", f"/api/v1/jobs/{job['id']}/cancel/", {}, token=token)
