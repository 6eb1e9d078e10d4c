"""A job's declared port on its own host (j<id>-p<port>.<ports domain>/jobs/<id>/ports/<port>/...), end to end on the
local backend: the site's Open link redirects there, and HTTP and WebSocket traffic reach a server inside the job's
closed network, for the job's group only, with none of the site's nor the port's cookies."""

from __future__ import annotations

import shutil

import pytest
from asgiref.sync import async_to_sync

from jobs.models import Job, JobEvent, Membership
from tests import waiting

from .conftest import cookie_headers
from .ports_flow import browser, cookie_of, open_port, port_socket, request

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


# Answers with the request's Cookie and Origin headers, and tries to set the site's and the port's cookies.
ECHO_COOKIES = """python3 - <<'PY'
from http.server import BaseHTTPRequestHandler, HTTPServer
class Echo(BaseHTTPRequestHandler):
    def do_GET(self):
        got = self.headers
        body = ("cookie=" + (got.get("Cookie") or "") + "|origin=" + (got.get("Origin") or "")).encode()
        self.send_response(200)
        for name in ("sessionid", "csrftoken", "jobsite_port", "theme"):
            self.send_header("Set-Cookie", name + "=from-the-job; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
HTTPServer(("127.0.0.1", 8888), Echo).serve_forever()
PY"""


@pytest.fixture(autouse=True)
def domain(settings):
    settings.JOBSITE_PORTS_DOMAIN = "ports.testserver"


def declare(job, *ports):
    Job.objects.filter(pk=job.pk).update(ports=[{"name": f"p{p}", "port": p} for p in ports])


def answered(path, headers, answer: dict):
    """A wait_for condition: the job's server answered ``path`` (it may still be starting)."""
    def check():
        answer.update(request(path, headers))
        return answer["status"] == 200
    return check


def test_a_declared_http_port_answers_on_its_own_host_for_the_group_only(running, world):
    job = running(command=HTTP_SERVER)
    declare(job, 8888)
    host, set_cookie, location = open_port(browser(world.users["bob"]), job.pk, 8888)
    assert location == f"/jobs/{job.pk}/ports/8888/"
    answer = {}
    waiting.wait_for(answered(location, [(b"host", host.encode()), (b"cookie", cookie_of(set_cookie))], answer),
                     timeout=60, message=lambda: f"the job's server answering: {answer}")
    assert answer["body"] == b"hello from the job\n"
    assert browser(world.users["eve"]).get(location).status_code == 404
    assert request(location, [(b"host", host.encode())])["status"] == 302  # no port cookie: to the site again
    assert request(location, [(b"host", b"testserver")] + cookie_headers(world.users["bob"])[2:])["status"] == 302


def test_neither_the_sites_nor_the_ports_cookies_reach_the_job_or_come_back(running, world):
    job = running(command=ECHO_COOKIES)
    declare(job, 8888)
    host, set_cookie, location = open_port(browser(world.users["bob"]), job.pk, 8888)
    session = dict(cookie_headers(world.users["bob"]))[b"cookie"]
    sent = b"; ".join([cookie_of(set_cookie), session, b"csrftoken=tok", b"theme=dark"])
    answer = {}
    headers = [(b"host", host.encode()), (b"cookie", sent), (b"origin", f"http://{host}".encode())]
    waiting.wait_for(answered(location, headers, answer),
                     timeout=60, message=lambda: f"the job's server answering: {answer}")
    assert answer["body"] == b"cookie=theme=dark|origin=http://127.0.0.1:8888"  # its own page: as the app sees itself
    assert [v for n, v in answer["headers"] if n == b"set-cookie"] == [b"theme=from-the-job; Path=/"]
    foreign = request(location, [*headers[:2], (b"origin", b"http://testserver")])
    assert foreign["body"] == b"cookie=theme=dark|origin=http://testserver"  # another origin's: the app may refuse


def test_a_websocket_server_in_the_job_answers_through_the_proxy(running, world):
    job = running(command=WS_ECHO)
    declare(job, 9999)
    host, set_cookie, location = open_port(browser(world.users["bob"]), job.pk, 9999)

    async def talk():
        communicator = port_socket(location + "ws", host, cookie_of(set_cookie))
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

    async def foreign():
        communicator = port_socket(location + "ws", host, cookie_of(set_cookie), origin="http://testserver")
        return await communicator.connect(timeout=60)

    assert async_to_sync(foreign)() == (False, 4403)
    Membership.objects.filter(user=world.users["bob"]).delete()  # no longer in the job's group: re-checked

    async def removed():
        communicator = port_socket(location + "ws", host, cookie_of(set_cookie))
        return await communicator.connect(timeout=60)

    assert async_to_sync(removed)() == (False, 4404)
