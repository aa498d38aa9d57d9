"""An inference job's replicas (issue 35, item 1): copies of a whole-GPU offer in one grant,
charged in full to the user's and the group's quota (``workloads.check_replicas``,
``workloads.replicas_of``, the allocator's ``Request.replicas``)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool.allocator import Allocator, Rejected
from jupyterhub_gpupool.pool.errors import PoolError
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec
from jupyterhub_gpupool.pool.workloads import (
    DEFAULT_CLASSES,
    MAX_REPLICAS,
    check_replicas,
    replicas_of,
)
from tests.allocrig import granted, h100_node, mig_node, offers, queued, req

OFFERS = {o.name: o for o in offers()}
INFERENCE, TRAINING = DEFAULT_CLASSES["inference"], DEFAULT_CLASSES["training"]


def test_good_replicas_pass():
    assert check_replicas(1, TRAINING, OFFERS["a100-1g"]) == 1  # one copy: any class, any offer
    assert check_replicas(3, INFERENCE, OFFERS["h100"]) == 3
    assert check_replicas(MAX_REPLICAS, INFERENCE, OFFERS["h100x2"]) == MAX_REPLICAS


@pytest.mark.parametrize(
    "replicas, cls, offer, words",
    [
        (0, INFERENCE, "h100", "from 1 to 64"),
        (MAX_REPLICAS + 1, INFERENCE, "h100", "from 1 to 64"),
        ("2", INFERENCE, "h100", "whole number"),
        (2.0, INFERENCE, "h100", "whole number"),
        (True, INFERENCE, "h100", "whole number"),
        (None, INFERENCE, "h100", "whole number"),
        (2, TRAINING, "h100", "only class 'inference'"),
        (2, INFERENCE, "a100-1g", "replicas need whole GPUs"),
        (2, INFERENCE, "shared", "replicas need whole GPUs"),
    ],
)
def test_bad_replicas_are_refused_with_their_code(replicas, cls, offer, words):
    with pytest.raises(PoolError) as e:
        check_replicas(replicas, cls, OFFERS[offer])
    assert e.value.code == "invalid_replicas" and e.value.field == "replicas"
    assert words in e.value.message


def test_replicas_of_an_offer_hold_its_gpus_cpu_and_memory_times_the_copies():
    offer = OFFERS["h100x2"]
    assert replicas_of(offer, 1) is offer
    three = replicas_of(offer, 3)
    assert (three.count, three.kind, three.models) == (6, "gpu", offer.models)
    assert three.name != offer.name  # the allocator's per-offer caches keep them apart


def quota_pool() -> Allocator:
    """Nodes of 4 and 8 H100s; group ``ml`` is guaranteed 2 units, ``capped`` may hold 2."""
    quotas = QuotaBook(
        users={"capped": QuotaSpec(limit=Fraction(2))},
        groups={"ml": QuotaSpec(guarantee=Fraction(2))},
    )
    return Allocator([h100_node("h", 4), h100_node("big", 8), mig_node()], offers(), quotas)


def test_every_replica_counts_against_the_users_and_the_groups_quota():
    alloc = quota_pool()
    g = granted(alloc.submit(req("svc", "h100", "ann", group="ml", groups=("ml",), replicas=3), 0))
    assert g.offer == "h100" and g.units == 3
    assert len(g.slots) == 3 and len({s.gpu for s in g.slots}) == 3
    assert len({alloc.gpus[s.gpu].node for s in g.slots}) == 1  # the copies share a node
    assert alloc.quotas.held("ann") == 3
    assert alloc.quotas.group_held("ml") == 3
    # three units against a guarantee of two: the lease borrows (one copy would not)
    assert g.borrowed and alloc.leases["svc"].borrowed
    alloc.release("svc", 1)
    assert alloc.quotas.held("ann") == 0 and alloc.quotas.group_held("ml") == 0
    assert all(g.whole_lease is None for g in alloc.gpus.values())
    one = granted(alloc.submit(req("svc-1", "h100", "ann", group="ml", groups=("ml",)), 2))
    assert one.units == 1 and not one.borrowed


def test_replicas_beyond_the_users_limit_or_a_node_are_refused():
    alloc = quota_pool()
    over = alloc.submit(req("a", "h100", "capped", replicas=3), 0)
    assert isinstance(over, Rejected) and over.code == "exceeds_limit"
    granted(alloc.submit(req("b", "h100", "capped", replicas=2), 0))
    too_big = alloc.submit(req("c", "h100x2", "ann", replicas=5), 0)  # 10 GPUs, nodes hold 8
    assert isinstance(too_big, Rejected) and too_big.code == "exceeds_node_size"


def test_queued_replicas_are_granted_together_when_a_node_has_room():
    alloc = quota_pool()
    granted(alloc.submit(req("fill", "h100x2", "x", replicas=4), 0))  # all of "big"
    granted(alloc.submit(req("half", "h100x2", "y"), 0))  # half of "h"
    q = queued(alloc.submit(req("svc", "h100", "ann", replicas=4), 1))
    assert q.units == 4
    grants = alloc.release("half", 2)
    assert [(g.request.id, g.node, len(g.slots), g.units) for g in grants] == [("svc", "h", 4, 4)]
    assert alloc.quotas.held("ann") == 4
