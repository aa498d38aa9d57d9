"""The spawner mixin's queue behaviour against a real pool service (and hub), in-process.

The spawner object is a real ``GPUPoolSimpleLocalProcessSpawner``; only the hub around it is
absent (its ``user`` is a plain object), so the tests can drive ``run_pre_spawn_hook`` and
``progress()`` directly while other users hold the GPUs through the pool's API.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from jupyterhub_gpupool.spawner.local import GPUPoolSimpleLocalProcessSpawner
from tests.fakes import HubEnv, request, wait_until_async, write_pool

#: what the spawner's progress says while the pool does not answer a queued request
UNREACHABLE = "The GPU pool is not answering; still waiting in line"


@pytest.fixture
def pool(tmp_path: Path):
    config = write_pool(tmp_path)  # the demo pool's, which a test edits
    env = HubEnv(
        tmp_path,
        f"sqlite:///{tmp_path}/pool.sqlite",
        config,
        service_args=(
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
        ),
    )
    with env.running():
        yield env


def make_spawner(pool: HubEnv, user: str, offer: str, **traits) -> GPUPoolSimpleLocalProcessSpawner:
    spawner = GPUPoolSimpleLocalProcessSpawner(
        user=SimpleNamespace(name=user, groups=[], settings={}),
        pool_api_url=pool.api,
        pool_api_token=pool.spawner_token,
        queue_poll_interval=0.2,
        **traits,
    )
    spawner.user_options = {"gpupool_offer": offer}
    return spawner


def hold_both_h100(pool: HubEnv) -> list[str]:
    ids = []
    for user in ("holder1", "holder2"):
        r = request(
            "POST", f"{pool.api}/allocations", pool.spawner_token, {"user": user, "offer": "h100"}
        )
        assert r.status == 201 and r.json()["state"] == "granted"
        ids.append(r.json()["id"])
    return ids


def lease_of(pool: HubEnv, user: str) -> dict:
    r = request("GET", f"{pool.api}/allocations?user={user}", pool.spawner_token)
    return r.json()["items"][0]


def count_calls(obj: object, method: str) -> list[tuple]:
    """Record every call of ``obj.method`` (an async method), passing it on."""
    calls: list[tuple] = []
    real = getattr(obj, method)

    async def counted(*args, **kwargs):
        calls.append(args)
        return await real(*args, **kwargs)

    setattr(obj, method, counted)
    return calls


async def _collect(spawner, events: list[dict]) -> None:
    async for event in spawner.progress():
        events.append(event)


def test_progress_follows_the_queue_until_the_grant(pool):
    holders = hold_both_h100(pool)
    spawner = make_spawner(pool, "alice", "h100")
    events: list[dict] = []

    async def scenario():
        spawn = asyncio.ensure_future(spawner.run_pre_spawn_hook())
        await wait_until_async(lambda: spawner._gpupool_waiting, what="the pre-spawn hook")
        progress = asyncio.ensure_future(_collect(spawner, events))
        await wait_until_async(
            lambda: any("1st in line" in e["message"] for e in events),
            what="progress to say alice is 1st in line",
        )
        r = await asyncio.to_thread(
            request, "DELETE", f"{pool.api}/allocations/{holders[0]}", pool.spawner_token
        )
        assert r.status == 200
        await asyncio.wait_for(spawn, 30)
        await asyncio.wait_for(progress, 30)

    asyncio.run(scenario())
    messages = [e["message"] for e in events]
    # the offer by its display name, as the picker shows it
    assert messages[0] == "Asking the GPU pool for 1× H100 80GB"
    assert any(m.startswith("Waiting for 1× H100 80GB: 1st in line") for m in messages)
    # the pool's message stays the status line until the server is up (JupyterHub's own
    # "Spawning server..." placeholder no longer replaces it)
    assert messages[-1].startswith("Got 1× H100 80GB on sim-h100")
    assert spawner.gpupool_lease["state"] == "granted"
    assert spawner.gpupool_lease["slots"][0]["gpu"] == lease_of(pool, "holder1")["slots"][0]["gpu"]
    asyncio.run(spawner.release_lease())
    assert lease_of(pool, "alice")["state"] == "released"


def test_queue_timeout_leaves_the_queue_with_a_message(pool):
    hold_both_h100(pool)
    spawner = make_spawner(pool, "alice", "h100", queue_timeout=1.0)
    # the offer by its display name, never its id
    with pytest.raises(Exception, match="No 1× H100 80GB became free within") as info:
        asyncio.run(spawner.run_pre_spawn_hook())
    assert info.value.status_code == 503
    lease = lease_of(pool, "alice")
    assert lease["state"] == "released" and lease["release_reason"] == "cancelled"
    assert spawner.gpupool_lease is None


def test_pool_restart_mid_queue_and_an_offer_removed(pool):
    holders = hold_both_h100(pool)
    spawner = make_spawner(pool, "alice", "h100")

    async def scenario():
        spawn = asyncio.ensure_future(spawner.run_pre_spawn_hook())
        await wait_until_async(lambda: spawner.gpupool_lease, what="alice's queued lease")
        # the pool goes away while alice waits: she keeps waiting (and her place) — once her
        # spawner found the pool gone (its progress says so), the spawn is still on
        await asyncio.to_thread(pool.kill_service)
        await wait_until_async(
            lambda: any(UNREACHABLE in e["message"] for e in spawner._gpupool_events),
            what="the spawner to notice the pool is away",
        )
        assert not spawn.done()
        # it comes back without the h100 offer: her request ends with the reason
        text = pool.pool_config.read_text()
        start = text.index("  - name: h100\n")
        end = text.index("  - name: t4-quarter")
        pool.pool_config.write_text(text[:start] + text[end:])
        await asyncio.to_thread(pool.start_service)
        with pytest.raises(Exception, match="removed from the pool") as info:
            await asyncio.wait_for(spawn, 30)
        return info.value

    err = asyncio.run(scenario())
    assert err.status_code == 409
    # the holders keep their GPUs
    assert [lease_of(pool, u)["state"] for u in ("holder1", "holder2")] == ["granted", "granted"]
    assert lease_of(pool, "alice")["release_reason"] == "cancelled"
    assert {lease_of(pool, u)["id"] for u in ("holder1", "holder2")} == set(holders)


def test_unreachable_pool_at_spawn_is_a_clear_503(pool):
    spawner = make_spawner(pool, "alice", "h100", allocate_retry_for=1.0)
    pool.kill_service()
    with pytest.raises(Exception, match="not reachable right now") as info:
        asyncio.run(spawner.run_pre_spawn_hook())
    assert info.value.status_code == 503
    assert spawner.gpupool_lease is None


def test_a_pool_restarting_at_spawn_time_is_waited_for(pool):
    """The service is down when the spawn asks; it is back within allocate_retry_for."""
    spawner = make_spawner(pool, "alice", "h100", allocate_retry_for=60.0)
    pool.kill_service()
    asked = count_calls(spawner.pool, "allocate")

    async def scenario():
        spawn = asyncio.ensure_future(spawner.run_pre_spawn_hook())
        # it asked, found nobody, and asked again: still asking
        await wait_until_async(lambda: len(asked) >= 2, what="a second allocation attempt")
        assert not spawn.done()  # still asking
        await asyncio.get_running_loop().run_in_executor(None, pool.start_service)
        await asyncio.wait_for(spawn, 30)

    asyncio.run(scenario())
    assert spawner.gpupool_lease["state"] == "granted"
    assert lease_of(pool, "alice")["id"] == spawner.gpupool_lease["id"]
