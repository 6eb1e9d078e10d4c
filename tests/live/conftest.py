"""Helpers of the live tests: WebSocket communicators logged in through a real session cookie."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time

import pytest
import pytest_asyncio
from asgiref.sync import SyncToAsync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.test import Client

from jobs import services
from jobs.choices import Phase
from jobs.models import Job

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    """The embedded default's layer (the Redis test overrides it again)."""
    settings.CHANNEL_LAYERS = IN_MEMORY
    settings.JOBSITE_LOG_FOLLOW_INTERVAL = 0.05


@pytest.fixture(autouse=True)
def _close_async_connections():
    """database_sync_to_async runs in asgiref's one worker thread: close its connection, or the test database
    cannot be dropped at the end of the session."""
    yield
    SyncToAsync.single_thread_executor.submit(connections.close_all).result()


def session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


@pytest_asyncio.fixture
async def ws():
    """``await ws("/ws/jobs/", user)`` → (communicator, connected); every communicator is closed afterwards."""
    from jobsite.asgi import application

    opened: list[WebsocketCommunicator] = []

    async def connect(path: str, user=None, origin: bytes = b"http://testserver"):
        headers = [(b"host", b"testserver"), (b"origin", origin)]
        if user is not None:
            headers.append((b"cookie", await database_sync_to_async(session_cookie)(user)))
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect(timeout=5)
        opened.append(communicator)
        return communicator, connected

    yield connect
    for communicator in opened:
        await communicator.disconnect()


def pending(job: Job, position: int = 1, reason: str = "GroupQuota", message: str = "waiting") -> Job:
    """Move a job to PENDING as a scheduling pass would: in a transaction, so the after-commit hooks run."""
    return services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.PENDING, reason=reason,
                                   message=message, queue_position=position)


def admitted(job: Job):
    """PENDING, then an attempt in PREPARING on the local backend (nothing launched); the local node recorded as a
    scheduling pass records it."""
    from scheduler.backend_factory import get_backend
    from scheduler.passes import refresh_nodes

    refresh_nodes(get_backend("local"))
    pending(job)
    attempt = services.job_admit(job=Job.objects.get(pk=job.pk), backend="local",
                                 placement=[{"node": "local"} for _ in range(job.replicas)])
    return Job.objects.get(pk=job.pk), attempt


@pytest.fixture
def asgi_server(transactional_db, world):
    """uvicorn serving ``jobsite.asgi:application`` in a thread, on the test database: its base URL."""
    import uvicorn

    from jobsite.asgi import application

    # Server threads close their connection after each request, so nothing holds the test database open.
    db_settings = connections["default"].settings_dict
    max_age = db_settings.get("CONN_MAX_AGE", 0)
    db_settings["CONN_MAX_AGE"] = 0
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # As production serves it (jobsite.serve_web): no per-message compression, the list's frames written as bytes.
    server = uvicorn.Server(uvicorn.Config(application, lifespan="off", log_level="warning",
                                           ws_per_message_deflate=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        db_settings["CONN_MAX_AGE"] = max_age


def db(fn, *args, **kwargs):
    """``fn`` run on a database thread, awaitable from a test's event loop."""
    return database_sync_to_async(fn)(*args, **kwargs)


async def frames_until(communicator, predicate, timeout: float = 60) -> list[str]:
    """Frames received until one satisfies ``predicate`` (that one last)."""
    got = []
    while True:
        got.append(await communicator.receive_from(timeout=timeout))
        if predicate(got[-1]):
            return got


REDIS_DEADLINE = 60.0  # generous: a busy two-core machine


class PrivateRedis:
    """A ``redis-server`` of this test's own, without persistence: stopping it loses everything, as an outage does."""

    def __init__(self, workdir) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + REDIS_DEADLINE
        while True:  # answering PING
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            assert self.process.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "redis-server did not answer"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=REDIS_DEADLINE)


@pytest.fixture
def private_redis(settings, tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(tmp_path)
    server.start()
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                                           "CONFIG": {"hosts": [server.url], "prefix": "jobsite-test:ws:"}}}
    yield server
    server.stop()
