"""End to end with a real JupyterHub, configurable-http-proxy, the pool service on simulated GPUs
and real single-user servers (``jupyterhub-singleuser``) started by the pool's local spawner.

The story of the spawner issue: the form shows availability → alice spawns and her server's
environment names exactly the granted GPU → bob asks for the same (only) GPU, queues and sees his
position in the progress stream → alice stops → bob's spawn completes; ``GET allocations`` shows
the right states all along. Plus the refusals (forged offer, no quota, pool down) and a hub
restart that keeps running servers' leases. Runs under JupyterHub 5 and 6 (``make test``).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fakes import SPAWNER_CONFIG, HubEnv, request, wait_until, write_pool

pytestmark = pytest.mark.e2e

POOL = """
nodes:
  - name: node-h100
    gpus: [{model: H100-80GB, count: 1}]
  - name: node-a100
    gpus:
      - model: A100-80GB
        mig:
          enabled: true
          instances: [{profile: 3g.40gb, start: 0}, {profile: 3g.40gb, start: 4}]
offers:
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB], display_name: "1× H100 80GB"}
  - {name: a100-3g, kind: mig, profile: 3g.40gb, models: [A100-80GB],
     display_name: "A100 · 3g.40gb slice"}
  - {name: vip-h100, kind: gpu, count: 1, models: [H100-80GB], groups: [vip]}
  - {name: h100-asked, kind: gpu, count: 1, models: [H100-80GB], approval: required,
     display_name: "1× H100 (by approval)"}
quotas:
  default: {guarantee: 1, limit: 2}
  users:
    carol: {guarantee: 0, limit: 0}
"""


@pytest.fixture
def hub(tmp_path: Path):
    pool = write_pool(tmp_path, POOL)
    env = HubEnv(
        tmp_path,
        f"sqlite:///{tmp_path}/pool.sqlite",
        pool,
        ("alice", "bob", "carol", "admin"),
        service_args=("--PoolService.telemetry_source=sim",),
        extra_config=SPAWNER_CONFIG,
    )
    (tmp_path / "home").mkdir()
    with env.running():
        try:
            yield env
        finally:
            for user in env.users:  # servers outlive the hub (cleanup_servers = False)
                request("DELETE", f"{env.hub_api}/users/{user}/server", env.admin_api_token)
            _wait_all_stopped(env)
            print(env.logs())  # shown by pytest when the test failed


def _wait_all_stopped(env: HubEnv, timeout: float = 120) -> None:
    def stopped() -> bool:
        users = request("GET", f"{env.hub_api}/users", env.admin_api_token).json()
        return not any(u["servers"] for u in users)  # type: ignore[union-attr]

    wait_until(stopped, timeout, "every server to stop", step=0.3, info=env.logs)


def spawn(env: HubEnv, user: str, offer: str | None) -> int:
    body = {} if offer is None else {"gpupool_offer": offer}
    return request("POST", f"{env.hub_api}/users/{user}/server", env.admin_api_token, body).status


def server_model(env: HubEnv, user: str) -> dict:
    r = request("GET", f"{env.hub_api}/users/{user}", env.admin_api_token)
    return r.json()["servers"].get("", {})  # type: ignore[index,union-attr]


def wait_ready(env: HubEnv, user: str, timeout: float = 120) -> dict:
    def ready() -> dict | None:
        s = server_model(env, user)
        if not s:  # the spawn failed and the server is gone
            raise AssertionError(f"{user}'s spawn failed:\n{env.logs()}")
        return s if s.get("ready") else None

    return wait_until(ready, timeout, f"{user}'s server to be ready", step=0.3, info=env.logs)


def server_environ(env: HubEnv, user: str) -> dict[str, str]:
    """The real environment of the user's server process (LocalProcessSpawner's pid)."""
    pid = server_model(env, user)["state"]["pid"]
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def leases(env: HubEnv, user: str | None = None) -> list[dict]:
    url = f"{env.api}/allocations" + (f"?user={user}" if user else "")
    return request("GET", url, env.spawner_token).json()["items"]  # type: ignore[index,return-value]


def live(env: HubEnv, user: str) -> list[dict]:
    return [le for le in leases(env, user) if le["state"] != "released"]


def progress_events(env: HubEnv, user: str, until: str, timeout: float = 60) -> list[dict]:
    """Read the hub's progress event stream until an event's message contains ``until``."""
    req = urllib.request.Request(f"{env.hub_api}/users/{user}/server/progress")
    req.add_header("Authorization", f"token {env.admin_api_token}")
    events: list[dict] = []
    deadline = time.monotonic() + timeout
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            if time.monotonic() > deadline:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            events.append(event)
            if until in event.get("message", "") or event.get("failed") or event.get("ready"):
                break
    return events


def test_form_shows_live_availability_and_quota(hub: HubEnv):
    page = hub.login("alice").open(f"{hub.hub_url}/hub/spawn", timeout=30).read().decode()
    assert 'name="gpupool_offer"' in page
    assert "1× H100 80GB" in page and "1 free now" in page
    assert "A100 · 3g.40gb slice" in page and "2 free now" in page
    assert "costs 1/2 GPU of your quota" in page  # a 3g.40gb is half an A100
    assert "vip-h100" not in page  # group-only offer, alice is not in vip
    assert "No GPU" in page
    assert "Your GPU quota" in page

    # carol has no quota: the GPU choices say why and cannot be picked
    page = hub.login("carol").open(f"{hub.hub_url}/hub/spawn", timeout=30).read().decode()
    assert "unavailable: beyond your quota limit" in page or "no GPU quota" in page
    assert page.count("disabled") >= 2


def test_spawn_pin_queue_release(hub: HubEnv):
    # alice takes the only H100
    assert spawn(hub, "alice", "h100") in (201, 202)
    wait_ready(hub, "alice")
    (lease,) = live(hub, "alice")
    assert lease["state"] == "active" and lease["offer"] == "h100"
    environ = server_environ(hub, "alice")
    gpu = lease["slots"][0]["gpu"]
    assert environ["CUDA_VISIBLE_DEVICES"] == gpu == environ["NVIDIA_VISIBLE_DEVICES"]
    assert environ["GPUPOOL_LEASE_ID"] == lease["id"]
    assert environ["GPUPOOL_OFFER"] == "h100"
    assert environ["GPUPOOL_API_URL"].rstrip("/") == hub.api

    # bob asks for it too: he queues, and the progress stream says where he stands
    assert spawn(hub, "bob", "h100") == 202
    events = progress_events(hub, "bob", "in line")
    assert any("1st in line" in e["message"] for e in events), events
    (bobs,) = live(hub, "bob")
    assert bobs["state"] == "queued" and bobs["position"] == 1
    assert not server_model(hub, "bob").get("ready")

    # alice stops → her lease is released and bob's spawn completes on the same GPU
    r = request("DELETE", f"{hub.hub_api}/users/alice/server", hub.admin_api_token)
    assert r.status in (202, 204)
    wait_ready(hub, "bob")
    assert live(hub, "alice") == []
    released = next(le for le in leases(hub, "alice") if le["id"] == lease["id"])
    assert released["state"] == "released" and released["release_reason"] == "stopped"
    (bobs,) = live(hub, "bob")
    assert bobs["state"] == "active" and bobs["slots"][0]["gpu"] == gpu
    assert server_environ(hub, "bob")["CUDA_VISIBLE_DEVICES"] == gpu


def test_mig_slice_and_cpu_only_pinning(hub: HubEnv):
    assert spawn(hub, "alice", "a100-3g") in (201, 202)
    wait_ready(hub, "alice")
    (lease,) = live(hub, "alice")
    mig = lease["slots"][0]["mig_uuid"]
    assert mig and mig.startswith("MIG-")
    assert server_environ(hub, "alice")["CUDA_VISIBLE_DEVICES"] == mig

    assert spawn(hub, "bob", "") in (201, 202)  # CPU only
    wait_ready(hub, "bob")
    assert live(hub, "bob") == []
    environ = server_environ(hub, "bob")
    assert environ["CUDA_VISIBLE_DEVICES"] == "-1"
    assert "GPUPOOL_LEASE_ID" not in environ


@pytest.mark.parametrize(
    ("user", "offer", "needle"),
    [
        # forged form value: a group-only offer reads as no offer at all to a non-member
        ("alice", "vip-h100", "no GPU offer called 'vip-h100'"),
        ("alice", "no-such-offer", "no GPU offer called"),
        ("carol", "h100", "no GPU quota"),  # limit 0
    ],
)
def test_refusals_end_the_spawn_with_a_message(hub: HubEnv, user, offer, needle):
    spawn(hub, user, offer)
    events = progress_events(hub, user, "\0never")
    assert events[-1].get("failed"), events
    assert needle in events[-1]["message"], events[-1]
    assert live(hub, user) == []
    assert not server_model(hub, user)


def test_pool_down_at_spawn_time(hub: HubEnv):
    hub.kill_service()
    spawn(hub, "alice", "h100")
    events = progress_events(hub, "alice", "\0never")
    assert events[-1].get("failed")
    assert "not reachable" in events[-1]["message"]
    assert not server_model(hub, "alice")  # no half-started server
    hub.start_service()
    assert live(hub, "alice") == []  # and no lease leaked


def test_hub_restart_keeps_running_servers_leases(hub: HubEnv):
    assert spawn(hub, "alice", "h100") in (201, 202)
    wait_ready(hub, "alice")
    (lease,) = live(hub, "alice")
    hub.stop_hub()
    hub.start_hub()
    # the hub polls the server back; the pool's lease is untouched
    assert server_model(hub, "alice").get("ready")
    assert [le["id"] for le in live(hub, "alice")] == [lease["id"]]
    # and stopping it after the restart still gives the GPU back (lease id from spawner state)
    request("DELETE", f"{hub.hub_api}/users/alice/server", hub.admin_api_token)
    _wait_all_stopped(hub)
    assert live(hub, "alice") == []


def test_hub_restart_mid_queue_keeps_the_place(hub: HubEnv):
    assert spawn(hub, "alice", "h100") in (201, 202)
    wait_ready(hub, "alice")
    assert spawn(hub, "bob", "h100") == 202
    progress_events(hub, "bob", "in line")
    (queued,) = live(hub, "bob")
    hub.stop_hub()
    hub.start_hub()
    # bob spawns again after the restart: he adopts his queued lease instead of a new one
    assert spawn(hub, "bob", "h100") == 202
    progress_events(hub, "bob", "in line")
    assert [le["id"] for le in live(hub, "bob")] == [queued["id"]]
    request("DELETE", f"{hub.hub_api}/users/alice/server", hub.admin_api_token)
    wait_ready(hub, "bob")
    assert live(hub, "bob")[0]["id"] == queued["id"]


def test_a_spawn_waits_for_approval_then_runs_on_the_approved_gpu(hub: HubEnv):
    """The spawn page's ask (reason, hours) reaches the pool; the progress says whose decision
    it waits for; an admin approves through the pool's API and the same spawn goes on."""
    body = {"gpupool_offer": "h100-asked", "gpupool_reason": "paper", "gpupool_duration_hours": "4"}
    r = request("POST", f"{hub.hub_api}/users/bob/server", hub.admin_api_token, body)
    assert r.status == 202, r.body
    events = progress_events(hub, "bob", "Waiting for an administrator")
    assert (
        "Waiting for an administrator to approve 1× H100 (by approval)" in (events[-1]["message"])
    ), events
    [ask] = live(hub, "bob")
    assert ask["state"] == "awaiting_approval" and ask["approval"]["reason"] == "paper"
    assert ask["approval"]["duration"] == 4 * 3600
    r = request("POST", f"{hub.api}/allocations/{ask['id']}/approve", hub.token("admin"), {})
    assert r.status == 200, r.body
    wait_ready(hub, "bob")
    [lease] = live(hub, "bob")
    assert lease["id"] == ask["id"] and lease["state"] == "active" and lease["lapses"]
    assert server_environ(hub, "bob")["GPUPOOL_LEASE_ID"] == ask["id"]
