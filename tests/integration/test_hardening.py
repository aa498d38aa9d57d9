"""Hardening against a real JupyterHub: tokens never reach the service's log, one user cannot
flood the queue or hold a GPU without a server, quota edits cannot lift a cap by accident, the
scope is checked before any lookup, and metrics need a token.

The periodic reconcile runs every second here and takes leases older than three seconds for
orphans: the tests wait for its effect with a generous bound, never for a fixed time.
"""

from __future__ import annotations

import re
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

POOL = """
nodes:
  - name: node-t4
    gpus: [{model: T4, count: 2, sharing: shared}]
offers:
  - {name: t4-quarter, kind: shared, fraction: 0.25, models: [T4], display_name: "¼ T4"}
  - {name: t4-half, kind: shared, fraction: 0.5, models: [T4], approval: required}
quotas:
  default: {guarantee: 0, limit: 2}
"""


@pytest.fixture
def hub(tmp_path: Path):
    pool = write_pool(tmp_path, POOL)
    env = HubEnv(
        tmp_path,
        f"sqlite:///{tmp_path}/pool.sqlite",
        pool,
        ("alice", "bob", "admin"),
        service_args=(
            "--PoolService.max_requests_per_user=3",
            "--PoolService.housekeeping_interval=0.5",
            "--PoolService.reconcile_interval=1",
            "--PoolService.orphan_after=3",
        ),
        extra_config=SPAWNER_CONFIG,
    )
    (tmp_path / "home").mkdir()
    with env.running():
        wait_reconciled(env)  # or it may release the tests' first leases as "stopped"
        try:
            yield env
        finally:
            for user in env.users:
                request("DELETE", f"{env.hub_api}/users/{user}/server", env.admin_api_token)


def _allocate(env: HubEnv, token: str, server: str, user: str | None = None):
    body = {"offer": "t4-quarter", "server": server}
    if user is not None:
        body["user"] = user
    return request("POST", f"{env.api}/allocations", token, body)


def test_tokens_never_reach_the_log_and_lines_carry_their_status(hub):
    alice = hub.token("alice")
    bob = hub.token("bob")
    # tokens in the query string (which the service does not take: 401) and in the header
    assert request("GET", f"{hub.api}/users/bob?token={alice}").status == 401
    assert request("GET", f"{hub.api}/users/alice?token=not-a-real-token-123").status == 401
    assert request("GET", f"{hub.api}/users/bob", alice).status == 403
    r = request("POST", f"{hub.api}/allocations?token={bob}", bob, {"offer": 5})
    assert r.status == 422
    assert request("GET", f"{hub.api}/pool", "forged-token-abcdef").status == 401

    def logged() -> str:
        text = (hub.dir / "service.log").read_text()
        return text if "offer must be" in text else ""

    log = wait_until(logged, what="the service to log the refused POST")
    for secret in (alice, bob, hub.spawner_token, "not-a-real-token-123", "forged-token-abcdef"):
        assert secret not in log, f"a token reached the service log: {secret[:6]}…"
    assert "token=[secret]" in log
    # a 4xx line starts with the status it answered (not 200)
    line = next(ln for ln in log.splitlines() if "offer must be" in ln)
    assert re.search(r"\b422 POST /services/gpupool/api/v1/allocations\?token=\[secret\]", line)


def test_a_user_may_only_name_servers_the_hub_knows(hub):
    alice = hub.token("alice")
    r = _allocate(hub, alice, "flood5")
    assert r.status == 422 and r.json()["error"]["code"] == "unknown_server", r.body
    assert r.json()["error"]["field"] == "server"
    assert _allocate(hub, alice, "").status == 201  # the default server is always hers


def test_a_flood_of_requests_is_refused_beyond_the_cap(hub):
    """The spawner's path is not checked against the hub (it asks for servers the hub is
    spawning), but the per-user cap holds there too: 300 made-up servers, 3 requests."""
    answers = [_allocate(hub, hub.spawner_token, f"flood{i}", "alice") for i in range(300)]
    codes = [r.status for r in answers]
    assert codes[:4] == [201, 201, 201, 429] and set(codes) == {201, 429}, codes[:6]
    error = answers[3].json()["error"]
    assert error["code"] == "too_many_requests" and "at most 3" in error["message"]
    # the periodic reconcile may free a slot meanwhile (these servers do not exist): never
    # more than 3 live at once, so every grant beyond the first 3 follows a release
    live = request("GET", f"{hub.api}/allocations?user=alice&limit=1000", hub.spawner_token)
    leases = live.json()["items"]
    assert sum(le["state"] != "released" for le in leases) <= 3
    orphaned = sum(le["release_reason"] == "orphaned" for le in leases)
    assert codes.count(201) <= 3 + orphaned
    # bob is not affected by alice's flood
    assert _allocate(hub, hub.spawner_token, "", "bob").status == 201


def test_a_ghost_lease_is_released_and_a_real_server_keeps_its_gpu(hub):
    # bob's real server, spawned by the hub through the pool's spawner
    r = request(
        "POST",
        f"{hub.hub_api}/users/bob/server",
        hub.admin_api_token,
        {"gpupool_offer": "t4-quarter"},
    )
    assert r.status in (201, 202), r.body

    def bob_ready() -> bool:
        model = request("GET", f"{hub.hub_api}/users/bob", hub.admin_api_token).json()
        return bool((model.get("servers") or {}).get("", {}).get("ready"))

    wait_until(bob_ready, 120, "bob's server to start", info=hub.logs)
    # a ghost: a lease kept alive for a server the hub never ran
    ghost = _allocate(hub, hub.spawner_token, "ghost", "alice").json()
    assert (
        request("POST", f"{hub.api}/allocations/{ghost['id']}/keepalive", hub.spawner_token).status
        == 200
    )

    def released() -> dict | None:
        lease = request("GET", f"{hub.api}/allocations/{ghost['id']}", hub.spawner_token).json()
        return lease if lease["state"] == "released" else None

    lease = wait_until(released, 60, "the reconcile to release the ghost lease", info=hub.logs)
    assert lease["release_reason"] == "orphaned"
    # bob's lease lived through the same reconciles
    items = request("GET", f"{hub.api}/allocations?user=bob", hub.spawner_token).json()["items"]
    assert [le["state"] for le in items] == ["active"]
    events = request("GET", f"{hub.api}/events?limit=1000", hub.token("admin")).json()["items"]
    assert any(e["kind"] == "reconciled" and e["data"]["released"] >= 1 for e in events)


def test_a_request_awaiting_approval_for_a_deleted_server_is_withdrawn(hub):
    """A server deleted while its request waits for an administrator never reports a stop
    (it was not running): the periodic reconcile asks the hub for the user's servers, stopped
    ones included, and withdraws the request of one the hub no longer has. A request for a
    server that is only stopped (alice's default one) lives on."""
    admin = hub.token("admin")

    def ask(server: str) -> dict:
        body = {"offer": "t4-half", "server": server, "user": "alice", "reason": "a deadline"}
        r = request("POST", f"{hub.api}/allocations", hub.spawner_token, body)
        assert r.status == 201 and r.json()["state"] == "awaiting_approval", r.body
        return r.json()

    gone, kept = ask("paper"), ask("")  # the hub has no server "paper" (deleted meanwhile)

    def withdrawn() -> dict | None:
        lease = request("GET", f"{hub.api}/allocations/{gone['id']}", hub.spawner_token).json()
        return lease if lease["state"] == "released" else None

    lease = wait_until(withdrawn, 60, "the reconcile to withdraw the request", info=hub.logs)
    assert lease["release_reason"] == "withdrawn"
    after = reconciles(hub, admin)
    wait_until(lambda: reconciles(hub, admin) > after + 1, 60, "two more reconciles")
    lease = request("GET", f"{hub.api}/allocations/{kept['id']}", hub.spawner_token).json()
    assert lease["state"] == "awaiting_approval"


def test_put_replaces_a_whole_quota_and_patch_changes_only_what_it_names(hub):
    admin = hub.token("admin")
    url = f"{hub.api}/quotas/users/alice"
    whole = {"guarantee": 1, "limit": 2, "budget": 100, "period": "week"}
    assert request("PUT", url, admin, whole).json()["limit"] == 2
    r = request("PUT", url, admin, {"guarantee": 1})  # would have silently lifted the limit
    assert r.status == 422 and r.json()["error"]["code"] == "missing_field", r.body
    assert request("GET", url, admin).json()["limit"] == 2  # nothing changed
    patched = request("PATCH", url, admin, {"limit": 4}).json()
    assert {k: patched[k] for k in whole} == {**whole, "limit": 4}
    assert patched["source"] == "api"
    r = request("PATCH", url, admin, {"guarantee": 9})  # above the limit
    assert r.status == 422 and r.json()["error"]["field"] == "quotas.users.alice.guarantee"
    r = request("PUT", f"{hub.api}/quotas/users/{'x' * 300}", admin, whole)
    # a path name over 255 characters is malformed (the spec's maxLength): 400 naming it
    assert r.status == 400 and r.json()["error"]["field"] == "name"


def test_no_scope_means_403_whether_or_not_the_lease_exists(hub):
    lease = _allocate(hub, hub.spawner_token, "", "alice").json()
    outsider = hub.token("bob", ["read:users:name!user=bob"])  # no pool scope at all
    for lid in (lease["id"], "0" * 32):
        r = request("GET", f"{hub.api}/allocations/{lid}", outsider)
        assert r.status == 403 and r.json()["error"]["code"] == "forbidden", (lid, r.body)
    # with the scope, another user's lease and a missing one look the same
    bob = hub.token("bob")
    mine, missing = (
        request("GET", f"{hub.api}/allocations/{x}", bob) for x in (lease["id"], "0" * 32)
    )
    assert mine.status == missing.status == 404


def test_metrics_need_a_token_with_a_metrics_scope(hub):
    url = hub.api.replace("/api/v1", "/metrics")
    assert request("GET", url).status == 401
    r = request("GET", url, hub.token("alice"))
    assert r.status == 403 and r.json()["error"]["code"] == "forbidden"
    assert request("GET", url, hub.token("admin")).status == 200
    prometheus = hub.token("admin", ["read:metrics"])  # the hub admin may grant it
    r = request("GET", url, prometheus)
    assert r.status == 200 and b"gpupool_capacity_units" in r.body
