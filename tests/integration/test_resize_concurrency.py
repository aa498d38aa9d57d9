"""Concurrent resizes cannot multiply leases (issue 30): through the real service (a real hub,
real tokens, the pool service as a process on SQLite or PostgreSQL), two users send 30 resizes at
once, of their leases and of the targets those resizes make. Afterwards every lease has at most
one live target, no target has a target of its own, nobody holds more than the per-user cap,
and releasing the leases releases their targets: nothing stays live.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.fakes import HubEnv, request, write_pool

POOL = """
nodes:
  - name: big
    cpu_milli: 1000000
    memory_mib: 100000000
    gpus:
      - {model: H100-80GB, count: 2}
      - {model: A100-80GB, count: 2, mig: {enabled: true, dynamic: true}}
      - {model: T4, count: 1, sharing: shared}
offers:
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB]}
  - {name: a100-1g, kind: mig, profile: 1g.10gb, models: [A100-80GB]}
  - {name: a100-3g, kind: mig, profile: 3g.40gb, models: [A100-80GB]}
  - {name: t4-quarter, kind: shared, fraction: 0.25, models: [T4]}
  - {name: t4-half, kind: shared, fraction: 0.5, models: [T4]}
quotas:
  default: {guarantee: 1, limit: 8}
"""
CAP = 5
USERS = ("alice", "bob")
RESIZES = 30
LIVE = ("awaiting_approval", "queued", "granted", "active", "reclaiming")


@pytest.fixture
def hub(tmp_path: Path, db_url: str):
    env = HubEnv(
        tmp_path,
        db_url,
        write_pool(tmp_path, POOL),
        users=(*USERS, "admin"),
        service_args=(
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
            "--PoolService.check_user_servers=False",
            f"--PoolService.max_requests_per_user={CAP}",
        ),
    )
    with env.running():
        yield env


def test_thirty_parallel_resizes_leave_at_most_one_target_per_lease(hub: HubEnv) -> None:
    tokens = {user: hub.token(user) for user in USERS}
    admin = hub.token("admin")
    originals: dict[str, list[str]] = {}
    for user in USERS:
        for server in ("one", "two"):
            r = request(
                "POST",
                f"{hub.api}/allocations",
                hub.spawner_token,
                {"user": user, "server": server, "offer": "t4-quarter"},
            )
            assert r.status == 201, r.body
            lease = r.json()
            assert (
                request(
                    "POST", f"{hub.api}/allocations/{lease['id']}/keepalive", tokens[user]
                ).status
                == 200
            )
            originals.setdefault(user, []).append(lease["id"])

    offers = itertools.cycle(("a100-3g", "h100", "a100-1g", "t4-half"))

    def resize(job: tuple[str, str, str]) -> tuple[str, str, int, dict]:
        user, lease_id, offer = job
        r = request(
            "POST", f"{hub.api}/allocations/{lease_id}/resize", tokens[user], {"offer": offer}
        )
        return user, lease_id, r.status, r.json()

    # the first wave: 30 at once, 15 per user over their two leases
    jobs = [
        (user, originals[user][i % 2], next(offers)) for i in range(RESIZES // 2) for user in USERS
    ]
    with ThreadPoolExecutor(RESIZES) as pool:
        first = list(pool.map(resize, jobs))
    made = [body for _, _, status, body in first if status == 201]
    refused = [(status, body["error"]["code"]) for _, _, status, body in first if status != 201]
    assert len(made) <= 4, made  # one per lease at most
    assert {code for _, code in refused} <= {"resize_pending", "too_many_requests"}, refused
    assert all(status == (409 if code == "resize_pending" else 429) for status, code in refused)

    # the second wave: 30 at once again, the targets included (a chain would start here)
    targets = {body["id"]: body["user"] for body in made}
    jobs = [
        (user, lease_id, next(offers))
        for lease_id, user in itertools.islice(
            itertools.cycle([*targets.items(), *((lid, u) for u in USERS for lid in originals[u])]),
            RESIZES,
        )
    ]
    with ThreadPoolExecutor(RESIZES) as pool:
        second = list(pool.map(resize, jobs))
    for _, lease_id, status, body in second:
        if lease_id in targets:
            assert (status, body["error"]["code"]) == (409, "resize_target"), body
        else:
            assert status in (201, 409, 422, 429), body

    leases = request("GET", f"{hub.api}/allocations?limit=1000", admin).json()["items"]
    live = [le for le in leases if le["state"] in LIVE]
    by_id = {le["id"]: le for le in leases}
    for user in USERS:
        assert len([le for le in live if le["user"] == user]) <= CAP, user
    for lease_id in {le["id"] for le in leases}:
        pending = [le for le in live if le["resize_of"] == lease_id]
        assert len(pending) <= 1, (lease_id, pending)
    for le in live:
        if le["resize_of"]:  # no chains: a live target's lease is not itself a live target
            assert (
                not by_id[le["resize_of"]]["resize_of"]
                or by_id[by_id[le["resize_of"]]["resize_of"]]["state"] == "released"
            ), le

    # releasing the leases releases their targets: nothing stays live
    for user in USERS:
        for lease_id in originals[user]:
            r = request("DELETE", f"{hub.api}/allocations/{lease_id}", tokens[user])
            assert r.status == 200, r.body
    leases = request("GET", f"{hub.api}/allocations?limit=1000", admin).json()["items"]
    assert [le for le in leases if le["state"] in LIVE] == []
