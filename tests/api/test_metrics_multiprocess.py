"""Several web processes behind one port (jobsite/serve_web.py): /metrics, answered by any one of them, reports what
all of them counted (prometheus_client's multiprocess mode), and the gauges of processes that ended are forgotten."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobsite import serve_web

pytestmark = pytest.mark.django_db

# A web process: counts as the web app does (the same metric names), then waits for a line on stdin to end.
PROCESS = textwrap.dedent("""
    import sys
    from prometheus_client import Counter, Gauge
    rejected = Counter("jobsite_channel_messages_rejected", "x", ["reason"])
    open_sessions = Gauge("jobsite_job_sessions_open", "x", ["kind"], multiprocess_mode="livesum")
    rejected.labels("stale").inc(int(sys.argv[1]))
    open_sessions.labels("exec").inc(int(sys.argv[2]))
    print("counted", flush=True)
    sys.stdin.readline()
""")


def web_process(tmp_path, rejected: int, sessions: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", PROCESS, str(rejected), str(sessions)],
                               env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "counted"
    return process


def scrape(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content[:300]
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}


def test_metrics_add_up_the_counters_of_every_web_process(client, settings, tmp_path, monkeypatch):
    settings.JOBSITE_PRODUCTION = False
    settings.JOBSITE_METRICS_PUBLIC = False
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    first, second = web_process(tmp_path, 2, 1), web_process(tmp_path, 3, 2)
    try:
        figures = scrape(client)
        assert figures[("jobsite_channel_messages_rejected_total", (("reason", "stale"),))] == 5
        assert figures[("jobsite_job_sessions_open", (("kind", "exec"),))] == 3
        assert ("jobsite_jobs", (("phase", "RUNNING"),)) in figures  # the database gauges as before
        second.communicate("\n", timeout=30)  # that process ends (a worker restarted): its sessions are gone
        figures = scrape(client)
        assert figures[("jobsite_channel_messages_rejected_total", (("reason", "stale"),))] == 5  # counted still
        assert figures[("jobsite_job_sessions_open", (("kind", "exec"),))] == 1
    finally:
        for process in (first, second):
            if process.poll() is None:
                process.communicate("\n", timeout=30)


@pytest.mark.fast
def test_the_web_command_runs_the_workers_asked_for_with_an_empty_metrics_directory(tmp_path):
    environ = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"), "JOBSITE_WEB_WORKERS": "3",
               "REDIS_URL": "redis://127.0.0.1:6379/0"}
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "counter_123.db").write_bytes(b"an earlier run's")
    assert serve_web.prepare_metrics_dir(environ) == tmp_path / "metrics"
    assert not list((tmp_path / "metrics").iterdir())
    args = serve_web.command(["--port", "8000"], environ)
    assert args[1:4] == ["-m", "uvicorn", "jobsite.asgi:application"]
    assert args[args.index("--workers") + 1] == "3" and args[-2:] == ["--port", "8000"]
    assert args[args.index("--ws-per-message-deflate") + 1] == "false"
    with pytest.raises(SystemExit, match="REDIS_URL"):  # the in-memory layer reaches one process's sockets
        serve_web.command([], {"JOBSITE_WEB_WORKERS": "2"})
    assert "--workers" in serve_web.command([], {})
