"""Waiting for a condition in tests and benchmarks: one poll loop with a deadline and a message that says what
never came.

Benchmarks import it too (they put the repository root on sys.path), so it needs nothing but the standard library.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition was still false at the deadline (an AssertionError, so a test reads it as a failure)."""


def _text(message: str | Callable[[], str]) -> str:
    return message() if callable(message) else message


def wait_for(condition: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05,
             message: str | Callable[[], str] = "the condition") -> T:
    """Call ``condition`` every ``interval`` seconds until it returns something true, and return that; raise
    WaitTimeout("timed out after <timeout> s waiting for <message>") if it is still false after ``timeout`` seconds.
    ``message`` may be a callable, read only at the deadline (to show the state that was reached)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {_text(message)}")
        time.sleep(interval)


async def async_wait_for(condition: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.02,
                         message: str | Callable[[], str] = "the condition") -> T:
    """wait_for inside an event loop: the same, sleeping with asyncio.sleep so the loop keeps running."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {_text(message)}")
        await asyncio.sleep(interval)
