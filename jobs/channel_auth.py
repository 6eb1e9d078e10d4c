"""Authenticated messages between processes over the channel layer.

Anything that can reach Redis can publish on a pub/sub channel, and Redis pub/sub ignores database numbers. So
every message jobsite puts on the layer (``jobs.live_publisher``) is signed, and the receiving side (the web process's
``jobs.live_hub.Hub``, the only taker of layer messages: sockets are not layer members) keeps only messages that
verify:

- the signature is an HMAC-SHA256 (``django.utils.crypto.salted_hmac``) keyed by ``SECRET_KEY`` with a purpose of
  its own (``KEY_SALT`` plus the installation id), over the canonical JSON of every field the receiver reads
  (``SIGNED_FIELDS``: type, group, items, installation, sent_at). Changing a row, moving a message to another
  group or installation, or dropping the signature breaks it;
- ``installation`` must be this installation's (``JOBSITE_INSTALLATION_ID``), which also prefixes the layer's Redis
  channels, so two installations on one Redis neither hear nor accept each other's messages;
- ``sent_at`` must lie within ``JOBSITE_CHANNEL_MESSAGE_MAX_AGE_SECONDS`` of now, so a message recorded off the
  wire cannot be replayed later to put an old row back on a page.

Rejected messages are dropped, logged (at most once per ``LOG_EVERY_SECONDS`` per reason, with the count) and
counted in ``jobsite_channel_messages_rejected_total{reason}`` (the web's ``/metrics``).
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.utils.crypto import salted_hmac
from prometheus_client import Counter

log = logging.getLogger(__name__)

KEY_SALT = "jobsite.channel-layer.message"
SIGNATURE = "sig"
SIGNED_FIELDS = ("type", "group", "items", "installation", "sent_at")
LOG_EVERY_SECONDS = 10.0
REASONS = ("unsigned", "bad_signature", "other_installation", "stale")

REJECTED = Counter(
    "jobsite_channel_messages_rejected",
    "Channel-layer messages dropped because they were unsigned, wrongly signed, of another installation or stale.",
    ["reason"],
)
for _reason in REASONS:  # every reason reported from the start, at 0
    REJECTED.labels(_reason)

_log_lock = threading.Lock()
_last_logged: dict[str, float] = {}
_unlogged: dict[str, int] = {}


def installation_id() -> str:
    return settings.JOBSITE_INSTALLATION_ID


def _canonical(message: dict[str, Any]) -> bytes:
    payload = {name: message.get(name) for name in SIGNED_FIELDS}
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _signature(message: dict[str, Any]) -> str:
    key_salt = f"{KEY_SALT}:{installation_id()}"
    return salted_hmac(key_salt, _canonical(message), algorithm="sha256").hexdigest()


def sign(message: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """``message`` with this installation's id, the time it is sent and its signature (a new dict)."""
    signed = {**message, "installation": installation_id(), "sent_at": time.time() if now is None else now}
    signed[SIGNATURE] = _signature(signed)
    return signed


def rejection(message: Any, now: float | None = None) -> str | None:
    """Why ``message`` must be dropped (one of ``REASONS``), or None when it is authentic, ours and fresh."""
    if not isinstance(message, dict) or not isinstance(message.get(SIGNATURE), str):
        return "unsigned"
    try:
        expected = _signature(message)
    except (TypeError, ValueError):  # not JSON: not something we signed
        return "bad_signature"
    if not hmac.compare_digest(expected, message[SIGNATURE]):
        return "bad_signature"
    if message.get("installation") != installation_id():
        return "other_installation"  # signed with a shared key by another installation
    sent_at = message.get("sent_at")
    max_age = settings.JOBSITE_CHANNEL_MESSAGE_MAX_AGE_SECONDS
    now = time.time() if now is None else now
    if not isinstance(sent_at, int | float) or abs(now - sent_at) > max_age:
        return "stale"
    return None


def accept(message: Any, channel: str = "") -> bool:
    """Whether to act on a message received from the layer; a rejected one is counted and logged."""
    reason = rejection(message)
    if reason is None:
        return True
    REJECTED.labels(reason).inc()
    _log_rejection(reason, channel, message)
    return False


def _log_rejection(reason: str, channel: str, message: Any) -> None:
    now = time.monotonic()
    with _log_lock:
        _unlogged[reason] = _unlogged.get(reason, 0) + 1
        if now - _last_logged.get(reason, float("-inf")) < LOG_EVERY_SECONDS:
            return
        _last_logged[reason] = now
        count, _unlogged[reason] = _unlogged[reason], 0
    kind = message.get("type") if isinstance(message, dict) else type(message).__name__
    log.warning("channel layer: dropped %d %s message(s) (latest: type %r on %s); something that can reach the "
                "channel layer is sending messages jobsite did not sign", count, reason, kind, channel or "?")
