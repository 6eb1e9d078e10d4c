"""A job's port on an origin of its own: ``j<id>-p<port>.<JOBSITE_PORTS_DOMAIN>`` (``jobsite/settings_ports.py``).

A page a job's app serves runs its scripts in that origin, which holds none of the site's cookies; the site's
WebSockets refuse it as an Origin (``SiteOriginValidator``) and Django's CSRF check refuses its posts (its host is not
the site's nor in CSRF_TRUSTED_ORIGINS). The path stays ``/jobs/<id>/ports/<port>/...`` (``JOB_BASE_URL``).

Signing in, for a port host knows no session: the site's ``/jobs/<id>/ports/<port>/...`` checks its user may open the
port and redirects to the port host's ``.../__jobsite_auth__?ticket=...&next=...`` with a ticket (signed, for that
user, job and port, good for JOBSITE_PORTS_TICKET_SECONDS and once); the port host trades it for its own cookie
(``PORT_COOKIE``: host-only, HttpOnly, signed for the same user, job and port, JOBSITE_PORTS_COOKIE_SECONDS) and
redirects to ``next``. The job's app never sees that cookie, nor may it set one of that name.
"""

from __future__ import annotations

import hashlib
from urllib.parse import urlsplit

from channels.security.websocket import OriginValidator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.cache import cache
from django.http.cookie import parse_cookie
from django.http.request import split_domain_port
from django.utils.crypto import constant_time_compare, salted_hmac
from django.utils.http import is_same_domain

PORT_COOKIE = "jobsite_port"
AUTH_STEP = "/__jobsite_auth__"
TICKET_SALT = "jobsite.ports.ticket"
COOKIE_SALT = "jobsite.ports.cookie"
LOOPBACK = {"localhost", "127.0.0.1", "[::1]"}
NO_DOMAIN = (
    "A job's ports are served from host names of their own, j<id>-p<port>.<domain>, never from the site's own "
    "address (a job's page would run with your login to the site). This site, reached as {host}, has no such "
    "domain: set JOBSITE_PORTS_DOMAIN to a domain whose wildcard DNS name (*.<domain>) reaches the site. The "
    "default, ports.localhost, serves a site reached at localhost or 127.0.0.1 only. Meanwhile `jobctl "
    "port-forward {pk} {port}:{port}` reaches the port.\n")


def _domain() -> tuple[str, str]:
    """(host name, port or "") of JOBSITE_PORTS_DOMAIN."""
    host, _, port = settings.JOBSITE_PORTS_DOMAIN.partition(":")
    return host, port


def _local(host: str) -> bool:
    return host == "localhost" or host.endswith(".localhost")


def under_ports_domain(hostname: str) -> bool:
    """Whether a host name (no port) is the ports' domain or under it."""
    domain = _domain()[0]
    return bool(domain and hostname) and is_same_domain(hostname.lower().rstrip("."), "." + domain)


def port_of_host(hostname: str) -> tuple[int, int] | None:
    """(job id, port) that a host name (no port) names under the ports' domain; None for any other host."""
    domain = _domain()[0]
    head, _, rest = (hostname or "").lower().rstrip(".").partition(".")
    job, _, port = head.partition("-p")
    if not domain or rest != domain or job[:1] != "j" or not job[1:].isdigit() or not port.isdigit():
        return None
    if job[1:2] == "0" or port[:1] == "0" or len(job) > 19 or not 1 <= int(port) <= 65535:
        return None  # one spelling per port: no leading zeros
    return int(job[1:]), int(port)


def _header(scope, name: bytes) -> str:
    return "; ".join(v.decode("latin-1") for n, v in scope.get("headers", []) if n == name)


def port_of_scope(scope) -> tuple[int, int] | None:
    """(job id, port) when a request or WebSocket came to a port's host (its Host header); None for the site."""
    host = _header(scope, b"host")
    return port_of_host(split_domain_port(host)[0]) if host[:1] in ("j", "J") else None  # most are the site's


def origin_for(site_host: str, *, secure: bool, pk: int, port: int) -> str | None:
    """The origin of job ``pk``'s ``port`` as linked from the site reached at ``site_host`` (``host[:port]``, the
    Host header); None where no ports' domain serves that site (a ``*.localhost`` one serves loopback only)."""
    domain, domain_port = _domain()
    name, site_port = split_domain_port(site_host)
    if not domain or not name or port_of_host(name) or (_local(domain) and not (name in LOOPBACK or _local(name))):
        return None
    netloc = f"j{pk}-p{port}.{domain}" + (f":{p}" if (p := domain_port or site_port) else "")
    return f"{'https' if secure else 'http'}://{netloc}"


def same_origin(scope) -> bool:
    """Whether a WebSocket to a port's host comes from a page of that same host (its Origin)."""
    origin, host = urlsplit(_header(scope, b"origin")), _header(scope, b"host").lower()
    return origin.scheme in ("http", "https") and bool(host) and origin.netloc.lower() == host


# --- the ticket (site to port host) and the port host's cookie ----------------------------------------------------

def ticket_mint(user, pk: int, port: int) -> str:
    return signing.dumps({"u": user.pk, "j": pk, "p": port}, salt=TICKET_SALT)


def _user(pk) -> object | None:
    return get_user_model().objects.filter(pk=pk, is_active=True).first() if isinstance(pk, int) else None


def ticket_user(ticket: str, pk: int, port: int):
    """The user a ticket for job ``pk``'s ``port`` names, if it is genuine, unexpired and not used yet; else None."""
    try:
        data = signing.loads(ticket, salt=TICKET_SALT, max_age=settings.JOBSITE_PORTS_TICKET_SECONDS)
    except signing.BadSignature:  # tampered, for another salt, or expired (SignatureExpired)
        return None
    if not isinstance(data, dict) or data.get("j") != pk or data.get("p") != port:
        return None
    used = "jobsite:port-ticket:" + hashlib.sha256(ticket.encode()).hexdigest()
    if not cache.add(used, 1, timeout=2 * settings.JOBSITE_PORTS_TICKET_SECONDS):
        return None  # once only: a ticket seen in a history or a log opens nothing
    return _user(data.get("u"))


def _mark(user) -> str:
    """Changes when the user's password does: a cookie issued before stops opening ports."""
    return salted_hmac(COOKIE_SALT, user.get_session_auth_hash()).hexdigest()[:24]


def cookie_header(user, pk: int, port: int, *, secure: bool) -> bytes:
    """The Set-Cookie value of the port host's login (host-only: no Domain)."""
    value = signing.dumps({"u": user.pk, "j": pk, "p": port, "m": _mark(user)}, salt=COOKIE_SALT)
    return (f"{PORT_COOKIE}={value}; Path=/; Max-Age={settings.JOBSITE_PORTS_COOKIE_SECONDS}; HttpOnly; "
            f"SameSite=Lax" + ("; Secure" if secure else "")).encode("latin-1")


def cookie_user(scope, pk: int, port: int):
    """The user the port host's cookie in a request's headers names for job ``pk``'s ``port``; else None."""
    value = parse_cookie(_header(scope, b"cookie")).get(PORT_COOKIE, "")
    try:
        data = signing.loads(value, salt=COOKIE_SALT, max_age=settings.JOBSITE_PORTS_COOKIE_SECONDS)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict) or data.get("j") != pk or data.get("p") != port:
        return None
    user = _user(data.get("u"))
    return user if user is not None and constant_time_compare(str(data.get("m")), _mark(user)) else None


class SiteOriginValidator(OriginValidator):
    """The site's WebSockets (``/ws/...``): an Origin of ALLOWED_HOSTS (as channels' AllowedHostsOriginValidator), and
    never one under the ports' domain, however broad ALLOWED_HOSTS is."""

    def __init__(self, application):
        hosts = settings.ALLOWED_HOSTS or (["localhost", "127.0.0.1", "[::1]"] if settings.DEBUG else [])
        super().__init__(application, hosts)

    def valid_origin(self, parsed_origin) -> bool:
        if parsed_origin is not None and under_ports_domain(parsed_origin.hostname or ""):
            return False
        return super().valid_origin(parsed_origin)
