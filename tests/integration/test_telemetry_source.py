"""The service reading the demo pool's simulated GPUs itself (``telemetry_source = sim``)."""

from __future__ import annotations

from tests.fakes import request, wait_until


def test_sim_source_fills_inventory_samples_and_minutes(sim_env):
    admin = sim_env.token("admin")

    def reported() -> set:
        events = request("GET", f"{sim_env.api}/events?limit=1000", admin).json()["items"]
        return {
            e["data"]["node"]
            for e in events
            if e["kind"] == "inventory" and e["actor"] == "telemetry"
        }

    # every node of the pool config is read in-process and its inventory put into the pool
    reporting = wait_until(
        lambda: len(reported()) == 3 and reported(),
        what="three nodes' inventories",
        step=0.2,
        info=sim_env.logs,
    )
    assert reporting == {"sim-a100", "sim-h100", "sim-t4"}, sim_env.logs()
    pool = request("GET", f"{sim_env.api}/pool", admin).json()
    nodes = {n["name"]: n for c in pool["clusters"] for n in c["nodes"]}
    assert nodes["sim-t4"]["cpu_milli"] == 32000  # completed from the pool config

    alice = sim_env.token("alice")
    r = request("POST", f"{sim_env.api}/allocations", alice, {"server": "", "offer": "h100"})
    assert r.status == 201, r.body
    lease = r.json()
    assert lease["state"] == "granted"
    gpu = lease["slots"][0]["gpu"]
    url = f"{sim_env.api}/utilization?lease={lease['id']}"

    def samples() -> list:
        return request("GET", f"{url}&resolution=sample", alice).json()["samples"]

    got = wait_until(
        lambda: len(samples()) >= 3 and samples(),
        what="three samples of the lease",
        step=0.2,
        info=sim_env.logs,
    )
    assert {x["gpu"] for x in got} == {gpu}, sim_env.logs()
    assert "minutes" not in request("GET", url, alice).json()

    def minutes() -> list:
        return request("GET", f"{url}&resolution=minute", alice).json()["minutes"]

    rows = wait_until(minutes, what="the lease's utilization minutes", step=0.2, info=sim_env.logs)
    assert {(m["gpu"], m["start"]) for m in rows} == {(gpu, None)}
    assert all(m["samples"] >= 1 and m["ts"] % 60 == 0 for m in rows)

    everything = request("GET", f"{sim_env.api}/utilization?since=0", admin).json()
    assert {m["gpu"] for m in everything["minutes"]} > {gpu}  # all devices, for admins
    bad = request("GET", f"{url}&resolution=hourly", alice)
    assert bad.status == 400 and bad.json()["error"]["field"] == "resolution"
