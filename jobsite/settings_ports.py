"""Settings of a job's ports' own origins (``jobs/port_origin.py``), imported at the end of ``jobsite.settings``.

Each declared port of a running job is served from a host name of its own, ``j<id>-p<port>.<JOBSITE_PORTS_DOMAIN>``,
never from the site's: a script of the job's app then runs in an origin that holds none of the site's cookies and
that the site's API, WebSockets and forms refuse. The domain needs a wildcard DNS name (``*.ports.example.org``)
reaching the web processes (and a wildcard TLS certificate under HTTPS). The default, ``ports.localhost``, needs no
DNS: browsers resolve ``*.localhost`` to this machine (RFC 6761), so it serves a site reached at ``localhost`` or
127.0.0.1 (``make run``), with the port the site was reached on.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured
from django.utils.http import is_same_domain

__all__ = ["JOBSITE_PORTS_DOMAIN", "JOBSITE_PORTS_COOKIE_SECONDS", "JOBSITE_PORTS_TICKET_SECONDS"]
_env = environ.Env()

JOBSITE_PORTS_DOMAIN = _env.str("JOBSITE_PORTS_DOMAIN", default="ports.localhost").strip().strip(".").lower()
# A port host's login (its own cookie, after a ticket from the site) lasts this long; then the site is asked again.
JOBSITE_PORTS_COOKIE_SECONDS = _env.int("JOBSITE_PORTS_COOKIE_SECONDS", default=12 * 3600)
JOBSITE_PORTS_TICKET_SECONDS = _env.int("JOBSITE_PORTS_TICKET_SECONDS", default=60)


def ports_domain_problem(domain: str, trusted_origins: list[str]) -> str:
    """Why ``domain`` cannot be the ports' domain ("" when it can)."""
    if not domain:
        return ""
    parts = urlsplit("//" + domain)
    if "/" in domain or "@" in domain or not parts.hostname or parts.hostname != domain.rsplit(":", 1)[0]:
        return f"JOBSITE_PORTS_DOMAIN is a host name, optionally with :port, not {domain!r}"
    sample = f"j1-p1.{parts.hostname}"
    for origin in trusted_origins:
        host = (urlsplit(origin).hostname or "").lower()
        if host and (is_same_domain(sample, host) or is_same_domain(sample, host.removeprefix("*"))):
            return (f"CSRF_TRUSTED_ORIGINS entry {origin!r} covers the ports' host names (*.{parts.hostname}): a job's "
                    f"page could post the site's forms")
    return ""


if problem := ports_domain_problem(JOBSITE_PORTS_DOMAIN, _env.list("CSRF_TRUSTED_ORIGINS", default=[])):
    raise ImproperlyConfigured(problem)
