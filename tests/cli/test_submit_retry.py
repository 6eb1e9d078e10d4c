"""`jobctl submit` sends its submit again after a network error or a 5xx, with the same `Idempotency-Key`: a reply
lost after the server saved the job never makes a second job."""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jobs.models import Job

from .conftest import Jobctl

pytestmark = pytest.mark.django_db(transaction=True)

SUBMIT_PATH = "/api/v1/jobs/"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class FlakyProxy(ThreadingHTTPServer):
    """Relays every request to the live server, except that the first ``failures`` submits (POST /api/v1/jobs/)
    fail as ``mode`` says: "502" and "drop" relay the submit (the server saves the job) and then answer 502 or
    close the connection without a reply, a reply lost after the commit; "503-unsent" answers 503 without
    relaying. ``keys`` holds the Idempotency-Key of each submit that arrived."""

    daemon_threads = True

    def __init__(self, upstream: str, mode: str, failures: int):
        super().__init__(("127.0.0.1", 0), _Relay)
        self.upstream = urllib.parse.urlsplit(upstream)
        self.mode, self.failures = mode, failures
        self.keys: list[str] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Relay(BaseHTTPRequestHandler):
    server: FlakyProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fail = None
        if self.command == "POST" and urllib.parse.urlsplit(self.path).path == SUBMIT_PATH:
            with self.server.lock:
                self.server.keys.append(self.headers.get("Idempotency-Key", ""))
                if len(self.server.keys) <= self.server.failures:
                    fail = self.server.mode
        if fail == "503-unsent":
            self._reply(503, {"Content-Type": "text/plain"}, b"Service Unavailable")
            return
        status, headers, content = self._relay(body)
        if fail == "502":
            self._reply(502, {"Content-Type": "text/plain"}, b"Bad Gateway")
        elif fail == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        else:
            self._reply(status, headers, content)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _handle

    def _relay(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        upstream = self.server.upstream
        conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            response = conn.getresponse()
            content = response.read()
            return response.status, {k: v for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP}, content
        finally:
            conn.close()

    def _reply(self, status: int, headers: dict[str, str], content: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)


@pytest.fixture
def flaky(live_server, world, tmp_path):
    """flaky(mode, failures) → (jobctl logged in as bob through the proxy, the proxy)."""
    proxies: list[FlakyProxy] = []

    def make(mode: str, failures: int = 1) -> tuple[Jobctl, FlakyProxy]:
        proxy = FlakyProxy(live_server.url, mode, failures)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        proxies.append(proxy)
        jobctl = Jobctl(proxy.url, tmp_path)
        result = jobctl("login", "--username", "bob", "--password", "pw-bob")
        assert result.returncode == 0, result.stderr
        return jobctl, proxy

    yield make
    for proxy in proxies:
        proxy.shutdown()
        proxy.server_close()


@pytest.mark.parametrize("mode", ["502", "drop", "503-unsent"])
def test_a_failed_submit_is_sent_again_with_the_same_key_and_makes_one_job(flaky, mode):
    jobctl, proxy = flaky(mode)

    result = jobctl("submit", "-g", "phusers", "--image", "base-notebook", "-t", "cpu-tiny", "-o", "json", "--",
                    "true")

    assert result.returncode == 0, result.stderr
    assert "sending the submit again" in result.stderr and "same Idempotency-Key" in result.stderr
    assert len(proxy.keys) == 2 and proxy.keys[0] == proxy.keys[1], proxy.keys
    uuid.UUID(proxy.keys[0])
    job = Job.objects.get()  # one job, whichever try made it
    assert f'"id": {job.pk}' in result.stdout


def test_a_refused_submit_is_not_sent_again(flaky):
    jobctl, proxy = flaky("502", failures=0)

    result = jobctl("submit", "-g", "phusers", "--image", "no-such-image", "-t", "cpu-tiny", "--", "true")

    assert result.returncode == 1, result.stderr
    assert "sending the submit again" not in result.stderr
    assert len(proxy.keys) == 1 and not Job.objects.exists()


def test_submits_stop_after_four_tries(flaky):
    jobctl, proxy = flaky("503-unsent", failures=100)

    result = jobctl("submit", "-g", "phusers", "--image", "base-notebook", "-t", "cpu-tiny", "--", "true")

    assert result.returncode != 0
    assert "503" in result.stderr
    assert len(proxy.keys) == 4 and len(set(proxy.keys)) == 1
    assert not Job.objects.exists()
