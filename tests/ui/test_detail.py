"""The job detail page, cancel and logs."""

from __future__ import annotations

import pytest
from django.urls import reverse

from jobs.choices import Role
from jobs.models import Job, Membership
from scheduler.backends import get_backend

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
    job = make_pending(submit("bob", "gpu-4"), position=2, reason="GroupQuota",
                      message="waiting for group GPU quota 4/4")
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
    assert f"Job #{job.pk} is being stopped." in client.get(detail(job)).content.decode()


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
    with django_assert_max_num_queries(6):
        client.get(detail(job))
