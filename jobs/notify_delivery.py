"""Sending one notification, by email or by webhook, and the address guard that keeps webhooks off this machine and
private networks.

The guard (``address_refusal``) is pure: it judges a host and the addresses it resolved to against the allow list
(JOBSITE_NOTIFY_ALLOW_HOSTS: host names or CIDRs). ``webhook_target`` resolves a URL's host and applies it, at
subscribe time and again at each send; ``webhook_post`` then connects to the very address that was checked (never
resolving the name a second time) and follows no redirect. Nothing here writes to the database.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import send_mail

from .choices import NotifyChannel, NotifyEvent, Phase
from .models import Notification

DELIVERY_HEADER = "X-Jobsite-Delivery"
USER_AGENT = "jobsite-notify/1"
ERROR_BODY_BYTES = 300  # of a refusing receiver's answer, kept in last_error


class DeliveryError(Exception):
    """A send that did not happen. ``permanent``: retrying cannot help (the address is refused, no email address)."""

    def __init__(self, message: str, *, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


# --- the address guard -----------------------------------------------------------------------------------------


def allow_list(entries: Iterable[str]) -> tuple[frozenset[str], tuple[ipaddress._BaseNetwork, ...]]:
    """JOBSITE_NOTIFY_ALLOW_HOSTS as (host names, networks): an entry that parses as an address or CIDR is a network."""
    hosts, networks = set(), []
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            hosts.add(entry.lower().rstrip("."))
    return frozenset(hosts), tuple(networks)


def _plain(address: ipaddress._BaseAddress) -> ipaddress._BaseAddress:
    """An IPv4-mapped IPv6 address (::ffff:10.0.0.1) judged as the IPv4 address it carries."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def address_refusal(host: str, addresses: Iterable[str], *, allow: Iterable[str],
                    is_local: Callable[[str], bool]) -> str | None:
    """Why a webhook to ``host``, resolved to ``addresses``, is refused; None if it may be sent.

    In order: a host name on the allow list may point anywhere; otherwise every address must be in an allowed
    network, or be global (not loopback, link-local, private as RFC 1918 or unique-local IPv6, reserved, shared or
    documentation space) and not one of this machine's own (``is_local``)."""
    hosts, networks = allow_list(allow)
    if host.lower().rstrip(".").strip("[]") in hosts:
        return None
    addresses = list(addresses)
    if not addresses:
        return f"{host} resolves to no address."
    for text in addresses:
        raw = ipaddress.ip_address(text)
        address = _plain(raw)
        if any(raw in net or address in net for net in networks):
            continue
        if address.is_loopback:
            return f"{host} is this machine ({text}): a webhook may not point here."
        if not address.is_global:
            return f"{host} is a private, link-local or reserved address ({text}): a webhook may not point there."
        if is_local(str(address)):
            return f"{host} is this machine ({text}): a webhook may not point here."
    return None


def is_local_address(address: str) -> bool:
    """Whether ``address`` is one of this machine's own: binding a socket to it succeeds only then (no listening)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((address, 0))
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class WebhookTarget:
    scheme: str
    host: str
    port: int
    path: str
    address: str  # the checked address the POST connects to


def webhook_target(url: str) -> WebhookTarget:
    """Parse, resolve and check a webhook URL; raise DeliveryError(permanent=True) with the reason it is refused."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise DeliveryError(f"Not a valid URL: {exc}.", permanent=True) from None
    if parts.scheme not in ("http", "https"):
        raise DeliveryError("A webhook URL must start with http:// or https://.", permanent=True)
    if not parts.hostname:
        raise DeliveryError("A webhook URL needs a host.", permanent=True)
    if parts.username or parts.password:
        raise DeliveryError("A webhook URL may not carry a user name or password.", permanent=True)
    host = parts.hostname
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise DeliveryError(f"{host} does not resolve ({exc}).") from None
    addresses = list(dict.fromkeys(info[4][0].split("%")[0] for info in infos))
    refusal = address_refusal(host, addresses, allow=settings.JOBSITE_NOTIFY_ALLOW_HOSTS, is_local=is_local_address)
    if refusal:
        raise DeliveryError(refusal + " (An administrator may allow it in JOBSITE_NOTIFY_ALLOW_HOSTS.)",
                            permanent=True)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return WebhookTarget(parts.scheme, host, port, path, addresses[0])


# --- webhooks --------------------------------------------------------------------------------------------------


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to a checked address, whatever the host name resolves to now (the Host header keeps the name)."""

    def __init__(self, target: WebhookTarget, timeout: float):
        super().__init__(target.host, target.port, timeout=timeout)
        self._address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to a checked address; the certificate is still verified against the host name."""

    def __init__(self, target: WebhookTarget, timeout: float):
        super().__init__(target.host, target.port, timeout=timeout, context=ssl.create_default_context())
        self._address = target.address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def webhook_post(url: str, body: dict, *, delivery_id: str, timeout: float) -> int:
    """POST ``body`` as JSON to ``url`` after checking where it points; the answer's status if it is 2xx, else
    DeliveryError. Redirects are not followed (a 3xx is a failure)."""
    target = webhook_target(url)
    connection_class = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
    conn = connection_class(target, timeout)
    data = json.dumps(body).encode()
    try:
        conn.request("POST", target.path, body=data, headers={
            "Content-Type": "application/json", "User-Agent": USER_AGENT, DELIVERY_HEADER: delivery_id,
        })
        response = conn.getresponse()
        answer = response.read(ERROR_BODY_BYTES).decode(errors="replace")
    except (OSError, http.client.HTTPException) as exc:
        raise DeliveryError(f"POST to {target.host} failed: {exc or type(exc).__name__}") from None
    finally:
        conn.close()
    if not 200 <= response.status < 300:
        raise DeliveryError(f"{target.host} answered {response.status} {response.reason}: {answer.strip()}"[:500])
    return response.status


# --- what is said ----------------------------------------------------------------------------------------------

HEADLINES = {
    NotifyEvent.SUCCEEDED: "succeeded", NotifyEvent.FAILED: "failed", NotifyEvent.RUNNING: "is running",
    NotifyEvent.IDLE_GPUS: "has idle GPUs",
}


def delivery_id(notification: Notification) -> str:
    """The same for every try of one notification (and for nothing else): a receiver drops a repeat by it."""
    return f"jobsite-{settings.JOBSITE_INSTALLATION_ID}-{notification.pk}"


def job_url(job_id: int) -> str:
    return f"{settings.JOBSITE_BASE_URL.rstrip('/')}/jobs/{job_id}/"


def headline(notification: Notification) -> str:
    job = notification.job
    what = HEADLINES.get(notification.kind) or ("ended" if job.phase == Phase.SUCCEEDED
                                                else f"ended {job.get_phase_display().lower()}")
    return f"Job #{job.pk} {job.name} ({job.group.name}) {what}"


def payload(notification: Notification) -> dict:
    """The webhook's JSON body."""
    job = notification.job
    return {
        "delivery": delivery_id(notification), "event": notification.kind, "id": job.pk, "name": job.name,
        "phase": job.phase, "status": job.status, "reason": job.reason, "message": notification.event.message,
        "exit_code": job.exit_code, "url": job_url(job.pk), "group": job.group.name,
        "user": job.user.get_username(), "time": notification.event.time.isoformat(),
    }


def slack_payload(notification: Notification) -> dict:
    job = notification.job
    detail = " · ".join(x for x in (job.status, job.reason) if x)
    return {"text": f"{headline(notification)}: {detail} <{job_url(job.pk)}|open>"}


def email_address(notification: Notification) -> str:
    subscription = notification.subscription
    return subscription.email or subscription.user.email


def email_send(notification: Notification) -> None:
    to = email_address(notification)
    if not to:
        raise DeliveryError(f"{notification.subscription.user} has no email address.", permanent=True)
    body = payload(notification)
    lines = [headline(notification) + ".", "", *(f"{k}: {body[k]}" for k in
                                                   ("phase", "status", "reason", "message", "exit_code") if body[k]),
             "", body["url"], "", f"Delivery {body['delivery']}."]
    try:
        send_mail(f"[jobsite] {headline(notification)}", "\n".join(lines), settings.DEFAULT_FROM_EMAIL, [to],
                  fail_silently=False)
    except Exception as exc:  # the email backend's own errors (SMTP, connection) vary
        raise DeliveryError(f"Sending email to {to} failed: {exc}") from None


def deliver(notification: Notification) -> None:
    """Send one notification (its subscription, job and event loaded); DeliveryError if it was not sent."""
    subscription = notification.subscription
    if subscription.channel == NotifyChannel.EMAIL:
        email_send(notification)
        return
    body = slack_payload(notification) if subscription.slack else payload(notification)
    webhook_post(subscription.url, body, delivery_id=delivery_id(notification),
                 timeout=settings.JOBSITE_NOTIFY_TIMEOUT_SECONDS)
