"""The live pages over HTTP: rows and fragments they refetch, log ranges, queue, utilisation, usage, YAML specs."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from jobs import live_publisher, prepared, services
from jobs.choices import Phase
from jobs.models import Attempt, Job
from jobs.templatetags.usage_charts import axis, stacked_bars
from scheduler.backend_factory import get_backend

from .conftest import admitted, pending

pytestmark = pytest.mark.django_db

SUBMIT = reverse("jobs:submit")


def row_ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr id="job-(\d+)" data-job=', html)]


def write_log(job: Job, data: bytes, number: int = 1, rank: int = 0):
    path = get_backend("local").log_path(job_id=job.pk, attempt_number=number, rank=rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# --- publishing ---------------------------------------------------------------------------------------------


def test_each_change_is_rendered_once_as_the_list_row_in_one_query(submit, django_assert_num_queries):
    jobs = [submit("bob") for _ in range(5)]
    with django_assert_num_queries(1):
        items = live_publisher.render_rows([j.pk for j in jobs] * 2)
    assert [item["id"] for item in items] == sorted(j.pk for j in jobs)
    assert all(item["row"].startswith(f'<tr id="job-{item["id"]}"') for item in items)


def test_a_batch_larger_than_a_statement_takes_is_read_in_parts(submit, monkeypatch, django_assert_num_queries):
    """A pass that changed 50,000 jobs at once published them as one batch: read as one statement, PostgreSQL
    refused it (more than 65,535 parameters) and none of their rows reached the pages."""
    jobs = [submit("bob") for _ in range(3)]
    gone = range(10**9, 10**9 + 70_000)  # ids of no job: only the statement's size matters
    items = live_publisher.render_rows([*gone, *(j.pk for j in jobs)])
    assert [item["id"] for item in items] == [j.pk for j in jobs]
    monkeypatch.setattr(prepared, "IDS_A_STATEMENT", 2)
    with django_assert_num_queries(2):  # 2 + 1 jobs, none of them pending (no queue positions to read)
        assert [item["id"] for item in live_publisher.render_rows([j.pk for j in jobs])] == [j.pk for j in jobs]


def test_rows_in_every_state_are_rendered_without_reading_a_column_per_row(submit, django_assert_num_queries):
    """The row's query leaves out the columns it does not show (live_publisher.ROW_UNUSED_FIELDS): a row that read
    one would cost a query per job. Queued, running over quota, ended: two queries (rows, queue positions)."""
    queued = pending(submit("bob"), position=1)
    running, _ = admitted(submit("pan", name="big"))
    services.job_transition(job=running, phase=Phase.RUNNING, reason="Started", over_quota=True)
    ended, _ = admitted(submit("bob"))
    services.job_transition(job=ended, phase=Phase.FAILED, reason="Error", exit_code=3)
    with django_assert_num_queries(2):
        items = live_publisher.render_rows([queued.pk, running.pk, ended.pk])
    rows = {item["id"]: item["row"] for item in items}
    assert "#1 in" in rows[queued.pk] and "over quota" in rows[running.pk] and "big" in rows[running.pk]


def test_publish_never_raises(monkeypatch, submit, caplog):
    job = submit("bob")

    def broken(*args, **kwargs):
        raise ConnectionError("layer down")

    monkeypatch.setattr(live_publisher, "_sockets_here", lambda: True)
    monkeypatch.setattr(live_publisher, "_dispatch", broken)
    live_publisher.publish_job_changes([job.pk])  # logged, not raised
    assert "could not publish" in caplog.text


def test_publish_is_after_commit(submit, django_capture_on_commit_callbacks, monkeypatch):
    sent = []
    monkeypatch.setattr(live_publisher, "_sockets_here", lambda: True)
    monkeypatch.setattr(live_publisher, "_dispatch", lambda sends: sent.extend(sends))
    job = submit("bob")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        pending(job)
    assert sent == []  # nothing before commit
    for callback in callbacks:
        callback()
    # One message per audience (the job's group, superusers, its page, utilisation), however many sockets listen.
    assert [g for g, _ in sent] == [f"jobs.group.{job.group_id}", "jobs.all", f"jobs.job.{job.pk}",
                                    "jobs.utilisation"]
    assert [item["id"] for item in sent[0][1]["items"]] == [job.pk]
    assert [item["id"] for item in sent[2][1]["items"]] == [job.pk]
    assert sent[3][1]["items"] == []


# --- the job list -------------------------------------------------------------------------------------------


def test_list_rows_carry_what_the_live_page_updates(login, submit):
    job = pending(submit("bob", "gpu-1", name="row"), 3)
    html = login("bob").get(reverse("jobs:list")).content.decode()
    row = re.search(rf'<tr id="job-{job.pk}".*?</tr>', html, re.S).group(0)
    assert f'data-updated="{job.updated_at.isoformat()}"' in row
    assert 'class="badge badge-orange" data-color="#fd8608"' in row and ">Pending</span>" in row
    assert "#1 in phusers" in row  # derived where read: the only one waiting
    assert 'class="num duration" data-start="" data-end=""' in row
    assert 'hx-ext="ws" ws-connect="/ws/jobs/?page=1&amp;since=' in html


def client_get(login, username: str, url: str) -> str:
    response = login(username).get(url)
    assert response.status_code == 200
    return response.content.decode()


# --- the job detail -----------------------------------------------------------------------------------------


def test_detail_live_fragment_has_head_status_attempts_and_new_log_viewers(login, submit):
    job, attempt = admitted(submit("bob", "gpu-1"))
    write_log(job, b"x" * 1000)
    html = client_get(login, "bob", reverse("jobs:detail", args=[job.pk]) + "?fragment=live")
    for part in ('id="job-head"', 'id="status-card"', 'id="attempts-card"', 'id="logs-list"', 'id="log-1-0"'):
        assert part in html
    assert "<html" not in html and 'id="events"' not in html
    assert "xxxxxxxx" not in html  # viewers of the fragment are empty: they follow from the start
    assert 'data-current' in html and ">ContainerCreating</span>" in html


def test_detail_has_the_log_viewer_controls(login, submit):
    job, _ = admitted(submit("bob"))
    data = b"\x1b[31mred\x1b[0m\n<b>not bold</b>\n"
    write_log(job, data)
    html = client_get(login, "bob", reverse("jobs:detail", args=[job.pk]))
    viewer = re.search(r'<details class="log" id="log-1-0".*?</details>', html, re.S).group(0)
    assert 'data-start="0"' in viewer and f'data-end="{len(data)}"' in viewer
    assert "data-log-follow checked" in viewer  # the running attempt follows
    assert "Jump to end" in viewer and "Download full log" in viewer and "Load earlier" in viewer
    assert "&lt;b&gt;not bold&lt;/b&gt;" in viewer  # escaped; colours are drawn by the page's script
    log_url = reverse("jobs:log", kwargs={"pk": job.pk, "number": 1, "rank": 0})
    assert f'href="{log_url}" download' in viewer


def test_a_50_mb_log_opens_fast_with_only_its_tail(login, submit):
    job, _ = admitted(submit("bob"))
    line = b"0123456789" * 10 + b"\n"  # 101 bytes
    count = 50 * 1024 * 1024 // len(line)
    write_log(job, line * count + b"THE END\n")
    size = len(line) * count + 8
    client = login("bob")
    response = client.get(reverse("jobs:detail", args=[job.pk]))
    html = response.content.decode()
    assert "THE END" in html and "last 256 KiB shown" in html
    assert len(html) < 400 * 1024  # the page carries the tail, not 50 MB
    start = int(re.search(r'id="log-1-0"[^>]*data-start="(\d+)"', html).group(1))
    assert (size - start) <= 256 * 1024 and (start % len(line)) == 0  # at a line boundary

    # "Load earlier" asks the API for the bytes before the tail.
    earlier = client.get(reverse("api:job-logs", args=[job.pk]), {"start": start - 64 * 1024, "end": start})
    body = b"".join(earlier.streaming_content)
    assert earlier.status_code == 200 and len(body) == 64 * 1024
    assert earlier["X-Log-Size"] == str(size) and body.endswith(line)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_full_log_download_streams_under_asgi(submit, world):
    """Under ASGI the download is an async stream read in chunks, never the whole file in memory first."""
    from asgiref.sync import sync_to_async
    from django.test import AsyncClient

    job, _ = await sync_to_async(lambda: admitted(submit("bob")))()
    body = b"line\n" * 100_000
    await sync_to_async(write_log)(job, body)
    client = AsyncClient()
    await sync_to_async(client.force_login)(world.users["bob"])
    response = await client.get(reverse("jobs:log", kwargs={"pk": job.pk, "number": 1, "rank": 0}))
    assert response.status_code == 200 and response.is_async
    assert response["Content-Length"] == str(len(body))
    assert b"".join([chunk async for chunk in response.streaming_content]) == body


def test_log_of_a_finished_ttl_cleaned_job_stays_readable(login, submit):
    from scheduler.sync import housekeeping

    job, attempt = admitted(submit("bob"))
    write_log(job, b"trained\n")
    services.job_transition(job=job, phase=Phase.RUNNING)
    services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.SUCCEEDED, reason="Completed", exit_code=0)
    housekeeping(backend=get_backend("local"), now=timezone.now() + timedelta(days=8))  # past the 7-day TTL
    job.refresh_from_db()
    assert job.cleaned_at is not None
    html = client_get(login, "pan", reverse("jobs:detail", args=[job.pk]))
    assert "trained" in html
    assert "data-log-follow checked" not in html  # ended: no follow by default
    raw = login("pan").get(reverse("api:job-log-raw", args=[job.pk]), {"attempt": 1, "replica": 0})
    assert b"".join(raw.streaming_content) == b"trained\n"


# --- queue, utilisation, usage ------------------------------------------------------------------------------


def test_queue_page_for_members_only(login, submit, world):
    url = reverse("jobs:queue", args=["phusers"])
    assert login("eve").get(url).status_code == 404
    assert login("admin").get(url).status_code == 200
    assert login("bob").get(url).status_code == 200
    assert login("bob").get(reverse("jobs:queue", args=["research"])).status_code == 404


def test_queue_page_lists_waiting_jobs_in_order_with_bars(login, submit, world):
    running, _ = admitted(submit("bob", "gpu-4", name="big"))
    low = pending(submit("pan", "gpu-1", name="low-prio", priority=0), 2, "GroupQuota", "waiting for group GPU quota")
    high = pending(submit("lin", "gpu-1", name="high-prio", priority=100), 1, "GroupQuota", "waiting for quota 4/4")
    fresh = submit("bob", name="fresh")
    html = client_get(login, "pan", reverse("jobs:queue", args=["phusers"]))
    order = [int(i) for i in re.findall(r'<tr data-job="(\d+)">', html)]
    assert order == [high.pk, fresh.pk, low.pk]  # priority, then submission time
    assert "waiting for quota 4/4" in html and "Not looked at by the scheduler yet." in html
    assert ">#1</td>" in html and ">#2</td>" in html
    # GPU quota 4, all used by bob's job: a full bar, the figures in text too.
    assert re.search(r"<strong>4</strong> used\s+of 4 quota", html)
    assert 'class="bar bar-full"' in html and "width: 100.00%" in html
    assert ">bob</td>" in html  # per-user usage
    assert running.pk not in order
    partial = login("pan").get(reverse("jobs:queue", args=["phusers"]), HTTP_HX_REQUEST="true").content.decode()
    assert partial.startswith('<div id="queue-live">') and "<html" not in partial


def test_queue_page_paginates(login, submit):
    for i in range(55):
        submit("bob", name=f"q{i}")
    html = client_get(login, "bob", reverse("jobs:queue", args=["phusers"]))
    assert len(re.findall(r'<tr data-job="', html)) == 50 and "Page 1 of 2" in html
    html = client_get(login, "bob", reverse("jobs:queue", args=["phusers"]) + "?page=2")
    assert len(re.findall(r'<tr data-job="', html)) == 5


def test_utilisation_page(login, submit):
    admitted(submit("bob", "gpu-2"))
    submit("eve", group="other")
    html = client_get(login, "eve", reverse("jobs:utilisation"))
    tiles = dict((label, int(value)) for value, label in
                 re.findall(r'<span class="tile-value">(\d+)</span><span class="tile-label">([^<]+)</span>', html))
    assert tiles == {"GPUs": 8, "in use": 2, "free": 6, "jobs running": 1, "jobs queued": 1}
    assert '<td class="mono">local</td>' in html
    partial = login("eve").get(reverse("jobs:utilisation"), HTTP_HX_REQUEST="true").content.decode()
    assert partial.startswith('<div id="util-live">')


def test_usage_page_chart_and_table(login, submit, world):
    job, attempt = admitted(submit("bob", "gpu-2"))
    Attempt.objects.filter(pk=attempt.pk).update(started_at=timezone.now() - timedelta(hours=3))
    services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.RUNNING)
    services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.SUCCEEDED, reason="Completed")
    other, other_attempt = admitted(submit("eve", group="other"))  # no GPU: not counted anyway
    html = client_get(login, "pan", reverse("jobs:usage"))
    assert "<svg" in html and 'role="img"' in html
    assert re.search(r'<rect x="[\d.]+" y="[\d.]+" width="[\d.]+" height="[\d.]+" fill="#3b6fd1"><title>[^<]*'
                     r'bob: 6\.00 GPU-h</title></rect>', html)
    assert "<td>phusers</td><td>bob</td><td class=\"num\">6.00</td>" in html
    assert "last 30 days" in html
    assert "eve" not in re.search(r'<table class="compact usage-table">.*?</table>', html, re.S).group(0)
    by_group = client_get(login, "pan", reverse("jobs:usage") + "?days=7&by=group")
    assert "phusers: 6.00 GPU-h" in by_group and 'value="7" selected' in by_group
    assert "No GPU time" in client_get(login, "eve", reverse("jobs:usage"))


def test_chart_geometry():
    assert axis(0) == (1.0, 0.25, 2)
    assert axis(7) == (8.0, 2.0, 0) and axis(22) == (30.0, 10.0, 0) and axis(1000) == (1000.0, 250.0, 0)
    assert axis(0.001) == (0.001, 0.00025, 5)
    from datetime import date

    days = [date(2024, 3, d) for d in range(1, 4)]
    series = [{"name": f"u{i}", "values": {days[0]: 1.0, days[2]: 2.0}, "total": 3.0} for i in range(11)]
    chart = stacked_bars(days, series)
    assert [s["name"] for s in chart["legend"]][-1] == "2 others" and len(chart["legend"]) == 10
    bars_day0 = [b for b in chart["bars"] if "2024-03-01" in b["title"]]
    assert len(bars_day0) == 10  # nine series and "others"
    top = min(b["y"] for b in chart["bars"] if "2024-03-03" in b["title"])
    assert top >= chart["top"] - 0.01  # the tallest stack (22) fits under the axis top (30)
    assert [t["label"] for t in chart["ticks"]] == ["0", "10", "20", "30"]


def test_nav_links_to_queues_utilisation_and_usage(login):
    html = client_get(login, "lin", reverse("jobs:list"))
    assert f'href="{reverse("jobs:queue", args=["phusers"])}"' in html
    assert f'href="{reverse("jobs:queue", args=["research"])}"' in html
    assert f'href="{reverse("jobs:utilisation")}"' in html and f'href="{reverse("jobs:usage")}"' in html
    html = client_get(login, "bob", reverse("jobs:usage"))
    assert f'href="{reverse("jobs:queue", args=["phusers"])}"' in html
    assert reverse("jobs:queue", args=["research"]) not in html


# --- YAML job specs -----------------------------------------------------------------------------------------

SPEC = """
name: resnet50
group: research
image: base-notebook
instance_type: gpu-2
command: |
  python train.py --epochs 10
env:
  EPOCHS: 10
  LR: "0.001"
replicas: 2
job_type: training
priority: high
preemptible: true
backoff_limit: 3
active_deadline_seconds: 7200
"""


def load(login, username: str, **data):
    return login(username).post(SUBMIT, {"load_yaml": "1", **data}).content.decode()


def value(html: str, name: str) -> str | None:
    match = re.search(rf'<input type="\w+" name="{name}" value="([^"]*)"', html)
    return match.group(1) if match else None


def selected(html: str, name: str) -> str | None:
    select = re.search(rf'<select name="{name}"[^>]*>(.*?)</select>', html, re.S)
    found = re.search(r'<option value="([^"]*)"[^>]* selected>', select.group(1))
    return found.group(1) if found else None


def test_yaml_spec_fills_in_the_form(login, world):
    html = load(login, "lin", spec=SPEC)
    assert 'id="yaml-loaded"' in html
    assert value(html, "name") == "resnet50"
    assert selected(html, "group") == "research" and selected(html, "instance_type") == "gpu-2"
    assert selected(html, "priority") == "high" and selected(html, "job_type") == "training"
    assert value(html, "replicas") == "2" and value(html, "timeout") == "7200" and value(html, "retries") == "3"
    assert "python train.py --epochs 10\n</textarea>" in html
    assert "EPOCHS=10\nLR=0.001</textarea>" in html
    assert re.search(r'<input type="checkbox" name="preemptible"[^>]* checked>', html)
    assert Job.objects.count() == 0  # filled in, not submitted


def test_yaml_spec_upload(login, world):
    upload = SimpleUploadedFile("job.yaml", SPEC.encode(), content_type="application/x-yaml")
    html = load(login, "lin", spec_file=upload)
    assert value(html, "name") == "resnet50"


@pytest.mark.parametrize(("spec", "error"), [
    ("name: [unclosed", "YAML parse error at line 1, column 16: while parsing a flow sequence"),
    ("- a list\n- of things", "A job spec is a mapping of field: value"),
    ("name: x\nfoo: 1\ngpus: 2", "foo: Unknown field."),
    ("replicas: many", "replicas: Give a whole number, not a string (&#x27;many&#x27;)."),
    ("replicas: 0", "replicas: Ensure this value is greater than or equal to 1."),
    ("priority: urgent", "priority: &#x27;urgent&#x27; is not a priority: use low, normal or high (or 0, 50, 100)."),
    ("env: [A, B]", "env: Give environment variables as an object of NAME: value."),
    ("group: research", "group: you are not a member of a group named &#x27;research&#x27;."),
    ("group: phusers\nimage: nope", "image: &#x27;nope&#x27; is not an image of group phusers."),
    ("", "Paste a YAML job spec or choose a file."),
    # An alias bomb is neither expanded nor printed: aliases are refused, as by the API.
    ("a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
     + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 8)) + "replicas: *a7",
     "aliases (*name) are not allowed in a job spec."),
])
def test_yaml_spec_errors_are_clear(login, world, spec, error):
    html = load(login, "bob", spec=spec)
    assert 'id="yaml-errors"' in html and "The spec was not loaded" in html
    assert error in html
    assert '<details class="card yaml-card" id="yaml-spec" open>' in html
