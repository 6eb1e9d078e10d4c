"""The job detail page, cancel and logs."""

from __future__ import annotations

import os
import re

import pytest
from django.urls import reverse

from jobs.choices import Role
from jobs.models import Attempt, Job, Membership
from scheduler.backend_factory import get_backend

pytestmark = pytest.mark.django_db


def detail(job) -> str:
    return reverse("jobs:detail", kwargs={"pk": job.pk})


def cancel(job) -> str:
    return reverse("jobs:cancel", kwargs={"pk": job.pk})


def log_url(job, number=1, rank=0) -> str:
    return reverse("jobs:log", kwargs={"pk": job.pk, "number": number, "rank": rank})


def write_log(job, text: str | bytes, number: int = 1, rank: int = 0):
    path = get_backend("local").log_path(job_id=job.pk, attempt_number=number, rank=rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    return path


# --- visibility ---------------------------------------------------------------------------------------------


def test_detail_visible_to_group_members_and_superusers(login, submit, client):
    job = submit("bob")
    assert login("bob").get(detail(job)).status_code == 200
    assert login("pan").get(detail(job)).status_code == 200
    assert login("admin").get(detail(job)).status_code == 200


def test_detail_404_for_non_member(login, submit, client):
    job = submit("bob", name="secret-job")
    response = login("eve").get(detail(job))
    assert response.status_code == 404
    assert "secret-job" not in response.content.decode()


def test_detail_404_for_missing_job(login, client):
    assert login("bob").get(reverse("jobs:detail", kwargs={"pk": 999999})).status_code == 404


# --- content ------------------------------------------------------------------------------------------------


def test_detail_shows_spec(login, submit, client):
    job = submit("bob", "gpu-2", name="spec-job", command="python train.py --lr 0.1\necho <done>",
                 env={"EPOCHS": "10", "LR": "0.1"}, replicas=2, job_type="interactive", priority=100,
                 active_deadline_seconds=7200, backoff_limit=3)
    html = login("bob").get(detail(job)).content.decode()
    assert "spec-job" in html
    assert "phusers" in html and "bob" in html
    assert "base-notebook" in html and "jupyter/base-notebook:latest" in html
    assert "gpu-2" in html and "per replica: 2 GPU · 16 CPU · 64 GiB" in html
    assert "total 4 GPU · 32 CPU · 128 GiB" in html
    assert "Interactive" in html
    assert "High" in html
    assert '<pre class="code">python train.py --lr 0.1\necho &lt;done&gt;</pre>' in html
    assert '<td class="mono">EPOCHS</td><td class="mono">10</td>' in html
    assert "2h 00m" in html and "(7200 s)" in html
    assert "<dt>Retries</dt><dd>3</dd>" in html


def test_detail_status_block_with_queue_position(login, submit, client, make_pending):
    make_pending(submit("pan", "gpu-4"))  # ahead of it: the position is derived from the queue order
    job = make_pending(submit("bob", "gpu-4"), reason="GroupQuota", message="waiting for group GPU quota 4/4")
    html = login("bob").get(detail(job)).content.decode()
    assert 'class="badge badge-orange"' in html and ">Pending</span>" in html
    assert "#2 in phusers" in html
    assert "GroupQuota" in html
    assert "waiting for group GPU quota 4/4" in html


def test_detail_events_with_warnings_highlighted(login, submit, client):
    from jobs import services

    job = submit("bob")
    services.job_transition(job=job, phase="INADMISSIBLE", status="Inadmissible", reason="QueueStopped",
                            message="the queue of phusers is stopped")
    html = login("bob").get(detail(job)).content.decode()
    assert "Submitted by bob to phusers" in html
    assert '<tr class="warning">' in html
    warning_row = html[html.index('<tr class="warning">'):]
    warning_row = warning_row[: warning_row.index("</tr>")]
    assert "Warning" in warning_row and "QueueStopped" in warning_row


def test_detail_attempts_table(login, submit, client, make_admitted):
    job, attempt = make_admitted(submit("bob", "gpu-1"))
    html = login("bob").get(detail(job)).content.decode()
    assert 'class="compact attempts"' in html
    assert "<td>local</td>" in html
    assert 'class="badge badge-green"' in html and ">ContainerCreating</span>" in html


def test_detail_is_live_instead_of_refreshing(login, submit, client):
    # Live over a WebSocket (tests/live); no meta refresh reloads the page any more.
    job = submit("bob")
    html = login("bob").get(detail(job)).content.decode()
    assert '<meta http-equiv="refresh"' not in html
    assert f'data-live="job" data-job="{job.pk}"' in html


def test_detail_has_clone_link(login, submit, client):
    job = submit("bob")
    html = login("pan").get(detail(job)).content.decode()
    assert f'href="{reverse("jobs:submit")}?clone={job.pk}"' in html


# --- cancel -------------------------------------------------------------------------------------------------


def test_cancel_button_only_for_who_may_act(login, submit, client):
    job = submit("bob")
    assert f'action="{cancel(job)}"' in login("bob").get(detail(job)).content.decode()
    assert f'action="{cancel(job)}"' not in login("pan").get(detail(job)).content.decode()
    assert f'action="{cancel(job)}"' in login("admin").get(detail(job)).content.decode()


def test_cancel_by_owner(login, submit, client, make_pending):
    job = make_pending(submit("bob"))
    response = login("bob").post(cancel(job))
    assert response.status_code == 302
    assert response["Location"] == detail(job)
    job.refresh_from_db()
    assert job.phase == "CANCELLED"
    assert job.reason == "CancelledByUser"
    page = client.get(detail(job)).content.decode()
    assert f"Job #{job.pk} cancelled." in page
    assert f'action="{cancel(job)}"' not in page  # no button once terminal


def test_cancel_by_other_member_is_forbidden(login, submit, client, make_pending):
    job = make_pending(submit("bob"))
    response = login("pan").post(cancel(job))
    assert response.status_code == 403
    job.refresh_from_db()
    assert job.phase == "PENDING"
    assert job.events.filter(reason="CancelledByUser").count() == 0


def test_cancel_by_non_member_is_404(login, submit, client):
    job = submit("bob")
    assert login("eve").post(cancel(job)).status_code == 404
    job.refresh_from_db()
    assert job.phase == "SUBMITTED"


def test_cancel_by_group_admin(login, submit, client, world):
    job = submit("bob")
    Membership.objects.filter(group=world.groups["phusers"], user=world.users["pan"]).update(role=Role.ADMIN)
    response = login("pan").post(cancel(job))
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.phase == "CANCELLED"
    assert job.message == "Cancelled by pan"


def test_cancel_running_job_goes_terminating(login, submit, client, make_admitted):
    job, _ = make_admitted(submit("bob"))
    login("bob").post(cancel(job))
    job.refresh_from_db()
    assert job.phase == "TERMINATING"
    assert f"Job #{job.pk} is being cancelled." in client.get(detail(job)).content.decode()


def test_cancel_of_ended_job_shows_error(login, submit, client):
    job = submit("bob")
    login("bob")
    client.post(cancel(job))
    response = client.post(cancel(job), follow=True)
    assert response.status_code == 200
    assert "has already ended" in response.content.decode()
    assert 'class="message message-error"' in response.content.decode()


def test_cancel_needs_post(login, submit, client):
    job = submit("bob")
    assert login("bob").get(cancel(job)).status_code == 405
    job.refresh_from_db()
    assert job.phase == "SUBMITTED"


def test_cancel_needs_csrf(submit, world):
    from django.test import Client

    job = submit("bob")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(world.users["bob"])
    assert strict.post(cancel(job)).status_code == 403
    job.refresh_from_db()
    assert job.phase == "SUBMITTED"


# --- logs ---------------------------------------------------------------------------------------------------


def test_detail_without_attempt_says_no_log(login, submit, client):
    job = submit("bob")
    assert "No log yet." in login("bob").get(detail(job)).content.decode()


def test_detail_log_missing_file_says_no_log(login, submit, client, make_admitted):
    job, _ = make_admitted(submit("bob"))
    html = login("bob").get(detail(job)).content.decode()
    assert "Attempt 1 · replica 0" in html
    assert "No log yet." in html


def test_detail_log_is_escaped(login, submit, client, make_admitted):
    job, _ = make_admitted(submit("bob"))
    write_log(job, "step 1\n<script>alert('x')</script>\ndone\n")
    html = login("bob").get(detail(job)).content.decode()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "<script>alert" not in html
    assert f'href="{log_url(job)}"' in html


def test_detail_shows_each_replica_log(login, submit, client, make_admitted):
    job, _ = make_admitted(submit("bob", replicas=2))
    write_log(job, "hello from rank zero\n", rank=0)
    write_log(job, "hello from rank one\n", rank=1)
    html = login("bob").get(detail(job)).content.decode()
    assert "Attempt 1 · replica 0" in html and "Attempt 1 · replica 1" in html
    assert "hello from rank zero" in html and "hello from rank one" in html


def test_detail_log_shows_only_the_tail(login, submit, client, make_admitted):
    job, _ = make_admitted(submit("bob"))
    lines = [f"line {i:07d} " + "x" * 100 for i in range(4000)]  # ~450 KiB
    write_log(job, "\n".join(lines) + "\nLAST LINE\n")
    html = login("bob").get(detail(job)).content.decode()
    assert "LAST LINE" in html
    assert "line 0000000 " not in html
    assert "last 256 KiB shown" in html


def test_log_view_streams_plain_text(login, submit, client, make_admitted):
    job, _ = make_admitted(submit("bob"))
    write_log(job, "<script>alert(1)</script>\n")
    response = login("pan").get(log_url(job))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert b"".join(response.streaming_content) == b"<script>alert(1)</script>\n"


def test_log_view_404s(login, submit, client, make_admitted):
    job, _ = make_admitted(submit("bob"))
    write_log(job, "hello\n")
    assert login("eve").get(log_url(job)).status_code == 404  # not a member
    login("bob")
    assert client.get(log_url(job, number=2)).status_code == 404  # no such attempt
    assert client.get(log_url(job, rank=1)).status_code == 404  # no such replica
    other = submit("bob")
    assert client.get(log_url(other)).status_code == 404  # not admitted


def test_log_view_404_when_file_missing(login, submit, client, make_admitted):
    job, _ = make_admitted(submit("bob"))
    assert login("bob").get(log_url(job)).status_code == 404


def test_detail_query_count_is_bounded(login, submit, client, make_admitted, django_assert_max_num_queries):
    job, _ = make_admitted(submit("bob"))
    for _ in range(20):
        from jobs import services

        services.event_record(job=Job.objects.get(pk=job.pk), reason="Tick", message="x")
    login("bob")
    with django_assert_max_num_queries(7):  # and one for its dependencies both ways
        client.get(detail(job))


# --- the first failed replica -------------------------------------------------------------------------------


def viewer_tag(html: str, number: int, rank: int) -> str:
    """The opening tag of the log viewer of replica ``rank`` of attempt ``number``."""
    match = re.search(rf'<details class="log" id="log-{number}-{rank}"[^>]*>', html)
    assert match, f"no viewer of attempt {number} replica {rank}"
    return match.group(0)


def viewer_summary(html: str, number: int, rank: int) -> str:
    start = html.index(viewer_tag(html, number, rank))
    return html[start: html.index("</summary>", start)]


def attempt_row(html: str, number: int) -> str:
    table = html[html.index('class="compact attempts"'):]
    rows = re.findall(r"<tr>\s*<td class=\"num\">(\d+)</td>(.*?)</tr>", table, re.S)
    return next(row for n, row in rows if int(n) == number)


def fail(attempt: Attempt, rank: int, exit_code: int) -> None:
    """What the scheduler writes when replica ``rank`` is the first of the attempt to fail."""
    Attempt.objects.filter(pk=attempt.pk).update(failed_rank=rank, exit_code=exit_code)


def test_detail_marks_the_failed_replica_and_opens_its_log(login, submit, client, make_admitted):
    job, attempt = make_admitted(submit("bob", replicas=3))
    for rank in range(3):
        write_log(job, f"hello from rank {rank}\n", rank=rank)
    fail(attempt, rank=1, exit_code=3)
    html = login("bob").get(detail(job)).content.decode()

    assert " open" in viewer_tag(html, 1, 1) and "data-failed" in viewer_tag(html, 1, 1)
    for rank in (0, 2):  # only the failed replica's log is unfolded
        assert " open" not in viewer_tag(html, 1, rank) and "data-failed" not in viewer_tag(html, 1, rank)
        assert "failed-mark" not in viewer_summary(html, 1, rank)
    assert re.search(r'<span class="failed-mark"[^>]*>failed · exit 3</span>', viewer_summary(html, 1, 1))
    assert html.count('class="failed-mark"') == 3  # the status card, the attempts table and the log's summary
    status = html[html.index('id="status-card"'):html.index("</section>", html.index('id="status-card"'))]
    assert re.search(r'<dt>Failed replica</dt><dd class="failed-rank"><a href="#log-1-1" data-open-log>replica 1</a> '
                     r'<span class="failed-mark"[^>]*>failed</span> <span class="muted">first in attempt 1</span>',
                     status)
    row = attempt_row(html, 1)
    assert re.search(r'<a href="#log-1-1" data-open-log>replica 1</a> <span class="failed-mark"[^>]*>failed</span>',
                     row)


def test_detail_without_a_failed_replica_opens_every_log_of_the_attempt(login, submit, client, make_admitted):
    job, attempt = make_admitted(submit("bob", replicas=2))
    html = login("bob").get(detail(job)).content.decode()
    assert all(" open" in viewer_tag(html, 1, rank) for rank in (0, 1))
    assert "failed-mark" not in html and "data-failed" not in html and "<dt>Failed replica</dt>" not in html
    assert "<th>Failed replica</th>" in html and "<td class=\"failed-rank\">—</td>" in attempt_row(html, 1)


def test_a_failed_earlier_attempt_is_marked_but_the_current_one_is_shown(login, submit, client, make_admitted):
    job, first = make_admitted(submit("bob", replicas=2))
    fail(first, rank=0, exit_code=137)
    second = Attempt.objects.create(job=job, number=2, replicas=2, gpu=job.gpu, backend="local")
    Job.objects.filter(pk=job.pk).update(current_attempt=second)
    html = login("bob").get(detail(job)).content.decode()
    assert all(" open" in viewer_tag(html, 2, rank) for rank in (0, 1))  # nothing failed in attempt 2 yet
    assert all(" open" not in viewer_tag(html, 1, rank) for rank in (0, 1))
    assert "failed · exit 137" in viewer_summary(html, 1, 0)
    assert "replica 0</a>" in attempt_row(html, 1) and "failed-mark" not in attempt_row(html, 2)


def test_live_fragment_carries_the_failed_replica(login, submit, client, make_admitted):
    job, attempt = make_admitted(submit("bob", replicas=2))
    fail(attempt, rank=1, exit_code=2)
    html = login("bob").get(detail(job) + "?fragment=live").content.decode()
    assert "data-failed" in viewer_tag(html, 1, 1) and " open" in viewer_tag(html, 1, 1)
    assert " open" not in viewer_tag(html, 1, 0)


# --- the same in a browser, at desktop and phone width ------------------------------------------------------


@pytest.fixture
def browser_page(live_server):
    from django.db import connections

    from tests.browser import chromium

    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM calls between Playwright's page actions
    with chromium() as browser:
        def open_page(username: str, width: int, height: int):
            context = browser.new_context(viewport={"width": width, "height": height})
            page = context.new_page()
            page.set_default_timeout(15_000)
            page.goto(live_server.url + "/login/")
            page.fill("input[name=username]", username)
            page.fill("input[name=password]", f"pw-{username}")
            page.click("button:has-text('Log in')")
            page.wait_for_url(live_server.url + "/")
            return page

        try:
            yield open_page
        finally:
            connections.close_all()


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("width,height,name", [(1360, 900, "desktop"), (390, 844, "phone")])
def test_browser_shows_the_failed_replica_and_its_log(browser_page, live_server, submit, make_admitted,
                                                      width, height, name):
    from tests.browser import ARTIFACTS

    job, first = make_admitted(submit("bob", "gpu-1", name="ddp-run", replicas=3))
    for rank in range(3):
        write_log(job, f"[rank {rank}] step 1 loss 0.93\n", rank=rank)
    write_log(job, "[rank 1] step 1 loss 0.93\n[rank 1] RuntimeError: CUDA error: out of memory\n", rank=1)
    fail(first, rank=1, exit_code=3)
    page = browser_page("bob", width, height)
    page.goto(live_server.url + detail(job))
    page.wait_for_function("() => window.jobsite && window.jobsite.ready")

    failed = page.locator("#log-1-1")
    assert failed.evaluate("el => el.open") is True
    assert failed.locator("summary .failed-mark").inner_text() == "failed · exit 3"
    assert failed.locator("summary .failed-mark").is_visible()
    assert "CUDA error: out of memory" in failed.locator("pre.log-text").inner_text()
    assert failed.locator("pre.log-text").is_visible()
    for rank in (0, 2):
        assert page.locator(f"#log-1-{rank}").evaluate("el => el.open") is False
        assert not page.locator(f"#log-1-{rank} pre.log-text").is_visible()
    assert page.locator("#status-card dd.failed-rank").inner_text() == "replica 1 failed first in attempt 1"
    cell = page.locator("table.attempts td.failed-rank")
    assert cell.inner_text() == "replica 1 failed"
    red = cell.locator(".failed-mark").evaluate("el => getComputedStyle(el).color")
    assert red == "rgb(194, 5, 16)"  # the error colour, with the word "failed"
    page.locator("#logs-h").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / f"ui-detail-failed-rank-{name}.png"), full_page=True)


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_browser_opens_the_current_attempt_and_an_older_log_on_click(browser_page, live_server, submit, make_admitted):

    job, first = make_admitted(submit("bob", "gpu-1", name="ddp-retry", replicas=2))
    fail(first, rank=0, exit_code=137)
    second = Attempt.objects.create(job=job, number=2, replicas=2, gpu=1, backend="local")
    Job.objects.filter(pk=job.pk).update(current_attempt=second)
    write_log(job, "attempt 1 rank 0: Killed\n", number=1, rank=0)
    for rank in (0, 1):
        write_log(job, f"attempt 2 rank {rank}: step 1\n", number=2, rank=rank)
    page = browser_page("bob", 1360, 900)
    page.goto(live_server.url + detail(job))
    page.wait_for_function("() => window.jobsite && window.jobsite.ready")
    assert [page.locator(f"#log-{n}-{r}").evaluate("el => el.open") for n, r in ((2, 0), (2, 1), (1, 0), (1, 1))] \
        == [True, True, False, False]

    # The attempts table's "replica 0" of attempt 1 unfolds that log.
    page.locator("table.attempts a[data-open-log]", has_text="replica 0").click()
    page.wait_for_function("() => document.getElementById('log-1-0').open")
    assert page.locator("#log-1-0 .log-link").is_visible()

