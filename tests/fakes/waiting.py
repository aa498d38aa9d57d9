"""Waiting without racing the clock.

:func:`wait_until` (and :func:`wait_until_async`, and :func:`until` for loops that take a stop
predicate) poll a condition with a *generous* bound and fail with a clear message; a test never
sleeps a short while and hopes. Where a test must show that something does *not* happen, it
waits for a positive marker that the system went past that point (an event, a counter, a round
of a loop), then asserts the absence. :func:`wait_past_deadline` waits out a reclaim notice on
the service's own (unmoved) clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any, TypeVar

T = TypeVar("T")

#: How long a test waits for something that normally takes a fraction of a second: only a
#: hung or broken system gets there, never a slow (loaded, shared) machine.
PATIENCE = 60.0


class WaitTimeout(AssertionError):
    """What a test waited for did not happen within its (generous) bound."""


def _timed_out(what: str, timeout: float, last: object, info: Callable[[], str] | None) -> str:
    text = f"waited {timeout:g} s for {what}; the last check gave {last!r}"
    return text + (f"\n{info()}" if info is not None else "")


def wait_until(
    cond: Callable[[], T],
    timeout: float = PATIENCE,
    what: str = "the condition",
    *,
    step: float = 0.05,
    info: Callable[[], str] | None = None,
) -> T:
    """Poll ``cond()`` every ``step`` seconds until it returns something truthy; return that.

    After ``timeout`` seconds fail the test (:class:`WaitTimeout`) naming ``what``, with
    ``info()`` (logs, say) appended. The bound is for hung systems, not a speed requirement.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = cond()
        if result:
            return result
        if time.monotonic() > deadline:
            raise WaitTimeout(_timed_out(what, timeout, result, info))
        time.sleep(step)


async def wait_until_async(
    cond: Callable[[], T],
    timeout: float = PATIENCE,
    what: str = "the condition",
    *,
    step: float = 0.05,
    info: Callable[[], str] | None = None,
) -> T:
    """:func:`wait_until` on an event loop: the loop runs (``asyncio.sleep``) between checks."""
    deadline = time.monotonic() + timeout
    while True:
        result = cond()
        if result:
            return result
        if time.monotonic() > deadline:
            raise WaitTimeout(_timed_out(what, timeout, result, info))
        await asyncio.sleep(step)


def until(
    cond: Callable[[], object], timeout: float = PATIENCE, what: str = "the condition"
) -> Callable[[], bool]:
    """A stop predicate for loops that poll one (``AgentLoop.run(until=...)``): true once
    ``cond()`` is; fails the test when ``timeout`` seconds pass without it."""
    deadline = time.monotonic() + timeout

    def check() -> bool:
        if cond():
            return True
        if time.monotonic() > deadline:
            raise WaitTimeout(_timed_out(what, timeout, False, None))
        return False

    return check


def wait_past_deadline(
    lease: Mapping[str, Any] | None, what: str = "the notice's deadline"
) -> None:
    """Wait until the wall clock (the service's, when it runs unmoved) is past the reclaim
    notice's deadline of ``lease`` (the lease JSON; nothing to wait for without a notice)."""
    rec = (lease or {}).get("reclaim")
    if not rec:
        return
    deadline = datetime.fromisoformat(rec["deadline"].replace("Z", "+00:00"))
    if deadline.tzinfo is None:
        deadline = deadline.replace(tzinfo=timezone.utc)
    at = deadline.timestamp()
    wait_until(lambda: time.time() > at, 60, what, step=0.05)
