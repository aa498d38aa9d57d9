"""Replicas decide alike: two pool service replicas (the real tornado app and writer of each,
over HTTP) on one PostgreSQL database, the agents' samples posted to one and the other in turn,
give the same reclaim decisions whichever replica runs the round, and the same as one replica
fed every sample (on PostgreSQL and on SQLite, the single-process default).

The samples are chosen so that a replica deciding on only the samples posted to it would decide
otherwise: a GPU busy only in the samples the other replica took, a share whose own processes
are busy only there, a MIG instance (no utilization) whose memory moves only between the two
replicas' samples. No flush runs between the posts and the round: a sample counts in every
replica's round once its POST has been answered. Time is the stores' clock, moved by the test;
nothing sleeps.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.service.scopes import AGENT, RECLAIM
from jupyterhub_gpupool.store import Store
from jupyterhub_gpupool.store.read.leases import LeaseView
from jupyterhub_gpupool.store.rows import epoch
from tests.conftest import PG_ADMIN_URL
from tests.fakes import InProcessService, StoreClock, make_instances, make_store

POOL: dict[str, Any] = {
    "nodes": [
        {"name": "h100", "cpu_milli": 64000, "memory_mib": 262144,
         "gpus": [{"model": "H100-80GB", "count": 3}]},
        {"name": "l4", "cpu_milli": 32000, "memory_mib": 131072,
         "gpus": [{"model": "L4", "sharing": "shared"}]},
        {"name": "a100", "cpu_milli": 64000, "memory_mib": 262144,
         "gpus": [{"model": "A100-80GB", "mig": {"enabled": True, "dynamic": True}}]},
    ],
    "offers": [
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "quarter", "kind": "shared", "fraction": 0.25},
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
    ],
    "quotas": {"default": {"guarantee": 1, "limit": 4}},
    # an idle lease gets notice after 8 one-minute windows, the action 2 minutes later
    "reclaim": {"default": {"idle_timeout": "10m", "pressure_idle_timeout": "5m",
                            "warn_before": "2m", "busy_grace": 0,
                            "min_runtime": 0, "max_extensions": 1, "extension": "10m"}},
}  # fmt: skip

MODELS = {
    "agent": {"kind": "service", "name": "agent", "scopes": [AGENT]},
    "reclaimer": {"kind": "service", "name": "reclaimer", "scopes": [RECLAIM]},
}
#: Lease label → (user, offer).
LEASES = {
    "idle": ("u1", "h100"),
    "busy-on-odd": ("u2", "h100"),
    "busy-on-even": ("u3", "h100"),
    "share-idle": ("u4", "quarter"),
    "share-busy-on-odd": ("u5", "quarter"),
    "mig-moving": ("u6", "a100-1g"),
}
ROUNDS = 10
#: Seconds before the window's end of each sample; the k-th goes to replica k % 2.
OFFSETS = (50, 40, 30, 20, 10, 0)


def ok(service: InProcessService, who: str, method: str, path: str, body: object) -> Any:
    r = service.call(who, method, path, body)
    assert r.status == 200, f"{method} {path}: {r.status} {r.body[:300]!r}"
    return r.json()


def batches(leases: dict[str, LeaseView], k: int, ts: float) -> dict[str, list[dict[str, Any]]]:
    """The k-th sample of the window (at ``ts``) of every lease's device, by node: what its
    agent posts. The odd ones carry the work the even ones do not show, and the reverse."""
    odd = k % 2 == 1
    by_node: dict[str, list[dict[str, Any]]] = {"h100": [], "l4": [], "a100": []}
    for label in ("idle", "busy-on-odd", "busy-on-even"):
        busy = (label == "busy-on-odd" and odd) or (label == "busy-on-even" and not odd)
        gpu = leases[label].slots[0].gpu
        by_node["h100"].append({"gpu": gpu, "ts": ts, "util": 80.0 if busy else 0.0})
    share_busy, share_idle = leases["share-busy-on-odd"], leases["share-idle"]
    own = {share_busy.id: 70.0} if odd else {}  # per-process: only the busy share's own
    by_node["l4"].append(
        {
            "gpu": share_busy.slots[0].gpu,
            "ts": ts,
            "util": 70.0 if odd else 0.0,
            "memory_used_mib": 4000,
            "lease_util": own,
        }
    )
    assert share_idle.slots[0].gpu == share_busy.slots[0].gpu
    mig = leases["mig-moving"].slots[0]
    # MIG without utilization (A100: no GPM): a process holds memory; it moves by 400 MiB
    # between the two replicas' samples, never within one replica's
    by_node["a100"].append(
        {
            "gpu": mig.gpu,
            "start": mig.start,
            "ts": ts,
            "util": None,
            "memory_used_mib": 2400 if odd else 2000,
            "processes": 1,
        }
    )
    return by_node


def run(
    url: str,
    replicas: int,
    decider: Callable[[int], int],
    busy: dict[str, float] | None = None,
) -> list[dict[str, tuple]]:
    """``ROUNDS`` one-minute rounds on a fresh database at ``url``: each window's samples posted
    to the replicas in turn (all to the one with ``replicas=1``), the round posted to replica
    ``decider(round)``. Returns each round's decisions by lease label; fills ``busy`` with
    each lease's recorded busy seconds."""
    upgrade(url)
    clock = StoreClock()
    stores: list[Store] = [make_store(url, clock, pool=POOL) for _ in range(replicas)]
    services = [InProcessService(s, MODELS) for s in stores]
    for service in services:
        service.__enter__()
    try:
        store = stores[0]
        leases: dict[str, LeaseView] = {}
        for label, (user, offer) in LEASES.items():
            lease = store.allocate(user, "", offer)
            if offer.startswith("a100"):
                make_instances(store)
            leases[label] = store.keepalive(lease.id)
        label_of = {lease.id: label for label, lease in leases.items()}
        out: list[dict[str, tuple]] = []
        for n in range(ROUNDS):
            clock.advance(minutes=1)
            now = epoch(clock())
            for k, offset in enumerate(OFFSETS):
                to = services[k % len(services)]
                for node, batch in batches(leases, k, now - offset).items():
                    ok(to, "agent", "POST", f"nodes/{node}/samples", {"samples": batch})
            decides = services[decider(n)]
            ok(decides, "reclaimer", "POST", "reclaim/leader", {"holder": "r1", "ttl": 600})
            seen = {
                "kernel": {"state": "idle", "last_activity": None, "observed_at": now},
                "presence": {"last_input": None, "connections": 0, "observed_at": now},
            }
            body = {
                "holder": "r1",
                "window": {"start": now - 60, "end": now},
                "observed": {lease.id: seen for lease in leases.values()},
            }
            answer = ok(decides, "reclaimer", "POST", "reclaim/rounds", body)
            out.append(
                {
                    label_of[d["lease"]]: (
                        d["kind"],
                        d["reason"],
                        d.get("evidence"),
                        d.get("deadline"),
                        d.get("action"),
                    )
                    for d in answer["decisions"]
                }
            )
        if busy is not None:
            start = clock() - timedelta(hours=1)
            recorded = store.busy_time([le.id for le in leases.values()], start, clock())
            for label, lease in leases.items():
                busy[label] = sum(b for b, _ in recorded.get(lease.id, {}).values())
        return out
    finally:
        for service in services:
            service.__exit__(None, None, None)
        for s in stores:
            s.engine.dispose()


@pytest.fixture
def new_pg_url() -> Iterator[Callable[[], str]]:
    """Makes new, empty PostgreSQL databases (as ``pg_url`` does), dropped afterwards."""
    import psycopg

    made: list[str] = []

    def make() -> str:
        name = f"gpupool_{uuid.uuid4().hex[:10]}"
        try:
            conn = psycopg.connect(PG_ADMIN_URL, autocommit=True)
        except psycopg.OperationalError as e:
            pytest.fail(f"PostgreSQL is needed at {PG_ADMIN_URL} (set GPUPOOL_TEST_PG): {e}")
        with conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"

    yield make
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        for name in made:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_two_replicas_decide_alike_and_as_one_fed_every_sample(new_pg_url, sqlite_url):
    one = run(new_pg_url(), 1, lambda n: 0)
    # what the rules make of these samples: the idle GPU and the idle share get notice after
    # 8 windows and the action 2 minutes later; the others are busy by samples only one of
    # the two replicas took
    kinds = {label: [r[label][0] for r in one] for label in LEASES}
    assert kinds["idle"] == ["none"] * 7 + ["notice", "noticed", "act"], kinds
    assert kinds["share-idle"] == kinds["idle"]
    for label in ("busy-on-odd", "busy-on-even", "share-busy-on-odd", "mig-moving"):
        assert kinds[label] == ["none"] * ROUNDS, (label, kinds[label])
        assert all(r[label][2]["gpu"] == "busy" for r in one), (label, one[0][label])
    assert one[0]["share-idle"][2]["gpu"] == "idle"

    assert run(sqlite_url, 1, lambda n: 0) == one, "SQLite decides as PostgreSQL"
    assert run(new_pg_url(), 2, lambda n: 0) == one, "replica A decides as one replica"
    assert run(new_pg_url(), 2, lambda n: 1) == one, "replica B decides as one replica"
    assert run(new_pg_url(), 2, lambda n: n % 2) == one, "A and B in turn decide as one"


def test_busy_time_is_counted_once_across_replicas(new_pg_url):
    """What a bill's busy hours rest on: with the samples split between two replicas, each
    busy sample adds the time since the device's previous sample, whichever replica took that
    one; a sample posted to both counts once. The reference follows the definition in
    docs/source/howto/chargeback.md (a busy sample adds the interval since the device's
    previous sample, at most a minute), counted here from the test's own schedule."""
    busy_one: dict[str, float] = {}
    busy_two: dict[str, float] = {}
    run(new_pg_url(), 1, lambda n: 0, busy_one)
    run(new_pg_url(), 2, lambda n: n % 2, busy_two)
    # the schedule: samples every 10 s (OFFSETS), the odd ones busy for busy-on-odd, the even
    # ones for busy-on-even; the very first sample of a device has no previous one
    per_window_odd = sum(10 for k in range(len(OFFSETS)) if k % 2 == 1)
    per_window_even = sum(10 for k in range(len(OFFSETS)) if k % 2 == 0)
    expected = {
        "busy-on-odd": ROUNDS * per_window_odd,
        "busy-on-even": ROUNDS * per_window_even - 10,
        "idle": 0,
    }
    for label, seconds in expected.items():
        assert busy_one[label] == pytest.approx(seconds), (label, busy_one)
        assert busy_two[label] == pytest.approx(seconds), (label, busy_two)
    assert busy_two == pytest.approx(busy_one)


def test_a_sample_posted_to_both_replicas_counts_once(new_pg_url):
    url = new_pg_url()
    upgrade(url)
    clock = StoreClock()
    stores = [make_store(url, clock, pool=POOL) for _ in range(2)]
    services = [InProcessService(s, MODELS) for s in stores]
    for service in services:
        service.__enter__()
    try:
        lease = stores[0].keepalive(stores[0].allocate("u1", "", "h100").id)
        gpu = lease.slots[0].gpu
        clock.advance(minutes=1)
        now = epoch(clock())
        for ts in (now - 20, now - 10, now):
            sample = {"gpu": gpu, "ts": ts, "util": 90.0}
            for service in services:  # an agent's retry that reached the other replica too
                ok(service, "agent", "POST", "nodes/h100/samples", {"samples": [sample]})
        recorded = stores[1].busy_time([lease.id], clock() - timedelta(hours=1), clock())
        assert sum(b for b, _ in recorded[lease.id].values()) == pytest.approx(20.0)
    finally:
        for service in services:
            service.__exit__(None, None, None)
        for s in stores:
            s.engine.dispose()
