"""The --load half of bench/live_latency.py: 1,000 WebSocket clients on the job list while changes are made at a
rate; see that file's docstring. Run it through ``bench/live_latency.py --load`` (the clients' processes are started
as ``live_latency.py --load-clients-of``)."""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path

from live_latency import ROOT, free_port, session_cookie, setup_world, wait_port

LOAD_GOAL_P95_MS = 200.0
SEQ = re.compile(rb"bench-seq (\d+)")
BUCKET_MS = 1.0  # latency histogram resolution
BUCKETS = 120_000  # up to 120 s


class LoadClients:
    """``count`` sockets on one event loop (one process of several). Each frame's rows carry the change's sequence
    number (in the job's message); per socket the first time each number is seen is kept. At the end, with the
    parent's log of changes (seq → job, time made), each change's latency is when that socket first saw it or a
    later change of the same job (a burst coalesced into its last state counts as delivered), and a change never
    covered by what the socket got is dropped."""

    def __init__(self, url: str, origin: str, cookie: str, count: int, changes_max: int):
        self.url, self.origin, self.cookie, self.count = url, origin, cookie, count
        self.seen = [array("d", bytes(8 * changes_max)) for _ in range(count)]
        self.frames = 0
        self.failed = 0
        self.ready = 0

    async def client(self, index: int, stopping: asyncio.Event) -> None:
        import websockets

        seen = self.seen[index]
        try:
            async with websockets.connect(self.url, origin=self.origin, additional_headers={
                    "Cookie": f"sessionid={self.cookie}"}, open_timeout=120, max_queue=None, max_size=None) as ws:
                self.ready += 1
                if self.ready + self.failed == self.count:
                    print("connected", self.ready, flush=True)
                stop = asyncio.ensure_future(stopping.wait())
                while True:
                    recv = asyncio.ensure_future(ws.recv(decode=False))
                    done, _ = await asyncio.wait({recv, stop}, return_when=asyncio.FIRST_COMPLETED)
                    if stop in done:
                        recv.cancel()
                        return
                    now = time.time()
                    self.frames += 1
                    for match in SEQ.finditer(recv.result()):
                        seq = int(match.group(1))
                        if seq < len(seen) and not seen[seq]:
                            seen[seq] = now
        except Exception:
            self.failed += 1
            if self.ready + self.failed == self.count:
                print("connected", self.ready, flush=True)

    async def run(self) -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        tasks = []
        for i in range(self.count):  # connect in small bursts, as browsers would
            tasks.append(asyncio.ensure_future(self.client(i, stopping)))
            if i % 20 == 19:
                await asyncio.sleep(0.05)
        log_path = (await loop.run_in_executor(None, sys.stdin.readline)).strip()  # the parent's change log
        await asyncio.sleep(float((await loop.run_in_executor(None, sys.stdin.readline)).strip()))  # settle
        stopping.set()
        await asyncio.gather(*tasks)
        changes = json.loads(Path(log_path).read_text())  # [[seq, job, t0], …] in seq order
        by_job: dict[int, list[tuple[int, float]]] = {}
        for seq, job, t0 in changes:
            by_job.setdefault(job, []).append((seq, t0))
        histogram = [0] * BUCKETS
        dropped = 0
        for seen in self.seen[: self.count]:
            for series in by_job.values():
                covered = 0.0  # the earliest time a change at or after this one was seen
                for seq, t0 in reversed(series):
                    t = seen[seq]
                    if t and (not covered or t < covered):
                        covered = t
                    if not covered:
                        dropped += 1
                        continue
                    histogram[min(BUCKETS - 1, max(0, int((covered - t0) * 1000 / BUCKET_MS)))] += 1
        print(json.dumps({"histogram": {i: n for i, n in enumerate(histogram) if n}, "dropped": dropped,
                          "frames": self.frames, "failed": self.failed, "ready": self.ready}), flush=True)


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (and its waited-for children), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def histogram_percentile(histogram: dict[int, int], q: float) -> float:
    total = sum(histogram.values())
    target = q / 100 * total
    running = 0
    for bucket in sorted(histogram):
        running += histogram[bucket]
        if running >= target:
            return (bucket + 0.5) * BUCKET_MS
    return float("nan")


def load(args: argparse.Namespace) -> None:
    """The child of --load: the world on PostgreSQL, uvicorn as a process, client processes, changes at a rate."""
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from jobs import live_publisher, services
    from jobs.choices import Phase
    from jobs.models import Job

    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3") or "Redis" not in settings.CHANNEL_LAYERS[
            "default"]["BACKEND"]:
        raise SystemExit("--load runs on PostgreSQL and Redis: set DATABASE_URL and REDIS_URL")
    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    user, jobs = setup_world()
    cookie = session_cookie(user)
    import redis

    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "jobsite.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--lifespan", "off", "--log-level", "warning", "--no-access-log", "--ws-per-message-deflate", "false"],
        cwd=ROOT, env=dict(os.environ), stderr=subprocess.PIPE, text=True)
    wait_port(port, 60)
    errors: list[str] = []
    server_log = open(args.server_log, "w") if args.server_log else None  # noqa: SIM115

    def read_server_log() -> None:
        for line in server.stderr:
            if server_log:
                server_log.write(line)
            if "ERROR" in line or "Traceback" in line:
                errors.append(line)

    threading.Thread(target=read_server_log, daemon=True).start()
    total = int(args.rate * args.seconds)
    per_process = [args.clients // args.client_processes + (1 if i < args.clients % args.client_processes else 0)
                   for i in range(args.client_processes)]
    base = f"http://127.0.0.1:{port}"
    clients = [subprocess.Popen([sys.executable, str(Path(__file__).with_name("live_latency.py")), "--load-clients-of", f"ws://127.0.0.1:{port}/ws/jobs/",
                                 base, cookie, str(n), str(total)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
               for n in per_process if n]
    connected = sum(int(c.stdout.readline().split()[1]) for c in clients)
    print(f"[load] uvicorn (1 process) on PostgreSQL + Redis, {len(jobs)} running jobs on the page, {connected} of "
          f"{args.clients} sockets connected ({len(clients)} client processes); {args.rate:g} changes/s for "
          f"{args.seconds:g} s = {total} changes", flush=True)
    load_before = os.getloadavg()[0]
    cpu_before = process_cpu(server.pid)
    changes = []
    started = time.monotonic() + 0.5

    def writer(k: int) -> None:
        # Changes as the scheduler and workers make them, from several threads; each job's in order. Latency is
        # counted from the commit (job_transition returns after it).
        from django.db import close_old_connections

        for seq in range(k, total, args.writers):
            delay = started + seq / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            job = jobs[seq % len(jobs)]
            status = "CrashLoopBackOff" if seq // len(jobs) % 2 == 0 else "Running"
            services.job_transition(job=Job(pk=job.pk), phase=Phase.RUNNING, status=status, reason="BackOff",
                                    message=f"bench-seq {seq}")
            changes.append([seq, job.pk, time.time()])
        close_old_connections()

    writers = [threading.Thread(target=writer, args=(k,)) for k in range(args.writers)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    changes.sort()
    elapsed = time.monotonic() - started
    load_after = os.getloadavg()[0]
    live_publisher.flush(30)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(changes, f)
    histogram: dict[int, int] = {}
    dropped = frames = failed = 0
    for c in clients:
        c.stdin.write(f"{f.name}\n{args.settle}\n")
        c.stdin.flush()
    for c in clients:
        result = json.loads(c.stdout.readline())
        c.wait(120)
        for bucket, n in result["histogram"].items():
            histogram[int(bucket)] = histogram.get(int(bucket), 0) + n
        dropped += result["dropped"]
        frames += result["frames"]
        failed += result["failed"]
    os.unlink(f.name)
    web_cpu = process_cpu(server.pid) - cpu_before
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the client processes, waited for above
    clients_cpu = usage.ru_utime + usage.ru_stime
    usage = resource.getrusage(resource.RUSAGE_SELF)  # the writers: transitions, and the publisher's renders
    writers_cpu = usage.ru_utime + usage.ru_stime
    time.sleep(2)  # the sockets' disconnects
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    in_groups = len(client.pubsub_channels(settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] + "*"))
    delivered = sum(histogram.values())
    publisher = live_publisher._publisher()
    print(f"[load] the publisher sent {publisher.batches} batches ({publisher.rows} rows rendered once each)",
          flush=True)
    print(f"[load] made {total} changes in {elapsed:.1f} s ({total / elapsed:.0f}/s); load average "
          f"{load_before:.1f} before, {load_after:.1f} at the end ({os.cpu_count()} CPUs)", flush=True)
    print(f"[load] change → socket over {connected} sockets: p50 {histogram_percentile(histogram, 50):7.1f} ms  "
          f"p95 {histogram_percentile(histogram, 95):7.1f} ms  (goal p95 ≤ {LOAD_GOAL_P95_MS:.0f} ms)", flush=True)
    print(f"[load] dropped {dropped} of {delivered + dropped} socket×change (goal 0); {frames} frames received "
          f"({frames / max(connected, 1):.0f} per socket for {total} changes); {failed} sockets failed", flush=True)
    print(f"[load] web CPU {web_cpu:.1f} s for {total} changes: {web_cpu * 1000 / total:.2f} ms per change "
          f"({web_cpu / max(elapsed + args.settle, 1e-9) * 100:.0f} % of one CPU; the clients used "
          f"{clients_cpu:.1f} s, this process {writers_cpu:.1f} s); load average now "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(f"[load] server errors logged: {len(errors)}; Redis channels still subscribed after the sockets closed: "
          f"{in_groups} (goal 0)", flush=True)
    for line, n in collections.Counter(line.strip()[:200] for line in errors).most_common(3):
        print(f"[load]   {n} × {line}", flush=True)
    server.terminate()
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        server.kill()
