"""A node whose agent goes silent is marked unreachable after a bound: no new grants there, its
leases stay, the pool view and the node JSON say so, and its agent's next report brings it
back (and serves the queue). Driven by the store's clock, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.model import Node
from jupyterhub_gpupool.store import Store
from jupyterhub_gpupool.store.read.poolmap import PoolNodeView
from tests.fakes import StoreClock, make_store


@pytest.fixture
def store(db_url: str, clock: StoreClock) -> Store:
    upgrade(db_url)
    return make_store(db_url, clock, grant_timeout=300)


def _report(store: Store, name: str = "h100") -> None:
    """The node's agent sends its inventory (as the config declares it)."""
    node = next(n for n in store.file_config.nodes if n.name == name)
    store.put_inventory(Node(node.name, node.cluster, node.cpu_milli, node.memory_mib, node.gpus))


def _pool_node(store: Store, name: str) -> PoolNodeView:
    return next(
        n for c in store.pool(detail=True).clusters or () for n in c.nodes if n.name == name
    )


def test_a_silent_agent_makes_its_node_unreachable_and_a_report_brings_it_back(store, clock):
    _report(store)  # the node is an agent's now (config nodes without an agent are never marked)
    held = store.allocate("alice", "", "h100")
    assert held.state == "granted"
    clock.advance(seconds=60)
    assert store.mark_unreachable(clock() - timedelta(seconds=120)) == []  # not silent long
    store.add_busy({}, node="h100")  # samples: the agent is alive
    clock.advance(seconds=100)
    assert store.mark_unreachable(clock() - timedelta(seconds=120)) == []
    clock.advance(seconds=30)  # 130 s since the last samples
    assert store.mark_unreachable(clock() - timedelta(seconds=120)) == ["h100"]
    assert store.mark_unreachable(clock() - timedelta(seconds=120)) == []  # marked once
    assert _pool_node(store, "h100").unreachable is True
    # its lease stays; nothing new is granted there: bob waits
    assert store.lease(held.id).state == "granted"
    store.release(held.id)
    waiting = store.allocate("bob", "", "h100")
    assert waiting.state == "queued"
    # the agent reports again: reachable, and bob gets the GPU at once
    store.add_busy({}, node="h100")
    assert _pool_node(store, "h100").unreachable is False
    assert store.lease(waiting.id).state == "granted"
    kinds = [e.kind for e in store.events(limit=1000)[0]]
    assert kinds.count("node-unreachable") == 1 and kinds.count("node-reachable") == 1


def test_an_inventory_report_also_brings_a_node_back(store, clock):
    _report(store)
    clock.advance(seconds=300)
    assert store.mark_unreachable(clock() - timedelta(seconds=120)) == ["h100"]
    _report(store)
    assert _pool_node(store, "h100").unreachable is False
    assert store.allocate("alice", "", "h100").state == "granted"


def test_nodes_without_an_agent_are_never_marked(store, clock):
    clock.advance(days=1)
    assert store.mark_unreachable(clock() - timedelta(seconds=120)) == []
    assert store.allocate("alice", "", "h100").state == "granted"
