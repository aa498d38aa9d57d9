"""The reclaim endpoints over HTTP, through the service's real tornado app (``make_app``) and
its writer, with the hub's token check played by a fake: who may call what, the statuses and
error bodies, a whole notice → keep → act → outcome flow with samples posted by the agent (the
round reads them from the database), the user's reclaims in ``GET users/me``, the policy
override, the metrics.

The service runs on its own event loop in a thread; the store's clock is the test's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.service.scopes import ADMIN, AGENT, RECLAIM, SPAWN, USE
from jupyterhub_gpupool.store import Store
from jupyterhub_gpupool.store.read.leases import LeaseView
from jupyterhub_gpupool.store.rows import epoch
from tests.fakes import STORE_POOL, InProcessService, Response, StoreClock, make_store, request

POLICY = {
    "default": {
        "idle_timeout": "10m",
        "pressure_idle_timeout": "5m",
        "cpu_busy_timeout": "30m",
        "warn_before": "2m",
        "max_extensions": 1,
        "extension": "10m",
        "busy_grace": 0,
    }
}
POOL = {**STORE_POOL, "reclaim": POLICY}

#: token → the model the hub would answer for it.
MODELS: dict[str, dict[str, Any]] = {
    "alice": {"kind": "user", "name": "alice", "scopes": [f"{USE}!user=alice"], "groups": []},
    "bob": {"kind": "user", "name": "bob", "scopes": [f"{USE}!user=bob"], "groups": []},
    "spawner": {"kind": "service", "name": "gpupool-spawner", "scopes": [SPAWN]},
    "agent": {"kind": "service", "name": "agent", "scopes": [AGENT]},
    "reclaimer": {"kind": "service", "name": "reclaimer", "scopes": [RECLAIM]},
    "admin": {"kind": "user", "name": "admin", "scopes": [ADMIN], "groups": []},
}


class Service(InProcessService):
    """The real app and writer in-process (``tests.fakes.InProcessService``), with the
    helpers these tests share."""

    def __init__(self, store: Store) -> None:
        super().__init__(store, MODELS)

    def ok(self, who: str, method: str, path: str, body: object = None) -> Any:
        r = self.call(who, method, path, body)
        assert r.status == 200, f"{method} {path}: {r.status} {r.body[:300]!r}"
        return r.json()

    def samples(self, lease: LeaseView, t0: float, t1: float, util: float = 0.0) -> None:
        """Telemetry of the lease's GPU over [t0, t1], posted by its node's agent (the round
        reads it from the database)."""
        gpu = lease.slots[0].gpu
        batch = [{"gpu": gpu, "ts": t, "util": util, "memory_used_mib": 100} for t in (t0 + 1, t1)]
        self.ok("agent", "POST", f"nodes/{lease.node}/samples", {"samples": batch})


@pytest.fixture
def api(db_url: str, clock: StoreClock) -> Iterator[Service]:
    upgrade(db_url)
    with Service(make_store(db_url, clock, pool=POOL)) as service:
        yield service


def error(r: Response) -> dict[str, Any]:
    assert r.headers.get("Content-Type", "").startswith("application/json"), r.headers
    return r.json()["error"]


def lease_of_alice(api: Service) -> LeaseView:
    lease = api.store.allocate("alice", "", "h100")
    return api.store.keepalive(lease.id)


def round_(
    api: Service, clock: StoreClock, lease: LeaseView, *, util: float = 0.0, who="reclaimer"
):
    """A minute later, a round seeing alice's server idle and alice away."""
    clock.advance(minutes=1)
    api.ok(who, "POST", "reclaim/leader", {"holder": "r1", "ttl": 600})  # renewed each round
    now = epoch(clock())
    api.samples(lease, now - 60, now, util)
    seen = {
        "kernel": {"state": "idle", "last_activity": None, "observed_at": now},
        "presence": {"last_input": None, "connections": 1, "observed_at": now},
    }
    body = {
        "holder": "r1",
        "window": {"start": now - 60, "end": now},
        "observed": {lease.id: seen},
    }
    answer = api.ok(who, "POST", "reclaim/rounds", body)
    return {d["lease"]: d for d in answer["decisions"]}[lease.id]


# -- who may call what -------------------------------------------------------------------------

CALLERS = (None, "alice", "spawner", "agent", "reclaimer", "admin")
#: Request, body, then the expected status per caller (anon, alice, spawner, agent,
#: reclaimer, admin). Each caller runs the rows in order: it takes the lead, gives it up.
ROUND = {"holder": "x", "window": {"start": 1, "end": 2}}
# fmt: off
MATRIX = [
    ("GET reclaim/leases", None,                             401, 403, 403, 403, 200, 200),
    # the reclaimer reads any lease (a shrink's reserved target), and changes none
    ("GET allocations/{id}", None,                           401, 200, 200, 403, 200, 200),
    ("POST allocations/{id}/resize", {"offer": "nope"},      401, 422, 422, 403, 403, 422),
    ("POST reclaim/leader", {"holder": "{who}", "ttl": 5},   401, 403, 403, 403, 200, 200),
    ("DELETE reclaim/leader?holder={who}", None,             401, 403, 403, 403, 200, 200),
    ("POST reclaim/rounds", ROUND,                           401, 403, 403, 403, 409, 409),
    ("POST reclaim/leases/{id}/outcome", {"holder": "x", "result": "done"},
                                                             401, 403, 403, 403, 409, 409),
    ("GET reclaim/policies", None,                           401, 403, 403, 403, 403, 200),
    ("PUT reclaim/policies", {"default": {"idle_timeout": "2h"}},
                                                             401, 403, 403, 403, 403, 200),
    ("DELETE reclaim/policies", None,                        401, 403, 403, 403, 403, 200),
]
# fmt: on


def _fill(value: Any, **names: str) -> Any:
    if isinstance(value, str):
        for k, v in names.items():
            value = value.replace("{" + k + "}", v)
        return value
    if isinstance(value, dict):
        return {k: _fill(v, **names) for k, v in value.items()}
    return value


def test_who_may_call_what(api):
    lease = lease_of_alice(api)
    wrong = []
    for column, who in enumerate(CALLERS):
        for what, body, *want in MATRIX:
            method, path = what.split(" ")
            status = want[column]
            names = {"who": who or "anon", "id": lease.id}
            r = api.call(who, method, _fill(path, **names), _fill(body, **names))
            if r.status != status:
                wrong.append(f"{method} {path} as {who}: {r.status} (want {status}) {r.body!r}")
            elif status >= 400:
                error(r)  # a JSON error body with a code
    assert not wrong, "\n".join(wrong)
    assert api.call("reclaimer", "DELETE", f"allocations/{lease.id}").status == 403
    # alice's "keep my GPU" on her lease; bob gets the 404 of a lease that does not exist
    assert api.call("bob", "POST", f"allocations/{lease.id}/keepalive", {}).status == 404
    assert api.call("alice", "POST", f"allocations/{lease.id}/keepalive", {}).status == 200


# -- the flow ----------------------------------------------------------------------------------


def test_notice_keep_act_outcome_over_http(api, clock):
    lease = lease_of_alice(api)
    took = api.ok("reclaimer", "POST", "reclaim/leader", {"holder": "r1", "ttl": 600})
    assert took["holder"] == "r1" and took["leader"] is True
    other = api.call("admin", "POST", "reclaim/leader", {"holder": "r2"})
    assert other.status == 409 and error(other)["code"] == "not_leader"
    assert "r1" in error(other)["message"]

    kinds = [round_(api, clock, lease)["kind"] for _ in range(8)]
    assert kinds == ["none"] * 7 + ["notice"]
    me = api.ok("alice", "GET", "users/me")
    (notice,) = me["notices"]
    assert notice["kind"] == "reclaim" and notice["action"] == "stop"
    assert notice["deadline"] == "2026-03-02T09:10:00Z" and "idle" in notice["reason"]
    assert me["leases"][0]["state"] == "reclaiming"
    assert me["leases"][0]["reclaim"]["extendable"] is True
    watched = api.ok("reclaimer", "GET", "reclaim/leases?limit=10")
    assert watched["total"] == 1 and watched["items"][0]["reclaim"]["kind"] == "idle"

    kept = api.ok("alice", "POST", f"allocations/{lease.id}/keepalive", {})
    assert kept["state"] == "active" and kept["reclaim"] is None
    for _ in range(30):
        if round_(api, clock, lease)["kind"] == "notice":
            break
    limit = api.call("alice", "POST", f"allocations/{lease.id}/keepalive", {})
    assert limit.status == 409
    assert error(limit)["code"] == "extension_limit" and error(limit)["allowed"] == [1]

    for _ in range(5):
        act = round_(api, clock, lease)
        if act["kind"] == "act":
            break
    assert act["action"] == "stop" and act["release_reason"] == "reclaimed-idle"
    late = api.call("alice", "POST", f"allocations/{lease.id}/keepalive", {})
    assert late.status == 409 and error(late)["code"] == "reclaim_in_progress"

    outcome = {"holder": "r1", "result": "done", "saved": ["nb.ipynb"], "detail": "saved"}
    done = api.ok("reclaimer", "POST", f"reclaim/leases/{lease.id}/outcome", outcome)
    assert done["state"] == "released" and done["release_reason"] == "reclaimed-idle"
    again = api.call("reclaimer", "POST", f"reclaim/leases/{lease.id}/outcome", outcome)
    assert again.status == 409 and error(again)["code"] == "not_acting"
    (past,) = api.ok("alice", "GET", "users/me")["reclaims"]
    assert past["saved"] == ["nb.ipynb"] and past["outcome"] == "done"
    assert past["release_reason"] == "reclaimed-idle"

    metrics = request("GET", f"{api.url}/metrics").body.decode()
    assert 'gpupool_reclaim_notices_total{kind="idle"} 2.0' in metrics
    assert 'gpupool_reclaim_acts_total{action="stop"} 1.0' in metrics
    assert 'gpupool_reclaim_cancels_total{why="kept"} 1.0' in metrics
    assert 'gpupool_reclaim_outcomes_total{result="done"} 1.0' in metrics
    assert "gpupool_leases_reclaiming 0.0" in metrics

    gone = api.ok("reclaimer", "DELETE", "reclaim/leader?holder=r1")
    assert gone == {"holder": None, "expires": None, "leader": False}


def test_a_round_without_samples_or_observations_decides_nothing(api, clock):
    lease = lease_of_alice(api)
    api.ok("reclaimer", "POST", "reclaim/leader", {"holder": "r1", "ttl": 600})
    for _ in range(15):
        clock.advance(minutes=1)
        api.ok("reclaimer", "POST", "reclaim/leader", {"holder": "r1", "ttl": 600})
        now = epoch(clock())
        body = {"holder": "r1", "window": {"start": now - 60, "end": now}}
        answer = api.ok("reclaimer", "POST", "reclaim/rounds", body)
        assert answer["stale"] == 1 and answer["decisions"][0]["kind"] == "stale"
    assert api.store.lease(lease.id).state == "active"


# -- bad input ---------------------------------------------------------------------------------

NOW = epoch(StoreClock()())
WINDOW = {"start": NOW - 60, "end": NOW}
# fmt: off
BAD = [
    # method, path, body, status, code, field
    ("POST", "reclaim/leader", {"holder": "r1", "ttl": 1}, 422, "invalid_field", "ttl"),
    ("POST", "reclaim/leader", {"holder": ""}, 422, "invalid_field", "holder"),
    ("POST", "reclaim/leader", {"ttl": 60}, 422, "missing_field", "holder"),
    ("POST", "reclaim/leader", {"holder": "r1", "colour": 1}, 422, "unknown_field", "colour"),
    ("DELETE", "reclaim/leader", None, 400, "invalid_argument", "holder"),
    ("POST", "reclaim/rounds", {"holder": "r1"}, 422, "missing_field", "window"),
    ("POST", "reclaim/rounds", {"holder": "r1", "window": {"start": 5, "end": 4}}, 422,
     "invalid_field", "window"),
    ("POST", "reclaim/rounds", {"holder": "r1", "window": {"start": "a", "end": 4}}, 422,
     "invalid_field", "window.start"),
    ("POST", "reclaim/rounds", {"holder": "r1", "window": {"start": 1}}, 422,
     "invalid_field", "window.end"),
    ("POST", "reclaim/rounds", {"holder": "r1", "window": WINDOW, "observed": {"x": 1}}, 422,
     "invalid_field", "observed.x"),
    ("POST", "reclaim/rounds", {"holder": "r1", "window": WINDOW,
     "observed": {"x": {"kernel": {"state": "asleep", "observed_at": NOW}}}}, 422,
     "invalid_field", "observed.x.kernel.state"),
    ("POST", "reclaim/rounds", {"holder": "r1", "window": WINDOW,
     "observed": {"x": {"presence": {"connections": -1, "observed_at": NOW}}}}, 422,
     "invalid_field", "observed.x.presence.connections"),
    ("POST", "reclaim/rounds", {"holder": "r1", "window": WINDOW,
     "observed": {"x": {"kernel": {"state": "idle"}}}}, 422,
     "invalid_field", "observed.x.kernel.observed_at"),
    ("POST", "reclaim/rounds", {"holder": "nobody", "window": WINDOW}, 409, "not_leader",
     "holder"),
    ("POST", "reclaim/leases/nope/outcome", {"holder": "r1", "result": "done"}, 404,
     "not_found", "id"),
    ("POST", "reclaim/leases/{id}/outcome", {"holder": "r1", "result": "meh"}, 422,
     "invalid_field", "result"),
    ("POST", "reclaim/leases/{id}/outcome", {"holder": "r1", "result": "done"}, 409,
     "not_acting", "id"),
    ("POST", "reclaim/leases/{id}/outcome", {"holder": "r1", "result": "done", "saved": [1]},
     422, "invalid_field", "saved[0]"),
    ("PUT", "reclaim/policies", {"offers": {"h100": {"idle_timeout": -1}}}, 422,
     "invalid_field", "reclaim.offers.h100.idle_timeout"),
    ("PUT", "reclaim/policies", {"offers": {"nope": {}}}, 422, "invalid_field", "reclaim.offers"),
    ("PUT", "reclaim/policies", {"default": {"action": "shrink:h100x9"}}, 422, "invalid_field",
     "reclaim.default.action"),
    ("PUT", "reclaim/policies", {"offers": {"h100": {"max_age": 1e30}}}, 422, "invalid_field",
     "reclaim.offers.h100.max_age"),
    ("PUT", "reclaim/policies", {"default": {"idle_timeout": "2h"}, "extra": {}}, 422,
     "unknown_field", "extra"),
]
# fmt: on


def test_bad_input_gets_a_json_error_naming_the_field(api):
    lease = lease_of_alice(api)
    api.ok("reclaimer", "POST", "reclaim/leader", {"holder": "r1", "ttl": 600})
    wrong = []
    for method, path, body, status, code, field in BAD:
        who = "admin" if "policies" in path else "reclaimer"
        r = api.call(who, method, path.replace("{id}", lease.id), body)
        got = (r.status, *(lambda e: (e["code"], e.get("field")))(error(r)))
        if got != (status, code, field):
            wrong.append(f"{method} {path} {body}: {got} != {(status, code, field)}")
    assert not wrong, "\n".join(wrong)
    assert api.ok("admin", "GET", "reclaim/policies")["source"] == "file"


def test_policies_over_http(api):
    got = api.ok("admin", "GET", "reclaim/policies")
    assert got["source"] == "file" and got["reclaim"] == POLICY
    assert got["effective"]["default"]["idle_timeout"] == 600.0
    put = api.ok("admin", "PUT", "reclaim/policies", {"offers": {"h100": {"idle_timeout": "3h"}}})
    assert put["source"] == "api" and put["effective"]["offers"]["h100"]["idle_timeout"] == 10800
    assert put["effective"]["offers"]["a100-1g"]["idle_timeout"] == 1800  # the defaults
    assert api.ok("admin", "DELETE", "reclaim/policies")["source"] == "file"


# -- shares: each judged by its own processes -----------------------------------------------------

SHARED_POOL = {
    **POOL,
    "nodes": [
        *STORE_POOL["nodes"],
        {"name": "l4", "cpu_milli": 32000, "memory_mib": 131072, "gpus": [
            {"model": "L4", "sharing": "shared"}]},
    ],
    "offers": [*STORE_POOL["offers"], {"name": "quarter", "kind": "shared", "fraction": 0.25}],
}  # fmt: skip


@pytest.fixture
def shared_api(db_url: str, clock: StoreClock) -> Iterator[Service]:
    upgrade(db_url)
    with Service(make_store(db_url, clock, pool=SHARED_POOL)) as service:
        yield service


def test_a_share_is_judged_by_its_own_processes_over_http(shared_api, clock):
    """The agent reports the GPU busy and, per lease, who makes it busy: alice's share is idle
    next to bob's busy one, and counts towards its idle timeout; bob's does not."""
    api = shared_api
    leases = {
        u: api.store.keepalive(api.store.allocate(u, "", "quarter").id) for u in ("alice", "bob")
    }
    alice, bob = leases["alice"], leases["bob"]
    gpu = alice.slots[0].gpu
    assert bob.slots[0].gpu == gpu  # neighbours on one L4
    api.ok("reclaimer", "POST", "reclaim/leader", {"holder": "r1", "ttl": 600})
    clock.advance(minutes=1)
    now = epoch(clock())
    per_lease = {bob.id: 70.0, alice.id: 0.0}
    batch = [
        {"gpu": gpu, "ts": t, "util": 70.0, "memory_used_mib": 4000, "lease_util": per_lease}
        for t in (now - 59, now)
    ]
    api.ok("agent", "POST", "nodes/l4/samples", {"samples": batch})
    seen = {
        "kernel": {"state": "idle", "last_activity": None, "observed_at": now},
        "presence": {"last_input": None, "connections": 0, "observed_at": now},
    }
    body = {
        "holder": "r1",
        "window": {"start": now - 60, "end": now},
        "observed": {alice.id: seen, bob.id: seen},
    }
    got = {d["lease"]: d for d in api.ok("reclaimer", "POST", "reclaim/rounds", body)["decisions"]}
    assert got[alice.id]["evidence"]["gpu"] == "idle"
    assert got[bob.id]["evidence"]["gpu"] == "busy"

    bad = [{"gpu": gpu, "ts": now, "util": 5.0, "lease_util": {alice.id: 150}}]
    r = api.call("agent", "POST", "nodes/l4/samples", {"samples": bad})
    assert r.status == 422 and error(r)["field"] == f"samples[0].lease_util.{alice.id}"
    r = api.call("agent", "POST", "nodes/l4/samples", {"samples": [{**bad[0], "lease_util": 3}]})
    assert r.status == 422 and error(r)["field"] == "samples[0].lease_util"
