"""The submit form in a real browser: a choice made while the new group's choices are on their way is kept (issue
22.6: the instance type picked within ~100 ms of changing the group went back to the default, and the job ran
without its GPU)."""

from __future__ import annotations

import os
import time

import pytest
from django.db import connections

from jobs import selectors
from tests.browser import chromium

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_instance_type_picked_while_the_group_switches_is_kept(live_server, world, monkeypatch):
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1360, "height": 900})
        page = context.new_page()
        page.set_default_timeout(20_000)
        try:
            page.goto(live_server.url + "/login/")
            page.fill("input[name=username]", "lin")
            page.fill("input[name=password]", "pw-lin")
            page.click("button:has-text('Log in')")
            page.wait_for_url(live_server.url + "/")
            page.goto(live_server.url + "/jobs/new/?group=phusers")
            assert page.eval_on_selector("select[name=instance_type]", "e => e.value") != "gpu-2"
            # From now on the server takes its time to draw a group's choices, as a busy one does.
            quota_rows = selectors.quota_rows
            monkeypatch.setattr(selectors, "quota_rows", lambda group: time.sleep(1.5) or quota_rows(group))
            page.select_option("select[name=group]", "research")  # the choices of research are on their way
            page.select_option("select[name=instance_type]", "gpu-2")  # picked before they arrive
            page.wait_for_function("() => (document.querySelector('#group-fields caption') || {}).textContent"
                                   " && document.querySelector('#group-fields caption').textContent"
                                   ".includes('research')")
            assert page.eval_on_selector("select[name=instance_type]", "e => e.value") == "gpu-2"
        finally:
            context.close()
            connections.close_all()
