"""Dynamic MIG end to end on the simulated NVML: the pool plans, the node makes and unmakes.

Three ways the plan reaches NVML: the service's own telemetry loop (``telemetry_source =
sim``) behind a real hub; an external ``jupyterhub-gpupool agent`` process; and the in-process
loop driven here directly, so the simulated machine can be reached (processes, instances made
behind the pool's back, NVML refusals).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.store import Store
from tests.fakes import HubEnv, Rig, request, wait_until

NODE = "sim-a100"


def pool_instances(env: HubEnv, token: str, gpu: str) -> list[tuple]:
    pool = request("GET", f"{env.api}/pool", token).json()
    for cluster in pool["clusters"]:
        for node in cluster["nodes"]:
            for g in node["gpus"]:
                if g["uuid"] == gpu:
                    return [
                        (i["profile"], i["start"], i["uuid"], i["state"]) for i in g["instances"]
                    ]
    raise AssertionError(f"no GPU {gpu}")


def event_kinds(env: HubEnv, token: str) -> list[tuple[str, Any]]:
    items = request("GET", f"{env.api}/events?limit=1000", token).json()["items"]
    return [(e["kind"], e["data"].get("error")) for e in items if e["kind"].startswith("mig-")]


# -- the service's own loop, behind a real hub --------------------------------------------------


def test_in_process_sim_makes_the_instances_of_grants_and_destroys_them_after(sim_env):
    admin, alice = sim_env.token("admin"), sim_env.token("alice")

    def reported() -> bool:
        events = request("GET", f"{sim_env.api}/events?limit=1000", admin).json()["items"]
        return any(e["kind"] == "inventory" and e["data"]["node"] == NODE for e in events)

    wait_until(reported, what="the A100 node's inventory", step=0.1, info=sim_env.logs)
    leases = []
    for server, offer in (("one", "a100-1g"), ("three", "a100-3g")):
        # the spawner asks for alice's servers (a user may name only servers the hub knows)
        body = {"user": "alice", "server": server, "offer": offer}
        r = request("POST", f"{sim_env.api}/allocations", sim_env.spawner_token, body)
        assert r.status == 201, r.body
        lease = r.json()
        assert lease["state"] == "granted" and lease["ready"] is False
        assert lease["slots"][0]["mig_uuid"] is None
        leases.append(lease)

    def lease(lid: str) -> dict:
        return request("GET", f"{sim_env.api}/allocations/{lid}", alice).json()

    wait_until(
        lambda: all(lease(le["id"])["ready"] for le in leases),
        what="both grants' instances",
        step=0.1,
        info=sim_env.logs,
    )
    for le in leases:
        now = lease(le["id"])
        (slot,) = now["slots"]
        assert now["state"] == "granted" and slot["mig_uuid"].startswith("MIG-")
        assert (slot["profile"], slot["start"], slot["mig_uuid"], "present") in pool_instances(
            sim_env, admin, slot["gpu"]
        )
        # the simulated NVML has the MIG device: it is sampled at that placement
        url = f"{sim_env.api}/utilization?lease={le['id']}&resolution=sample"
        samples = wait_until(
            lambda u=url: request("GET", u, alice).json()["samples"],
            what="samples at the instance's placement",
            step=0.1,
            info=sim_env.logs,
        )
        assert {(s["gpu"], s["start"]) for s in samples} == {(slot["gpu"], slot["start"])}

    for le in leases:
        r = request("DELETE", f"{sim_env.api}/allocations/{le['id']}", alice)
        assert r.status == 200 and r.json()["release_reason"] == "stopped"
    gpus = {le["slots"][0]["gpu"] for le in leases}
    wait_until(
        lambda: all(not pool_instances(sim_env, admin, g) for g in gpus),
        what="both instances destroyed",
        step=0.1,
        info=sim_env.logs,
    )
    kinds = event_kinds(sim_env, admin)
    assert kinds.count(("mig-created", None)) == 2
    assert kinds.count(("mig-destroyed", None)) == 2
    metrics = request("GET", sim_env.api.removesuffix("/api/v1") + "/metrics", admin).body.decode()
    assert 'gpupool_mig_actions_total{op="create",result="ok"} 2.0' in metrics
    assert 'gpupool_mig_actions_total{op="destroy",result="ok"} 2.0' in metrics


# -- an external agent process ------------------------------------------------------------------


def test_external_agent_applies_the_plan_and_failures_come_back(hub_env, demo_pool_file):
    admin, alice = hub_env.token("admin"), hub_env.token("alice")
    body = {"user": "alice", "server": "x", "offer": "a100-1g"}
    r = request("POST", f"{hub_env.api}/allocations", hub_env.spawner_token, body)
    first = r.json()
    (slot,) = first["slots"]
    assert first["ready"] is False
    # no agent has reported this node yet: nobody to plan for
    plan = request("GET", f"{hub_env.api}/nodes/{NODE}/mig-plan", hub_env.agent_token).json()
    assert plan == {"node": NODE, "actions": []}

    proc = hub_env.start_agent(NODE, demo_pool_file, 0.3)

    def lease(lid: str) -> dict:
        return request("GET", f"{hub_env.api}/allocations/{lid}", alice).json()

    try:
        made = wait_until(
            lambda: lease(first["id"])["ready"] and lease(first["id"]),
            what="the agent to make the grant's instance",
            step=0.1,
            info=hub_env.logs,
        )
        uuid = made["slots"][0]["mig_uuid"]
        assert uuid.startswith("MIG-")
        assert pool_instances(hub_env, admin, slot["gpu"]) == [
            (slot["profile"], slot["start"], uuid, "present")
        ]
        request("DELETE", f"{hub_env.api}/allocations/{first['id']}", alice)
        wait_until(
            lambda: not pool_instances(hub_env, admin, slot["gpu"]),
            what="the agent to destroy the instance",
            step=0.1,
            info=hub_env.logs,
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    assert f"MIG create {slot['profile']} at {slot['start']} on {slot['gpu']}: done" in out, out
    assert f"MIG destroy {slot['profile']} at {slot['start']} on {slot['gpu']}: done" in out, out
    assert "mig_actions=2 mig_failures=0" in out, out

    # the agent is gone: report NVML failures by hand, as an agent would
    body = {"user": "alice", "server": "y", "offer": "a100-3g"}
    r = request("POST", f"{hub_env.api}/allocations", hub_env.spawner_token, body)
    second = r.json()
    for attempt in (1, 2, 3):
        plan = request("GET", f"{hub_env.api}/nodes/{NODE}/mig-plan", hub_env.agent_token).json()
        (action,) = plan["actions"]
        assert action["op"] == "create" and action["start"] == second["slots"][0]["start"]
        result = {**action, "ok": False, "error": "InsufficientResources", "mig_uuid": None}
        r = request(
            "POST",
            f"{hub_env.api}/nodes/{NODE}/mig-results",
            hub_env.agent_token,
            {"results": [result]},
        )
        assert r.status == 200 and r.json() == {"accepted": 1}
        if attempt < 3:
            assert f"attempt {attempt} of 3" in lease(second["id"])["message"]
    gone = lease(second["id"])
    assert gone["state"] == "released" and gone["release_reason"] == "mig-failed"
    assert "InsufficientResources" in gone["message"]
    assert event_kinds(hub_env, admin).count(("mig-failed", "InsufficientResources")) == 3


# -- the in-process loop, with the simulated machine at hand ------------------------------------


@pytest.fixture
def rig(tmp_path: Path, demo_pool_file: Path) -> Rig:
    """The demo pool's A100 node, its telemetry loop sampling every 0.2 s."""
    return Rig(tmp_path, demo_pool_file, NODE, interval=0.2)


def test_a_grant_wakes_the_loop_the_instance_exists_before_the_next_sample(
    tmp_path, demo_pool_file
):
    rig = Rig(tmp_path, demo_pool_file, NODE, interval=3600)  # the next samples: an hour later

    async def main() -> None:
        rig.start()
        try:
            await rig.until(
                lambda: rig.mig_steps and rig.store.mig_plan(NODE) == () and rig.telemetry.sent,
                "the loop's first round",
            )
            sampled = rig.telemetry.samples
            lease = await rig.write(commands.Allocate("alice", "", "a100-1g"))
            await rig.until(lambda: rig.store.lease(lease.id).ready, "the instance")
            # no round of samples ran meanwhile: the grant woke the loop, it did not wait for
            # the next sample tick (an hour away)
            assert rig.telemetry.samples == sampled
            (slot,) = rig.store.lease(lease.id).slots
            assert rig.on_node()[(slot.gpu, slot.start)] == (
                slot.profile,
                slot.mig_uuid,
                0,
            )
        finally:
            await rig.stop()

    asyncio.run(main())


def test_an_instance_with_a_process_is_never_destroyed(rig):
    async def main() -> None:
        rig.start()
        try:
            lease = await rig.write(commands.Allocate("alice", "", "a100-3g"))
            await rig.until(lambda: rig.store.lease(lease.id).ready, "the instance")
            (slot,) = rig.store.lease(lease.id).slots
            where = (slot.gpu, slot.start)
            await rig.rounds(1)  # the creating step is over: its inventory shows no process
            pid = rig.sim.add_process(slot.mig_uuid, used_mib=2048)
            await rig.write(commands.Release(lease.id))
            # the pool's last inventory showed no process: it asks, the node re-checks and
            # refuses (InUse); then it waits for the node to say the process is gone
            await rig.until(lambda: "mig-failed" in kinds(rig.store), "the refusal")
            await rig.rounds(3)  # several rounds of the loop
            assert rig.on_node()[where] == (slot.profile, slot.mig_uuid, 1)
            assert rig.store.mig_plan(NODE) == ()
            rig.sim.remove_process(pid)
            await rig.telemetry.check_inventory(NODE)  # the node reports the process gone
            # the node destroys the instance, then the pool records it: wait for the record
            await rig.until(lambda: "mig-destroyed" in kinds(rig.store), "the destruction")
            assert where not in rig.on_node()
            assert kinds(rig.store) == ["mig-created", "mig-failed", "mig-destroyed"]
        finally:
            await rig.stop()

    asyncio.run(main())


def test_nvml_refusing_a_creation_is_reported_then_handled(rig):
    """An instance made by hand where the pool plans one: NVML refuses (InsufficientResources),
    the failure is recorded and told, the node's inventory shows why, and the pool destroys the
    idle intruder and creates its instance."""
    gpus = [g["uuid"] for g in rig.reader.inventory()["gpus"]]

    async def main() -> None:
        rig.start()
        try:
            await rig.until(lambda: rig.telemetry.sent, "the node's first inventory")
            for gpu in gpus:  # after the pool's last look at the node
                hand = {"op": "create", "gpu": gpu, "profile": "7g.80gb", "start": 0}
                assert rig.by_hand(hand)["ok"]
            lease = await rig.write(commands.Allocate("alice", "", "a100-3g"))
            await rig.until(lambda: rig.store.lease(lease.id).ready, "the instance")
            (slot,) = rig.store.lease(lease.id).slots
            assert rig.on_node() == {(slot.gpu, slot.start): (slot.profile, slot.mig_uuid, 0)}
            items, _ = rig.store.events(lease=lease.id)
            failures = [e.data for e in items if e.kind == "mig-failed"]
            assert [f["error"] for f in failures] == ["InsufficientResources"]
        finally:
            await rig.stop()

    asyncio.run(main())


def test_a_busy_intruder_fails_the_grant_at_once(rig):
    gpus = [g["uuid"] for g in rig.reader.inventory()["gpus"]]

    async def main() -> None:
        rig.start()
        try:
            await rig.until(lambda: rig.telemetry.sent, "the node's first inventory")
            for gpu in gpus:
                hand = {"op": "create", "gpu": gpu, "profile": "7g.80gb", "start": 0}
                rig.sim.add_process(rig.by_hand(hand)["mig_uuid"])
            lease = await rig.write(commands.Allocate("alice", "", "a100-1g"))
            gone = await rig.until(
                lambda: (le := rig.store.lease(lease.id)).state == "released" and le,
                "the grant released",
            )
            assert gone.release_reason == "mig-failed", gone
            assert "could not create" in gone.message
            # nothing the pool does touches the busy instances (the loop goes on after it)
            await rig.rounds(2)
            assert sorted(p for p, _, _ in rig.on_node().values()) == ["7g.80gb", "7g.80gb"]
            assert rig.store.mig_plan(NODE) == ()
        finally:
            await rig.stop()

    asyncio.run(main())


def kinds(store: Store) -> list[str]:
    items, _ = store.events(limit=1000)
    return [e.kind for e in items if e.kind.startswith("mig-")]
