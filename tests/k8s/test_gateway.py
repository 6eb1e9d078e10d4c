"""Exec and ports on Kubernetes, end to end: the web's WebSocket (Channels) -> the gateway (scheduler/gateway, the real
``kubernetes`` client over HTTP) -> a fake API server speaking the exec and port-forward subprotocols
(tests/k8s/fake_exec_apiserver.py). The web holds no kubeconfig of its own; the gateway opens only pods of this
installation that carry the ticket's job, attempt and rank, and only for a ticket the site signed, recently, once."""

from __future__ import annotations

import json
import socket
import threading
import time
from urllib.parse import urlencode

import pytest
from asgiref.sync import SyncToAsync, async_to_sync
from channels.testing import WebsocketCommunicator
from django.core import signing
from django.db import connections

from jobs import gateway_door
from jobs import gateway_wire as wire
from jobs.choices import Phase
from jobs.exec_door import DoorClosed
from jobs.models import Attempt, Job, JobEvent
from jobs.services import sessions
from scheduler.backends.k8s_manifest import pod_name
from scheduler.gateway.server import GatewayServer
from tests.exec.conftest import token_headers

from .conftest import NAMESPACE, wait_for
from .emulator import kubeconfig
from .fake_exec_apiserver import FakeExecApiServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STDIN, STDOUT, STDERR, STATUS, RESIZE = 0, 1, 2, 3, 4


@pytest.fixture
def api():
    server = FakeExecApiServer(NAMESPACE).start()
    yield server
    server.stop()


@pytest.fixture
def gateway(settings, api, tmp_path, monkeypatch):
    """The gateway with a kubeconfig of the fake API server (the web's settings name only its address)."""
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig(api.url))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings.JOBSITE_K8S_NAMESPACE = NAMESPACE
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    server = GatewayServer(("127.0.0.1", 0)).start()
    settings.JOBSITE_GATEWAY_URL = f"127.0.0.1:{server.port}"
    yield server
    server.shutdown()
    server.server_close()
    SyncToAsync.single_thread_executor.submit(connections.close_all).result()


def pod(job_id: int, attempt: int = 1, rank: int = 0, installation: str | None = None, phase: str = "Running",
        **labels: str) -> dict:
    from django.conf import settings

    return {"apiVersion": "v1", "kind": "Pod", "status": {"phase": phase},
            "metadata": {"name": pod_name(job_id, attempt, rank), "namespace": NAMESPACE, "labels": {
                "app.kubernetes.io/managed-by": "jobsite", "jobsite/job-id": str(job_id),
                "jobsite/attempt": str(attempt), "jobsite/replica": str(rank),
                "jobsite/installation": installation or settings.JOBSITE_INSTALLATION_ID, **labels}}}


@pytest.fixture
def running(submit, api):
    """A Running job of bob's on the Kubernetes backend, its pod in the fake API server."""

    def start(**pod_labels) -> Job:
        job = submit("bob", ports=[{"name": "app", "port": 8888}])
        attempt = Attempt.objects.create(job=job, number=1, replicas=1, backend="kubernetes")
        Job.objects.filter(pk=job.pk).update(phase=Phase.RUNNING, current_attempt=attempt)
        api.pods[pod_name(job.pk, 1, 0)] = pod(job.pk, **pod_labels)
        return Job.objects.get(pk=job.pk)

    return start


def exec_session(path: str, headers, frames: list[bytes] = ()) -> tuple[bytes, bytes, dict | None, int | None]:
    """(stdout, stderr, status, close code) of one exec WebSocket, ``frames`` sent once it is open."""
    from jobsite.asgi import application

    async def run():
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect(timeout=30)
        assert connected
        for f in frames:
            await communicator.send_to(bytes_data=f)
        out, err, status = b"", b"", None
        while True:
            message = await communicator.receive_output(timeout=60)
            if message["type"] == "websocket.close":
                return out, err, status, message.get("code")
            channel, body = message["bytes"][0], message["bytes"][1:]
            if channel == STDOUT:
                out += body
            elif channel == STDERR:
                err += body
            elif channel == STATUS:
                status = json.loads(body)

    return async_to_sync(run)()


def command_query(*argv: str, **extra: str) -> str:
    return urlencode([("command", a) for a in argv] + list(extra.items()))


def test_jobctl_exec_in_a_pod_prints_hello_and_returns_exit_code_7(world, running, gateway, api):
    job = running()
    out, err, status, code = exec_session(f"/ws/jobs/{job.pk}/exec/?" + command_query("sh", "-c", "echo hello; exit 7"),
                                          token_headers(world.users["bob"]))
    assert out == b"hello\n" and err == b""
    assert status["exit_code"] == 7 and status["reason"] == "NonZeroExitCode" and code == 1000
    assert api.execs == [{"pod": pod_name(job.pk, 1, 0), "command": ["sh", "-c", "echo hello; exit 7"],
                          "container": "main", "tty": "false"}]
    [event] = JobEvent.objects.filter(job=job, reason="Exec")
    assert "bob ran a command in replica 0" in event.message and "exit code 7" in event.message

    out, err, status, _ = exec_session(f"/ws/jobs/{job.pk}/exec/?" + command_query("sh", "-c", "echo oops >&2"),
                                       token_headers(world.users["pan"]))  # another member of the group
    assert (out, err, status) == (b"", b"oops\n", {"status": "Success"})


def test_stdin_and_the_terminal_size_reach_the_pod(world, running, gateway, api):
    job = running()
    out, _, status, _ = exec_session(f"/ws/jobs/{job.pk}/exec/?" + command_query("head", "-c", "5"),
                                     token_headers(world.users["bob"]), [bytes([STDIN]) + b"abcde"])
    assert out == b"abcde" and status == {"status": "Success"}

    resize = bytes([RESIZE]) + json.dumps({"Width": 100, "Height": 40}).encode()
    out, _, status, _ = exec_session(
        f"/ws/jobs/{job.pk}/exec/?" + command_query("sh", "-c", "read x; echo got $x", tty="1", rows="30", cols="90"),
        token_headers(world.users["bob"]), [resize, bytes([STDIN]) + b"hi\n"])
    assert out == b"got hi\n" and status == {"status": "Success"}
    assert api.resizes == [{"Width": 90, "Height": 30}, {"Width": 100, "Height": 40}]
    assert api.execs[-1]["tty"] == "true"


def test_a_command_ends_when_the_webs_session_does(world, running, gateway, api):
    job = running()
    target = sessions.session_target(user=world.users["bob"], job_id=job.pk)

    async def leave():
        remote = await gateway_door.open_exec(target, command=["sleep", "600"], tty=False)
        remote.close()

    async_to_sync(leave)()
    wait_for(lambda: api.ended, timeout=60, what="the command killed with its session")
    assert api.ended == [-9]


def test_a_user_outside_the_group_never_reaches_the_gateway(world, running, gateway, api):
    job = running()
    _, _, status, code = exec_session(f"/ws/jobs/{job.pk}/exec/?" + command_query("id"),
                                      token_headers(world.users["eve"]))
    assert code == 4404 and status["code"] == 404 and api.execs == []


@pytest.fixture
def upper_server():
    """A TCP server on this machine answering each chunk in upper case (the app on the pod's port)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data.upper())

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()
    listener.close()


def test_port_forward_relays_bytes_both_ways(world, running, gateway, api, upper_server):
    job = running()
    api.forwards[(pod_name(job.pk, 1, 0), 8888)] = upper_server
    target = sessions.port_target(user=world.users["bob"], job_id=job.pk, port=8888)
    sock = gateway_door.connect_port(target, 8888)  # what the port proxy gets: a plain connected socket
    sock.settimeout(60)
    sock.sendall(b"ping")
    assert _read(sock, 4) == b"PING"
    # Both ways at once, more than every buffer on the way holds: neither direction may wait on the other.
    size = 32 << 20
    threading.Thread(target=sock.sendall, args=(b"x" * size,), daemon=True).start()
    assert _read(sock, size) == b"X" * size
    sock.close()

    from jobsite.asgi import application

    headers = token_headers(world.users["bob"])

    async def forward():  # jobctl port-forward: /ws/jobs/<id>/portforward/
        communicator = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/portforward/?port=8888",
                                             headers=headers)
        connected, _ = await communicator.connect(timeout=30)
        assert connected
        await communicator.send_to(bytes_data=b"hello pod")
        received = b""
        while len(received) < 9:
            received += await communicator.receive_from(timeout=30)
        await communicator.disconnect()
        return received

    assert async_to_sync(forward)() == b"HELLO POD"
    assert [p for m, p, q in api.journal if p.endswith("/portforward")] == [
        f"/api/v1/namespaces/{NAMESPACE}/pods/{pod_name(job.pk, 1, 0)}/portforward"] * 2


def _read(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size and (chunk := sock.recv(1 << 20)):
        data += chunk
    return bytes(data)


def raw(gateway, ticket: str) -> dict:
    """The gateway's answer to one ticket, sent straight to it."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(ticket.encode() + b"\n")
        return wire.answer(wire.read_line(sock))


def test_the_gateway_refuses_tickets_not_signed_by_the_site_altered_expired_or_replayed(
        running, gateway, api, monkeypatch):
    job = running()
    request = {"job": job.pk, "attempt": 1, "rank": 0, "port": 8888}
    ok = wire.ticket_sign(**request)
    assert raw(gateway, ok) == {"ok": True}
    assert raw(gateway, ok)["status"] == 403  # once only
    assert "already used" in raw(gateway, ok)["error"]

    payload, _, signature = wire.ticket_sign(**request).rpartition(":")
    forged = signing.dumps({**request, "job": job.pk + 1, "nonce": "n1"}, salt=wire.SALT).rpartition(":")[0]
    assert raw(gateway, f"{forged}:{signature}")["status"] == 403  # another job's request, this ticket's signature
    tampered = payload[:-1] + ("A" if payload[-1] != "A" else "B") + ":" + signature
    assert raw(gateway, tampered)["status"] == 403
    other_site = signing.dumps({**request, "nonce": "n2"}, key="another-site-key-" + "x" * 40, salt=wire.SALT)
    assert raw(gateway, other_site)["status"] == 403
    other_purpose = signing.dumps({**request, "nonce": "n3"})  # the site's key, not the gateway's salt
    assert raw(gateway, other_purpose)["status"] == 403
    other_installation = signing.dumps({**request, "nonce": "n4", "installation": "another"}, salt=wire.SALT)
    assert "another installation" in raw(gateway, other_installation)["error"]

    real_time = time.time
    monkeypatch.setattr(signing.time, "time", lambda: real_time() - wire.TICKET_SECONDS - 5)
    stale = wire.ticket_sign(**request)
    monkeypatch.setattr(signing.time, "time", real_time)
    answer = raw(gateway, stale)
    assert answer["status"] == 403 and "expired" in answer["error"]
    # Only the first, valid ticket reached the cluster.
    assert len([p for m, p, q in api.journal if p.endswith("/portforward")]) == 1


@pytest.mark.parametrize("label, change, status", [
    ("another installation's pod of the same name", {"installation": "another-site"}, 403),
    ("a pod jobsite did not make", {"app.kubernetes.io/managed-by": "someone"}, 403),
    ("a pod of another job under this name", {"jobsite/job-id": "999999"}, 403),
    ("a pod of another attempt under this name", {"jobsite/attempt": "2"}, 403),
    ("a pod that is not running", {"phase": "Pending"}, 409),
])
def test_the_gateway_opens_only_this_installations_running_pod_of_the_tickets_replica(
        world, running, gateway, api, label, change, status):
    job = running(**change)
    assert raw(gateway, wire.ticket_sign(job=job.pk, attempt=1, rank=0, command=["id"]))["status"] == status
    out, _, answer, code = exec_session(f"/ws/jobs/{job.pk}/exec/?" + command_query("id"),
                                        token_headers(world.users["bob"]))
    assert code == 4409 and answer["code"] == 409 and "cannot be entered" in answer["message"]
    assert api.execs == [] and out == b""


def test_a_replica_with_no_pod_and_a_site_with_no_gateway_are_refused_clearly(world, running, gateway, api,
                                                                              settings):
    job = running()
    del api.pods[pod_name(job.pk, 1, 0)]
    assert raw(gateway, wire.ticket_sign(job=job.pk, attempt=1, rank=0, port=8888))["status"] == 404
    settings.JOBSITE_GATEWAY_URL = ""
    target = sessions.port_target(user=world.users["bob"], job_id=job.pk, port=8888)
    with pytest.raises(DoorClosed, match="JOBSITE_GATEWAY_URL"):
        gateway_door.connect_port(target, 8888)
