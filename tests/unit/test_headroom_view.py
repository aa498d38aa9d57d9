"""The headroom where admins look (``store.read.headroom``): the pool map's ``headroom``
(``GET pool/map``) and the metrics' ``gpupool_headroom_*`` and ``gpupool_held_node`` gauges:
what is kept free per GPU model, the free units counted against it, and which node is held for
which long waiter (the sticky hold), with whether it is out of the count."""

from __future__ import annotations

import copy
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.service.metrics import PoolMetrics
from jupyterhub_gpupool.service.serialize.headroom import headroom_json
from jupyterhub_gpupool.store.read.headroom import HeadroomView
from tests.fakes.jobpool import POOL, fill, ok, service

KEEP = copy.deepcopy(POOL)
KEEP["borrowing"] = {"keep_free": 1}
KEEP["classes"]["training"]["preempt_for_waiters"] = False  # the 8-GPU job only waits


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def test_the_pool_map_and_the_metrics_show_the_headroom_and_the_node_held(db_url, clock):
    with service(db_url, clock, KEEP) as svc:
        _, _, asks = fill(svc, clock)  # a: 8 of 8 held; b: 2 of 8
        big = asks["big"]
        queued_at = clock.now
        room = ok(svc.call("root", "GET", "pool/map"))["headroom"]
        assert room == {
            "keep_free": "keep_free 1",
            "models": [
                {"model": "H100-80GB", "keep_free": 1, "free_units": 6.0, "short_units": 0.0}
            ],
            "held": [],  # nobody has waited reserve_after (1800 s) yet
        }
        clock.advance(seconds=1801)
        assert svc.run(commands.PreemptJobs()) == []  # it only waits: b is remembered
        room = ok(svc.call("root", "GET", "pool/map"))["headroom"]
        since = queued_at.isoformat(timespec="seconds")
        (held,) = room["held"]
        assert held["waiting_since"].startswith(since)
        assert {k: v for k, v in held.items() if k != "waiting_since"} == {
            "node": "b",
            "request": big["lease_id"],
            "user": "trainer",
            "offer": "h100x8",
            "out_of_count": False,  # -50 + 3 levels of aging: notebooks still rank ahead
        }
        assert room["models"][0]["free_units"] == 6.0  # b's free GPUs still count
        view = svc.store.headroom()  # the store's read the map serves, by the clock
        assert isinstance(view, HeadroomView) and headroom_json(view) == room
        assert view.held[0].waiting_since == queued_at  # a datetime (naive UTC), not text
        text = PoolMetrics().render(svc.store).decode()
        assert samples(text, "gpupool_headroom_free_units") == [({"model": "H100-80GB"}, 6.0)]
        assert samples(text, "gpupool_headroom_keep_free_units") == [({"model": "H100-80GB"}, 1.0)]
        node = {"node": "b", "request": big["lease_id"], "offer": "h100x8", "out_of_count": "0"}
        assert samples(text, "gpupool_held_node") == [(node, 1.0)]
        # 8.3 h later it outranks notebooks: b's six free GPUs are its alone, out of the
        # count, and one is missing from the headroom
        clock.advance(hours=8, minutes=30)
        room = ok(svc.call("root", "GET", "pool/map"))["headroom"]
        assert room["held"][0]["node"] == "b" and room["held"][0]["out_of_count"] is True
        assert room["models"] == [
            {"model": "H100-80GB", "keep_free": 1, "free_units": 0.0, "short_units": 1.0}
        ]
        text = PoolMetrics().render(svc.store).decode()
        assert samples(text, "gpupool_held_node") == [({**node, "out_of_count": "1"}, 1.0)]
        assert samples(text, "gpupool_headroom_free_units") == [({"model": "H100-80GB"}, 0.0)]


def test_without_a_headroom_the_map_keeps_nothing_free(db_url, clock):
    plain: dict[str, Any] = copy.deepcopy(POOL)
    with service(db_url, clock, plain) as svc:
        room = ok(svc.call("root", "GET", "pool/map"))["headroom"]
        assert room == {
            "keep_free": "none",
            "models": [
                {"model": "H100-80GB", "keep_free": 0, "free_units": 16.0, "short_units": 0.0}
            ],
            "held": [],
        }
