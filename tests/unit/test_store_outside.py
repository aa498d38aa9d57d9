"""The store's outside holds and rebinding: written in one transaction each, audited, and
read back the same by a store rebuilt from the rows (a restart, another replica)."""

from __future__ import annotations

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.errors import Refusal
from jupyterhub_gpupool.poolconfig import gpu_uuid
from tests.fakes import StoreClock, lease_events, make_store

NODE = "n1"
G0, G1, G2 = (gpu_uuid(NODE, i) for i in range(3))
POOL = {
    "nodes": [{"name": NODE, "gpus": [{"model": "A100-80GB"}] * 3}],
    "offers": [{"name": "a100", "kind": "gpu", "models": ["A100-80GB"]}],
    "quotas": {"default": {"guarantee": 0, "limit": 4}},
}


def gpus_of(store, lease_id: str) -> list[str]:
    return [s.gpu for s in store.lease(lease_id).slots]


def test_rebinding_swaps_leases_and_marks_and_a_rebuilt_store_agrees(db_url: str):
    upgrade(db_url)
    clock = StoreClock()
    store = make_store(db_url, clock, POOL)
    a = store.allocate("alice", "", "a100").id
    b = store.allocate("bob", "", "a100").id
    assert (gpus_of(store, a), gpus_of(store, b)) == ([G0], [G1])
    held = store.set_outside(NODE, {"gpu": 1}, ["ml/train-0"])
    assert held["gpus"] == [G2]
    # the plugin put alice on GPU 1 and bob on GPU 0: one report swaps both
    store.rebind(a, [G1], actor="agent")
    assert (gpus_of(store, a), gpus_of(store, b)) == ([G1], [G0])
    assert lease_events(store, a)[-1] == "rebound" and lease_events(store, b)[-1] == "rebound"
    # then the plugin moves alice onto the GPU the training pod was marked on
    store.rebind(a, [G2], actor="agent")
    again = make_store(db_url, clock, POOL)  # rebuilt from the rows
    assert gpus_of(again, a) == [G2]
    with again.locked() as alloc:
        gpus = alloc.nodes[NODE].gpus
        assert [(g.whole_lease, g.outside) for g in gpus] == [(b, False), (None, True), (a, False)]
    # nothing is free: carol waits; the training pod ends and carol gets GPU 1
    carol = again.allocate("carol", "", "a100")
    assert carol.state == "queued"
    again.set_outside(NODE, {}, [])
    assert again.lease(carol.id).state == "granted"
    assert gpus_of(again, carol.id) == [G1]


def test_rebinding_refuses_what_the_lease_cannot_be(db_url: str):
    upgrade(db_url)
    store = make_store(db_url, StoreClock(), POOL)
    a = store.allocate("alice", "", "a100").id
    with pytest.raises(Refusal) as e:
        store.rebind(a, ["GPU-not-here"])
    assert e.value.code == "unknown_device"
    store.release(a)
    with pytest.raises(Refusal) as e:
        store.rebind(a, [G1])
    assert e.value.code == "not_live"
    assert gpus_of(store, a) == [G0]
