"""Benchmark: from a status change in the backend to the new badge in a real browser's job list; and (--load)
1,000 sockets at 200 changes/s.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobsite_bench REDIS_URL=redis://127.0.0.1:6379/10 \
        .venv/bin/python bench/live_latency.py --load    # 1,000 sockets, 200 changes/s, 30 s

--load: uvicorn (one process, production settings) on PostgreSQL and Redis; --clients WebSocket clients (default
1,000, the ``websockets`` library, in --client-processes processes) on the job list's socket; this process makes
--rate status changes a second for --seconds through ``services.job_transition`` (20 running jobs, each change
numbered in the job's message). Prints p50 / p95 from each change to each socket's frame that shows it (or a later
state of the same job: bursts are coalesced), the socket×change pairs dropped, server errors and the channels left
in Redis groups, beside the goals (p95 ≤ 200 ms, 0 dropped), with the machine's load average.

    .venv/bin/python bench/live_latency.py                        # embedded (in-memory layer), then Redis if
    REDIS_URL=redis://127.0.0.1:6379/14 .venv/bin/python bench/live_latency.py    # REDIS_URL is set

For each channel layer it starts the ASGI app under uvicorn on a fresh SQLite database in a temporary directory
(or --database-url, which must point at a database it may fill), opens the job list in headless Chromium
(/usr/bin/chromium via Playwright), then makes --changes status changes through ``services.job_transition`` (a
RUNNING job flipping between Running, green, and CrashLoopBackOff, red) and times each one from just before the
transition to the moment a MutationObserver in the page sees the badge's new text. The same again with --clients
extra WebSocket clients (the ``websockets`` library, logged in with a session cookie) connected to /ws/jobs/
and receiving every message. Prints p50 / p95 / max in milliseconds; nothing is asserted.

Where the changes are made, so that they share the server's channel layer:
  memory  the embedded default: the server runs in a thread of this process, like ``manage.py serve`` runs the
          web server and the scheduler in one process; the in-memory layer hands messages to its event loop.
  redis   production: the server is a separate process (uvicorn), the changes are made here and published
          through Redis (channels_redis), as the scheduler or a Celery worker does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.waiting import wait_for  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
JOBS_ON_PAGE = 20

# In the page: every change of a badge's text, with its time (ms since the epoch, sub-millisecond).
OBSERVE = """() => {
  window.__seen = [];
  const shown = {};
  const scan = () => {
    const now = performance.timeOrigin + performance.now();
    for (const row of document.querySelectorAll('#job-rows tr[data-job]')) {
      const text = row.querySelector('.badge').textContent;
      if (shown[row.dataset.job] !== text) {
        if (shown[row.dataset.job] !== undefined) window.__seen.push({id: Number(row.dataset.job), text, t: now});
        shown[row.dataset.job] = text;
      }
    }
  };
  scan();
  new MutationObserver(scan).observe(document.getElementById('job-rows'),
                                     {subtree: true, childList: true, characterData: true, attributes: true});
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 20) -> None:
    def listens() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    wait_for(listens, timeout=timeout, interval=0.1, message=f"a server on port {port}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


# --- the child: one channel layer -----------------------------------------------------------------------------


def setup_world():
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from jobs import services
    from jobs.choices import Phase, Role
    from jobs.models import Group, Image, InstanceType, Job, Membership

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="bench-pass")
    group = Group.objects.create(name="bench")
    Membership.objects.create(group=group, user=user, role=Role.MEMBER)
    image = Image.objects.create(name="bench-image", url="bench:latest")
    itype = InstanceType.objects.create(name="bench-gpu", gpu=0)
    image.groups.add(group)
    itype.groups.add(group)
    jobs = []
    for i in range(JOBS_ON_PAGE):
        spec = services.job_spec_validate(user=user, data={"group": "bench", "image": "bench-image",
                                                           "instance_type": "bench-gpu", "command": "true",
                                                           "name": f"bench-{i}"})
        job = services.job_submit(user=user, spec=spec)
        services.job_transition(job=job, phase=Phase.PENDING, reason="Queued")
        services.job_admit(job=Job.objects.get(pk=job.pk), backend="bench", placement=[{"node": "bench"}])
        jobs.append(services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.RUNNING))
    return user, jobs


def session_cookie(user) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def start_server(layer: str, port: int, env: dict):
    """memory: uvicorn in a thread of this process; redis: a uvicorn process."""
    if layer == "memory":
        import uvicorn

        from jobsite.asgi import application

        server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, lifespan="off",
                                               log_level="warning", ws_per_message_deflate=False))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        wait_port(port)
        return lambda: (setattr(server, "should_exit", True), thread.join(10))
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "jobsite.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--lifespan", "off", "--log-level", "warning", "--ws-per-message-deflate", "false"],
        cwd=ROOT, env=env,
    )
    wait_port(port)
    return lambda: (process.terminate(), process.wait(10))


class ExtraClients:
    """N WebSocket clients on one event loop, counting the messages they receive (run as a separate process, as
    real clients are: their own work must not compete with the server's)."""

    def __init__(self, url: str, origin: str, cookie: str, count: int):
        self.url, self.origin, self.cookie, self.count = url, origin, cookie, count
        self.received = 0
        self.failed = 0
        self.ready = 0

    async def client(self, stopping: asyncio.Event) -> None:
        from page_watchers import page_socket

        try:
            await page_socket(self.url, self.origin, self.cookie, stopping, self._opened, self._frame)
        except Exception:
            self.failed += 1
            if self.ready + self.failed == self.count:
                print("connected", flush=True)

    def _opened(self) -> None:
        self.ready += 1
        if self.ready == self.count:
            print("connected", flush=True)

    def _frame(self) -> None:
        self.received += 1

    async def run(self) -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        tasks = []
        for _ in range(self.count):  # connect in small bursts, as browsers would
            tasks.append(asyncio.ensure_future(self.client(stopping)))
            await asyncio.sleep(0.005)
        command = await loop.run_in_executor(None, sys.stdin.readline)  # "reset" then "stop"
        while command.strip() == "reset":
            self.received = 0
            print("reset", flush=True)
            command = await loop.run_in_executor(None, sys.stdin.readline)
        stopping.set()
        await asyncio.gather(*tasks)
        print(f"received {self.received} failed {self.failed}", flush=True)


def start_clients(url: str, origin: str, cookie: str, count: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, __file__, "--clients-of", url, origin, cookie, str(count)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert process.stdout.readline().strip() == "connected"
    return process


def measure(page, jobs, changes: int, warmup: int = 10, interval: float = 0.0) -> list[float]:
    from jobs import services
    from jobs.choices import Phase
    from jobs.models import Job

    if not page.evaluate("() => Array.isArray(window.__seen)"):
        page.evaluate(OBSERVE)
    statuses = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "status"))
    latencies = []
    for i in range(warmup + changes):
        job = jobs[i % len(jobs)]
        status = "CrashLoopBackOff" if statuses[job.pk] == "Running" else "Running"
        statuses[job.pk] = status
        before = page.evaluate("() => window.__seen.length")
        t0 = time.time() * 1000
        services.job_transition(job=Job(pk=job.pk), phase=Phase.RUNNING, status=status,
                                reason="BackOff" if status != "Running" else "")
        page.wait_for_function(f"() => window.__seen.length > {before}", timeout=10_000)
        seen = page.evaluate(f"() => window.__seen[{before}]")
        assert (seen["id"], seen["text"]) == (job.pk, status), (seen, job.pk, status)
        if i >= warmup:
            latencies.append(seen["t"] - t0)
        if interval:
            time.sleep(interval)
    return latencies


def summary(label: str, latencies: list[float]) -> str:
    return (f"{label:<44} n={len(latencies):<4} p50={statistics.median(latencies):7.1f} ms  "
            f"p95={percentile(latencies, 95):7.1f} ms  max={max(latencies):7.1f} ms  "
            f"mean={statistics.fmean(latencies):6.1f} ms")


def child(args: argparse.Namespace) -> None:
    import django

    django.setup()
    from django.conf import settings

    port = free_port()
    user, jobs = setup_world()
    cookie = session_cookie(user)
    stop_server = start_server(args.layer, port, dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    layer = settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1]
    print(f"[{args.layer}] layer {layer}, database {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}, "
          f"{JOBS_ON_PAGE} jobs on the page, server {'in this process' if args.layer == 'memory' else 'a process'}",
          flush=True)
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
            context = browser.new_context(viewport={"width": 1360, "height": 900})
            context.add_cookies([{"name": "sessionid", "value": cookie, "url": base}])
            page = context.new_page()
            page.goto(base + "/")
            page.wait_for_function("() => window.jobsite && window.jobsite.opened >= 1")
            page.wait_for_timeout(300)  # the page's catch-up fetch on open
            latencies = measure(page, jobs, args.changes, interval=args.interval)
            print(summary(f"[{args.layer}] browser only", latencies), flush=True)

            if args.clients:
                clients = start_clients(f"ws://127.0.0.1:{port}/ws/jobs/", base, cookie, args.clients)
                time.sleep(0.5)
                clients.stdin.write("reset\n")
                clients.stdin.flush()
                assert clients.stdout.readline().strip() == "reset"
                latencies = measure(page, jobs, args.changes, warmup=0, interval=args.interval)
                time.sleep(1.0)
                clients.stdin.write("stop\n")
                clients.stdin.flush()
                _, received, _, failed = clients.stdout.readline().split()
                clients.wait(30)
                connected = args.clients - int(failed)
                print(summary(f"[{args.layer}] with {connected} more clients", latencies), flush=True)
                print(f"[{args.layer}]   the extra clients (another process) received {received} messages "
                      f"(expected {args.changes * connected}), {failed} failed to connect", flush=True)
            browser.close()
    finally:
        from jobs import live_publisher

        live_publisher.flush(5)
        stop_server()


# --- the parent: one child process per layer -------------------------------------------------------------------


def main() -> None:
    from live_load import LoadClients, load

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--clients", type=int, default=200, help="extra WebSocket clients (0: none)")
    parser.add_argument("--layer", choices=["memory", "redis", "both"], default=None,
                        help="default: both if REDIS_URL is set, else memory")
    parser.add_argument("--interval", type=float, default=0.0,
                        help="seconds between two changes (default 0: the next change as soon as the badge shows)")
    parser.add_argument("--database-url", default="", help="default: a new SQLite file in a temporary directory")
    parser.add_argument("--load", action="store_true",
                        help="instead: --clients sockets (default 1000) at --rate changes/s for --seconds against "
                             "uvicorn on PostgreSQL (--database-url) and Redis (REDIS_URL)")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--writers", type=int, default=10,
                        help="threads making the changes (jobs split between them)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to wait for the last frames")
    parser.add_argument("--server-log", default="", help="--load: write the server's log to this file")
    parser.add_argument("--web-workers", type=int, default=1, help="--load: uvicorn worker processes")
    parser.add_argument("--py-spy", default="", help="--load: py-spy executable: sample the web processes while "
                        "the changes are made and print where their time goes")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--load-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--clients-of", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--load-clients-of", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_clients_of:
        url, origin, cookie, count, changes_max = args.load_clients_of
        asyncio.run(LoadClients(url, origin, cookie, int(count), int(changes_max)).run())
        return
    if args.load_child:
        load(args)
        return
    if args.load:
        redis_url, database_url = os.environ.get("REDIS_URL", ""), args.database_url or os.environ.get(
            "DATABASE_URL", "")
        if not redis_url or not database_url.startswith("postgres"):
            parser.error("--load needs REDIS_URL and a PostgreSQL --database-url (or DATABASE_URL) it may fill")
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "jobsite.settings", "PYTHONPATH": str(ROOT),
               "DATABASE_URL": database_url, "REDIS_URL": redis_url, "DEBUG": "false", "LOG_LEVEL": "WARNING",
               "JOBSITE_SCHEDULER_MODE": "inprocess", "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-" + "x" * 50),
               # the writer threads, the publisher and the server's database thread each hold one
               "JOBSITE_DB_POOL_MAX": str(args.writers + 8)}
        clients = args.clients if "--clients" in sys.argv else 1000
        command = [sys.executable, __file__, "--load-child", "--clients", str(clients), "--rate", str(args.rate),
                   "--seconds", str(args.seconds), "--client-processes", str(args.client_processes),
                   "--settle", str(args.settle), "--writers", str(args.writers), "--server-log", args.server_log,
                   "--web-workers", str(args.web_workers), "--py-spy", args.py_spy]
        from proc_cpu import speed_line

        print(f"[load] {speed_line()} (before the run)", flush=True)
        subprocess.run(command, env=env, cwd=ROOT, check=True)
        return
    if args.clients_of:
        url, origin, cookie, count = args.clients_of
        asyncio.run(ExtraClients(url, origin, cookie, int(count)).run())
        return
    if args.child:
        child(args)
        return
    redis_url = os.environ.get("REDIS_URL", "")
    layers = {"memory": ["memory"], "redis": ["redis"], "both": ["memory", "redis"]}[
        args.layer or ("both" if redis_url else "memory")]
    if "redis" in layers and not redis_url:
        parser.error("the redis layer needs REDIS_URL")
    for layer in layers:
        with tempfile.TemporaryDirectory(prefix="jobsite-bench-") as tmp:
            env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
            env.update({
                "DJANGO_SETTINGS_MODULE": "jobsite.settings",
                "PYTHONPATH": str(ROOT),
                "JOBSITE_VAR_DIR": tmp,
                "JOBSITE_SCHEDULER_MODE": "inprocess",
                "DATABASE_URL": args.database_url or f"sqlite:///{tmp}/bench.sqlite3",
                "DJANGO_ALLOW_ASYNC_UNSAFE": "true",  # Playwright's sync API runs an event loop in the main thread
                "LOG_LEVEL": "WARNING",
            })
            if layer == "redis":
                env["REDIS_URL"] = redis_url
            command = [sys.executable, __file__, "--child", "--layer", layer, "--changes", str(args.changes),
                       "--clients", str(args.clients), "--interval", str(args.interval)]
            subprocess.run(command, env=env, cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
