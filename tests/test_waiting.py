"""tests/waiting.py: wait_for returns the first true value, or fails at the deadline saying what never came."""

import asyncio
import itertools

import pytest

from tests.waiting import WaitTimeout, async_wait_for, wait_for

pytestmark = pytest.mark.fast


def test_returns_the_first_true_value_of_the_condition():
    calls = itertools.count()
    assert wait_for(lambda: next(calls) >= 2 and "ready", timeout=5, interval=0) == "ready"


def test_at_the_deadline_it_fails_saying_what_it_waited_for():
    with pytest.raises(WaitTimeout, match=r"timed out after 0\.05 s waiting for the pod"):
        wait_for(lambda: None, timeout=0.05, interval=0.01, message="the pod")


def test_a_callable_message_is_read_at_the_deadline():
    state = {"phase": "PENDING"}

    def condition():
        state["phase"] = "RUNNING"
        return False

    with pytest.raises(AssertionError, match="job stayed RUNNING"):
        wait_for(condition, timeout=0.02, interval=0.01, message=lambda: f"SUCCEEDED: job stayed {state['phase']}")


def test_the_condition_is_asked_once_more_at_the_deadline_even_with_no_time_left():
    assert wait_for(lambda: True, timeout=0) is True


def test_async_wait_for_keeps_the_event_loop_running():
    async def main():
        done = asyncio.Event()
        asyncio.get_running_loop().call_later(0.02, done.set)
        await async_wait_for(done.is_set, timeout=5, interval=0.005, message="the event")
        with pytest.raises(WaitTimeout, match="never"):
            await async_wait_for(lambda: False, timeout=0.02, message="never")

    asyncio.run(main())
