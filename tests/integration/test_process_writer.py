"""Decisions in a child process (``PoolService.decisions = process``): what the handlers await
is what the thread writer would give them, and a dying child costs only its own batch."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.service.apihandlers.errors import status_of
from jupyterhub_gpupool.service.writer import ProcessBatchWriter
from jupyterhub_gpupool.store import Store, StoreError, utcnow
from jupyterhub_gpupool.store.read.leases import LeaseView
from jupyterhub_gpupool.store.read.poolmap import PoolNodeView
from tests.fakes import make_store


@pytest.fixture
def store(db_url: str) -> Store:
    upgrade(db_url)
    return make_store(db_url, utcnow, grant_timeout=300)  # the child's clock is the real one


def started(store: Store, db_url: str) -> ProcessBatchWriter:
    writer = ProcessBatchWriter(store, db_url, {"grant_timeout": 300})
    writer.start()
    return writer


def test_results_refusals_and_events_cross_over(store, db_url):
    seen: list[tuple[str, str | None]] = []
    store.listeners.append(lambda kind, data: seen.append((kind, data.get("lease"))))
    writer = started(store, db_url)
    try:

        async def scenario():
            a, b, missing, bad = await asyncio.gather(
                writer.run(commands.Allocate("alice", "", "a100-1g", actor="t")),
                writer.run(commands.Allocate("bob", "", "h100", actor="t")),
                writer.run(commands.Release("no-such-lease", actor="t")),
                writer.run(commands.Allocate("carol", "", "no-such-offer", actor="t")),
                return_exceptions=True,
            )
            return a, b, missing, bad

        a, b, missing, bad = asyncio.run(scenario())
        assert a.state == "granted" and a.user == "alice" and a.slots
        assert b.state == "granted" and b.node == "h100"
        # refusals keep status, code, field and allowed values, as the thread writer raises them
        assert isinstance(missing, StoreError) and status_of(missing) == 404
        assert missing.to_dict()["error"]["code"] == "not_found"
        assert isinstance(bad, StoreError) and (status_of(bad), bad.field) == (422, "offer")
        assert "h100" in bad.to_dict()["error"]["allowed"]
        # the listeners of the service's store heard the child's events, after its commit
        assert ("granted", a.id) in seen and ("granted", b.id) in seen
        # the service's own store reads what the child committed, and its views are told to
        # catch up: they never show less than the decisions already answered
        assert store.lease(a.id).state == "granted"
        store.view_lag = 3600.0  # no help from the timer
        with store.locked() as alloc:
            assert a.id in alloc.leases and b.id in alloc.leases
        released = asyncio.run(writer.run(commands.Release(a.id, actor="t")))
        assert released.state == "released"
        with store.locked() as alloc:
            assert a.id not in alloc.leases
    finally:
        writer.stop()
    assert not writer._child.is_alive()


def test_every_store_write_crosses_over_and_nothing_else(store, db_url):
    """The writer is the one write path: node actions (and every other write) run in the
    child too, each in its own transaction; a read or any other function is refused."""
    writer = started(store, db_url)
    try:
        with pytest.raises(ValueError, match="not a store write"):
            asyncio.run(writer.run(commands.Command(actor="t")))  # abstract
        with pytest.raises(ValueError, match="not a store write"):
            asyncio.run(writer.run(print))
        node = next(iter(store.file_config.nodes)).name
        done = asyncio.run(writer.run(commands.SetNode(node, "cordon", actor="t")))
        assert done.node.name == node and done.node.cordoned is True  # pickled back
        with pytest.raises(StoreError) as err:
            asyncio.run(writer.run(commands.SetNode("no-such-node", "cordon")))
        assert status_of(err.value) == 404 and err.value.field == "name"
        # the service's views follow the child's commit
        assert any(n.name == node and n.cordoned for n in _nodes(store))
    finally:
        writer.stop()


def _nodes(store: Store) -> list[PoolNodeView]:
    return [n for c in store.pool(detail=True).clusters or () for n in c.nodes]


def test_a_killed_child_fails_its_batch_and_is_replaced(store, db_url):
    writer = started(store, db_url)
    try:
        first = asyncio.run(writer.run(commands.Allocate("alice", "", "a100-1g", actor="t")))
        os.kill(writer.pid, signal.SIGKILL)
        writer._child.join(10)
        with pytest.raises(StoreError) as err:
            asyncio.run(writer.run(commands.Allocate("bob", "", "a100-1g", actor="t")))
        assert status_of(err.value) == 503 and err.value.code == "store_restarting"
        assert writer.restarts == 1 and writer._child.is_alive()
        # the new child starts from the database: it knows alice's lease, and serves bob
        with pytest.raises(StoreError) as err:
            asyncio.run(writer.run(commands.Allocate("alice", "", "a100-1g", actor="t")))
        assert err.value.code == "already_allocated" and first.id in str(err.value)
        bob = asyncio.run(writer.run(commands.Allocate("bob", "", "a100-1g", actor="t")))
        assert bob.state == "granted"
    finally:
        writer.stop()


def test_the_loop_sends_what_it_read_together_and_what_piled_up_at_once(store, db_url):
    """No writer thread: calls made in one pass of the event loop go as one batch; those made
    while the child works go together as soon as it answers, ``max_batch`` at a time. The
    batch figures and the store's listeners run on the loop's thread."""
    writer = ProcessBatchWriter(store, db_url, {"grant_timeout": 300}, max_batch=8)
    batches: list[int] = []
    threads: set[int] = set()

    def observe(calls: int, _seconds: float) -> None:
        batches.append(calls)
        threads.add(threading.get_ident())

    writer.observe_batch = observe
    store.listeners.append(lambda kind, data: threads.add(threading.get_ident()))
    writer.start()
    try:

        async def scenario() -> list:
            def ask(user: str):
                return writer.run(commands.Allocate(user, "", "a100-1g", actor="t"))

            first = await asyncio.gather(*(ask(f"u{i}") for i in range(5)))
            releases = (writer.run(commands.Release(r.id, actor="t")) for r in first)
            return await asyncio.gather(
                *releases, *(ask(f"v{i}") for i in range(6)), return_exceptions=True
            )

        out = asyncio.run(scenario())
    finally:
        writer.stop()
    assert not any(isinstance(r, BaseException) and not isinstance(r, StoreError) for r in out)
    assert [r.state for r in out[:5]] == ["released"] * 5
    assert batches == [5, 8, 3]
    assert threads == {threading.get_ident()}  # asyncio.run ran the loop on this thread


@pytest.mark.parametrize("where", ["another thread", "the loop's thread"])
def test_stop_finishes_what_is_pending(store, db_url, where):
    """``stop`` from another thread while the loop runs (the loop finishes the calls), or on
    the loop's own thread (it waits for the child itself): nothing asked is dropped."""
    writer = started(store, db_url)

    async def scenario() -> LeaseView:
        task = asyncio.ensure_future(writer.run(commands.Allocate("alice", "", "a100-1g")))
        # one yield to the loop (no wall-clock wait): the task makes its call, which is now
        # pending, its dispatch scheduled for the loop's next pass
        await asyncio.sleep(0)
        assert [type(c) for c, _ in writer._pending] == [commands.Allocate] and writer._scheduled
        if where == "another thread":
            await asyncio.to_thread(writer.stop)
        else:
            writer.stop()
        return await task

    lease = asyncio.run(scenario())
    assert lease.state == "granted"
    assert not writer._child.is_alive()
    with store.locked() as alloc:
        assert lease.id in alloc.leases
