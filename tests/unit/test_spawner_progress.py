"""The spawn progress page's status line is the pool's message, naming the offer as the picker does.

JupyterHub's progress page shows the latest event's ``message`` as its status line (the rest
goes to the collapsed event log). So every pool event names the offer by its display name, and
after the grant JupyterHub's placeholder ("Spawning server...", all a LocalProcessSpawner says)
does not replace the pool's last word. A fake pool client stands in for the service.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

from jupyterhub_gpupool.poolclient import PoolUnavailable
from jupyterhub_gpupool.spawner.local import GPUPoolSimpleLocalProcessSpawner
from jupyterhub_gpupool.spawner.picker import DURATION_OPTION, OPTION, REASON_OPTION
from tests.fakes import wait_until_async

QUEUED = {"id": "L1", "offer": "h100", "state": "queued", "position": 1, "eta_seconds": None}
GRANTED = {**QUEUED, "state": "granted", "ready": True, "node": "node-h100", "position": None}
PREPARING = {**GRANTED, "offer": "a100-1g", "ready": False, "node": "node-a100"}


class FakePool:
    """What the spawner asks the pool: offers (display names), allocate, the lease's states."""

    def __init__(self, *states: dict[str, Any], offers_fail: bool = False) -> None:
        self.states = list(states)
        self.offers_fail = offers_fail
        self.released: list[tuple[str, str]] = []

    async def offers(
        self, user: str, groups: list[str], clusters: Any = ()
    ) -> list[dict[str, Any]]:
        if self.offers_fail:
            raise PoolUnavailable("down")
        return [
            {"name": "h100", "display_name": "1× H100 80GB"},
            {"name": "a100-1g", "display_name": "A100 · 1g.10gb slice"},
        ]

    async def allocate(
        self,
        user: str,
        server: str,
        offer: str,
        groups: Any = (),
        clusters: Any = (),
        reason: str = "",
        duration: float | None = None,
    ) -> dict:
        self.asked = (reason, duration)
        return self.states.pop(0)

    async def lease(self, lease_id: str) -> dict[str, Any]:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    async def release(self, lease_id: str, reason: str) -> dict[str, Any]:
        self.released.append((lease_id, reason))
        return {}


def spawner(offer: str, pool: FakePool) -> GPUPoolSimpleLocalProcessSpawner:
    s = GPUPoolSimpleLocalProcessSpawner(
        user=SimpleNamespace(name="bob", groups=[], settings={}), queue_poll_interval=0.01
    )
    s._gpupool_client = pool  # type: ignore[assignment]
    s.user_options = {OPTION: offer}
    return s


async def spawn_and_watch(s: GPUPoolSimpleLocalProcessSpawner) -> list[str]:
    """Run the pre-spawn hook (the GPU part of a spawn) and collect what progress() yields,
    the stream opened as the hub does: as soon as the spawn is pending."""
    s._spawn_pending = True
    events: list[str] = []

    async def watch() -> None:
        async for event in s.progress():
            events.append(event["message"])

    watching = asyncio.ensure_future(watch())
    await asyncio.sleep(0.2)  # the hub awaits the authenticator and other hooks first
    await s.run_pre_spawn_hook()
    await asyncio.wait_for(watching, 10)
    return events


def test_the_status_line_names_the_offer_and_stays_the_pools():
    s = spawner("h100", FakePool(QUEUED, QUEUED, GRANTED))
    messages = asyncio.run(spawn_and_watch(s))
    assert messages == [
        "Asking the GPU pool for 1× H100 80GB",
        "Waiting for 1× H100 80GB: 1st in line, no estimate yet",
        "Got 1× H100 80GB on node-h100; starting your server",
    ]  # and no "Spawning server..." after it: the page's last word is the pool's


def test_a_slice_being_made_is_named_too():
    s = spawner("a100-1g", FakePool(PREPARING, PREPARING, {**PREPARING, "ready": True}))
    messages = asyncio.run(spawn_and_watch(s))
    assert "Preparing A100 · 1g.10gb slice on node-a100 (creating the MIG instance)" in messages
    assert messages[-1] == "Got A100 · 1g.10gb slice on node-a100; starting your server"


def test_without_display_names_the_offer_id_is_used():
    s = spawner("h100", FakePool(GRANTED, offers_fail=True))
    messages = asyncio.run(spawn_and_watch(s))
    assert messages == [
        "Asking the GPU pool for h100",
        "Got h100 on node-h100; starting your server",
    ]


def test_a_cpu_only_spawn_keeps_jupyterhubs_progress():
    s = spawner("", FakePool())
    assert asyncio.run(spawn_and_watch(s)) == ["Spawning server..."]


class Pending:
    """A true ``_spawn_pending`` that counts how often the spawner looks at it."""

    def __init__(self) -> None:
        self.checks = 0

    def __bool__(self) -> bool:
        self.checks += 1
        return True


def test_a_stream_opened_before_the_hook_waits_for_this_spawns_events():
    """The hub marks the spawn pending before it runs run_pre_spawn_hook: a progress stream
    opened in between must not fall through to the placeholder and end."""
    s = spawner("h100", FakePool(QUEUED, QUEUED, GRANTED))

    async def scenario() -> list[str]:
        pending = Pending()
        s._spawn_pending = pending  # type: ignore[assignment]
        got: list[str] = []

        async def watch() -> None:
            async for event in s.progress():
                got.append(event["message"])

        watching = asyncio.ensure_future(watch())
        # the stream looked three times whether the spawn is still pending (or it ended: wrong)
        await wait_until_async(
            lambda: pending.checks >= 3 or watching.done(), what="the stream to check 3 times"
        )
        assert got == [] and not watching.done()  # waiting, not "Spawning server..."
        hook = asyncio.ensure_future(s.run_pre_spawn_hook())
        await wait_until_async(lambda: watching.done(), 10, "the progress stream to end")
        await hook
        return got

    messages = asyncio.run(scenario())
    assert messages[0] == "Asking the GPU pool for 1× H100 80GB"
    assert "Spawning server..." not in messages


def awaiting(minutes_ago: float) -> dict[str, Any]:
    asked = datetime.fromtimestamp(time.time() - minutes_ago * 60, timezone.utc)
    approval = {"asked": asked.isoformat().replace("+00:00", "Z"), "reason": "deadline"}
    return {**QUEUED, "state": "awaiting_approval", "position": None, "approval": approval}


def test_a_request_awaiting_approval_says_so_with_how_long_ago_then_queues():
    pool = FakePool(awaiting(14), awaiting(14), QUEUED, GRANTED)
    s = spawner("h100", pool)
    s.user_options = {OPTION: ["h100"], REASON_OPTION: [" deadline "], DURATION_OPTION: ["24"]}
    messages = asyncio.run(spawn_and_watch(s))
    assert pool.asked == ("deadline", 86400.0)
    assert messages == [
        "Asking the GPU pool for 1× H100 80GB",
        "Waiting for an administrator to approve 1× H100 80GB (asked 14 min ago)",
        "Waiting for 1× H100 80GB: 1st in line, no estimate yet",
        "Got 1× H100 80GB on node-h100; starting your server",
    ]


def test_a_spawn_that_waits_too_long_for_approval_ends_but_keeps_the_request():
    """The kept request is never released: a queued request given up afterwards on the same
    loop and pool is, and releases run in the order they were scheduled, so the kept one's
    would have come first."""
    pool = FakePool(awaiting(2), awaiting(2))
    kept = spawner("h100", pool)
    kept.approval_wait = 0.05
    given_up = spawner("h100", pool)
    given_up.queue_timeout = 0.05

    async def ended(s: GPUPoolSimpleLocalProcessSpawner) -> str:
        try:
            await spawn_and_watch(s)
        except Exception as e:
            return str(e)
        raise AssertionError("the spawn should have ended")

    async def scenario() -> str:
        error = await ended(kept)
        pool.states = [{**QUEUED, "id": "L2"}] * 2
        await ended(given_up)
        await wait_until_async(lambda: pool.released, what="the given-up request's release")
        return error

    error = asyncio.run(scenario())
    assert "still waiting for an administrator (asked 2 min ago)" in error
    assert "starting this server again picks it up" in error
    assert kept.gpupool_lease is None
    assert pool.released == [("L2", "cancelled")]


def test_a_duration_that_is_not_hours_is_refused():
    s = spawner("h100", FakePool(GRANTED))
    s.user_options = {OPTION: "h100", DURATION_OPTION: "a week"}
    try:
        s.chosen_ask()
    except Exception as e:
        assert "must be a number of hours" in str(e)
    else:
        raise AssertionError("refused")
