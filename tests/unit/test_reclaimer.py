"""The reclaimer's core against real HTTP servers: a real JupyterHub with real single-user
servers (a subprocess, module-wide) and the real pool service app served in-process on the
test's event loop, its store on the test's clock.

The clock (:class:`SecondsClock`) runs an hour ahead of the real one, so what the hub and the
servers stamp themselves (activity, a kernel's ``last_activity``) is older than any window:
presence is absent and kernels idle unless a test says otherwise. Time between rounds moves
through the clock's ``sleep``; only the hub stopping a real server takes real time.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from jupyterhub_gpupool.hubclient import HubClient
from jupyterhub_gpupool.poolclient import PoolClient
from jupyterhub_gpupool.reclaim.core import Reclaimer, kernel_state
from tests.fakes import HubEnv, SecondsClock, free_port, request, wait_until, write_pool

RECLAIMER_TOKEN = secrets.token_hex(16)
USERS = ("alice", "bob", "carol", "admin")
POOL = """
nodes:
  - name: n1
    cpu_milli: 64000
    memory_mib: 262144
    gpus:
      - {model: H100-80GB, count: 3}
  - name: n2
    cpu_milli: 64000
    memory_mib: 262144
    gpus:
      - {model: A100-80GB, mig: {enabled: true, dynamic: true}}
offers:
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB]}
  - {name: a100-1g, kind: mig, profile: 1g.10gb, models: [A100-80GB]}
quotas:
  default: {guarantee: 2, limit: 3}
reclaim:
  default: {idle_timeout: 2m, pressure_idle_timeout: 1m, warn_before: 1m, busy_grace: 1m}
"""
POLICY = {"idle_timeout": "2m", "pressure_idle_timeout": "1m", "warn_before": "1m"}
#: The reclaimer registered by the shipped helper (its role has exactly the documented
#: scopes); single-user servers by JupyterHub's own simple spawner, no GPU pool spawner: the
#: tests make the pool's leases themselves.
HUB_EXTRA = (
    "from jupyterhub_gpupool.hubconfig import configure_reclaimer\n"
    f"configure_reclaimer(c, token={RECLAIMER_TOKEN!r}, command=None)\n"
    'c.JupyterHub.spawner_class = "simple"\n'
    'c.Spawner.cmd = [{bin!r} + "/jupyterhub-singleuser"]\n'
    'c.Spawner.args = ["--allow-root"] if __import__("os").geteuid() == 0 else []\n'
    "c.Spawner.start_timeout = 90\n"
    "c.Spawner.http_timeout = 60\n"
    'c.SimpleLocalProcessSpawner.home_dir_template = "{dir}/home/{{username}}"\n'
)


def start_server(env: HubEnv, user: str) -> dict[str, Any]:
    """Start ``user``'s default server through the hub and wait until it is ready."""
    r = request("POST", f"{env.hub_api}/users/{user}/server", env.admin_api_token, {})
    assert r.status in (201, 202, 400), r.body  # 400: running already

    def ready() -> dict[str, Any] | None:
        model = request("GET", f"{env.hub_api}/users/{user}", env.admin_api_token).json()
        server = model["servers"].get("")  # type: ignore[index]
        return server if server and server["ready"] else None

    return wait_until(ready, what=f"{user}'s server to start", step=0.3)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubEnv]:
    """A real hub with alice's and bob's servers running (carol's starts in her test)."""
    tmp = tmp_path_factory.mktemp("reclaimer-hub")
    env = HubEnv(tmp, f"sqlite:///{tmp}/unused.sqlite", None, users=USERS, extra_config=HUB_EXTRA)
    try:
        env.start_hub()
        for user in ("alice", "bob"):
            start_server(env, user)
        yield env
    except BaseException:
        print(env.logs())
        raise
    finally:
        env.stop_hub()


class Pool:
    """The real pool service app on the test's loop (decisions in a thread of it), its store
    reading ``clock``; the hub authenticates every token."""

    def __init__(self, env: HubEnv, tmp: Path, clock: SecondsClock) -> None:
        from jupyterhub.services.auth import HubOAuth

        from jupyterhub_gpupool.service.app import PoolService

        self.env, self.clock = env, clock
        HubOAuth.clear_instance()  # a singleton: this hub's, not an earlier test's
        self.service = PoolService()
        self.service.initialize(
            [
                f"--db-url=sqlite:///{tmp}/pool.sqlite",
                f"--pool-config={write_pool(tmp, POOL)}",
                f"--port={env.service_port}",
                "--PoolService.decisions=thread",
                "--PoolService.reconcile_on_start=False",
            ]
        )
        self.service.store.clock = lambda: datetime.fromtimestamp(clock(), timezone.utc).replace(
            tzinfo=None
        )
        self.http: Any = None

    async def __aenter__(self) -> Pool:
        from tornado.httpserver import HTTPServer

        self.service.writer.start()
        self.http = HTTPServer(self.service.make_app())
        self.http.listen(self.env.service_port, "127.0.0.1")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.http.stop()
        await asyncio.to_thread(self.service.writer.stop)

    async def call(self, method: str, path: str, token: str, body: object = None) -> Any:
        """One request to this pool (from a thread: the pool serves on this loop)."""
        r = await asyncio.to_thread(request, method, f"{self.env.api}/{path}", token, body)
        assert r.status < 400, (method, path, r.status, r.body)
        return r.json()

    async def lease(self, user: str, server: str = "") -> dict[str, Any]:
        """An active h100 lease of ``user``'s server, as the spawner makes and binds it."""
        body = {"user": user, "server": server, "offer": "h100"}
        lease = await self.call("POST", "allocations", self.env.spawner_token, body)
        path = f"allocations/{lease['id']}/keepalive"
        return await self.call("POST", path, self.env.spawner_token, {})

    async def idle_samples(self, *leases: dict[str, Any]) -> None:
        """The leases' GPUs were idle just now (the node agent's report)."""
        samples = [
            {"gpu": lease["slots"][0]["gpu"], "ts": self.clock(), "util": 0.0, "memory_used_mib": 0}
            for lease in leases
        ]
        await self.call("POST", "nodes/n1/samples", self.env.agent_token, {"samples": samples})


@pytest.fixture
def clock() -> SecondsClock:
    return SecondsClock(time.time() + 3600)


@pytest.fixture
def hub_environment(hub: HubEnv, monkeypatch: pytest.MonkeyPatch) -> HubEnv:
    """The pool app in this process authenticates with the hub as the pool service does."""
    for key, value in hub.service_env().items():
        if key.startswith("JUPYTERHUB_"):
            monkeypatch.setenv(key, value)
    return hub


def make_reclaimer(
    env: HubEnv,
    clock: SecondsClock,
    *,
    token: str = RECLAIMER_TOKEN,
    hub_url: str | None = None,
    pool_url: str | None = None,
    proxy_url: str | None = None,
    page_size: int = 200,
    **kw: Any,
) -> Reclaimer:
    hub = HubClient(
        hub_url or env.hub_api,
        token,
        page_size=page_size,
        proxy_url=proxy_url or env.hub_url,
        timeout=5,
    )
    pool = PoolClient(pool_url or env.api + "/", token, timeout=5)
    kw.setdefault("interval", 30.0)
    return Reclaimer(pool, hub, clock=clock, sleep=clock.sleep, page_size=page_size, **kw)


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


# -- observing ---------------------------------------------------------------------------------


def test_a_round_pages_the_hub_and_reads_every_leased_server(hub_environment, tmp_path, clock):
    """Users come a page at a time (one per page here); each leased server's kernels and
    connections are read through the proxy with the reclaimer's token; a lease whose server
    the hub does not run is not observed, so the pool calls it stale."""
    env = hub_environment

    async def scenario(pool: Pool) -> None:
        async with pool:
            alice, bob = await pool.lease("alice"), await pool.lease("bob")
            gone = await pool.lease("carol")  # carol's server does not run
            kernel = await asyncio.to_thread(
                request, "POST", f"{env.hub_url}/user/alice/api/kernels", env.token("alice"), {}
            )
            assert kernel.status == 201, kernel.body
            await pool.idle_samples(alice, bob, gone)
            reclaimer = make_reclaimer(env, clock, page_size=1)
            assert len(await reclaimer.hub.users(state="active")) == 2  # two pages of one
            result = await reclaimer.run_once()
            assert result.result == "ok", result
            assert set(result.observed) == {alice["id"], bob["id"]}
            for lease in (alice, bob):
                seen = result.observed[lease["id"]]
                assert seen["kernel"]["state"] == "idle"
                assert seen["kernel"]["observed_at"] == clock()
                assert seen["presence"]["connections"] == 0
                # the hub's last_activity is not input: the reclaimer reports none of its own
                assert seen["presence"]["last_input"] is None
            assert result.observed[alice["id"]]["kernel"]["last_activity"] is not None
            assert result.observed[bob["id"]]["kernel"]["last_activity"] is None  # no kernels
            kinds = {d["lease"]: d["kind"] for d in result.decisions}
            assert kinds[gone["id"]] == "stale"
            assert kinds[alice["id"]] == kinds[bob["id"]] == "none"
            assert reclaimer.metrics.value("gpupool_reclaimer_stale_leases_total") == 1

    asyncio.run(scenario(Pool(env, tmp_path, clock)))


def test_the_reclaimers_reads_are_not_the_users_activity(hub_environment, tmp_path, clock):
    """Read at the address its spawner gave the pool, a server is observed without the proxy
    stamping the reads as activity (the hub copies the proxy's stamps into its users'
    ``last_activity``, which the idle culler and every admin read too). Through the proxy, as
    for a lease with no address, every round stamps it."""
    env = hub_environment

    def stamps() -> dict[str, str]:
        routes = env.proxy_routes()
        return {user: routes[f"/user/{user}"]["last_activity"] for user in ("alice", "bob")}

    async def scenario(pool: Pool) -> None:
        async with pool:
            alice, bob = await pool.lease("alice"), await pool.lease("bob")
            target = env.proxy_routes()["/user/alice"]["target"]
            path = f"allocations/{alice['id']}/server"
            answer = await pool.call(
                "PUT", path, env.spawner_token, {"url": f"{target}/user/alice"}
            )
            assert answer["server_url"] == f"{target}/user/alice/"
            await pool.idle_samples(alice, bob)
            reclaimer = make_reclaimer(env, clock)
            before = await asyncio.to_thread(stamps)
            for _ in range(3):
                await asyncio.sleep(0.05)  # the proxy stamps in ms: make a stamp visible
                result = await reclaimer.run_once()
                assert result.result == "ok", result
                assert result.observed[alice["id"]]["kernel"]["state"] == "idle"
                assert result.observed[bob["id"]]["kernel"]["state"] == "idle"
            after = await asyncio.to_thread(stamps)
            assert after["alice"] == before["alice"]  # read directly: never stamped
            assert after["bob"] > before["bob"]  # read through the proxy: stamped each round

    asyncio.run(scenario(Pool(env, tmp_path, clock)))


def test_only_the_spawner_says_where_a_server_listens(hub_environment, tmp_path, clock):
    """The reclaimer sends its token to the address: a user may not set it (403), bad
    addresses are refused with the field named, and setting it is audited."""
    env = hub_environment

    async def scenario(pool: Pool) -> None:
        async with pool:
            lease = await pool.lease("alice")
            url = f"{env.api}/allocations/{lease['id']}/server"
            mine = await asyncio.to_thread(
                request, "PUT", url, env.token("alice"), {"url": "http://evil.example/"}
            )
            assert mine.status == 403, mine.body
            # a wrong type or no server address: 422 with the field named
            for bad in ("ftp://x/", "http:///nohost", "http://h/?q", 7):
                r = await asyncio.to_thread(request, "PUT", url, env.spawner_token, {"url": bad})
                assert r.status == 422 and r.json()["error"]["field"] == "url", (bad, r.body)
            good = {"url": "http://10.0.0.7:8888/user/alice/"}
            r = await asyncio.to_thread(request, "PUT", url, env.spawner_token, good)
            assert r.status == 200, r.body
            events = await pool.call("GET", f"events?lease={lease['id']}", env.token("admin"))
            assert any(e["kind"] == "server-address" for e in events["items"]), events

    asyncio.run(scenario(Pool(env, tmp_path, clock)))


def test_server_requests_are_bounded_by_concurrency(hub_environment, tmp_path, clock):
    env = hub_environment

    async def scenario(pool: Pool) -> None:
        async with pool:
            await pool.lease("alice")
            await pool.lease("bob")
            for bound in (1, 3):
                reclaimer = make_reclaimer(env, clock, concurrency=bound)
                result = await reclaimer.run_once()
                assert len(result.observed) == 2
                assert 1 <= reclaimer.peak_in_flight <= bound

    asyncio.run(scenario(Pool(env, tmp_path, clock)))


def test_a_refused_token_reads_as_unknown_and_an_unreachable_server_as_nothing(
    hub_environment, tmp_path, clock
):
    """A token that may reach alice's server only: bob's kernels are ``unknown`` (never idle).
    A proxy nobody answers at: no kernel observation at all (the pool then sees it stale)."""
    env = hub_environment
    scopes = [
        "list:users",
        "read:servers",
        "servers",
        "access:servers!server=alice/",
        "custom:gpupool:reclaim",
    ]
    narrow = env.token("admin", scopes)

    async def scenario(pool: Pool) -> None:
        async with pool:
            alice, bob = await pool.lease("alice"), await pool.lease("bob")
            result = await make_reclaimer(env, clock, token=narrow).run_once()
            assert result.observed[alice["id"]]["kernel"]["state"] == "idle"
            assert result.observed[bob["id"]]["kernel"]["state"] == "unknown"
            reclaimer = make_reclaimer(env, clock, proxy_url=dead_url())
            result = await reclaimer.run_once()
            assert result.result == "ok"
            assert [o["kernel"] for o in result.observed.values()] == [None, None]
            assert {d["kind"] for d in result.decisions} == {"stale"}
            assert reclaimer.metrics.value("gpupool_reclaimer_errors_total", target="server") == 2

    asyncio.run(scenario(Pool(env, tmp_path, clock)))


def test_kernel_states():
    assert kernel_state([]) == ("idle", None)
    busy = [{"execution_state": "idle"}, {"execution_state": "busy"}]
    assert kernel_state(busy)[0] == "busy"
    assert kernel_state([{"execution_state": "starting"}])[0] == "idle"
    assert kernel_state([{"execution_state": "mystery"}])[0] == "unknown"
    assert kernel_state({"message": "not a list"}) == ("unknown", None)
    stamps = [{"execution_state": "idle", "last_activity": "2026-03-02T09:00:00.5Z"}]
    assert kernel_state(stamps) == ("idle", 1772442000.5)


# -- faults and the leader lock ----------------------------------------------------------------


def test_hub_or_pool_away_observes_posts_and_acts_on_nothing_and_backs_off(
    hub_environment, tmp_path, clock
):
    env = hub_environment

    async def scenario(pool: Pool) -> None:
        async with pool:
            await pool.lease("alice")
            cases = (({"hub_url": dead_url()}, "hub"), ({"pool_url": dead_url()}, "pool"))
            for broken, target in cases:
                delays: list[float] = []
                reclaimer = make_reclaimer(env, clock, backoff_max=200.0, **broken)

                async def sleep(seconds: float, delays: list[float] = delays) -> None:
                    delays.append(seconds)
                    await clock.sleep(seconds)

                reclaimer.sleep = sleep
                await reclaimer.run(rounds=5)
                assert delays == [60.0, 120.0, 200.0, 200.0]  # doubling from 30 s, capped
                assert (
                    reclaimer.metrics.value(
                        "gpupool_reclaimer_rounds_total", result=f"{target}_error"
                    )
                    == 5
                )
                assert reclaimer.metrics.value("gpupool_reclaimer_errors_total", target=target) == 5
                assert (
                    reclaimer.metrics.value("gpupool_reclaimer_decisions_total", kind="none") == 0
                )
            events = await pool.call("GET", "events?limit=1000", env.token("admin"))
            kinds = {e["kind"] for e in events["items"]}
            assert not {k for k in kinds if k.startswith("reclaim")} - {"reclaim-leader"}
            # the hub comes back: the next round works and the pause is the interval again
            reclaimer = make_reclaimer(env, clock)
            reclaimer.failures = 3
            assert (await reclaimer.run_once()).result == "ok"
            assert reclaimer.next_delay() == 30.0

    asyncio.run(scenario(Pool(env, tmp_path, clock)))


def test_only_the_leader_observes_and_acts(hub_environment, tmp_path, clock):
    env = hub_environment

    async def scenario(pool: Pool) -> None:
        async with pool:
            lease = await pool.lease("alice")
            first = make_reclaimer(env, clock, holder="replica-a")
            second = make_reclaimer(env, clock, holder="replica-b")
            assert (await first.run_once()).observed.keys() == {lease["id"]}
            other = await second.run_once()
            assert other.result == "not_leader" and other.observed == {} and other.decisions == []
            assert second.metrics.value("gpupool_reclaimer_leader") == 0
            assert second.next_delay() == 30.0  # not a failure: no backoff
            await first.close()  # gives the lead up
            assert (await second.run_once()).result == "ok"
            assert (await first.run_once()).result == "not_leader"

    asyncio.run(scenario(Pool(env, tmp_path, clock)))


# -- the hook ----------------------------------------------------------------------------------


def test_notify_hook_sync_async_and_raising(hub_environment, clock, caplog):
    env = hub_environment
    seen: list[tuple[str, str]] = []

    def sync_hook(event: str, lease: dict, decision: dict) -> None:
        seen.append((event, decision["lease"]))

    async def async_hook(event: str, lease: dict, decision: dict) -> None:
        await asyncio.sleep(0)
        seen.append((f"async-{event}", decision["lease"]))

    def broken_hook(event: str, lease: dict, decision: dict) -> None:
        raise RuntimeError("the mail relay is down")

    async def scenario() -> None:
        for hook in (sync_hook, async_hook, broken_hook):
            reclaimer = make_reclaimer(env, clock, notify_hook=hook)
            await reclaimer.notify("notice", {"id": "L1"}, {"lease": "L1", "kind": "notice"})
            if hook is broken_hook:
                assert reclaimer.metrics.value("gpupool_reclaimer_hook_errors_total") == 1

    asyncio.run(scenario())
    assert seen == [("notice", "L1"), ("async-notice", "L1")]
    assert "the mail relay is down" in caplog.text


def test_the_webhook_example_posts_each_event():
    """``hooks.webhook`` posts a readable line and the decision to a real HTTP endpoint."""
    import json

    from tornado import web
    from tornado.httpserver import HTTPServer

    from jupyterhub_gpupool.reclaim.hooks import webhook

    got: list[dict[str, Any]] = []

    class Endpoint(web.RequestHandler):
        def post(self) -> None:
            got.append(json.loads(self.request.body))

    async def scenario() -> None:
        port = free_port()
        server = HTTPServer(web.Application([(r"/hook", Endpoint)]))
        server.listen(port, "127.0.0.1")
        try:
            hook = webhook(f"http://127.0.0.1:{port}/hook")
            decision = {
                "lease": "L1",
                "user": "alice",
                "offer": "h100",
                "kind": "notice",
                "deadline": "2026-03-02T10:00:00Z",
                "reason": "idle for 1 h",
            }
            await hook("notice", {"id": "L1"}, decision)
        finally:
            server.stop()

    asyncio.run(scenario())
    assert got[0]["event"] == "notice" and got[0]["decision"]["lease"] == "L1"
    assert got[0]["text"].startswith("alice: your GPU (h100) will be reclaimed at 2026-03-02T10")


# -- acting ------------------------------------------------------------------------------------


def test_an_idle_lease_gets_a_notice_then_is_saved_stopped_and_released(
    hub_environment, tmp_path, clock
):
    """Carol's idle server: notice (the hook hears it), then the act: her open notebook is
    checkpointed (no save-all endpoint: the server answers 404), the hub stops the server, the
    pool releases the lease ``reclaimed-idle`` with the saved file in its audit event."""
    env = hub_environment
    server = start_server(env, "carol")
    carol = env.token("carol")
    base = f"{env.hub_url}{server['url']}api"
    notebook = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    r = request(
        "PUT", f"{base}/contents/work.ipynb", carol, {"type": "notebook", "content": notebook}
    )
    assert r.status in (200, 201), r.body
    session = {
        "path": "work.ipynb",
        "type": "notebook",
        "name": "work",
        "kernel": {"name": "python3"},
    }
    r = request("POST", f"{base}/sessions", carol, session)
    assert r.status == 201, r.body
    heard: list[tuple[str, str]] = []

    async def hook(event: str, lease: dict, decision: dict) -> None:
        heard.append((event, decision["kind"]))

    async def scenario(pool: Pool) -> None:
        async with pool:
            lease = await pool.lease("carol")
            reclaimer = make_reclaimer(env, clock, notify_hook=hook, stop_timeout=60)
            for _ in range(20):
                clock.advance(30)
                await pool.idle_samples(lease)
                result = await reclaimer.run_once()
                assert result.result == "ok"
                if result.outcomes:
                    break
            outcome = result.outcomes[lease["id"]]
            assert outcome.result == "done", outcome
            assert outcome.saved == ["work.ipynb"]
            admin = env.token("admin")
            after = await pool.call("GET", f"allocations/{lease['id']}", admin)
            assert after["state"] == "released" and after["release_reason"] == "reclaimed-idle"
            events = await pool.call("GET", "events?limit=1000", admin)
            done = [e for e in events["items"] if e["kind"] == "reclaimed"]
            assert done and done[-1]["data"]["saved"] == ["work.ipynb"]
            assert (
                reclaimer.metrics.value(
                    "gpupool_reclaimer_acts_total", action="stop", outcome="done"
                )
                == 1
            )

    asyncio.run(scenario(Pool(env, tmp_path, clock)))
    assert [e for e, _ in heard] == ["notice", "act", "done"]
    model = request("GET", f"{env.hub_api}/users/carol", env.admin_api_token).json()
    assert "" not in model["servers"]  # type: ignore[index]
    home = env.dir / "home" / "carol"
    assert (home / "work.ipynb").exists()
    assert list((home / ".ipynb_checkpoints").glob("work-*.ipynb"))


async def rounds_until_acted(pool: Pool, reclaimer: Reclaimer, lease: dict[str, Any]) -> Any:
    """Idle windows of 30 s, one round each, until the round's act is carried out."""
    for _ in range(20):
        clock = pool.clock
        clock.advance(30)  # type: ignore[attr-defined]
        await pool.idle_samples(lease)
        result = await reclaimer.run_once()
        assert result.result == "ok"
        if result.outcomes:
            return result.outcomes[lease["id"]]
    raise AssertionError("no act in 20 idle windows")


def test_release_gpu_restarts_the_server_without_a_gpu(hub_environment, tmp_path, clock):
    """The admin's policy says release-gpu: bob's server is stopped and started again with
    ``user_options {"gpupool_offer": ""}`` (CPU only); the lease goes back to the pool."""
    env = hub_environment
    admin = env.token("admin")

    async def scenario(pool: Pool) -> None:
        async with pool:
            policy = {"default": {**POLICY, "action": "release-gpu"}}
            await pool.call("PUT", "reclaim/policies", admin, policy)
            lease = await pool.lease("bob")
            reclaimer = make_reclaimer(env, clock, stop_timeout=60, start_timeout=90)
            outcome = await rounds_until_acted(pool, reclaimer, lease)
            assert outcome.result == "done" and outcome.detail == "", outcome
            after = await pool.call("GET", f"allocations/{lease['id']}", admin)
            assert after["release_reason"] == "reclaimed-idle"
            assert (
                reclaimer.metrics.value(
                    "gpupool_reclaimer_acts_total", action="release-gpu", outcome="done"
                )
                == 1
            )

    asyncio.run(scenario(Pool(env, tmp_path, clock)))
    server = request("GET", f"{env.hub_api}/users/bob", env.admin_api_token).json()["servers"][""]  # type: ignore[index]
    assert server["ready"] and server["user_options"] == {"gpupool_offer": ""}


@pytest.mark.parametrize(
    "who",
    [
        "reclaimer",
        "admin",
    ],
)
def test_a_shrink_whose_target_never_comes_fails_and_the_user_keeps_the_server(
    hub_environment, tmp_path, clock, who
):
    """Make-before-break: the target (a MIG slice whose instance nobody makes) is not ready
    within the bound, or is withdrawn: the action fails before anything was saved or stopped."""
    env = hub_environment
    token = RECLAIMER_TOKEN if who == "reclaimer" else env.token("admin")

    async def scenario(pool: Pool) -> None:
        async with pool:
            body = {"user": "alice", "server": "", "offer": "a100-1g"}
            target = await pool.call("POST", "allocations", env.spawner_token, body)
            assert target["state"] == "granted" and not target["ready"], target
            reclaimer = make_reclaimer(
                env, clock, token=token, shrink_timeout=0.5, poll_interval=0.1
            )
            server = await reclaimer.hub.server("alice")
            decision = {
                "lease": "unclaimed",
                "user": "alice",
                "server": "",
                "offer": "h100",
                "kind": "act",
                "action": "shrink:a100-1g",
                "target_lease": target["id"],
            }
            outcome = await reclaimer.act(decision, {}, server)
            assert outcome.result == "failed" and "not ready within" in outcome.detail
            assert outcome.saved == [] and "the user keeps the GPU" in outcome.detail
            path = f"allocations/{target['id']}?reason=cancelled"
            await pool.call("DELETE", path, env.spawner_token)
            outcome = await reclaimer.act(decision, {}, server)
            assert outcome.result == "failed" and "withdrawn" in outcome.detail
            assert server == await reclaimer.hub.server("alice")  # never stopped

    asyncio.run(scenario(Pool(env, tmp_path, clock)))


# -- the command -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["--bogus=1"], ["--interval"], ["--interval=soon"], ["--concurrency=0"], ["stray"]],
)
def test_bad_flags_exit_2_with_one_line(argv):
    done = subprocess.run(
        [sys.executable, "-m", "jupyterhub_gpupool.cli", "reclaimer", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "JUPYTERHUB_API_TOKEN": "x"},
    )
    assert done.returncode == 2, done
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("jupyterhub-gpupool reclaimer: error: ")


def test_help_and_hub_managed_defaults(monkeypatch):
    from jupyterhub_gpupool.reclaim.app import ReclaimerApp

    done = subprocess.run(
        [sys.executable, "-m", "jupyterhub_gpupool.cli", "reclaimer", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "--concurrency" in done.stdout
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "hub-given")
    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://10.0.0.1:8081/hub/api")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_NAME", "gpupool-reclaimer")
    monkeypatch.setenv("JUPYTERHUB_PUBLIC_HUB_URL", "https://hub.example.org/hub/")
    monkeypatch.delenv("GPUPOOL_RECLAIMER_TOKEN", raising=False)
    app = ReclaimerApp()
    app.initialize([])
    assert app.api_token == "hub-given"
    assert app.hub_api_url == "http://10.0.0.1:8081/hub/api"
    assert app.proxy_url == "https://hub.example.org"
    assert app.holder.startswith("gpupool-reclaimer@")
    assert app.api_url == "http://127.0.0.1:10101/services/gpupool/api/v1/"
    reclaimer = app.make_reclaimer()
    assert reclaimer.concurrency == 10 and reclaimer.interval == 30.0


def test_metrics_and_health_are_served_on_their_port(monkeypatch):
    from jupyterhub_gpupool.reclaim.app import ReclaimerApp

    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "x")
    app = ReclaimerApp()
    port = free_port()
    app.initialize([f"--metrics-port={port}", "--ReclaimerApp.health_stall_after=60"])
    reclaimer = app.make_reclaimer()
    reclaimer.metrics.rounds.labels(result="hub_error").inc()

    async def scenario() -> tuple[str, list]:
        server = app.start_metrics(reclaimer)
        base = f"http://127.0.0.1:{port}"
        try:
            r = await asyncio.to_thread(request, "GET", f"{base}/metrics")
            between = await asyncio.to_thread(request, "GET", f"{base}/health")
            # a round that began long ago and never ended: it hangs
            reclaimer.round_started = time.monotonic() - 120
            hung = await asyncio.to_thread(request, "GET", f"{base}/health")
            return r.body.decode(), [between, hung]
        finally:
            server.stop()

    text, (between, hung) = asyncio.run(scenario())
    assert 'gpupool_reclaimer_rounds_total{result="hub_error"} 1.0' in text
    assert "gpupool_reclaimer_backoff_seconds" in text
    assert between.status == 200 and between.json()["round"] == {"ok": True, "stalled_seconds": 0}
    assert hung.status == 503 and hung.json()["status"] == "unhealthy"
    assert hung.json()["round"]["stalled_seconds"] >= 120


def test_configure_hub_registers_the_reclaimer_with_its_scopes_only():
    from traitlets.config import Config

    from jupyterhub_gpupool.hubconfig import RECLAIMER_SCOPES, configure_hub

    c = Config()
    c.JupyterHub.port = 8123
    configure_hub(c, spawner_token="s")
    assert "gpupool-reclaimer" not in {s["name"] for s in c.JupyterHub.services}  # opt-in
    c = Config()
    c.JupyterHub.port = 8123
    configure_hub(c, spawner_token="s", reclaimer=True, reclaimer_args=["--interval=20"])
    service = next(s for s in c.JupyterHub.services if s["name"] == "gpupool-reclaimer")
    assert service["command"][-4:] == [
        "reclaimer",
        "--service-url=http://127.0.0.1:10101/services/gpupool/",
        "--proxy-url=http://127.0.0.1:8123",
        "--interval=20",
    ]
    role = next(r for r in c.JupyterHub.load_roles if r["name"] == "gpupool-reclaimer")
    assert role["services"] == ["gpupool-reclaimer"]
    assert (
        role["scopes"]
        == list(RECLAIMER_SCOPES)
        == [
            "list:users",
            "read:servers",
            "servers",
            "access:servers",
            "custom:gpupool:reclaim",
        ]
    )
