"""A drain by a deadline with no reclaimer running: the pool service carries it out itself.

A real hub, a real single-user server on a simulated H100 (the pool's local spawner), and the
pool service on the test's clock (:class:`~tests.fakes.ClockFile`). The admin drains the node
by a deadline; the test moves the pool's clock past the deadline and past
``notice_enforce_after``; the service's housekeeping then stops the server through the hub and
the lease ends with reason ``admin``, audited as the service's doing. Nothing waits for time to
pass: the clock jumps, and the test waits (with a generous bound) for what the service does.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from tests.fakes import (
    SPAWNER_CONFIG,
    ClockFile,
    HubEnv,
    SimAgent,
    clocked_service_python,
    request,
    wait_reconciled,
    wait_until,
    write_pool,
)

pytestmark = pytest.mark.e2e

POOL = """
nodes:
  - name: node-h100
    gpus: [{model: H100-80GB, count: 2}]
offers:
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB]}
quotas:
  default: {guarantee: 2, limit: 2}
"""
#: seconds past the deadline the service waits for a reclaimer before acting itself
ENFORCE_AFTER = 300


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_drain_deadline_passes_with_no_reclaimer_and_the_service_stops_the_server(
    tmp_path,
) -> None:
    clock = ClockFile(tmp_path / "clock", time.time() + 180)
    env = HubEnv(
        tmp_path,
        f"sqlite:///{tmp_path}/pool.sqlite",
        write_pool(tmp_path, POOL),
        ("alice", "admin"),
        service_args=(
            "--PoolService.decisions=thread",
            "--PoolService.agent_timeout=0",  # the clock jumps: the node stays reachable
            "--PoolService.reconcile_interval=0",
            "--PoolService.housekeeping_interval=0.2",
            f"--PoolService.notice_enforce_after={ENFORCE_AFTER}",
        ),
        extra_config=SPAWNER_CONFIG,  # no reclaimer among the hub's services
        python=clocked_service_python(clock),
    )
    (tmp_path / "home").mkdir()
    with env.running():
        wait_reconciled(env)
        SimAgent(env, env.pool_config, ["node-h100"], clock).report_inventory()  # type: ignore[arg-type]
        admin = env.token("admin")
        server_api = f"{env.hub_api}/users/alice/servers/"
        r = request("POST", server_api, env.admin_api_token, {"gpupool_offer": "h100"})
        assert r.status in (201, 202), r.body

        def server() -> dict:
            users = request("GET", f"{env.hub_api}/users/alice", env.admin_api_token).json()
            return users["servers"].get("", {})  # type: ignore[index,union-attr]

        wait_until(lambda: server().get("ready"), 120, "alice's server", step=0.2, info=env.logs)
        items = request("GET", f"{env.api}/allocations?user=alice", admin).json()["items"]  # type: ignore[index]
        (lease,) = [le for le in items if le["state"] == "active"]

        deadline = clock.now + 600
        r = request("POST", f"{env.api}/nodes/node-h100/drain", admin, {"deadline": _iso(deadline)})
        assert r.status == 200 and r.json()["noticed"] == 1, r.body  # type: ignore[index]

        def get() -> dict:
            return request("GET", f"{env.api}/allocations/{lease['id']}", admin).json()  # type: ignore[return-value]

        assert get()["state"] == "reclaiming" and get()["reclaim"]["kind"] == "drain"
        clock.advance(600 + ENFORCE_AFTER + 1)  # past the deadline, and past the reclaimer's turn
        wait_until(
            lambda: get()["state"] == "released", 120, "the lease to end", step=0.2, info=env.logs
        )
        assert get()["release_reason"] == "admin"
        wait_until(lambda: not server(), 120, "alice's server to stop", step=0.2, info=env.logs)
        url = f"{env.api}/events?lease={lease['id']}&limit=100"

        def kinds() -> dict[str, dict]:
            events = request("GET", url, admin).json()["items"]  # type: ignore[index]
            return {e["kind"]: e for e in events}

        # the service records the outcome once it has seen the server stop, which can come
        # after the spawner's stop released the lease and after the hub dropped the server
        wait_until(lambda: "reclaimed" in kinds(), 120, "the reclaimed event", info=env.logs)
        by_kind = kinds()
        acting = by_kind["reclaim-acting"]
        assert acting["actor"] == "service:gpupool" and acting["data"]["kind"] == "drain"
        assert "no reclaimer carried out the drain notice" in acting["data"]["enforced"]
        assert by_kind["released"]["data"]["reason"] == "admin"
        assert by_kind["reclaimed"]["actor"] == "service:gpupool"
        assert by_kind["reclaimed"]["data"]["outcome"] == "done"
        # nothing new lands on the drained node
        r = request("POST", f"{env.api}/allocations", env.spawner_token, {
            "user": "alice", "server": "again", "offer": "h100"})  # fmt: skip
        assert r.status == 201 and r.json()["state"] == "queued", r.body  # type: ignore[index]
