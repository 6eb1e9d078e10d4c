"""A job's declared port through the site (/jobs/<id>/ports/<port>/...), end to end on the local backend: HTTP and
WebSocket traffic reach a server inside the job's closed network, for the job's group only."""

from __future__ import annotations

import shutil

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator, WebsocketCommunicator

from jobs.models import Job, JobEvent
from tests import waiting

from .conftest import cookie_headers

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandboxed"),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]

# The app sees the whole path (JOB_BASE_URL): http.server serves it from a directory of that name.
HTTP_SERVER = ("mkdir -p site/jobs/$JOB_ID/ports/8888 && echo 'hello from the job' > site/jobs/$JOB_ID/ports/8888/"
               "index.html && exec python3 -m http.server 8888 --bind 127.0.0.1 --directory site")
WS_ECHO = """python3 - <<'PY'
import asyncio, base64, hashlib, struct
async def client(r, w):
    head = (await r.readuntil(b"\\r\\n\\r\\n")).decode()
    key = [l.split(":", 1)[1].strip() for l in head.split("\\r\\n") if l.lower().startswith("sec-websocket-key")][0]
    accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
    w.write(b"HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\n"
            b"Sec-WebSocket-Accept: " + accept + b"\\r\\n\\r\\n")
    while True:
        b1, b2 = await r.readexactly(2)
        n = b2 & 127
        n = struct.unpack(">H", await r.readexactly(2))[0] if n == 126 else n
        mask = await r.readexactly(4)
        data = bytes(c ^ mask[i % 4] for i, c in enumerate(await r.readexactly(n)))
        if b1 & 15 == 8:
            return w.close()
        out = b"echo:" + data
        w.write(bytes([0x81, len(out)]) + out)
async def main():
    async with await asyncio.start_server(client, "127.0.0.1", 9999) as s:
        await s.serve_forever()
asyncio.run(main())
PY"""


def get(path, headers):
    from jobsite.asgi import application

    async def run():
        communicator = HttpCommunicator(application, "GET", path, headers=headers)
        return await communicator.get_response(timeout=60)

    return async_to_sync(run)()


def declare(job, *ports):
    Job.objects.filter(pk=job.pk).update(ports=[{"name": f"p{p}", "port": p} for p in ports])


def test_a_declared_http_port_answers_for_the_group_only(running, world):
    job = running(command=HTTP_SERVER)
    declare(job, 8888)
    path = f"/jobs/{job.pk}/ports/8888/"
    answer = {}

    def served():
        answer.update(get(path, cookie_headers(world.users["bob"])))
        return answer["status"] == 200

    waiting.wait_for(served, timeout=60, message=lambda: f"the job's server answering: {answer}")
    assert answer["body"] == b"hello from the job\n"
    assert get(path, cookie_headers(world.users["eve"]))["status"] == 404
    assert get(f"/jobs/{job.pk}/ports/8889/", cookie_headers(world.users["bob"]))["status"] == 404  # undeclared
    assert get(path, [(b"host", b"testserver")])["status"] == 302  # anonymous: the login page


def test_a_websocket_server_in_the_job_answers_through_the_proxy(running, world):
    from jobsite.asgi import application

    job = running(command=WS_ECHO)
    declare(job, 9999)
    bob, eve = cookie_headers(world.users["bob"]), cookie_headers(world.users["eve"])

    async def talk():
        communicator = WebsocketCommunicator(application, f"/jobs/{job.pk}/ports/9999/ws", headers=bob)
        connected, code = await communicator.connect(timeout=60)
        if not connected:
            return code
        await communicator.send_to(text_data="ping")
        reply = await communicator.receive_from(timeout=60)
        await communicator.disconnect()
        return reply

    replies = []
    waiting.wait_for(lambda: replies.append(async_to_sync(talk)()) or replies[-1] == "echo:ping", timeout=60,
                     message=lambda: f"an echo through the proxy: {replies[-3:]}")
    assert JobEvent.objects.filter(job=job, reason="PortSession").exists()

    async def outsider():
        communicator = WebsocketCommunicator(application, f"/jobs/{job.pk}/ports/9999/ws", headers=eve)
        return await communicator.connect(timeout=60)

    assert async_to_sync(outsider)() == (False, 4404)
