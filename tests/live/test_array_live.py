"""An array's row in a real browser: Chromium (Playwright) on the job list while an array of 5 with ``%2`` runs
after a job it depends on. The row's counts go Pending 5 → Running 2 → Succeeded 5 over the list's socket, with
never more than 2 members holding resources at once, and the page is never reloaded."""

from __future__ import annotations

import pytest

from jobs.models import JobArray
from jobs.services import arrays as array_services
from jobs.services import job_spec_validate
from tests.browser import ARTIFACTS

from . import test_live_browser as live
from .test_live_browser import logged_in, not_reloaded

# The live browser tests' fixtures: the ASGI server, the scheduler the test drives, Chromium.
asgi_server, scheduler, browser = live.asgi_server, live.scheduler, live.browser

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Records each state of every array row's counts ({status: n}), in order (consecutive repeats once).
WATCH_COUNTS = """() => {
  window.__counts = {};
  const record = () => {
    for (const row of document.querySelectorAll('#job-rows tr[data-array]')) {
      const state = {};
      for (const c of row.querySelectorAll('[data-status]')) {
        state[c.dataset.status] = Number(c.querySelector('b').textContent);
      }
      const seen = (window.__counts[row.dataset.array] = window.__counts[row.dataset.array] || []);
      if (JSON.stringify(seen[seen.length - 1]) !== JSON.stringify(state)) seen.push(state);
    }
  };
  new MutationObserver(record).observe(document.getElementById('job-rows'),
                                       {subtree: true, childList: true, characterData: true});
  record();
}"""


def count_of(page, array_id: int, status: str) -> str:
    return f'#job-rows tr[data-array="{array_id}"] [data-status="{status}"] b'


def test_an_arrays_row_counts_its_members_live(browser, asgi_server, scheduler, world, submit):
    page = logged_in(browser, asgi_server, "bob")
    page.evaluate(WATCH_COUNTS)
    bob = world.users["bob"]
    first = submit("bob", name="prepare", command="sleep 1")
    spec = job_spec_validate(user=bob, data={
        "name": "train", "group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny",
        "command": 'echo "index $JOB_ARRAY_INDEX"; sleep 2', "after": [{"job": first.pk, "when": "ok"}]})
    plan = array_services.array_plan_validate(spec=spec, array="0-4%2", sweep=None)
    array = array_services.array_submit(user=bob, spec=spec, plan=plan)

    # The array appears as one row, all five waiting for the job it depends on.
    page.wait_for_selector(f'{count_of(page, array.pk, "Pending")}:text-is("5")')
    row = page.locator(f'#job-rows tr[data-array="{array.pk}"]')
    assert "array of 5, 2 at once" in row.inner_text()
    assert page.locator("#job-rows tr[data-array]").count() == 1
    page.screenshot(path=str(ARTIFACTS / "array-row-pending.png"), full_page=True)

    scheduler.paused.clear()
    page.wait_for_selector(f'{count_of(page, array.pk, "Running")}:text-is("2")', timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "array-row-running.png"), full_page=True)
    page.wait_for_selector(f'{count_of(page, array.pk, "Succeeded")}:text-is("5")', timeout=60_000)

    states = page.evaluate(f"() => window.__counts['{array.pk}']")
    assert states[0] == {"Pending": 5} or states[0] == {"Submitted": 5}
    assert {"Pending": 5} in states and states[-1] == {"Succeeded": 5}
    holding = [s.get("Preparing", 0) + s.get("Running", 0) + s.get("Terminating", 0) for s in states]
    assert max(holding) == 2  # the %2 limit, as the row showed it
    assert not_reloaded(page)
    assert set(JobArray.objects.get().members.values_list("phase", flat=True)) == {"SUCCEEDED"}
    page.screenshot(path=str(ARTIFACTS / "array-row-succeeded.png"), full_page=True)
