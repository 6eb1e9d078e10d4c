"""The --load half of bench/live_latency.py: 1,000 WebSocket clients on the job list while changes are made at a
rate; see that file's docstring. Run it through ``bench/live_latency.py --load`` (the clients' processes are started
as ``live_latency.py --load-clients-of``)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import json
import os
import re
import resource
import shutil
import signal
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

    async def client(self, index: int) -> None:
        """One socket: a minimal WebSocket client (the handshake, then frames parsed in place: a ping answered, a
        text frame searched for sequence numbers), so that the clients, on the server's machine, take little of
        its CPU (a browser's socket is native code on another machine)."""
        from urllib.parse import urlsplit

        url = urlsplit(self.url)
        loop = asyncio.get_running_loop()
        protocol = None
        try:
            _, protocol = await asyncio.wait_for(loop.create_connection(
                lambda: _Socket(self, self.seen[index]), url.hostname, url.port), 120)
            key = base64.b64encode(os.urandom(16)).decode()
            protocol.transport.write(
                f"GET {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Origin: {self.origin}\r\nCookie: sessionid={self.cookie}\r\n\r\n".encode())
            await asyncio.wait_for(protocol.upgraded, 120)
            self.ready += 1
            if self.ready + self.failed == self.count:
                print("connected", self.ready, flush=True)
            await protocol.closed
        except asyncio.CancelledError:
            if protocol is not None:
                protocol.transport.close()
            return
        except Exception:
            self.failed += 1
            if self.ready + self.failed == self.count:
                print("connected", self.ready, flush=True)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        tasks = []
        for i in range(self.count):  # connect in small bursts, as browsers would
            tasks.append(asyncio.ensure_future(self.client(i)))
            if i % 20 == 19:
                await asyncio.sleep(0.05)
        log_path = (await loop.run_in_executor(None, sys.stdin.readline)).strip()  # the parent's change log
        await asyncio.sleep(float((await loop.run_in_executor(None, sys.stdin.readline)).strip()))  # settle
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
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


class _Socket(asyncio.Protocol):
    """The client end of one WebSocket (RFC 6455): upgrade, then unmasked server frames; pings are answered."""

    def __init__(self, clients: LoadClients, seen: array):
        self.clients, self.seen = clients, seen
        loop = asyncio.get_running_loop()
        self.upgraded, self.closed = loop.create_future(), loop.create_future()
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.upgraded, self.closed):
            if not future.done():
                future.set_exception(ConnectionError("closed")) if future is self.upgraded else future.set_result(None)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data
        if not self.upgraded.done():
            head, found, buffer = buffer.partition(b"\r\n\r\n")
            if not found:
                self.buffer = head
                return
            if b" 101 " not in head.split(b"\r\n", 1)[0]:
                self.upgraded.set_exception(ConnectionError(head.split(b"\r\n", 1)[0].decode()))
                self.transport.close()
                return
            self.upgraded.set_result(None)
        now, seen, at = time.time(), self.seen, 0
        while len(buffer) - at >= 2:
            opcode, size = buffer[at] & 0x0F, buffer[at + 1] & 0x7F
            start = at + 2 + (2 if size == 126 else 8 if size == 127 else 0)
            if size >= 126:
                if len(buffer) < start:
                    break
                size = int.from_bytes(buffer[at + 2:start], "big")
            if len(buffer) < start + size:
                break
            payload = buffer[start:start + size]
            at = start + size
            if opcode == 1:
                self.clients.frames += 1
                for match in SEQ.finditer(payload):
                    seq = int(match.group(1))
                    if seq < len(seen) and not seen[seq]:
                        seen[seq] = now
            elif opcode == 9:  # ping: pong, masked (a zero mask)
                self.transport.write(bytes((0x8A, 0x80 | len(payload))) + bytes(4) + payload)
            elif opcode == 8:
                self.transport.close()
        self.buffer = buffer[at:]


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process and its descendants (live, or ended and waited for), from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
            times[int(entry.name)] = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    tree, grew = {pid}, True
    while grew:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(times.get(p, 0.0) for p in tree)


def profile_summary(raw: Path, top: int = 30) -> list[str]:
    """py-spy's raw samples (``frame;frame;… count``) as the functions with the most samples, inclusive and self."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = [re.sub(r" \((?:/[^)]*/)?([^/)]+)\)", r" (\1)", f) for f in stack.split(";")]
        total += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
        own[frames[-1]] += int(count)
    lines = [f"{total} samples; inclusive:"]
    lines += [f"  {n / total * 100:5.1f} %  {frame}" for frame, n in inclusive.most_common(top)]
    lines.append("self:")
    lines += [f"  {n / total * 100:5.1f} %  {frame}" for frame, n in own.most_common(top)]
    return lines


def histogram_percentile(histogram: dict[int, int], q: float) -> float:
    total = sum(histogram.values())
    target = q / 100 * total
    running = 0
    for bucket in sorted(histogram):
        running += histogram[bucket]
        if running >= target:
            return (bucket + 0.5) * BUCKET_MS
    return float("nan")


def create_database(db: dict) -> None:
    """Create the benchmark's database when this PostgreSQL does not have it yet (a fresh machine)."""
    import psycopg

    server = dict(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], password=db["PASSWORD"])
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]).fetchone():
            conn.execute(f'CREATE DATABASE "{db["NAME"]}"')


def load(args: argparse.Namespace) -> None:
    """The child of --load: the world on PostgreSQL, uvicorn as a process, client processes, changes at a rate."""
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from jobs import catchup, live_publisher, services
    from jobs.choices import Phase
    from jobs.models import Job

    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3") or "Redis" not in settings.CHANNEL_LAYERS[
            "default"]["BACKEND"]:
        raise SystemExit("--load runs on PostgreSQL and Redis: set DATABASE_URL and REDIS_URL")
    create_database(settings.DATABASES["default"])
    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    user, jobs = setup_world()
    cookie = session_cookie(user)
    import redis

    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()
    port = free_port()
    # The production web command (jobsite/serve_web.py): uvicorn, --web-workers processes, no compression.
    metrics_dir = tempfile.mkdtemp(prefix="jobsite-bench-metrics-")
    server = subprocess.Popen(
        [sys.executable, "-m", "jobsite.serve_web", "--host", "127.0.0.1", "--port", str(port),
         "--lifespan", "off", "--log-level", "warning"], cwd=ROOT, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "JOBSITE_WEB_WORKERS": str(args.web_workers), "PROMETHEUS_MULTIPROC_DIR": metrics_dir})
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
    # As the page connects: the rows it shows and when it was drawn (a reconnect catches up from the hub's ring,
    # which reaches back to when the process began to listen: a few sockets opened first, so that every worker
    # likely has one, kept open throughout).
    from django.utils import timezone
    from websockets.sync.client import connect

    first = contextlib.ExitStack()
    for _ in range(3 * args.web_workers):
        first.enter_context(connect(f"ws://127.0.0.1:{port}/ws/jobs/", origin=base, additional_headers={
            "Cookie": f"sessionid={cookie}"}, open_timeout=60, max_queue=None))
    time.sleep(0.5 + catchup.MARGIN.total_seconds())  # a page drawn now is caught up from the ring

    query = f"shown={','.join(str(job.pk) for job in jobs)}&since={timezone.now().isoformat()}".replace("+", "%2B")
    clients = [subprocess.Popen([sys.executable, str(Path(__file__).with_name("live_latency.py")),
                                 "--load-clients-of", f"ws://127.0.0.1:{port}/ws/jobs/?{query}",
                                 base, cookie, str(n), str(total)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
               for n in per_process if n]
    connected = sum(int(c.stdout.readline().split()[1]) for c in clients)
    print(f"[load] uvicorn ({args.web_workers} worker process(es)) on PostgreSQL + Redis, {len(jobs)} running "
          f"jobs on the page, {connected} of "
          f"{args.clients} sockets connected ({len(clients)} client processes); {args.rate:g} changes/s for "
          f"{args.seconds:g} s = {total} changes", flush=True)
    load_before = os.getloadavg()[0]
    cpu_before = process_cpu(server.pid)
    raw = Path(tempfile.mkstemp(suffix=".txt")[1])
    spy = subprocess.Popen([args.py_spy, "record", "--pid", str(server.pid), "--subprocesses", "--format", "raw",
                            "--rate", "200", "--nonblocking", "--output", str(raw)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if args.py_spy else None
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
    first.close()
    web_cpu = process_cpu(server.pid) - cpu_before
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
        for line in profile_summary(raw):
            print(f"[load] py-spy {line}", flush=True)
        print(f"[load] py-spy's samples: {raw}", flush=True)
    else:
        raw.unlink()
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
    shutil.rmtree(metrics_dir, ignore_errors=True)
