"""Two processes deciding on one pool (``store/changes.py``): each catches up with the other's
batches by reloading the leases they wrote, and ends up holding what a rebuild from the rows
would hold; any other change, or a MIG lease, makes it rebuild as before."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from jupyterhub_gpupool import orm
from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.pool.allocator import Allocator
from jupyterhub_gpupool.store import Store
from jupyterhub_gpupool.store.errors import StoreError
from jupyterhub_gpupool.store.rebuild import build_allocator
from tests.fakes import STORE_POOL, StoreClock, make_store

#: Two nodes of four whole H100s, one of two shareable T4s, and the MIG node of the store tests.
POOL: dict[str, Any] = {
    "nodes": [
        *(
            {
                "name": f"h{n}",
                "cpu_milli": 64000,
                "memory_mib": 262144,
                "gpus": [{"model": "H100-80GB", "count": 4}],
            }
            for n in range(2)
        ),
        {
            "name": "t4",
            "cpu_milli": 64000,
            "memory_mib": 262144,
            "gpus": [{"model": "T4", "count": 2, "sharing": "shared"}],
        },
        STORE_POOL["nodes"][0],  # one dynamic-MIG A100
    ],
    "offers": [
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "h100x2", "kind": "gpu", "count": 2, "models": ["H100-80GB"]},
        {"name": "t4q", "kind": "shared", "fraction": 0.25, "models": ["T4"]},
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
    ],
    "quotas": {"default": {"guarantee": 1, "limit": 3}},
}
WHOLE_OR_SHARED = ("h100", "h100x2", "t4q")
USERS = [f"u{i}" for i in range(6)]


def state(alloc: Allocator) -> dict[str, Any]:
    """What decisions depend on: leases and where, the queue, every GPU, node and quota use."""
    return {
        "leases": {
            i: (le.node, le.slots, le.units, le.group, le.request.user, le.request.server)
            for i, le in alloc.leases.items()
        },
        # not the reason a waiter waits: a queue pass updates it in memory only, where the
        # process that made the pass shows it (a rebuild reads the reason it was queued with)
        "waiters": {i: (w.units, w.group, w.since) for i, w in alloc.waiters.items()},
        "gpus": {u: g.state_key() for u, g in alloc.gpus.items()},
        "nodes": {n.name: (n.cpu_used, n.memory_used) for n in alloc.nodes.values()},
        "held_user": {u: v for u, v in alloc.quotas.held_user.items() if v},
        "held_group": {g: v for g, v in alloc.quotas.held_group.items() if v},
    }


def rebuilt(store: Store) -> dict[str, Any]:
    """The state a fresh rebuild from the rows gives."""
    with store.read() as db:
        alloc = build_allocator(
            db, store.catalog, store.clock(), aging_interval=600.0, reserve_after=1800.0
        )
        return state(alloc)


def caught_up(store: Store) -> dict[str, Any]:
    """The store's own allocator, once it has looked at the pool version."""
    store.commits_elsewhere()
    with store.locked() as alloc:
        return state(alloc)


@pytest.fixture
def pair(db_url: str, clock: StoreClock) -> tuple[Store, Store]:
    upgrade(db_url)
    a = make_store(db_url, clock, POOL)
    b = make_store(db_url, clock, POOL)
    yield a, b
    a.engine.dispose()
    b.engine.dispose()


def batch(store: Store, rng: random.Random, live: dict[str, str], n: int) -> None:
    """``n`` random asks and releases of whole or shared GPUs, in one batch."""
    calls: list[commands.Command] = []
    chosen: set[str] = set()
    for _ in range(n):
        if live and rng.random() < 0.45:
            lease_id = rng.choice(sorted(set(live) - chosen or live))
            if lease_id in chosen:
                continue
            chosen.add(lease_id)
            calls.append(commands.Release(lease_id))
        else:
            user = rng.choice(USERS)
            server, offer = f"s{rng.randrange(10**6)}", rng.choice(WHOLE_OR_SHARED)
            calls.append(commands.Allocate(user, server, offer))
    for cmd, out in zip(calls, store.run_batch(calls), strict=True):
        if isinstance(out, Exception):
            continue
        if isinstance(cmd, commands.Release):
            live.pop(cmd.lease_id, None)
        elif out.state in ("granted", "queued"):
            live[out.id] = out.state


def test_two_deciders_catch_up_without_rebuilding(pair, clock):
    a, b = pair
    rng = random.Random(16)
    live: dict[str, str] = {}
    for store in (a, b):  # both start in step (their own config loads were rebuilds)
        caught_up(store)
    rebuilds = (a.rebuilds, b.rebuilds)
    for step in range(40):
        decider, other = (a, b) if rng.random() < 0.5 else (b, a)
        batch(decider, rng, live, rng.randint(1, 6))
        clock.advance(seconds=rng.choice([0, 5, 60]))
        if step % 3 == 0:  # the other one sometimes decides again before it looks
            continue
        assert caught_up(other) == rebuilt(other), f"step {step}"
        assert caught_up(decider) == rebuilt(decider), f"step {step}"
    assert (a.rebuilds, b.rebuilds) == rebuilds  # every catch-up reloaded leases only
    assert a.catch_ups + b.catch_ups >= 20
    assert any(s == "queued" for s in live.values())  # the queue was exercised too
    with a.read() as db:
        assert db.query(orm.PoolChangeRow).count() > 0


def test_other_changes_and_mig_leases_rebuild(pair):
    a, b = pair
    caught_up(b)
    lease = a.allocate("u1", "s1", "h100")
    assert caught_up(b) == rebuilt(b)
    before = b.rebuilds
    assert (b.catch_ups, before) != (0, 0)

    a.set_node("h0", "cordon")  # not a batch of leases: no change row
    assert caught_up(b) == rebuilt(b)
    assert b.rebuilds == before + 1

    a.run_batch([commands.Allocate("u2", "s2", "a100-1g")])  # a MIG slice: instances too
    assert caught_up(b) == rebuilt(b)
    assert b.rebuilds == before + 2

    catch_ups = b.catch_ups
    a.run_batch([commands.Release(lease.id)])
    assert caught_up(b) == rebuilt(b)
    assert (b.rebuilds, b.catch_ups) == (before + 2, catch_ups + 1)


def test_a_gap_in_the_history_rebuilds(pair):
    """Change rows pruned (or never written by older code): the other process rebuilds."""
    a, b = pair
    caught_up(b)
    a.run_batch([commands.Allocate("u1", "s1", "h100")])
    a.run_batch([commands.Allocate("u2", "s2", "h100")])
    with a.writing() as db:
        db.query(orm.PoolChangeRow).delete()
    before = b.rebuilds
    assert caught_up(b) == rebuilt(b)
    assert b.rebuilds == before + 1


def test_two_deciders_at_once_never_collide(pair):
    """Both decide at the same time on a pool too small for the asks: each catches up with
    the other's batches under the pool lock before deciding, so no batch ever picks a slot the
    other holds (the database's unique index on live slots would fail the whole batch)."""
    a, b = pair
    failures: list[BaseException] = []
    live: dict[Store, dict[str, str]] = {a: {}, b: {}}
    together = threading.Barrier(2, timeout=120)  # each round starts at once in both

    def decide(store: Store, seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(40):
                together.wait()
                batch(store, rng, live[store], rng.randint(1, 6))
        except BaseException as e:  # reported by the main thread
            failures.append(e)
            together.abort()  # the other one stops waiting for this one

    threads = [threading.Thread(target=decide, args=(s, i)) for i, s in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not failures, failures
    assert not any(t.is_alive() for t in threads)
    assert a.catch_ups and b.catch_ups  # they did take turns
    for store in (a, b):
        assert caught_up(store) == rebuilt(store)


@pytest.mark.parametrize("how", ["ask", "ask in a batch", "resize"])
def test_a_request_awaiting_approval_in_one_process_is_seen_by_the_others_calls(db_url, clock, how):
    """A process that knew of no request awaiting approval (and so asks the database for
    none: ``Store.awaiting_requests``) learns of one the other process made, in a batch (a
    catch-up) or alone (a rebuild): the server has it, so a second ask for it is refused; a
    release of the lease it would replace withdraws it."""
    upgrade(db_url)
    big = {"name": "big", "kind": "gpu", "count": 2, "models": ["H100-80GB"]}
    config = {**POOL, "offers": [*POOL["offers"], {**big, "approval": "required"}]}
    a, b = make_store(db_url, clock, config), make_store(db_url, clock, config)
    try:
        held = b.allocate("u1", "s1", "h100")
        caught_up(b)
        assert b._none_awaiting
        if how == "ask":
            ask = a.allocate("u1", "s2", "big", reason="a deadline")
        elif how == "ask in a batch":
            (ask,) = a.run_batch([commands.Allocate("u1", "s2", "big", reason="a deadline")])
        else:
            ask = a.allocate("u1", "s1", "big", resize_of=held.id, reason="a deadline")
        assert ask.state == "awaiting_approval"
        if how == "resize":
            assert b.release(held.id).state == "released"
            assert (b.lease(ask.id).state, b.lease(ask.id).release_reason) == (
                "released",
                "withdrawn",
            )
        else:
            with pytest.raises(StoreError) as e:
                b.allocate("u1", "s2", "h100")
            assert (e.value.code, e.value.field) == ("already_allocated", "server")
    finally:
        a.engine.dispose()
        b.engine.dispose()
