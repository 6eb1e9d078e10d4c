"""Opening a job's port as a browser does: the site's Open link (a Django test client, signed in), its redirect to
the port's own host with a ticket, the ticket traded there for the port's cookie (through the ASGI application, as
all that the port's host serves). The site's side goes through the test client: the ASGI handler's per-request
threads would each keep a pooled database connection until the test ends."""

from __future__ import annotations

from http.cookies import SimpleCookie
from urllib.parse import urlsplit

from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator, WebsocketCommunicator


def request(path: str, headers: list[tuple[bytes, bytes]], method: str = "GET", query: str = "") -> dict:
    from jobsite.asgi import application

    async def run():
        communicator = HttpCommunicator(application, method, path + (f"?{query}" if query else ""), headers=headers)
        return await communicator.get_response(timeout=60)

    return async_to_sync(run)()


def header(answer: dict, name: bytes) -> str:
    return next((v.decode("latin-1") for n, v in answer["headers"] if n.lower() == name), "")


def browser(user=None):
    """A test client, signed in as ``user`` (anonymous without)."""
    from django.test import Client

    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def open_port(site, pk: int, port: int, rest: str = "/", host: str = "testserver") -> tuple[str, str, str]:
    """Follow the Open link of a signed-in ``browser`` as far as the port's cookie: (the port's host, the cookie's
    Set-Cookie header, the path the port host sends the browser on to)."""
    answer = site.get(f"/jobs/{pk}/ports/{port}{rest}", HTTP_HOST=host)
    assert answer.status_code == 302, (answer.status_code, answer.content)
    to = urlsplit(answer["Location"])
    assert to.path == f"/jobs/{pk}/ports/{port}/__jobsite_auth__", to
    signed_in = request(to.path, [(b"host", to.netloc.encode())], query=to.query)
    assert signed_in["status"] == 302, signed_in
    return to.netloc, header(signed_in, b"set-cookie"), header(signed_in, b"location")


def cookie_of(set_cookie: str) -> bytes:
    """The Cookie header a browser sends back after this Set-Cookie."""
    [(name, morsel)] = SimpleCookie(set_cookie).items()
    return f"{name}={morsel.value}".encode()


def port_socket(path: str, host: str, cookie: bytes, origin: str | None = None) -> WebsocketCommunicator:
    from jobsite.asgi import application

    headers = [(b"host", host.encode()), (b"cookie", cookie), (b"origin", (origin or f"http://{host}").encode())]
    return WebsocketCommunicator(application, path, headers=headers)
