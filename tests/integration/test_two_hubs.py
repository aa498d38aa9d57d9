"""One pool service over two clusters, serving two real JupyterHubs (the multi-cluster how-to).

The pool service runs once, as a service of the ``eu`` hub; the node agents of the two clusters
(real agent processes on simulated GPUs) report their nodes with ``--cluster=eu`` and
``--cluster=us``. The ``us`` hub is a second JupyterHub with its own proxy, users and spawner
config: its spawner reaches the pool with the token of a service registered on the pool's hub
(``hub-us-spawner``, scope ``custom:gpupool:spawn``). Each hub's spawner declares its cluster
(``pool_clusters``) and, being a local spawner, its own machine (``local_nodes``). Real
single-user servers are started by both hubs. Each lease keeps its hub: a spawner reaches only
its own hub's leases, and the pool's reconcile with its hub (at a restart) leaves the other
hub's alone.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fakes import (
    SPAWNER_CONFIG,
    HubEnv,
    reconciles,
    request,
    wait_reconciled,
    wait_until,
    write_pool,
)

pytestmark = pytest.mark.e2e

POOL = """
clusters: [eu, us]
offers:
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB], display_name: "H100 anywhere"}
  - {name: h100-eu, kind: gpu, count: 1, models: [H100-80GB], clusters: [eu],
     display_name: "H100 kept in the EU"}
  - {name: h100-us, kind: gpu, count: 1, models: [H100-80GB], clusters: [us],
     display_name: "H100 kept in the US"}
quotas:
  default: {guarantee: 1, limit: 2}
"""

#: The machines the agents simulate (one per cluster).
MACHINES = """
nodes:
  - name: eu-gpu
    gpus: [{model: H100-80GB, count: 2}]
  - name: us-gpu
    gpus: [{model: H100-80GB, count: 2}]
"""


def hub_config(cluster: str, node: str) -> str:
    return (
        SPAWNER_CONFIG
        + f"c.GPUPoolSpawnerMixin.pool_clusters = [{cluster!r}]\n"
        + f"c.GPUPoolLocalProcessSpawner.local_nodes = [{node!r}]\n"
    )


@pytest.fixture
def hubs(tmp_path: Path):
    (tmp_path / "eu" / "home").mkdir(parents=True)
    (tmp_path / "us" / "home").mkdir(parents=True)
    machines = write_pool(tmp_path, MACHINES, "machines.yaml")
    eu = HubEnv(
        tmp_path / "eu",
        f"sqlite:///{tmp_path}/pool.sqlite",
        write_pool(tmp_path, POOL),
        ("alice", "bob", "admin"),
        # the pool reconciles with its own hub (at start, and every reconcile_interval): only
        # its own hub's leases, so the us hub's live ones stay (the test restarts the service)
        service_args=("--PoolService.housekeeping_interval=0.5",),
        remote_spawners=("hub-us-spawner",),
        extra_config=hub_config("eu", "eu-gpu"),
    )
    us = eu.second_hub(
        tmp_path / "us",
        "hub-us-spawner",
        users=("carol", "dave", "admin"),
        extra_config=hub_config("us", "us-gpu"),
    )
    agents = []
    with eu.running():
        try:
            wait_reconciled(eu)  # the reconcile at start is past before any lease is made
            agents = [
                eu.start_agent("eu-gpu", machines, 2.0, cluster="eu"),
                eu.start_agent("us-gpu", machines, 2.0, cluster="us"),
            ]
            admin = eu.token("admin")
            wait_until(
                lambda: clusters_of(eu, admin) == {"eu": {"eu-gpu"}, "us": {"us-gpu"}},
                60,
                "both agents' nodes in their clusters",
                step=0.2,
                info=eu.logs,
            )
            with us.running():
                try:
                    yield eu, us
                finally:
                    for env in (eu, us):
                        for user in env.users:
                            request(
                                "DELETE",
                                f"{env.hub_api}/users/{user}/server",
                                env.admin_api_token,
                            )
                        wait_until(
                            lambda env=env: (
                                not any(
                                    u["servers"]
                                    for u in request(
                                        "GET", f"{env.hub_api}/users", env.admin_api_token
                                    ).json()
                                )
                            ),
                            120,
                            "every server to stop",
                            step=0.3,
                            info=env.logs,
                        )
                    print(us.logs())
        finally:
            for agent in agents:
                agent.terminate()
                agent.wait(30)


def clusters_of(env: HubEnv, admin: str) -> dict[str, set[str]]:
    pool = request("GET", f"{env.api}/pool", admin).json()
    return {c["name"]: {n["name"] for n in c["nodes"]} for c in pool["clusters"] if c["nodes"]}


def spawn(env: HubEnv, user: str, offer: str) -> int:
    body = {"gpupool_offer": offer}
    return request("POST", f"{env.hub_api}/users/{user}/server", env.admin_api_token, body).status


def server(env: HubEnv, user: str) -> dict:
    r = request("GET", f"{env.hub_api}/users/{user}", env.admin_api_token)
    return r.json()["servers"].get("", {})


def wait_ready(env: HubEnv, user: str) -> dict:
    def ready() -> dict | None:
        s = server(env, user)
        if not s:
            raise AssertionError(f"{user}'s spawn failed:\n{env.logs()}")
        return s if s.get("ready") else None

    return wait_until(ready, 120, f"{user}'s server to be ready", step=0.3, info=env.logs)


def leases(env: HubEnv, user: str, token: str | None = None) -> list[dict]:
    r = request("GET", f"{env.api}/allocations?user={user}", token or env.spawner_token)
    assert r.status == 200, r.body
    return [le for le in r.json()["items"] if le["state"] != "released"]


def environ(env: HubEnv, user: str) -> dict[str, str]:
    raw = Path(f"/proc/{server(env, user)['state']['pid']}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def spawn_page(env: HubEnv, user: str) -> str:
    return env.login(user).open(f"{env.hub_url}/hub/spawn", timeout=30).read().decode()


def failure(env: HubEnv, user: str, timeout: float = 60) -> dict:
    """The last event of the user's spawn progress stream (it failed or finished)."""
    req = urllib.request.Request(f"{env.hub_api}/users/{user}/server/progress")
    req.add_header("Authorization", f"token {env.admin_api_token}")
    last: dict = {}
    deadline = time.monotonic() + timeout
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            if line.startswith(b"data:"):
                last = json.loads(line[5:])
                if last.get("failed") or last.get("ready") or time.monotonic() > deadline:
                    break
    return last


def test_two_hubs_one_pool_each_in_its_own_cluster(hubs):
    eu, us = hubs

    # the pickers show only what each hub can serve, counted in its cluster
    page = spawn_page(eu, "alice")
    assert 'value="h100"' in page and 'value="h100-eu"' in page
    assert 'value="h100-us"' not in page and "H100 kept in the US" not in page
    page = spawn_page(us, "carol")
    assert 'value="h100"' in page and 'value="h100-us"' in page
    assert 'value="h100-eu"' not in page and "H100 kept in the EU" not in page

    # alice (eu hub) is granted in eu, on its machine; her server runs on that GPU
    assert spawn(eu, "alice", "h100") in (201, 202)
    wait_ready(eu, "alice")
    (alices,) = leases(eu, "alice")
    assert alices["cluster"] == "eu" and alices["node"] == "eu-gpu"
    assert alices["state"] == "active"
    assert environ(eu, "alice")["CUDA_VISIBLE_DEVICES"] == alices["slots"][0]["gpu"]
    # the same offer is counted per cluster: one H100 left in eu, both still free in us
    assert "1 free now" in spawn_page(eu, "bob")
    assert "1 free now" not in spawn_page(us, "dave")

    # carol (us hub) asks for the same offer: granted in us, never on the free eu GPU
    assert spawn(us, "carol", "h100") in (201, 202)
    wait_ready(us, "carol")
    (carols,) = leases(us, "carol")
    assert carols["cluster"] == "us" and carols["node"] == "us-gpu"
    assert environ(us, "carol")["CUDA_VISIBLE_DEVICES"] == carols["slots"][0]["gpu"]

    # each hub's spawner state holds its own lease, and each hub knows only its own users
    assert server(eu, "alice")["state"]["gpupool"]["lease"] == alices["id"]
    assert server(us, "carol")["state"]["gpupool"]["cluster"] == "us"
    assert server(us, "carol")["state"]["gpupool"]["lease"] == carols["id"]
    assert request("GET", f"{us.hub_api}/users/alice", us.admin_api_token).status == 404
    assert request("GET", f"{eu.hub_api}/users/carol", eu.admin_api_token).status == 404
    # a user of the pool's hub lists her own leases only
    assert [le["id"] for le in leases(eu, "alice", eu.token("alice"))] == [alices["id"]]
    r = request("GET", f"{eu.api}/allocations", eu.token("bob"))
    assert r.status == 200 and r.json()["items"] == []
    # the pool authenticates with its own hub: a token of the us hub reaches nothing there
    assert request("GET", f"{us.api}/allocations", us.token("carol")).status == 401

    # an offer only the other cluster serves is refused, naming where it runs
    spawn(us, "dave", "h100-eu")
    last = failure(us, "dave")
    assert last.get("failed"), last
    assert "runs in clusters this hub cannot start servers in" in last["message"]
    assert "runs in cluster(s) eu; this hub launches into us" in last["message"]
    assert leases(us, "dave") == [] and not server(us, "dave")
    r = request(
        "POST",
        f"{us.api}/allocations",
        us.spawner_token,
        {"user": "dave", "offer": "h100-eu", "clusters": ["us"]},
    )
    assert r.status == 422 and r.json()["error"]["code"] == "cluster_not_served"
    assert r.json()["error"]["allowed"] == ["h100", "h100-us"]

    # each spawner reaches its own hub's leases only: the other hub's are a 404, as if missing
    for method in ("GET", "DELETE"):
        r = request(method, f"{us.api}/allocations/{alices['id']}", us.spawner_token)
        assert r.status == 404 and r.json()["error"]["code"] == "not_found", r.body
    r = request("POST", f"{us.api}/allocations/{alices['id']}/keepalive", us.spawner_token, {})
    assert r.status == 404
    assert request("GET", f"{eu.api}/allocations/{carols['id']}", eu.spawner_token).status == 404
    mine = request("GET", f"{us.api}/allocations?limit=1000", us.spawner_token).json()["items"]
    assert [le["id"] for le in mine] == [carols["id"]]
    assert [le["hub"] for le in mine] == ["hub-us-spawner"]
    ours = request("GET", f"{eu.api}/allocations?limit=1000", eu.spawner_token).json()["items"]
    assert [le["id"] for le in ours] == [alices["id"]] and ours[0]["hub"] is None
    admin = eu.token("admin")
    every = request("GET", f"{eu.api}/allocations?limit=1000", admin).json()["items"]
    assert {le["id"] for le in every} == {alices["id"], carols["id"]}
    assert leases(eu, "alice")[0]["state"] == "active"

    # the pool's reconcile with its hub (at a restart of the service) releases a lease of its
    # own hub whose server that hub does not run, and keeps the us hub's live lease
    r = request(
        "POST",
        f"{eu.api}/allocations",
        eu.spawner_token,
        {"user": "bob", "server": "ghost", "offer": "h100-eu"},
    )
    assert r.status == 201 and r.json()["state"] == "granted", r.body
    ghost = r.json()
    before = reconciles(eu, admin)
    eu.kill_service()
    eu.start_service()
    wait_reconciled(eu, before)
    r = request("GET", f"{eu.api}/allocations/{ghost['id']}", admin)
    assert r.json()["state"] == "released" and r.json()["release_reason"] == "stopped"
    events = request("GET", f"{eu.api}/events?limit=1000", admin).json()["items"]
    assert [e for e in events if e["kind"] == "reconciled"][-1]["data"] == {"released": 1}
    (kept,) = leases(us, "carol")
    assert kept["id"] == carols["id"] and kept["state"] == "active"
    assert leases(eu, "alice")[0]["state"] == "active"
    assert server(us, "carol").get("ready")

    # user names are the pool's keys: "admin" on both hubs is one pool user with one lease per
    # server name, so the us hub's admin cannot start the server the eu hub's admin runs
    assert spawn(eu, "admin", "h100") in (201, 202)
    wait_ready(eu, "admin")
    spawn(us, "admin", "h100")
    last = failure(us, "admin")
    assert last.get("failed"), last
    assert "through another hub this pool serves" in last["message"], last
    assert "user names are the pool's keys" in last["message"]
    assert leases(us, "admin") == [] and not server(us, "admin")
    (held,) = leases(eu, "admin")
    assert held["state"] == "active" and held["id"] not in last["message"]
