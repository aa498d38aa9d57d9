"""The lab package's server extension in real single-user servers: a real JupyterHub and proxy,
the pool service on simulated GPUs, servers started by the pool's spawner with
``jupyterlab-gpupool`` installed (``make test`` installs ``./labextension``).

What it must do: show the server's lease, quota and offers from the pool with the server's own
token (whose scopes the hub's server role gives); ask the pool once per interval however many
tabs listen; save through the open labs (or checkpoint without one) when the reclaimer calls
save-all, in the very call the reclaimer makes; say the pool is away and recover; move the
server to another offer (the pool restarts it into the reserved lease) and refuse what the pool
refuses; list the user's GPU kernels.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from tests.fakes import (
    LAB_POOL,
    HubEnv,
    LabTab,
    lab_hub,
    request,
    server_environ,
    start_server,
    stop_server,
    user_server,
    wait_until,
)

pytestmark = pytest.mark.e2e

POOL = (
    LAB_POOL
    + """  - {name: vip-h100, kind: gpu, count: 1, models: [H100-80GB], groups: [vip]}
quotas:
  default: {guarantee: 1, limit: 2, budget: 100, period: week}
"""
)

#: short enough for a test to wait out: a save-all with no lab answering
SAVE_TIMEOUT = "--GPUPoolLab.save_timeout=3"
#: the shortest gap between two presence reports, short for the test (60 s by default)
PRESENCE_INTERVAL = "--GPUPoolLab.presence_interval=3"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    env = lab_hub(
        tmp_path_factory.mktemp("lab"),
        POOL,
        lab_args=(SAVE_TIMEOUT, PRESENCE_INTERVAL),
        # a restart's target is looked at only when a release wakes it (see the hand-off test)
        service_args=("--PoolService.telemetry_source=sim", "--PoolService.restart_poll=3600"),
    )
    with env.running():
        yield env
        print(env.logs())


@pytest.fixture
def alice(hub: HubEnv):
    """alice's server on a 1g.10gb slice (stopped afterwards)."""
    start_server(hub, "alice", "a100-1g")
    yield f"{hub.hub_url}/user/alice"
    stop_server(hub, "alice")


def pool_requests(env: HubEnv, route: str) -> int:
    """How many API requests of ``route`` the pool service has answered (its /metrics)."""
    text = request("GET", env.api.replace("/api/v1", "/metrics"), env.token("admin")).body.decode()
    pattern = rf'gpupool_request_duration_seconds_count\{{[^}}]*route="{route}"[^}}]*\}} (\S+)'
    return int(sum(float(n) for n in re.findall(pattern, text)))


def test_state_shows_the_lease_quota_and_offers(hub: HubEnv, alice: str):
    token = hub.token("alice")
    r = request("GET", f"{alice}/gpupool/state", token)
    assert r.status == 200, r.body
    state = r.json()
    assert state["pool"]["ok"], state["pool"]
    lease = state["lease"]
    assert lease["offer"] == "a100-1g" and lease["state"] == "active"
    assert lease["device"] == "A100 1g.10gb"
    assert lease["devices"][0]["uuid"].startswith("MIG-")
    assert lease["devices"][0]["uuid"] == server_environ(hub, "alice")["CUDA_VISIBLE_DEVICES"]
    assert lease["devices"][0]["parent"].startswith("GPU-")
    assert lease["node"] == "node-a100" and lease["memory_total_mib"] == 10 * 1024
    assert state["lease_id"] == lease["id"] and not state["stale_lease"]
    q = state["quota"]
    assert (q["guarantee"], q["limit"], q["budget"], q["period"]) == (1.0, 2.0, 100.0, "week")
    assert q["held_units"] == pytest.approx(1 / 7, abs=1e-3)
    assert q["resets_at"].endswith("Z")
    choices = {c["name"]: c for c in state["offers"]}
    assert set(choices) == {"a100-3g", "h100"}  # not the current one, not vip's
    assert choices["a100-3g"]["units"] == 0.5 and choices["a100-3g"]["fits"]
    assert choices["h100"]["available"] == 1
    assert state["local"] == {
        "available": False,
        "reason": "NVML is switched off on this server",
        "devices": [],
    }


def test_the_servers_own_token_has_the_pool_scopes(hub: HubEnv, alice: str):
    token = server_environ(hub, "alice")["JUPYTERHUB_API_TOKEN"]
    me = request("GET", f"{hub.hub_api}/user", token).json()
    assert "custom:gpupool:use!user=alice" in me["scopes"], me["scopes"]
    assert "access:services!service=gpupool" in me["scopes"], me["scopes"]
    # and the pool answers it as alice's
    r = request("GET", f"{hub.proxied_api}/users/me", token)
    assert r.status == 200 and r.json()["name"] == "alice"


def test_only_the_owner_and_the_reclaimer_reach_the_routes(hub: HubEnv, alice: str):
    assert request("GET", f"{alice}/gpupool/state").status in (302, 403)
    bob = hub.token("bob")
    assert request("GET", f"{alice}/gpupool/state", bob).status == 403
    assert request("POST", f"{alice}/gpupool/save-all", bob, {}).status == 403
    # the reclaimer's kind of token (access:servers) may save, as the reclaimer does
    r = request("POST", f"{alice}/gpupool/save-all", hub.token("admin"), {})
    assert r.status == 200 and r.json()["via"] == "checkpoints"


def test_input_reaches_the_pool_at_most_once_per_interval(hub: HubEnv, alice: str):
    """The server announces its lab to the pool when it starts; then however many tabs report
    input, however often, the pool hears of it once per ``presence_interval`` (3 s here), with
    the newest input; bad reports are refused and lose nothing."""
    token = hub.token("alice")
    wait_until(lambda: pool_requests(hub, "presence") >= 1, 30, "the lab's announcement")
    before = pool_requests(hub, "presence")
    for _ in range(10):  # ten reports from "several tabs" within a second
        r = request("POST", f"{alice}/gpupool/presence", token, {"idle_for": 0})
        assert r.status == 202 and r.json()["reported"], r.body
    wait_until(lambda: pool_requests(hub, "presence") == before + 2, 30, "the second report")
    time.sleep(4)  # another interval: nothing new to report, so nothing is sent
    assert pool_requests(hub, "presence") == before + 2
    for bad in ({"idle_for": -1}, {"idle_for": "now"}, {"idle_for": 601}, {}):
        r = request("POST", f"{alice}/gpupool/presence", token, bad)
        assert r.status == 400 and r.json()["error"]["code"] == "invalid_field", (bad, r.body)
    bob = hub.token("bob")
    assert request("POST", f"{alice}/gpupool/presence", bob, {"idle_for": 0}).status == 403


def test_tabs_share_one_ask_per_interval(hub: HubEnv, alice: str):
    token = hub.token("alice")
    tabs = [LabTab(alice, token) for _ in range(5)]
    try:
        first = tabs[0].state["version"]
        before = pool_requests(hub, "user")
        # ten more refreshes of the shared state (each an ask of the pool)...
        target = first + 10
        for tab in tabs:
            tab.wait_state(lambda s: s["version"] >= target, "ten refreshes")
        asked = pool_requests(hub, "user") - before
        # ...cost one users/me each, whatever the number of tabs (±1 at the edges)
        assert asked <= 11, asked
        versions = {tab.state["version"] for tab in tabs}
        assert max(versions) - min(versions) <= 1  # they saw the same answers
        # a state request between refreshes is served from the shared answer
        seen = pool_requests(hub, "user")
        for _ in range(5):
            assert request("GET", f"{alice}/gpupool/state", token).status == 200
        assert pool_requests(hub, "user") - seen <= 2
    finally:
        for tab in tabs:
            tab.close()


def test_the_reclaimers_save_all_saves_through_the_open_labs(hub: HubEnv, alice: str):
    from jupyterhub_gpupool.hubclient import HubClient
    from jupyterhub_gpupool.reclaim import actions

    token = hub.token("alice")
    answered: list[str] = []

    def save(request_id: str) -> dict:
        answered.append(request_id)
        return {"saved": ["work/train.ipynb"], "unchanged": ["notes.md"], "failed": []}

    tabs = [LabTab(alice, token, save), LabTab(alice, token, save)]
    try:
        client = HubClient(hub.hub_api, hub.token("admin"), proxy_url=hub.hub_url)
        saved = asyncio.run(actions.save_all(client, "/user/alice/", 30))
        assert saved == ["work/train.ipynb"]
        assert len(answered) == 2 and len(set(answered)) == 1  # both tabs, one request
        r = request("POST", f"{alice}/gpupool/save-all", token, {"reason": "test"})
        body = r.json()
        assert body["via"] == "lab" and body["labs"] == 2 and body["answered"] == 2
        assert body["unchanged"] == ["notes.md"]
        # and every tab hears what was saved
        wait_until(lambda: all(any(e == "saved" for e, _ in t.events) for t in tabs))
    finally:
        for tab in tabs:
            tab.close()


def test_save_all_without_a_lab_checkpoints_the_open_files(hub: HubEnv, alice: str):
    token = hub.token("alice")
    api = f"{alice}/api"
    nb = {"type": "notebook", "content": {"cells": [], "metadata": {}, "nbformat": 4,
                                          "nbformat_minor": 5}}  # fmt: skip
    assert request("PUT", f"{api}/contents/saved.ipynb", token, nb).status in (200, 201)
    session = {"path": "saved.ipynb", "type": "notebook", "name": "", "kernel": {"name": "python3"}}
    r = request("POST", f"{api}/sessions", token, session)
    assert r.status == 201, r.body
    try:
        # a tab that never answers: save-all waits save_timeout, then checkpoints
        silent = LabTab(alice, token)
        try:
            body = request("POST", f"{alice}/gpupool/save-all", token, {}).json()
        finally:
            silent.close()
        assert body["via"] == "checkpoints" and body["labs"] == 1 and body["answered"] == 0
        assert body["saved"] == ["saved.ipynb"]
        checkpoints = request("GET", f"{api}/contents/saved.ipynb/checkpoints", token).json()
        assert len(checkpoints) >= 1
    finally:
        request("DELETE", f"{api}/sessions/{r.json()['id']}", token)


def test_pool_away_is_said_and_recovers_without_a_new_tab(hub: HubEnv, alice: str):
    token = hub.token("alice")
    tab = LabTab(alice, token)
    try:
        tab.wait_state(lambda s: s["pool"]["ok"], "the pool answering")
        hub.kill_service()
        try:
            down = tab.wait_state(lambda s: s["pool"]["error"], "the pool's absence")
            assert not down["pool"]["ok"] and down["pool"]["code"] == "down"
            assert "could not be reached" in down["pool"]["error"]
            assert down["lease"]["offer"] == "a100-1g"  # what it last said stays shown
            longer = tab.wait_state(
                lambda s: (s["pool"]["retry_in"] or 0) >= 4, "the wait to back off"
            )
            assert longer["pool"]["down_since"] is not None
        finally:
            hub.start_service()
        back = tab.wait_state(
            lambda s: s["pool"]["ok"] and s["version"] > longer["version"], "the pool back"
        )
        assert back["lease"]["offer"] == "a100-1g" and back["pool"]["error"] is None
    finally:
        tab.close()


def test_a_move_the_pool_refuses_keeps_the_gpu(hub: HubEnv, alice: str):
    token = hub.token("alice")
    r = request("POST", f"{alice}/gpupool/resize", token, {"offer": "vip-h100"})
    assert r.status == 422, r.body  # a group's offer is as missing as one that does not exist
    assert r.json()["error"]["code"] == "unknown_offer"
    assert "vip-h100" not in r.json()["error"].get("allowed", [])
    r = request("POST", f"{alice}/gpupool/resize", token, {})
    assert r.status == 400 and r.json()["error"]["code"] == "missing_field"
    state = request("GET", f"{alice}/gpupool/state", token).json()
    assert state["lease"]["offer"] == "a100-1g" and state["pending"] is None


def test_a_move_from_1g_to_3g_restarts_the_server_on_the_new_slice(hub: HubEnv, alice: str):
    token = hub.token("alice")
    before = server_environ(hub, "alice")
    r = request("POST", f"{alice}/gpupool/resize", token, {"offer": "a100-3g"})
    assert r.status == 202, r.body
    target = r.json()["target"]
    assert target["resize_of"] == before["GPUPOOL_LEASE_ID"]

    def restarted() -> dict | None:
        s = user_server(hub, "alice")
        if not s.get("ready"):
            return None
        try:
            env = server_environ(hub, "alice")
        except (FileNotFoundError, KeyError):  # the old process went between the two reads
            return None
        return env if env.get("GPUPOOL_LEASE_ID") == target["id"] else None

    after = wait_until(restarted, 180, "alice's server on the 3g slice", info=hub.logs)
    assert after["GPUPOOL_OFFER"] == "a100-3g"
    assert after["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert after["CUDA_VISIBLE_DEVICES"] != before["CUDA_VISIBLE_DEVICES"]

    def new_state() -> dict | None:
        # ready on the hub comes before the proxy routes to it and the extension answers:
        # until then the hub's own HTML page answers, not the extension's JSON
        r = request("GET", f"{alice}/gpupool/state", token)
        kind = {k.lower(): v for k, v in r.headers.items()}.get("content-type", "")
        if r.status != 200 or not kind.startswith("application/json"):
            return None
        s = r.json()
        return s if s["pool"]["ok"] else None

    state = wait_until(new_state, 120, "the new server's state")
    assert state["lease"]["id"] == target["id"] and state["lease"]["device"] == "A100 3g.40gb"
    old = request("GET", f"{hub.api}/allocations/{before['GPUPOOL_LEASE_ID']}", token).json()
    assert old["state"] == "released"


def test_a_cpu_only_server_is_offered_a_gpu(hub: HubEnv):
    start_server(hub, "bob", "")
    try:
        token = hub.token("bob")
        state = request("GET", f"{hub.hub_url}/user/bob/gpupool/state", token).json()
        assert state["pool"]["ok"] and state["lease"] is None and state["lease_id"] is None
        assert {c["name"] for c in state["offers"]} == {"a100-1g", "a100-3g", "h100"}
        r = request("POST", f"{hub.hub_url}/user/bob/gpupool/keepalive", token, {})
        assert r.status == 409 and r.json()["error"]["code"] == "no_lease"
    finally:
        stop_server(hub, "bob")


def test_status_and_the_widget_in_a_kernels_environment(hub: HubEnv, alice: str):
    """A kernel inherits the server's environment: status() and GPUPoolWidget() reach the
    server's routes with it (run here as a process with exactly that environment)."""
    import json
    import subprocess
    import sys

    code = (
        "import json\n"
        "from jupyterlab_gpupool import GPUPoolWidget, status\n"
        "s = status()\n"
        "w = GPUPoolWidget()\n"
        "print(json.dumps({'device': s['lease']['device'], 'ok': s['pool']['ok'],\n"
        "                  'widget': w.children[0].value, 'quota': w.children[2].value}))\n"
    )
    env = server_environ(hub, "alice")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["device"] == "A100 1g.10gb" and seen["ok"]
    assert "A100 1g.10gb" in seen["widget"] and "GPU units in use" in seen["quota"]


def test_a_move_that_must_wait_shows_its_place_and_can_be_cancelled(hub: HubEnv, alice: str):
    start_server(hub, "bob", "h100")  # the only H100
    try:
        token = hub.token("alice")
        before = server_environ(hub, "alice")["GPUPOOL_LEASE_ID"]
        tab = LabTab(alice, token)
        try:
            r = request("POST", f"{alice}/gpupool/resize", token, {"offer": "h100"})
            assert r.status == 202, r.body
            waiting = tab.wait_state(lambda s: s["pending"], "the move waiting")["pending"]
            assert waiting["state"] == "queued" and waiting["position"] == 1
            assert waiting["resize_of"] == before
            # a second move while one waits is refused, the first one stays
            again = request("POST", f"{alice}/gpupool/resize", token, {"offer": "a100-3g"})
            assert again.status == 409 and again.json()["error"]["code"] == "resize_pending"
            r = request("DELETE", f"{alice}/gpupool/resize", token)
            assert r.status == 200 and r.json()["pending"] is None, r.body
            assert r.json()["lease"]["id"] == before  # alice keeps her slice
        finally:
            tab.close()
        assert hub_lease(hub, waiting["id"])["state"] == "released"
        assert server_environ(hub, "alice")["GPUPOOL_LEASE_ID"] == before  # never restarted
        r = request("DELETE", f"{alice}/gpupool/resize", token)
        assert r.status == 404 and r.json()["error"]["code"] == "not_found"
    finally:
        stop_server(hub, "bob")


def test_the_pool_restarts_only_into_a_waiting_lease_of_ones_own(hub: HubEnv, alice: str):
    lease = server_environ(hub, "alice")["GPUPOOL_LEASE_ID"]
    r = request("POST", f"{hub.api}/allocations/{lease}/restart", hub.token("alice"), {})
    assert r.status == 409 and r.json()["error"]["code"] == "not_live", r.body  # active
    r = request("POST", f"{hub.api}/allocations/{lease}/restart", hub.token("bob"), {})
    assert r.status == 404, r.body  # another user's lease reads as missing
    r = request("POST", f"{hub.api}/allocations/{lease}/restart", hub.token("alice"), {"x": 1})
    assert r.status == 422 and r.json()["error"]["code"] == "unknown_field", r.body


def test_a_cpu_only_server_moves_onto_a_gpu(hub: HubEnv):
    start_server(hub, "bob", "")
    try:
        assert "GPUPOOL_LEASE_ID" not in server_environ(hub, "bob")
        token = hub.token("bob")
        r = request("POST", f"{hub.hub_url}/user/bob/gpupool/resize", token, {"offer": "h100"})
        assert r.status == 202, r.body
        target = r.json()["target"]
        assert target["resize_of"] is None and target["server"] == ""

        def on_gpu() -> dict | None:
            if not user_server(hub, "bob").get("ready"):
                return None
            try:
                env = server_environ(hub, "bob")
            except (FileNotFoundError, KeyError):  # the old process went between the reads
                return None
            return env if env.get("GPUPOOL_LEASE_ID") == target["id"] else None

        env = wait_until(on_gpu, 180, "bob's server on the H100", info=hub.logs)
        assert env["GPUPOOL_OFFER"] == "h100" and env["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
    finally:
        stop_server(hub, "bob")


def hub_lease(env: HubEnv, lease_id: str) -> dict:
    return request("GET", f"{env.api}/allocations/{lease_id}", env.spawner_token).json()  # type: ignore[return-value]


def test_a_hand_off_goes_as_soon_as_the_holder_releases(hub: HubEnv, alice: str):
    """bob's CPU-only server waits in line for the one H100, which alice holds; alice stops her
    server: the release wakes bob's waiting restart at once (the fixture's poll is an hour),
    and bob's server restarts on the H100."""
    start_server(hub, "bob", "")
    try:
        stop_server(hub, "alice")
        start_server(hub, "alice", "h100")
        token = hub.token("bob")
        bob = f"{hub.hub_url}/user/bob"
        r = request("POST", f"{bob}/gpupool/resize", token, {"offer": "h100"})
        assert r.status == 202, r.body
        target = r.json()["target"]
        assert target["state"] == "queued", target
        stop_server(hub, "alice")  # the release serves the queue: bob's target is granted

        def on_h100() -> dict | None:
            if not user_server(hub, "bob").get("ready"):
                return None
            try:
                env = server_environ(hub, "bob")
            except (FileNotFoundError, KeyError):  # the old process went between the reads
                return None
            return env if env.get("GPUPOOL_LEASE_ID") == target["id"] else None

        env = wait_until(on_h100, 120, "bob's server on the H100", info=hub.logs)
        assert env["GPUPOOL_OFFER"] == "h100"
        assert hub_lease(hub, target["id"])["state"] == "active"
    finally:
        stop_server(hub, "bob")
        start_server(hub, "alice", "a100-1g")  # as the fixture left it


def test_my_jobs_through_the_servers_routes(hub: HubEnv, alice: str):
    """The panel's "My jobs": the server lists, cancels and reads the output of its user's
    jobs with its own token; another user's job is as missing as one that does not exist."""
    token = hub.token("alice")
    body = {"offer": "a100-3g", "class": "training", "name": "resnet", "command": ["python"]}
    r = request("POST", f"{hub.api}/jobs", token, body)
    assert r.status == 201, r.body
    job = r.json()
    r = request("POST", f"{hub.api}/jobs", hub.token("bob"), {**body, "name": "bobs"})
    assert r.status == 201, r.body
    bobs = r.json()
    try:
        r = request("GET", f"{alice}/gpupool/jobs", token)
        assert r.status == 200, r.body
        [seen] = r.json()["jobs"]  # alice's only
        assert (seen["id"], seen["name"], seen["class"]) == (job["id"], "resnet", "training")
        assert seen["state"] == "granted" and seen["offer"] == "a100-3g"
        out = "epoch 1 loss 2.3\n"
        r = request("POST", f"{hub.api}/jobs/{job['id']}/logs", hub.agent_token,
                    {"offset": 0, "data": out})  # fmt: skip
        assert r.status == 200, r.body
        r = request("GET", f"{alice}/gpupool/jobs/{job['id']}/logs?offset=0", token)
        assert r.status == 200 and r.json()["data"] == out and r.json()["next"] == len(out)
        r = request("GET", f"{alice}/gpupool/jobs/{job['id']}/logs?offset=5", token)
        assert r.json()["data"] == out[5:]
        r = request("GET", f"{alice}/gpupool/jobs/{job['id']}/logs?offset=-1", token)
        assert r.status == 400 and r.json()["error"]["code"] == "invalid_argument"
        # bob's job through alice's server: the pool's 404, kept
        for method, path in (("GET", f"jobs/{bobs['id']}/logs"), ("DELETE", f"jobs/{bobs['id']}")):
            r = request(method, f"{alice}/gpupool/{path}", token)
            assert r.status == 404 and r.json()["error"]["code"] == "not_found", r.body
        # and bob cannot reach alice's server's routes at all
        assert request("GET", f"{alice}/gpupool/jobs", hub.token("bob")).status == 403
        r = request("DELETE", f"{alice}/gpupool/jobs/{job['id']}", token)
        assert r.status == 200 and r.json()["state"] == "cancelled", r.body
        r = request("GET", f"{hub.api}/allocations/{job['lease_id']}", hub.token("admin"))
        assert r.json()["state"] == "released"
    finally:
        for j in (job, bobs):
            request("DELETE", f"{hub.api}/jobs/{j['id']}", hub.token("admin"))


def test_my_gpu_kernels_through_the_servers_routes(hub: HubEnv, alice: str):
    """The panel's "GPU kernels": the server lists its user's kernel leases (any server's)
    with its own token; a lab's event stream starts with this server's kernel starts (none
    waiting here: a lease asked for through the API is no start of this server)."""
    token = hub.token("alice")
    kid = "lab-kernel-1"
    r = request("POST", f"{hub.api}/kernels", token, {"offer": "a100-1g", "kernel_id": kid})
    assert r.status == 201, r.body
    r = request("POST", f"{hub.api}/kernels", hub.token("bob"),
                {"offer": "a100-1g", "kernel_id": "bobs-kernel"})  # fmt: skip
    assert r.status == 201, r.body
    tab = LabTab(alice, token)
    try:
        r = request("GET", f"{alice}/gpupool/kernels", token)
        assert r.status == 200, r.body
        [seen] = r.json()["kernels"]  # alice's only
        assert (seen["kernel_id"], seen["offer"]) == (kid, "a100-1g")
        # the fields the list shows (granted or in line: the lab pool's slices may be taken)
        assert seen["state"] in ("granted", "queued") and seen["created"]
        assert {"position", "eta_seconds", "devices", "granted", "activated"} <= set(seen)
        assert request("GET", f"{alice}/gpupool/kernels", hub.token("bob")).status == 403
        none = ("kernel-starts", {"waiting": [], "notices": []})
        wait_until(lambda: none in tab.events, what="the kernel-starts event")
    finally:
        tab.close()
        request("DELETE", f"{hub.api}/kernels/{kid}", token)
        request("DELETE", f"{hub.api}/kernels/bobs-kernel", hub.token("bob"))
