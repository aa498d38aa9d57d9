"""The audit log's JSON (``GET events``) and a stored utilization minute's (the ``minutes`` of
``GET allocations/{id}/utilization``) from their read models, against JSON written out by hand
(key order included: the API's bytes stay the same), and an event read back as a view."""

from __future__ import annotations

import json
import pickle
from datetime import datetime

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.service.serialize.events import event_json
from jupyterhub_gpupool.service.serialize.utilization import minute_json
from jupyterhub_gpupool.store.read.events import EventView
from jupyterhub_gpupool.store.read.utilization import MinuteView
from tests.fakes import make_store


def test_an_event_is_written_as_the_api_always_wrote_it():
    view = EventView(
        7,
        datetime(2026, 3, 1, 9, 30, 5, 120000),
        "user:admin",
        "reclaim-notice",
        "lease-1",
        "alice",
        {"grace": 600, "reason": "idle"},
    )
    text = json.dumps(event_json(view))
    assert text == (
        '{"id": 7, "ts": "2026-03-01T09:30:05.120000Z", "actor": "user:admin", '
        '"kind": "reclaim-notice", "lease": "lease-1", "user": "alice", '
        '"data": {"grace": 600, "reason": "idle"}}'
    )
    assert pickle.loads(pickle.dumps(view)) == view


def test_an_event_about_no_lease_keeps_its_nulls():
    view = EventView(1, datetime(2026, 1, 1), "system", "inventory", None, None, {})
    assert event_json(view) == {
        "id": 1,
        "ts": "2026-01-01T00:00:00Z",
        "actor": "system",
        "kind": "inventory",
        "lease": None,
        "user": None,
        "data": {},
    }


def test_the_store_answers_its_audit_log_as_views(db_url, clock):
    upgrade(db_url)
    store = make_store(db_url, clock)
    lease = store.allocate("alice", "", "a100-1g", actor="user:alice")
    items, total = store.events(lease=lease.id)
    assert total == 1 and len(items) == 1
    (granted,) = items
    assert isinstance(granted, EventView)
    # the pool grants (the user asked): the grant's actor is the pool's own
    assert (granted.kind, granted.actor, granted.lease, granted.user) == (
        "granted",
        "system",
        lease.id,
        "alice",
    )
    assert isinstance(granted.ts, datetime) and granted.ts.tzinfo is None


def test_a_stored_minute_is_written_with_epoch_seconds_as_before():
    # 2027-01-15T08:00:00Z is 1,800,000,000 s after the epoch; a whole GPU's start is null
    view = MinuteView(datetime(2027, 1, 15, 8, 0), "GPU-a", None, 4, 30.0, 60.0, 500)
    assert json.dumps(minute_json(view)) == (
        '{"ts": 1800000000.0, "gpu": "GPU-a", "start": null, "samples": 4, '
        '"util_mean": 30.0, "util_max": 60.0, "memory_used_mib_max": 500}'
    )
    mig = MinuteView(datetime(2027, 1, 15, 8, 1), "GPU-a", 2, 3, None, None, 7)
    assert minute_json(mig)["ts"] == 1_800_000_060.0 and minute_json(mig)["start"] == 2
    assert pickle.loads(pickle.dumps(mig)) == mig
