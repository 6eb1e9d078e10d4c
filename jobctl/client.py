"""A small client of the jobsite REST API on the standard library's urllib."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
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


class Api:
    def __init__(self, server: str, token: str | None = None, timeout: float = 30.0):
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout

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
