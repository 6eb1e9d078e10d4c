"""A job's port on its own origin (jobs/port_origin.py): the site's Open link only checks and redirects with a
ticket; the port's host trades the ticket for its own cookie, serves that port's path only, and its WebSockets come
from that host only; the site's WebSockets refuse a port's host as Origin. No supervisor answers in these tests, so
a request that gets through every check ends at 502 (the job's port is closed)."""

from __future__ import annotations

import time
from unittest import mock
from urllib.parse import parse_qs, urlsplit

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.core import signing

from jobs import port_origin
from jobs.choices import Phase
from jobs.models import Attempt, Job, Membership
from jobsite.settings_ports import ports_domain_problem

from .conftest import cookie_headers
from .ports_flow import browser, cookie_of, header, open_port, port_socket, request

pytestmark = [pytest.mark.fast]


@pytest.fixture
def domain(settings):
    settings.JOBSITE_PORTS_DOMAIN = "ports.testserver"
    return settings.JOBSITE_PORTS_DOMAIN


@pytest.mark.parametrize("host, expected", [
    ("j42-p8888.ports.testserver", (42, 8888)),
    ("J42-P8888.Ports.Testserver.", (42, 8888)),
    ("j42-p8888.ports.testserver.evil.org", None),
    ("j42-p8888.other.testserver", None),
    ("ports.testserver", None),
    ("j042-p8888.ports.testserver", None),  # one spelling per port
    ("j42-p08888.ports.testserver", None),
    ("j42-p65536.ports.testserver", None),
    ("j42-p0.ports.testserver", None),
    ("x.j42-p8888.ports.testserver", None),
    ("testserver", None),
])
def test_which_hosts_are_a_ports(domain, host, expected):
    assert port_origin.port_of_host(host) == expected


@pytest.mark.parametrize("configured, site, secure, expected", [
    ("ports.localhost", "127.0.0.1:8000", False, "http://j7-p8888.ports.localhost:8000"),
    ("ports.localhost", "localhost:8000", False, "http://j7-p8888.ports.localhost:8000"),
    ("ports.localhost", "[::1]:8000", False, "http://j7-p8888.ports.localhost:8000"),
    ("ports.localhost", "jobs.example.org", True, None),  # *.localhost is this machine: not a remote site's
    ("ports.example.net", "jobs.example.org", True, "https://j7-p8888.ports.example.net"),
    ("ports.example.net:8443", "jobs.example.org", True, "https://j7-p8888.ports.example.net:8443"),
    ("", "127.0.0.1:8000", False, None),
])
def test_the_origin_of_a_port_as_the_site_links_it(settings, configured, site, secure, expected):
    settings.JOBSITE_PORTS_DOMAIN = configured
    assert port_origin.origin_for(site, secure=secure, pk=7, port=8888) == expected


@pytest.mark.parametrize("configured, trusted, problem", [
    ("ports.example.net", ["https://jobs.example.org"], ""),
    ("ports.example.net", ["https://*.example.net"], "covers the ports"),
    ("ports.example.net", ["https://j1-p1.ports.example.net"], "covers the ports"),
    ("https://ports.example.net", [], "a host name"),
    ("ports.example.net/x", [], "a host name"),
])
def test_what_the_ports_domain_may_be(configured, trusted, problem):
    got = ports_domain_problem(configured, trusted)
    assert (problem in got) if problem else got == ""


@pytest.fixture
def job(world, submit):
    """A job of bob's declaring port 8888, Running (a replica with no supervisor: its port is closed)."""
    job = submit("bob", ports=[{"name": "web", "port": 8888}])
    attempt = Attempt.objects.create(job=job, number=1, replicas=1, backend="local")
    Job.objects.filter(pk=job.pk).update(phase=Phase.RUNNING, current_attempt=attempt)
    return job


@pytest.mark.django_db(transaction=True)
def test_the_open_link_redirects_to_the_ports_host_whose_cookie_then_opens_it(domain, job, world, settings):
    site = browser(world.users["bob"])
    assert f'href="/jobs/{job.pk}/ports/8888/"' in site.get(f"/jobs/{job.pk}/").content.decode()
    answer = request(f"/jobs/{job.pk}/ports/8888/lab/tree", site_cookie(site), query="rank=0&a=b%20c")  # ASGI
    assert answer["status"] == 302 and header(answer, b"cache-control") == "no-store"
    to = urlsplit(header(answer, b"location"))
    assert (to.scheme, to.netloc) == ("http", f"j{job.pk}-p8888.ports.testserver")
    assert parse_qs(to.query)["next"] == ["/lab/tree?rank=0&a=b%20c"]
    host, set_cookie, location = open_port(site, job.pk, 8888, "/lab/tree?rank=0")
    assert location == f"/jobs/{job.pk}/ports/8888/lab/tree?rank=0"
    attributes = {a.strip().split("=")[0].lower() for a in set_cookie.split(";")[1:]}
    assert set_cookie.startswith(f"{port_origin.PORT_COOKIE}=") and {"httponly", "path", "max-age"} <= attributes
    assert "samesite=lax" in set_cookie.lower() and "domain" not in attributes and "secure" not in attributes
    port = [(b"host", host.encode()), (b"cookie", cookie_of(set_cookie))]
    assert request(location, port)["status"] == 502  # every check passed: the job's port itself is closed
    again = request(location, [(b"host", host.encode())])  # no cookie: back to the site, which signs in again
    assert again["status"] == 302 and header(again, b"location") == settings.JOBSITE_BASE_URL + location
    assert request(location, [(b"host", host.encode())], method="POST")["status"] == 401


def site_cookie(site) -> list[tuple[bytes, bytes]]:
    return [(b"host", b"testserver"), (b"cookie", f"sessionid={site.cookies['sessionid'].value}".encode())]


@pytest.mark.django_db(transaction=True)
def test_a_ports_cookie_is_secure_when_the_site_is_https(domain, job, world, settings):
    settings.JOBSITE_HTTPS = True
    site = browser(world.users["bob"])
    answer = site.get(f"/jobs/{job.pk}/ports/8888/", secure=True)
    assert answer["Location"].startswith(f"https://j{job.pk}-p8888.ports.testserver/")
    _host, set_cookie, _location = open_port(site, job.pk, 8888)
    assert "; Secure" in set_cookie


@pytest.mark.django_db(transaction=True)
def test_who_gets_a_ticket_at_the_site(domain, job, world, submit, settings):
    path = f"/jobs/{job.pk}/ports/8888/"
    assert browser().get(path)["Location"].startswith("/login/")  # anonymous: the login page
    assert browser(world.users["eve"]).get(path).status_code == 404  # not her group's job
    bob = browser(world.users["bob"])
    assert bob.get(f"/jobs/{job.pk}/ports/8889/").status_code == 404  # not declared
    assert bob.get(path + "?rank=3").status_code == 400
    queued = submit("bob", ports=[{"name": "web", "port": 8888}])
    assert bob.get(f"/jobs/{queued.pk}/ports/8888/").status_code == 409
    settings.JOBSITE_PORTS_DOMAIN = "ports.localhost"  # the default: for a site reached at localhost only
    refused = bob.get(path)
    assert refused.status_code == 503 and b"JOBSITE_PORTS_DOMAIN" in refused.content
    local = bob.get(path, HTTP_HOST="127.0.0.1:8000")
    assert local["Location"].startswith(f"http://j{job.pk}-p8888.ports.localhost:8000{path}")
    settings.JOBSITE_PORTS_DOMAIN = ""
    assert bob.get(path, HTTP_HOST="127.0.0.1:8000").status_code == 503  # never served from the site itself


@pytest.mark.django_db(transaction=True)
def test_a_ticket_opens_its_own_job_and_port_once_and_only_while_fresh(domain, job, world, submit):
    other = submit("bob", ports=[{"name": "web", "port": 8888}, {"name": "tb", "port": 6006}])
    Job.objects.filter(pk=other.pk).update(phase=Phase.RUNNING, current_attempt=Attempt.objects.create(
        job=other, number=1, replicas=1, backend="local"))
    bob = world.users["bob"]

    def sign_in(ticket, pk, port):
        host = f"j{pk}-p{port}.ports.testserver".encode()
        return request(f"/jobs/{pk}/ports/{port}/__jobsite_auth__", [(b"host", host)],
                       query=f"ticket={ticket}&next=/")["status"]

    assert sign_in(port_origin.ticket_mint(bob, job.pk, 8888), other.pk, 8888) == 403  # job A's, at job B's host
    assert sign_in(port_origin.ticket_mint(bob, other.pk, 8888), other.pk, 6006) == 403  # another port's
    ticket = port_origin.ticket_mint(bob, job.pk, 8888)
    assert sign_in(ticket[:-2] + ("AA" if not ticket.endswith("AA") else "BB"), job.pk, 8888) == 403  # tampered
    assert sign_in(signing.dumps({"u": bob.pk, "j": job.pk, "p": 8888}, salt="another"), job.pk, 8888) == 403
    before = signing.b62_encode(int(time.time()) - 120)
    with mock.patch.object(signing.TimestampSigner, "timestamp", return_value=before):
        stale = port_origin.ticket_mint(bob, job.pk, 8888)
    assert sign_in(stale, job.pk, 8888) == 403  # expired
    assert sign_in(ticket, job.pk, 8888) == 302
    assert sign_in(ticket, job.pk, 8888) == 403  # once only


@pytest.mark.django_db(transaction=True)
def test_a_ports_cookie_opens_that_port_of_that_job_for_members_only(domain, job, world, submit):
    host, set_cookie, location = open_port(browser(world.users["bob"]), job.pk, 8888)
    cookie = cookie_of(set_cookie)
    other = submit("bob", ports=[{"name": "web", "port": 8888}])
    foreign = [(b"host", f"j{other.pk}-p8888.ports.testserver".encode()), (b"cookie", cookie)]
    assert request(f"/jobs/{other.pk}/ports/8888/", foreign)["status"] == 302  # not its cookie: sign in again
    tampered = cookie.replace(cookie[-3:], b"xyz")
    assert request(location, [(b"host", host.encode()), (b"cookie", tampered)])["status"] == 302
    eve = world.users["eve"]  # a genuine cookie of someone outside the group (never issued: no ticket for her)
    eves = cookie_of(port_origin.cookie_header(eve, job.pk, 8888, secure=False).decode())
    assert request(location, [(b"host", host.encode()), (b"cookie", eves)])["status"] == 404
    assert request(location, [(b"host", host.encode()), (b"cookie", cookie)])["status"] == 502
    Membership.objects.filter(user=world.users["bob"]).delete()  # removed after signing in: re-checked each time
    assert request(location, [(b"host", host.encode()), (b"cookie", cookie)])["status"] == 404


@pytest.mark.django_db(transaction=True)
def test_a_ports_host_serves_nothing_of_the_site(domain, job, world):
    host, set_cookie, _location = open_port(browser(world.users["bob"]), job.pk, 8888)
    with_both = [(b"host", host.encode()),
                 (b"cookie", cookie_of(set_cookie) + b"; " + dict(cookie_headers(world.users["bob"]))[b"cookie"])]
    for path in ("/api/v1/jobs/", "/admin/", "/login/", "/", f"/jobs/{job.pk}/", "/static/jobs/app.js", "/metrics",
                 f"/jobs/{job.pk}/ports/6006/", f"/jobs/{job.pk + 1}/ports/8888/", f"/jobs/0{job.pk}/ports/8888/"):
        answer = request(path, with_both)
        assert answer["status"] == 404 and b"nothing else" in answer["body"], (path, answer["status"])

    async def socket(path):
        communicator = port_socket(path, host, with_both[1][1])
        return await communicator.connect(timeout=60)

    assert async_to_sync(socket)("/ws/jobs/") == (False, 4404)
    assert async_to_sync(socket)(f"/ws/jobs/{job.pk}/exec/") == (False, 4404)


@pytest.mark.django_db(transaction=True)
def test_a_ports_websocket_comes_from_its_own_host_only(domain, job, world):
    host, set_cookie, location = open_port(browser(world.users["bob"]), job.pk, 8888)
    cookie = cookie_of(set_cookie)

    async def connect(origin=None, with_cookie=cookie):
        communicator = port_socket(location + "ws", host, with_cookie, origin)
        return await communicator.connect(timeout=60)

    assert async_to_sync(connect)() == (False, 4502)  # every check passed: the job's port itself is closed
    for origin in ("http://testserver", f"http://j{job.pk}-p6006.ports.testserver", "http://evil.example", "null",
                   f"http://{host}.evil.example"):
        assert async_to_sync(connect)(origin) == (False, 4403), origin
    assert async_to_sync(connect)(with_cookie=b"") == (False, 4401)


@pytest.mark.django_db(transaction=True)
def test_the_sites_websockets_refuse_a_ports_host_as_origin(domain, job, world, settings):
    from jobsite.asgi import application

    bob = dict(cookie_headers(world.users["bob"]))

    async def connect(app, origin):
        headers = [(b"host", b"testserver"), (b"origin", origin.encode()), (b"cookie", bob[b"cookie"])]
        communicator = WebsocketCommunicator(app, f"/ws/jobs/{job.pk}/", headers=headers)
        connected, _code = await communicator.connect(timeout=60)
        await communicator.disconnect()
        return connected

    assert async_to_sync(connect)(application, "http://testserver")  # the site's own page
    assert not async_to_sync(connect)(application, f"http://j{job.pk}-p8888.ports.testserver")
    settings.ALLOWED_HOSTS = ["*"]  # however broad ALLOWED_HOSTS is
    from channels.auth import AuthMiddlewareStack
    from channels.routing import URLRouter

    from jobs.routing import websocket_urlpatterns

    broad = port_origin.SiteOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
    assert async_to_sync(connect)(broad, "http://testserver")
    assert not async_to_sync(connect)(broad, f"http://j{job.pk}-p8888.ports.testserver")
    assert not async_to_sync(connect)(broad, "http://anything.ports.testserver")
