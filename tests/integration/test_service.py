"""The running service behind a real JupyterHub: metrics, usage CSV, agents' inventory and
samples feeding utilization and busy time, and reconciliation with the hub on restart."""

from __future__ import annotations

import csv
import io
import signal
import time

from tests.fakes import reconciles, request, wait_reconciled, wait_until

#: seconds an unbound grant lives in the housekeeping test (the service runs on real time)
GRANT_TIMEOUT = 3.0


def _metric(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}}") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_usage_samples_and_reconcile(hub_env):
    api, admin = hub_env.api, hub_env.token("admin")
    spawner = hub_env.spawner_token
    alice = hub_env.server_token("alice")

    # --- a grant and a queued request show up in /metrics --------------------------------
    lease = request("POST", f"{api}/allocations", spawner, {"user": "alice", "offer": "h100"})
    assert lease.status == 201, lease.body
    lease = lease.json()
    other = request("POST", f"{api}/allocations", spawner, {"user": "bob", "offer": "h100"}).json()
    third = request("POST", f"{api}/allocations", spawner, {"user": "admin", "offer": "h100"})
    assert third.json()["state"] == "queued"
    metrics = request("GET", api.replace("/api/v1", "/metrics"), admin).body.decode()
    assert _metric(metrics, "gpupool_grants_total", offer="h100") == 2.0
    assert _metric(metrics, "gpupool_capacity_units", model="H100-80GB") == 2.0
    assert _metric(metrics, "gpupool_free_units", model="H100-80GB") == 0.0
    assert _metric(metrics, "gpupool_queue_length", offer="h100") == 1.0
    assert _metric(metrics, "gpupool_offer_available", offer="a100-1g") == 14.0
    assert "gpupool_request_duration_seconds_bucket" in metrics
    # the three requests' decisions went through the writer (in one batch or more)
    assert _metric(metrics, "gpupool_write_batch_calls_sum") >= 3.0
    assert _metric(metrics, "gpupool_write_batch_calls_count") >= 1.0  # the loops' writes too
    assert _metric(metrics, "gpupool_write_batch_seconds_count") >= 1.0

    # --- the agent reports samples: utilization and busy time -----------------------------
    gpu = lease["slots"][0]["gpu"]
    now = time.time()
    batch = [
        {"gpu": gpu, "ts": now - 20 + 5 * i, "util": 80.0, "memory_used_mib": 1024}
        for i in range(4)
    ]
    r = request("POST", f"{api}/nodes/sim-h100/samples", hub_env.agent_token, {"samples": batch})
    assert r.status == 200 and r.json() == {"accepted": 4, "busy_leases": 1, "mig_plan": []}, r.body
    again = request(
        "POST", f"{api}/nodes/sim-h100/samples", hub_env.agent_token, {"samples": batch}
    )
    assert again.json()["accepted"] == 4  # accepted, but duplicates add no busy time
    series = request("GET", f"{api}/utilization?lease={lease['id']}", alice)
    assert series.status == 200, series.body
    assert [s["util"] for s in series.json()["samples"]] == [80.0] * 4
    bad = request(
        "POST",
        f"{api}/nodes/sim-h100/samples",
        hub_env.agent_token,
        {"samples": [{"gpu": gpu, "ts": now, "util": 180}]},
    )
    assert bad.status == 422 and bad.json()["error"]["field"] == "samples[0].util"
    wrong_node = request(
        "POST", f"{api}/nodes/sim-a100/samples", hub_env.agent_token, {"samples": batch}
    )
    assert wrong_node.status == 422

    # --- usage as CSV: busy time is 15 s of the held time ---------------------------------
    request("DELETE", f"{api}/allocations/{other['id']}", spawner)
    usage = request(
        "GET",
        f"{api}/usage?by=user&format=csv&from=2020-01-01T00:00:00Z&to=2100-01-01T00:00:00Z",
        admin,
    )
    assert usage.status == 200 and usage.headers["Content-Type"].startswith("text/csv")
    rows = {r["user"]: r for r in csv.DictReader(io.StringIO(usage.body.decode()))}
    assert set(rows) == {"alice", "bob", "admin"}
    # 15 s of samples, but busy time never exceeds the time held (the idle hours are >= 0)
    alice = rows["alice"]
    busy, held = float(alice["busy_unit_hours"]), float(alice["held_unit_hours"])
    assert 0 < busy == min(round(15 / 3600, 6), held)
    assert float(alice["idle_unit_hours"]) == round(held - busy, 6) >= 0
    assert float(rows["bob"]["busy_unit_hours"]) == 0.0
    bad_usage = request("GET", f"{api}/usage?by=colour", admin)
    assert bad_usage.status == 400 and bad_usage.json()["error"]["allowed"] == [
        "user",
        "group",
        "offer",
        "job",
        "kernel",
    ]

    # --- an agent reports a new node --------------------------------------------------------
    inv = {
        "cpu_milli": 32000,
        "memory_mib": 65536,
        "gpus": [
            {"uuid": "GPU-new-0", "model": "NVIDIA L4", "memory_mib": 23034},
            {"uuid": "GPU-new-1", "model": "NVIDIA RTX 9999 Imaginary", "memory_mib": 49152},
        ],
    }
    r = request("PUT", f"{api}/nodes/new-node/inventory", hub_env.agent_token, inv)
    assert r.status == 200 and r.json()["gpus"] == 2, r.body
    pool = request("GET", f"{api}/pool", admin).json()
    names = {n["name"] for c in pool["clusters"] for n in c["nodes"]}
    assert "new-node" in names
    assert {"L4", "RTX-9999-Imaginary"} <= {m["model"] for m in pool["models"]}
    illegal = {
        "gpus": [
            {
                "uuid": "GPU-m",
                "model": "A100-80GB",
                "mig": {"enabled": True, "instances": [{"profile": "3g.40gb", "start": 2}]},
            }
        ]
    }
    r = request("PUT", f"{api}/nodes/bad-node/inventory", hub_env.agent_token, illegal)
    assert r.status == 422 and r.json()["error"]["code"] == "invalid_mig_layout", r.body
    assert r.json()["error"]["allowed"] == [0, 4]

    # --- restart: alice has no running server, so reconcile releases her lease -------------
    hub_env.kill_service()
    hub_env.start_service()

    def released() -> dict | None:
        state = request("GET", f"{api}/allocations/{lease['id']}", admin).json()
        return state if state["state"] == "released" else None

    state = wait_until(released, what="the reconcile on start to release alice's lease", step=0.2)
    assert state["release_reason"] == "stopped"
    events = request("GET", f"{api}/events?limit=1000", admin).json()["items"]
    reconciled = [e for e in events if e["kind"] == "reconciled"]
    assert reconciled and reconciled[-1]["data"]["released"] == 2  # alice's and the waiter's


def test_housekeeping_expires_unbound_grants_and_serves_the_queue(hub_env):
    """The leading service's housekeeping runs through the writer (in the store process with
    decisions = process): a grant nobody binds expires, and the waiter behind it gets its GPU."""
    api, spawner = hub_env.api, hub_env.spawner_token
    before = reconciles(hub_env, hub_env.token("admin"))
    hub_env.kill_service(signal.SIGTERM)
    # the service's clock is the real one: the grant timeout is a few seconds, and nothing the
    # test does between a grant and what must come before its expiry takes more than one call
    hub_env.start_service(
        f"--PoolService.grant_timeout={GRANT_TIMEOUT}", "--PoolService.housekeeping_interval=0.2"
    )
    wait_reconciled(hub_env, before)  # its reconcile at start would release these leases

    def allocate(user: str) -> dict:
        return request(
            "POST", f"{api}/allocations", spawner, {"user": user, "offer": "h100"}
        ).json()

    # bob binds his grant at once (a server that started), so only alice's can expire
    first = allocate("bob")
    bound = request("POST", f"{api}/allocations/{first['id']}/keepalive", spawner, {})
    assert bound.status == 200 and bound.json()["state"] == "active"
    leases = {"bob": first} | {u: allocate(u) for u in ("alice", "carol")}
    assert [leases[u]["state"] for u in ("alice", "bob", "carol")] == [
        "granted",
        "granted",
        "queued",
    ]
    alice, bob, carol = (leases[u]["id"] for u in ("alice", "bob", "carol"))
    wait_until(
        lambda: request("GET", f"{api}/allocations/{carol}", spawner).json()["state"] == "granted",
        what="alice's grant to expire and carol to get the GPU",
        step=0.2,
    )
    expired = request("GET", f"{api}/allocations/{alice}", spawner).json()
    assert (expired["state"], expired["release_reason"]) == ("released", "expired")
    assert request("GET", f"{api}/allocations/{carol}", spawner).json()["state"] == "granted"
    assert request("GET", f"{api}/allocations/{bob}", spawner).json()["state"] == "active"
    # the service's own views (GET pool: the allocator's holders) follow the writer's
    # decisions, within Store.view_lag (1 s) when they were made in the store process
    admin = hub_env.token("admin")
    pool = wait_until(
        lambda: carol in (text := request("GET", f"{api}/pool", admin).body.decode()) and text,
        what="GET pool to show carol's grant",
        step=0.2,
    )
    assert carol in pool and bob in pool and alice not in pool
