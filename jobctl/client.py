"""A small client of the jobsite REST API on the standard library's urllib."""

from __future__ import annotations

import http.client
import json
import random
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import __version__


class ConnectError(Exception):
    """The server could not be reached (refused, unknown host, timeout)."""


@dataclass
class ApiError(Exception):
    status: int
    detail: str
    errors: dict[str, list[str]] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.detail

    def lines(self) -> list[str]:
        """Plain lines for a person: one per invalid field (``path: message``), else the detail."""
        if self.errors:
            return [f"{path}: {message}" for path, messages in self.errors.items() for message in messages]
        return [self.detail]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def _error(status: int, raw: bytes, reason: str) -> ApiError:
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict) and "detail" in data:
        errors = data.get("errors") if isinstance(data.get("errors"), dict) else {}
        return ApiError(status, str(data["detail"]), {str(k): [str(m) for m in v] for k, v in errors.items()})
    text = raw.decode("utf-8", "replace").strip().splitlines()
    return ApiError(status, f"HTTP {status} {reason}" + (f": {text[0][:200]}" if text else ""))


# A submit is sent again after these pauses (each ±25 %) when it met a network error or a 5xx: 4 tries in all.
SUBMIT_RETRY_DELAYS = (0.5, 1.0, 2.0)
# 409: the server still makes the job of an earlier try with the same key ("in progress; try again").
RETRY_STATUSES = frozenset({409, 500, 502, 503, 504})


class Api:
    def __init__(self, server: str, token: str | None = None, timeout: float = 30.0):
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retry_delays = SUBMIT_RETRY_DELAYS

    def url(self, path: str, params: dict[str, Any] | None = None) -> str:
        query = {k: v for k, v in (params or {}).items() if v is not None and v != [] and v != ""}
        return self.server + path + ("?" + urllib.parse.urlencode(query, doseq=True) if query else "")

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None, json_body: Any = None,
                data: bytes | None = None, content_type: str | None = None, accept: str = "application/json",
                sink: Callable[[bytes], None] | None = None, headers: dict[str, str] | None = None) -> Reply:
        """One request. 4xx/5xx raise ApiError, an unreachable server ConnectError. With ``sink`` the body is
        streamed to it (and not kept). ``headers`` are sent as well (e.g. an `Idempotency-Key`)."""
        headers = {**(headers or {}), "Accept": accept, "User-Agent": f"jobctl/{__version__}"}
        if self.token:
            headers["Authorization"] = f"Token {self.token}"
        if json_body is not None:
            data = json.dumps(json_body).encode()
            content_type = "application/json"
        if content_type:
            headers["Content-Type"] = content_type
        if data is None and method in ("POST", "PUT", "PATCH"):
            data = b""
        request = urllib.request.Request(self.url(path, params), data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                reply_headers = {k: v for k, v in response.headers.items()}
                if sink is None:
                    return Reply(response.status, reply_headers, response.read())
                while chunk := response.read(64 * 1024):
                    sink(chunk)
                return Reply(response.status, reply_headers, b"")
        except urllib.error.HTTPError as exc:
            raw = exc.read() if exc.fp else b""
            raise _error(exc.code, raw, exc.reason) from None
        except urllib.error.URLError as exc:
            raise ConnectError(f"cannot connect to {self.server}: {exc.reason}") from None
        except (http.client.HTTPException, OSError) as exc:  # refused, reset, timed out
            raise ConnectError(f"cannot connect to {self.server}: {exc}") from None

    def submit(self, path: str, **kw: Any) -> Reply:
        """POST a new job with an `Idempotency-Key` (a UUID) and send it again with the same key after a network
        error or a 5xx, up to ``retry_delays`` more times: the server answers the job an earlier try made (whose
        reply was lost) instead of making another. Other errors are not retried."""
        headers = {**kw.pop("headers", {}), "Idempotency-Key": str(uuid.uuid4())}
        for delay in self.retry_delays:
            try:
                return self.request("POST", path, headers=headers, **kw)
            except (ConnectError, ApiError) as exc:
                if isinstance(exc, ApiError) and exc.status not in RETRY_STATUSES:
                    raise
                pause = delay * random.uniform(0.75, 1.25)
                print(f"jobctl: {exc}; sending the submit again in {pause:.1f} s (same Idempotency-Key)",
                      file=sys.stderr)
                time.sleep(pause)
        return self.request("POST", path, headers=headers, **kw)

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params).json()

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.request("POST", path, json_body=body, **kw).json()

    def pages(self, path: str, *, limit: int | None = None, **params: Any):
        """Every item of a paginated list, following ``next`` (at most ``limit`` items)."""
        params = {**params, "page_size": min(limit or 500, 500)}
        reply = self.get(path, **params)
        count = 0
        while True:
            for item in reply["results"]:
                yield item
                count += 1
                if limit is not None and count >= limit:
                    return
            if not reply.get("next"):
                return
            params["page"] = params.get("page", 1) + 1
            reply = self.get(path, **params)
