"""REST API v1 against the running service: the OpenAPI spec is the contract.

* ``test_fuzz_operation``: schemathesis draws requests from the spec (docs/source/_static/
  rest-api.yml), valid ones and ones that break it, for every operation, sends each with an
  admin's, the spawner's and a user's token, and checks that nothing answers 5xx, that every
  status is documented, that every body (2xx, and the error shape of 4xx) validates against the
  spec, and that the pool still answers afterwards.
* ``test_success_responses_match_spec``: the happy path of every operation, each 2xx body
  validated against its response schema.
* ``test_bad_input``: hand-written bad requests (malformed JSON, unknown fields, wrong types,
  unknown offers, users, leases and nodes, impossible resizes, bad quotas and query arguments,
  missing scopes): the right 4xx, with the right error code, field and message, and the pool,
  quotas and audit log unchanged after.
* ``test_quota_below_current_use_marks_leases_borrowed``, ``test_inventory_never_breaks_the_pool``.

One hub + proxy + pool service serves the module (module scope: starting a hub costs seconds),
started with ``reconcile_on_start=False`` (no real servers run, and reconciling would release
every lease at the first housekeeping pass). Tests never depend on each other's state: each puts
back the leases and quotas it changed.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.client import responses as REASONS
from pathlib import Path
from typing import Any

import openapi_schema_validator as osv
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, given, settings

from jupyterhub_gpupool.data import data_path
from jupyterhub_gpupool.poolconfig import gpu_uuid
from tests.fakes import HubEnv, Response, request, wait_past_deadline, wait_until

ROOT = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((ROOT / "docs" / "source" / "_static" / "rest-api.yml").read_text())
#: Examples per operation and caller, valid and invalid (raise them locally to fuzz harder).
FUZZ_EXAMPLES = int(os.environ.get("GPUPOOL_FUZZ_EXAMPLES", "20"))
FUZZ_NEGATIVE_EXAMPLES = int(os.environ.get("GPUPOOL_FUZZ_NEGATIVE_EXAMPLES", "8"))
USERS = ("admin", "alice", "bob", "carol", "dave", "erin")
ACTOR = "carol"  # the user of the bad-input cases
NOTHING = object()

pytestmark = pytest.mark.slow

# -- the spec ----------------------------------------------------------------------------------


def resolve(node: Any) -> Any:
    """Follow local ``$ref``s."""
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        node = SPEC
        for part in ref[2:].split("/"):
            node = node[part]
    return node


def schema_errors(schema: dict[str, Any], instance: Any) -> list[str]:
    """Messages of every way ``instance`` breaks ``schema`` (a schema of the spec)."""
    validator = osv.OAS30Validator(
        {**schema, "components": SPEC["components"]}, format_checker=osv.oas30_format_checker
    )
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<body>'}: {e.message}"
        for e in validator.iter_errors(instance)
    ]


ERROR_SCHEMA = {"$ref": "#/components/schemas/Error"}


def header(response: Response, name: str) -> str:
    """A response header, case-insensitively ('' when absent)."""
    return next((v for k, v in response.headers.items() if k.lower() == name.lower()), "")


def check_against_spec(method: str, path: str, response: Response) -> None:
    """The status is documented for the operation and the body validates against it."""
    op = SPEC["paths"][path][method.lower()]
    documented = op["responses"].get(str(response.status))
    assert documented is not None, (
        f"{method} {path} answered undocumented {response.status}: {response.body[:300]!r}"
    )
    media = header(response, "Content-Type").split(";")[0].strip()
    content = resolve(documented)["content"]
    assert media in content, f"{method} {path} {response.status} answered {media}"
    if media == "application/json":
        errors = schema_errors(content[media]["schema"], response.json())
        assert not errors, f"{method} {path} {response.status}: {errors}"


# -- the service -------------------------------------------------------------------------------


class Api:
    """Requests to the pool API with each caller's token."""

    def __init__(self, env: HubEnv) -> None:
        self.env = env
        self.tokens: dict[str, str | None] = {
            "spawner": env.spawner_token,
            "agent": env.agent_token,
            "anonymous": None,
            "forged": "0123456789abcdef0123456789abcdef",
        }
        self._gpus: dict[str, str] = {}

    def token(self, who: str) -> str | None:
        """``admin``, a user name, ``spawner``, ``agent``, ``anonymous`` or ``forged``."""
        if who not in self.tokens:
            self.tokens[who] = self.env.token(who)
        return self.tokens[who]

    def call(
        self, who: str, method: str, path: str, body: Any = NOTHING, raw: bytes | None = None
    ) -> Response:
        """One request; ``body`` is sent as JSON, ``raw`` as it is."""
        return request(
            method,
            f"{self.env.api}/{path}",
            self.token(who),
            None if body is NOTHING else body,
            raw=raw,
        )

    def ok(self, who: str, method: str, path: str, body: Any = NOTHING) -> Any:
        """A request that must succeed; its JSON body."""
        r = self.call(who, method, path, body)
        assert r.status in (200, 201), f"{method} {path}: {r.status} {r.body[:300]!r}"
        return r.json()

    def live_leases(self, user: str) -> list[dict[str, Any]]:
        """The user's leases that are not released."""
        page = self.ok("admin", "GET", f"allocations?user={user}&limit=1000")
        return [le for le in page["items"] if le["state"] != "released"]

    def release_all(self, user: str) -> None:
        """Release every lease of ``user`` (clean-up)."""
        for lease in self.live_leases(user):
            self.ok("spawner", "DELETE", f"allocations/{lease['id']}?reason=admin")

    def snapshot(self) -> dict[str, Any]:
        """What a refused request must not change: leases, pool, quotas, the audit log."""
        return {
            "leases": self.ok("admin", "GET", "allocations?limit=1000"),
            "pool": self.ok("admin", "GET", "pool"),
            "quota": self.ok("admin", "GET", f"quotas/users/{ACTOR}"),
            "events": self.ok("admin", "GET", "events?limit=1")["total"],
        }

    def gpu_of(self, node: str) -> str:
        """The uuid of the first GPU of ``node`` (looked up once)."""
        if node in self._gpus:
            return self._gpus[node]
        for cluster in self.ok("admin", "GET", "pool")["clusters"]:
            for n in cluster["nodes"]:
                if n["name"] == node:
                    self._gpus[node] = n["gpus"][0]["uuid"]
                    return self._gpus[node]
        raise AssertionError(f"no node {node}")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """One hub + pool service (demo pool, SQLite, reconcile off) for the module."""
    where = tmp_path_factory.mktemp("contract")
    # the demo pool, plus a second cluster an agent may report a node in
    pool = yaml.safe_load(Path(data_path("demo-pool.yaml")).read_text())
    pool["clusters"] = ["default", "edge"]
    (where / "pool.yaml").write_text(yaml.safe_dump(pool))
    env = HubEnv(where, f"sqlite:///{where}/pool.sqlite", str(where / "pool.yaml"), USERS)
    # decisions in the store process: every error shape crosses the process boundary too
    env.service_args = (
        "--PoolService.reconcile_on_start=False",
        "--PoolService.reconcile_interval=0",
        "--PoolService.check_user_servers=False",  # fuzzed server names are not the hub's
        "--PoolService.decisions=process",
    )
    with env.running():
        yield Api(env)


_servers = itertools.count()


def new_server() -> str:
    """A server name never used before in this module."""
    return f"contract{next(_servers)}"


# -- the happy path, validated -----------------------------------------------------------------


def kernels_round_trip(call: Any, user: str) -> None:
    """A GPU kernel's lease: asked for, listed, read, reported busy, released."""
    body = {"offer": "t4-quarter", "kernel_id": "contract-kernel"}
    kernel = call(user, "POST", "kernels", "/kernels", body).json()
    assert kernel["kernel_id"] == "contract-kernel" and kernel["server"] == "kernel:contract-kernel"
    assert [k["kernel_id"] for k in call(user, "GET", "kernels", "/kernels").json()["kernels"]] == [
        "contract-kernel"
    ]
    call(user, "GET", "kernels/contract-kernel", "/kernels/{id}")
    state = {"state": "busy"}
    call(user, "POST", "kernels/contract-kernel/activity", "/kernels/{id}/activity", state)
    done = call(user, "DELETE", "kernels/contract-kernel", "/kernels/{id}").json()
    assert done["state"] == "released"


def test_success_responses_match_spec(api: Api):
    """Every operation once with a request that succeeds; every body validates."""
    seen: set[tuple[str, str]] = set()

    def call(who: str, method: str, path: str, template: str, body: Any = NOTHING) -> Any:
        r = api.call(who, method, path, body)
        assert 200 <= r.status < 300, f"{method} {path}: {r.status} {r.body[:300]!r}"
        check_against_spec(method, template, r)
        seen.add((template, method))
        return r

    user = "dave"
    try:
        offers = call(user, "GET", "offers", "/offers").json()["items"]
        assert {o["name"] for o in offers} >= {"a100-1g", "h100", "t4-quarter"}
        assert all(o["quota_ok"] is True for o in offers)
        call("spawner", "GET", "offers?user=dave&group=physics", "/offers")
        r = call(user, "POST", "allocations", "/allocations", {"offer": "a100-1g"})
        assert r.status == 201
        lease = r.json()
        assert lease["state"] == "granted" and lease["user"] == user
        assert header(r, "Location").endswith(f"/allocations/{lease['id']}")
        lid = lease["id"]
        call(user, "GET", "allocations", "/allocations")
        call("spawner", "GET", "allocations?state=granted&limit=5", "/allocations")
        assert call(user, "GET", f"allocations/{lid}", "/allocations/{id}").json() == lease
        # dynamic MIG: the slice is made by the node's agent before the server can bind it
        assert lease["ready"] is False
        early = api.call(user, "POST", f"allocations/{lid}/keepalive", {})
        assert early.status == 409 and early.json()["error"]["code"] == "not_ready"
        gpu, start = lease["slots"][0]["gpu"], lease["slots"][0]["start"]
        inventory = {
            "cpu_milli": 64000,
            "memory_mib": 524288,
            "gpus": [
                {
                    "uuid": gpu_uuid("sim-a100", i),
                    "index": i,
                    "model": "NVIDIA A100-SXM4-80GB",
                    "memory_mib": 81920,
                    "mig": {"enabled": True, "dynamic": True, "instances": []},
                }
                for i in range(2)
            ],
        }
        call("agent", "PUT", "nodes/sim-a100/inventory", "/nodes/{name}/inventory", inventory)
        plan = call("agent", "GET", "nodes/sim-a100/mig-plan", "/nodes/{name}/mig-plan").json()
        create = {"op": "create", "gpu": gpu, "profile": "1g.10gb", "start": start}
        assert plan == {"node": "sim-a100", "actions": [create]}
        made = {**create, "ok": True, "error": None, "mig_uuid": "MIG-contract"}
        call(
            "agent",
            "POST",
            "nodes/sim-a100/mig-results",
            "/nodes/{name}/mig-results",
            {"results": [made]},
        )
        lease = call(user, "GET", f"allocations/{lid}", "/allocations/{id}").json()
        assert lease["ready"] is True and lease["slots"][0]["mig_uuid"] == "MIG-contract"
        # the node's agent says the pod got the device the pool chose: nothing moves
        same = call(
            "agent",
            "POST",
            f"allocations/{lid}/device",
            "/allocations/{id}/device",
            {"device": "MIG-contract"},
        ).json()
        assert same["slots"] == lease["slots"]
        active = call(user, "POST", f"allocations/{lid}/keepalive", "/allocations/{id}/keepalive")
        assert active.json()["state"] == "active"
        # the spawner says where the server listens; the server's lab reports input
        url = "http://10.0.0.7:8888/user/dave"
        where = call("spawner", "PUT", f"allocations/{lid}/server", "/allocations/{id}/server",
                     {"url": url}).json()  # fmt: skip
        assert where == {"lease": lid, "server_url": url + "/"}
        # input 10 min ago: the reclaim below still comes
        told = call(user, "POST", f"allocations/{lid}/presence", "/allocations/{id}/presence",
                    {"idle_for": 600}).json()  # fmt: skip
        assert told["source"] == "lab" and told["last_input"].endswith("Z")
        resized = call(
            user, "POST", f"allocations/{lid}/resize", "/allocations/{id}/resize", {"offer": "h100"}
        ).json()
        assert resized["resize_of"] == lid and resized["state"] == "granted"
        me = call(user, "GET", "users/me", "/users/{name}").json()
        assert {le["id"] for le in me["leases"]} == {lid, resized["id"]}
        nobody = call("admin", "GET", "users/nobody-at-all", "/users/{name}").json()
        assert nobody["leases"] == [] and nobody["quota"]["guarantee"] == 0.25

        assert "clusters" not in call(user, "GET", "pool", "/pool").json()
        assert "clusters" in call("admin", "GET", "pool", "/pool").json()
        samples = [
            {"gpu": gpu, "start": start, "ts": 1_700_000_000 + i, "util": None} for i in range(3)
        ]
        samples.append({"gpu": gpu, "ts": "2030-01-01T00:00:00Z", "util": 50.0})
        accepted = call(
            "agent",
            "POST",
            "nodes/sim-a100/samples",
            "/nodes/{name}/samples",
            {"samples": samples},
        ).json()
        assert accepted["accepted"] == 4 and accepted["mig_plan"] == []  # all made
        gone = {"op": "destroy", "gpu": gpu, "profile": "1g.10gb", "start": 6, "ok": True}
        recorded = call(
            "agent",
            "POST",
            "nodes/sim-a100/mig-results",
            "/nodes/{name}/mig-results",
            {"results": [{**gone, "error": None, "mig_uuid": None}]},
        ).json()
        assert recorded == {"accepted": 1}
        util = call(user, "GET", f"utilization?lease={lid}&since=0", "/utilization").json()
        assert util["lease"] == lid and len(util["samples"]) >= 3
        call("admin", "GET", "utilization?since=2020-01-01T00:00:00Z", "/utilization")
        # times at the ends of the calendar are clamped to it (the spec's date-times allow them)
        call("admin", "GET", "utilization?since=0001-01-01T00:00:00%2B01:00", "/utilization")
        early = call("admin", "GET", "usage?to=0001-01-05", "/usage").json()
        assert early["items"] == [] and early["to"].startswith("0002-01-0")

        quota = call("admin", "GET", f"quotas/users/{user}", "/quotas/{kind}/{name}").json()
        assert quota["source"] == "default"
        body = {"guarantee": 1, "limit": 2.5, "budget": 100, "period": "week", "exception": 4,
                "budget_action": "stop", "budget_minimum": 5}  # fmt: skip
        put = call("admin", "PUT", f"quotas/users/{user}", "/quotas/{kind}/{name}", body).json()
        assert put == {"name": user, "kind": "user", "source": "api", **body}
        call("admin", "PUT", "quotas/groups/physics", "/quotas/{kind}/{name}", whole(guarantee=2))
        patched = {"limit": 3}
        call("admin", "PATCH", "quotas/groups/physics", "/quotas/{kind}/{name}", patched)
        call("admin", "GET", "quotas/groups/physics", "/quotas/{kind}/{name}")
        reset = call("admin", "DELETE", f"quotas/users/{user}", "/quotas/{kind}/{name}").json()
        assert reset["source"] == "default"
        call("admin", "DELETE", "quotas/groups/physics", "/quotas/{kind}/{name}")

        # approvals: an exception beyond bob's limit, approved for less time; another denied
        call("admin", "PUT", "quotas/users/bob", QUOTA, whole(limit=0.5, exception=2))
        asks = []
        for server in ("", "second"):
            body = {"user": "bob", "server": server, "offer": "h100"}
            ask = {**body, "reason": "the deadline", "duration": 7200}
            r = call("spawner", "POST", "allocations", "/allocations", ask)
            assert r.status == 201 and r.json()["state"] == "awaiting_approval", r.body
            asks.append(r.json()["id"])
        path = "/allocations/{id}/approve"
        approved = call("admin", "POST", f"allocations/{asks[0]}/approve", path, {"duration": 3600})
        assert approved.json()["state"] in ("queued", "granted") and approved.json()["lapses"]
        again = api.call("admin", "POST", f"allocations/{asks[0]}/approve", {})
        check_against_spec("POST", path, again)
        assert again.status == 409 and again.json()["error"]["code"] == "not_awaiting_approval"
        path = "/allocations/{id}/deny"
        denied = call(
            "admin", "POST", f"allocations/{asks[1]}/deny", path, {"reason": "one is enough"}
        )
        assert denied.json()["release_reason"] == "denied"
        call("spawner", "DELETE", f"allocations/{asks[0]}", LEASE)
        call("admin", "DELETE", "quotas/users/bob", QUOTA)

        for action in ("cordon", "uncordon", "drain", "uncordon"):
            node = call(
                "admin", "POST", f"nodes/sim-t4/{action}", "/nodes/{name}/{action}", {}
            ).json()
            assert node["name"] == "sim-t4" and node["cordoned"] is (action == "cordon")
        inventory = {
            "cluster": "edge",
            "cpu_milli": 8000,
            "memory_mib": 32768,
            "labels": {"zone": "b"},
            "gpus": [{"uuid": "GPU-contract-0", "index": 0, "model": "NVIDIA L4"}],
        }
        node = call(
            "agent", "PUT", "nodes/contract-node/inventory", "/nodes/{name}/inventory", inventory
        ).json()
        assert node == {
            "name": "contract-node",
            "cluster": "edge",
            "cordoned": False,
            "draining": False,
            "unreachable": False,
            "gpus": 1,
            "source": "agent",
        }
        call(
            "agent", "PUT", "nodes/contract-node/inventory", "/nodes/{name}/inventory", {"gpus": []}
        )

        # a queued lease: both H100s taken (one by dave's resize), then a third asks
        h100 = {"user": "alice", "server": new_server(), "offer": "h100"}
        call("spawner", "POST", "allocations", "/allocations", h100)
        queued = call(
            "spawner", "POST", "allocations", "/allocations", {**h100, "server": new_server()}
        ).json()
        assert queued["state"] == "queued" and queued["position"] == 1
        released = call(
            "spawner", "DELETE", f"allocations/{queued['id']}", "/allocations/{id}"
        ).json()
        assert released["release_reason"] == "cancelled"

        usage = call("admin", "GET", "usage?by=offer&from=0", "/usage").json()
        assert {row["offer"] for row in usage["items"]} >= {"a100-1g"}
        csv = call("admin", "GET", "usage?format=csv&by=group", "/usage")
        assert csv.body.decode().splitlines()[0] == (
            "group,kind,leases,held_unit_hours,busy_unit_hours,estimated_busy_unit_hours,"
            "idle_unit_hours,idle_share,unpriced_unit_hours,cost"
        )
        call("admin", "GET", "usage/idle-holders?from=0&limit=5", "/usage/idle-holders")
        call("admin", "GET", "prices", "/prices")
        call("admin", "GET", "capacity?offer=a100-1g", "/capacity")
        # a what-if wants whole recorded days: today's requests up to the end of today
        tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).date().isoformat()
        body = {"days": 1, "until": tomorrow, "add": {"H100-80GB": 1}}
        side = call("admin", "POST", "capacity/what-if", "/capacity/what-if", body).json()
        assert side["offers"]["*"]["recorded"]["requests"] >= 1
        events = call("admin", "GET", f"events?lease={lid}&limit=2", "/events").json()
        assert [e["kind"] for e in events["items"]] == ["granted", "mig-created"]
        assert events["total"] == 4 and events["next_offset"] == 2  # + server-address
        assert call("admin", "GET", "events?limit=1", "/events").json()["next_offset"] == 1
        call("admin", "GET", f"events?user={user}", "/events")
        assert call("admin", "GET", "alerts", "/alerts").json()["total"] >= 0
        panel_round_trip(api, call, lease)
        reclaim_round_trip(api, call, lease)
        kernels_round_trip(call, user)
        # a restart needs a server the hub runs (its success: test_lab_server.py); here an
        # active lease has nothing to restart into, and the refusal is what the spec says
        restart = api.call(user, "POST", f"allocations/{lid}/restart", {})
        assert restart.status == 409 and restart.json()["error"]["code"] == "not_live"
        check_against_spec("POST", "/allocations/{id}/restart", restart)
        done = call(user, "DELETE", f"allocations/{lid}", "/allocations/{id}").json()
        assert done["state"] == "released" and done["release_reason"] == "stopped"
        jobs_round_trip(call)
    finally:
        for who in (user, "alice", "erin"):
            api.release_all(who)
    spec_ops = {
        (path, method.upper())
        for path, item in SPEC["paths"].items()
        for method in item
        if method != "parameters"
    }
    #: operations whose success needs more than this module's hub, and where it is tested
    elsewhere = {
        ("/allocations/{id}/restart", "POST"): "tests/integration/test_lab_server.py",
        # only nodes the service simulates itself (telemetry_source = sim)
        ("/nodes/{name}/gpus/{gpu}/simulated-fault", "POST"): (
            "tests/integration/test_alerts_service.py"
        ),
    }
    assert spec_ops - seen - set(elsewhere) == set(), "operations this test does not cover"


def jobs_round_trip(call: Any) -> None:
    """A job's life through the API: submitted, listed, started and reported by its runner
    (the agent's token), its output appended and read, its exit; a second one cancelled."""
    body = {"offer": "t4-quarter", "command": ["python", "train.py"], "name": "contract-job"}
    job = call("erin", "POST", "jobs", "/jobs", body).json()
    assert job["state"] == "granted" and job["name"] == "contract-job", job
    jid, node = job["id"], job["node"]
    assert [j["id"] for j in call("erin", "GET", "jobs", "/jobs").json()["jobs"]] == [jid]
    assert call("erin", "GET", f"jobs/{jid}", "/jobs/{id}").json()["id"] == jid
    runner = call("agent", "GET", f"nodes/{node}/jobs", "/nodes/{name}/jobs").json()
    assert jid in {j["id"] for j in runner["jobs"]}
    status = {"state": "running", "pid": 4242}
    assert (
        call("agent", "POST", f"jobs/{jid}/status", "/jobs/{id}/status", status).json()["state"]
        == "running"
    )
    appended = {"offset": 0, "data": "epoch 1\n"}
    call("agent", "POST", f"jobs/{jid}/logs", "/jobs/{id}/logs", appended)
    logs = call("erin", "GET", f"jobs/{jid}/logs?offset=0", "/jobs/{id}/logs").json()
    assert logs["data"] == "epoch 1\n"
    exited = {"state": "exited", "exit_code": 0}
    ended = call("agent", "POST", f"jobs/{jid}/status", "/jobs/{id}/status", exited).json()
    assert ended["state"] == "succeeded" and ended["exit_code"] == 0
    other = call("erin", "POST", "jobs", "/jobs", {**body, "name": "cancelled"}).json()
    cancelled = call("erin", "DELETE", f"jobs/{other['id']}", "/jobs/{id}").json()
    assert cancelled["state"] == "cancelled"


def panel_round_trip(api: Api, call: Any, lease: dict[str, Any]) -> None:
    """The admin panel's operations: the map and its history, reclaim now (a notice, an
    extension, then at once), a drain by a deadline, a re-partition previewed, asked for
    (waiting for ``lease``, which is in the way), listed and cancelled; the audit filters."""
    pool_map = call("admin", "GET", "pool/map", "/pool/map").json()
    assert lease["id"] in pool_map["leases"]
    history = call("admin", "GET", "pool/history?hours=2&step=600", "/pool/history").json()
    assert len(history["times"]) == len(history["used"]) == len(history["queued"])
    t4 = {"user": "alice", "server": new_server(), "offer": "t4-quarter"}
    held = call("spawner", "POST", "allocations", "/allocations", t4).json()
    api.ok("alice", "POST", f"allocations/{held['id']}/keepalive", {})
    noticed = call(
        "admin",
        "POST",
        f"allocations/{held['id']}/reclaim",
        "/allocations/{id}/reclaim",
        {"grace": 600, "reason": "contract"},
    ).json()
    assert noticed["state"] == "reclaiming" and noticed["reclaim"]["kind"] == "admin"
    later = call(
        "admin",
        "POST",
        f"allocations/{held['id']}/extend",
        "/allocations/{id}/extend",
        {"seconds": 60},
    ).json()
    assert later["reclaim"]["deadline"] > noticed["reclaim"]["deadline"]
    kept = call(
        "admin",
        "POST",
        f"allocations/{held['id']}/notice/cancel",
        "/allocations/{id}/notice/cancel",
        {"reason": "contract"},
    ).json()
    assert kept["state"] == "active" and kept["reclaim"] is None
    gone = call(
        "admin",
        "POST",
        f"allocations/{held['id']}/reclaim",
        "/allocations/{id}/reclaim",
        {"immediately": True},
    ).json()
    assert gone["release_reason"] == "admin"
    held = call("spawner", "POST", "allocations", "/allocations", {**t4, "server": new_server()})
    api.ok("alice", "POST", f"allocations/{held.json()['id']}/keepalive", {})
    drained = call(
        "admin",
        "POST",
        "nodes/sim-t4/drain",
        "/nodes/{name}/{action}",
        {"deadline": "2099-01-01T00:00:00Z"},
    ).json()
    assert drained["draining"] and drained["noticed"] == 1
    undrained = call("admin", "POST", "nodes/sim-t4/uncordon", "/nodes/{name}/{action}", {})
    assert undrained.json()["withdrawn"] == [held.json()["id"]]
    api.ok("admin", "DELETE", f"allocations/{held.json()['id']}?reason=admin")
    gpu = lease["slots"][0]["gpu"]
    whole = {"gpu": gpu, "layout": [{"profile": "7g.80gb", "start": 0}]}
    plan = call(
        "admin",
        "POST",
        "nodes/sim-a100/repartitions",
        "/nodes/{name}/repartitions",
        {**whole, "dry_run": True},
    ).json()
    assert plan["in_way"][0]["lease"] == lease["id"] and plan["method"] == "agent"
    rep = call(
        "admin", "POST", "nodes/sim-a100/repartitions", "/nodes/{name}/repartitions", whole
    ).json()
    assert rep["state"] == "waiting"
    listed = call("agent", "GET", "repartitions?node=sim-a100", "/repartitions").json()
    assert listed["items"][0]["id"] == rep["id"]
    cancelled = call("admin", "DELETE", f"repartitions/{rep['id']}", "/repartitions/{id}").json()
    assert cancelled["state"] == "cancelled"
    effect = call(
        "admin",
        "POST",
        "quotas/users/dave/preview",
        "/quotas/{kind}/{name}/preview",
        {"guarantee": 0},
    ).json()
    assert effect["kind"] == "user" and effect["quota"]["guarantee"] == 0 and effect["held"] > 0
    assert set(effect["become_borrowed"]) <= set(pool_map["leases"])
    kinds = call("admin", "GET", "events?kind=reclaim-notice&order=desc&from=0", "/events").json()
    assert {e["kind"] for e in kinds["items"]} == {"reclaim-notice"}


#: A reclaim policy that gives notice at once and acts at the next round (no grace at all).
AT_ONCE = {
    "idle_timeout": "1s",
    "pressure_idle_timeout": "1s",
    "cpu_busy_timeout": "1s",
    "warn_before": 0,
    "busy_grace": 0,
    "max_extensions": 0,
}


def reclaim_round_trip(api: Api, call: Any, lease: dict[str, Any]) -> None:
    """The reclaimer's operations on ``lease`` (an active MIG lease of dave's, whose GPU is
    idle): a policy override that acts at once, the lead, rounds (notice, then act) on samples
    the agent posts now, a failed outcome (dave keeps the lease), then everything put back."""
    lid, slot = lease["id"], lease["slots"][0]
    policies = call("admin", "GET", "reclaim/policies", "/reclaim/policies").json()
    assert policies["source"] in ("file", "default")
    body = {"default": AT_ONCE}
    put = call("admin", "PUT", "reclaim/policies", "/reclaim/policies", body).json()
    assert put["source"] == "api"
    try:
        lead = {"holder": "contract", "ttl": 60}
        call("admin", "POST", "reclaim/leader", "/reclaim/leader", lead)
        watched = call("admin", "GET", "reclaim/leases?limit=50", "/reclaim/leases").json()
        assert lid in {le["id"] for le in watched["items"]}
        kinds = []
        for _ in range(2):
            now = time.time()
            idle = {"gpu": slot["gpu"], "start": slot["start"], "util": None, "memory_used_mib": 8}
            samples = {"samples": [{**idle, "ts": now - 1}]}
            api.ok("agent", "POST", "nodes/sim-a100/samples", samples)
            seen = {
                "kernel": {"state": "idle", "last_activity": None, "observed_at": now},
                "presence": {"last_input": None, "connections": 0, "observed_at": now},
            }
            round_body = {
                "holder": "contract",
                "window": {"start": now - 30, "end": now},
                "observed": {lid: seen},
            }
            answer = call("admin", "POST", "reclaim/rounds", "/reclaim/rounds", round_body).json()
            kinds.append({d["lease"]: d["kind"] for d in answer["decisions"]}[lid])
            # the service's own clock: the next round comes after the notice's deadline
            wait_past_deadline(api.call("admin", "GET", f"allocations/{lid}").json())
        assert kinds == ["notice", "act"], kinds
        outcome = {"holder": "contract", "result": "failed", "saved": [], "detail": "contract"}
        kept = call(
            "admin",
            "POST",
            f"reclaim/leases/{lid}/outcome",
            "/reclaim/leases/{id}/outcome",
            outcome,
        ).json()
        assert kept["state"] == "active" and kept["reclaim"] is None
        call("admin", "DELETE", "reclaim/leader?holder=contract", "/reclaim/leader")
    finally:
        call("admin", "DELETE", "reclaim/policies", "/reclaim/policies")


def test_quota_below_current_use_marks_leases_borrowed(api: Api):
    user = "bob"
    try:
        api.ok("admin", "PUT", f"quotas/users/{user}", whole(guarantee=2, limit=2))
        small = api.ok("bob", "POST", "allocations", {"offer": "a100-1g", "server": "a"})
        big = api.ok("bob", "POST", "allocations", {"offer": "h100", "server": "b"})
        assert (small["borrowed"], big["borrowed"]) == (False, False)

        lowered = api.ok("admin", "PUT", f"quotas/users/{user}", whole(guarantee=0.5, limit=2))
        assert lowered["guarantee"] == 0.5
        after = {le["id"]: le for le in api.live_leases(user)}
        assert after[small["id"]]["state"] == after[big["id"]]["state"] == "granted"
        # the oldest lease (1/7 unit) still fits the new guarantee; the H100 no longer does
        assert after[small["id"]]["borrowed"] is False
        assert after[big["id"]]["borrowed"] is True
        assert api.ok("bob", "GET", "users/me")["held_units"] == pytest.approx(1 + 1 / 7)

        api.ok("admin", "PUT", f"quotas/users/{user}", whole(guarantee=2, limit=2))
        assert not any(le["borrowed"] for le in api.live_leases(user))
    finally:
        api.release_all(user)
        api.call("admin", "DELETE", f"quotas/users/{user}")


def test_a_preempting_jobs_notice_is_in_its_leases_map_entry(api: Api):
    """``GET pool/map``'s lease entry says its job's preemption notice (``preempting``: the
    job's ``notice_deadline`` and ``reason``) and validates against ``JobPreemption``; a lease
    whose job is not preempting says null. The job here follows an administrator's notice on
    its lease (the next housekeeping round gives it), the one preemption a request brings
    about in this pool."""
    user = "erin"
    body = {"offer": "t4-quarter", "command": ["python", "train.py"], "name": "contract-noticed"}
    job = api.ok(user, "POST", "jobs", body)
    other = api.ok("dave", "POST", "allocations", {"offer": "t4-quarter", "server": new_server()})
    try:
        api.ok("agent", "POST", f"jobs/{job['id']}/status", {"state": "running", "pid": 7})
        notice = {"grace": 600, "reason": "contract"}
        api.ok("admin", "POST", f"allocations/{job['lease_id']}/reclaim", notice)
        noticed = wait_until(
            lambda: (j := api.ok(user, "GET", f"jobs/{job['id']}"))["state"] == "preempting" and j,
            what="the job's notice (a housekeeping round)",
        )
        r = api.call("admin", "GET", "pool/map")
        check_against_spec("GET", "/pool/map", r)
        leases = r.json()["leases"]
        entry = leases[job["lease_id"]]
        assert entry["preempting"] == {
            "deadline": noticed["notice_deadline"],
            "reason": noticed["reason"],
        }
        assert entry["notice"]["kind"] == "admin"  # the lease's own, which the job follows
        assert leases[other["id"]]["preempting"] is None
    finally:
        api.call("agent", "POST", f"jobs/{job['id']}/status", {"state": "exited", "exit_code": 0})
        api.release_all(user)
        api.release_all("dave")


# -- bad input ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """One bad request and the error it must get."""

    id: str
    who: str
    method: str
    path: str  # {lease}: the case's lease; {t4}/{h100}: a GPU uuid of that node
    status: int
    code: str
    field: str | None = None
    body: Any = NOTHING
    raw: bytes | None = None
    setup: str | None = None  # lease, released, limited, others
    template: str | None = None  # the spec path (for the documented-status check)
    allowed: str | None = None  # for unknown_field: the spec schema whose fields are allowed
    bug: str | None = None  # a known handler bug makes this case fail (strict xfail)


BODY_ENDPOINTS = [
    # (id, who, method, path, spec path, setup)
    ("allocate", "carol", "POST", "allocations", "/allocations", None),
    ("resize", "carol", "POST", "allocations/{lease}/resize", "/allocations/{id}/resize", "lease"),
    (
        "keepalive",
        "carol",
        "POST",
        "allocations/{lease}/keepalive",
        "/allocations/{id}/keepalive",
        "lease",
    ),
    ("quota", "admin", "PUT", f"quotas/users/{ACTOR}", "/quotas/{kind}/{name}", None),
    ("cordon", "admin", "POST", "nodes/sim-t4/cordon", "/nodes/{name}/{action}", None),
    ("inventory", "agent", "PUT", "nodes/sim-t4/inventory", "/nodes/{name}/inventory", None),
    ("samples", "agent", "POST", "nodes/sim-t4/samples", "/nodes/{name}/samples", None),
    (
        "mig-results",
        "agent",
        "POST",
        "nodes/sim-a100/mig-results",
        "/nodes/{name}/mig-results",
        None,
    ),
]

ALLOWED_FIELDS = {
    "allocate": "AllocationRequest",
    "resize": "ResizeRequest",
    "keepalive": "EmptyBody",
    "quota": "QuotaUpdate",
    "cordon": "NodeActionRequest",  # the drain fields; cordon refuses them (invalid_field)
    "inventory": "Inventory",
    "samples": "SampleBatch",
    "mig-results": "MigResults",
}

CASES: list[Bad] = []
for name, who, method, path, template, setup in BODY_ENDPOINTS:
    CASES += [
        Bad(f"{name}-not-json", who, method, path, 400, "invalid_json", raw=b'{"offer": ',
            setup=setup, template=template),
        Bad(f"{name}-not-utf8", who, method, path, 400, "invalid_json", raw=b"\xff\xfe{}",
            setup=setup, template=template),
        Bad(f"{name}-not-object", who, method, path, 400, "invalid_json", body=["offer"],
            setup=setup, template=template),
        Bad(f"{name}-unknown-field", who, method, path, 422, "unknown_field", "zzz",
            body={"zzz": 1}, setup=setup, template=template, allowed=ALLOWED_FIELDS[name]),
    ]  # fmt: skip

ALLOC = "/allocations"
RESIZE = "/allocations/{id}/resize"
KEEP = "/allocations/{id}/keepalive"
LEASE = "/allocations/{id}"
QUOTA = "/quotas/{kind}/{name}"


def whole(**fields: Any) -> dict[str, Any]:
    """A whole quota for ``PUT`` (which requires every field): the given fields, and the
    defaults a partial ``PUT`` used to fill in."""
    return {"guarantee": 0, "limit": None, "budget": None, "period": "month", **fields}


INV = "/nodes/{name}/inventory"
SAMPLES = "/nodes/{name}/samples"
MIG_RESULTS = "/nodes/{name}/mig-results"
NODE = "/nodes/{name}/{action}"
T4_GPU = {"uuid": "{t4}", "model": "T4"}

# fmt: off
CASES += [
    # wrong types and missing fields (json_body)
    Bad("offer-not-string", "carol", "POST", "allocations", 422, "invalid_field", "offer",
        body={"offer": 5}, template=ALLOC),
    Bad("server-not-string", "carol", "POST", "allocations", 422, "invalid_field", "server",
        body={"offer": "a100-1g", "server": ["x"]}, template=ALLOC),
    Bad("group-not-string", "carol", "POST", "allocations", 422, "invalid_field", "group",
        body={"offer": "a100-1g", "group": 7}, template=ALLOC),
    Bad("groups-not-list", "spawner", "POST", "allocations", 422, "invalid_field", "groups",
        body={"user": ACTOR, "offer": "a100-1g", "groups": "physics"}, template=ALLOC),
    Bad("groups-not-strings", "spawner", "POST", "allocations", 422, "invalid_field", "groups",
        body={"user": ACTOR, "offer": "a100-1g", "groups": [1]}, template=ALLOC),
    Bad("priority-not-integer", "spawner", "POST", "allocations", 422, "invalid_field",
        "priority", body={"user": ACTOR, "offer": "a100-1g", "priority": "high"}, template=ALLOC),
    Bad("priority-boolean", "spawner", "POST", "allocations", 422, "invalid_field", "priority",
        body={"user": ACTOR, "offer": "a100-1g", "priority": True}, template=ALLOC),
    Bad("server-too-long", "carol", "POST", "allocations", 422, "invalid_field", "server",
        body={"offer": "a100-1g", "server": "s" * 256}, template=ALLOC, ),
    Bad("offer-missing", "carol", "POST", "allocations", 422, "missing_field", "offer",
        body={"server": "x"}, template=ALLOC),
    Bad("empty-body", "carol", "POST", "allocations", 422, "missing_field", "offer",
        raw=b"", template=ALLOC),
    Bad("user-missing-for-service", "spawner", "POST", "allocations", 422, "missing_field",
        "user", body={"offer": "a100-1g"}, template=ALLOC),
    Bad("resize-offer-missing", "carol", "POST", "allocations/{lease}/resize", 422,
        "missing_field", "offer", body={}, setup="lease", template=RESIZE),
    Bad("resize-offer-null", "carol", "POST", "allocations/{lease}/resize", 422,
        "invalid_field", "offer", body={"offer": None}, setup="lease", template=RESIZE),
    Bad("guarantee-string", "admin", "PUT", f"quotas/users/{ACTOR}", 422, "invalid_field",
        "guarantee", body=whole(guarantee='1'), template=QUOTA),
    Bad("guarantee-boolean", "admin", "PUT", f"quotas/users/{ACTOR}", 422, "invalid_field",
        "guarantee", body=whole(guarantee=True), template=QUOTA),
    Bad("guarantee-null", "admin", "PUT", f"quotas/users/{ACTOR}", 422, "invalid_field",
        "guarantee", body=whole(guarantee=None), template=QUOTA),
    Bad("limit-string", "admin", "PUT", f"quotas/users/{ACTOR}", 422, "invalid_field", "limit",
        body=whole(limit='2'), template=QUOTA),
    Bad("period-number", "admin", "PUT", f"quotas/users/{ACTOR}", 422, "invalid_field",
        "period", body=whole(period=7), template=QUOTA),
    Bad("gpus-not-list", "agent", "PUT", "nodes/sim-t4/inventory", 422, "invalid_field", "gpus",
        body={"gpus": {}}, template=INV),
    Bad("gpus-missing", "agent", "PUT", "nodes/sim-t4/inventory", 422, "missing_field", "gpus",
        body={"cluster": "x"}, template=INV),
    Bad("cpu-milli-float", "agent", "PUT", "nodes/sim-t4/inventory", 422, "invalid_field",
        "cpu_milli", body={"gpus": [T4_GPU], "cpu_milli": 1.5}, template=INV),
    Bad("labels-not-object", "agent", "PUT", "nodes/sim-t4/inventory", 422, "invalid_field",
        "labels", body={"gpus": [T4_GPU], "labels": ["a"]}, template=INV),
    Bad("gpu-not-object", "agent", "PUT", "nodes/sim-t4/inventory", 422, "invalid_field",
        "gpus[0]", body={"gpus": ["T4"]}, template=INV),
    Bad("gpu-unknown-field", "agent", "PUT", "nodes/sim-t4/inventory", 422, "invalid_field",
        "gpus[0].colour", body={"gpus": [{**T4_GPU, "colour": "red"}]}, template=INV),
    Bad("gpu-uuid-empty", "agent", "PUT", "nodes/sim-t4/inventory", 422, "invalid_field",
        "gpus[0].uuid", body={"gpus": [{"uuid": "", "model": "T4"}]}, template=INV),
    Bad("gpu-model-missing", "agent", "PUT", "nodes/sim-t4/inventory", 422, "invalid_field",
        "gpus[0].model", body={"gpus": [{"uuid": "{t4}"}]}, template=INV),
    Bad("gpu-memory-negative", "agent", "PUT", "nodes/sim-t4/inventory", 422, "invalid_field",
        "gpus[0].memory_mib", body={"gpus": [{**T4_GPU, "memory_mib": -1}]}, template=INV),
    Bad("gpu-sharing-unknown", "agent", "PUT", "nodes/sim-t4/inventory", 422, "invalid_field",
        "gpus[0].sharing", body={"gpus": [{**T4_GPU, "sharing": "mps"}]}, template=INV),
    Bad("gpu-index-string", "agent", "PUT", "nodes/sim-t4/inventory", 422, "invalid_field",
        "gpus[0].index", body={"gpus": [{**T4_GPU, "index": "0"}]}, template=INV),
    Bad("mig-layout-overlap", "agent", "PUT", "nodes/sim-a100/inventory", 422,
        "invalid_mig_layout", "start",
        body={"gpus": [{"uuid": "GPU-contract-mig", "model": "A100-80GB", "mig": {
            "enabled": True,
            "instances": [{"profile": "7g.80gb", "start": 0}, {"profile": "1g.10gb", "start": 0}],
        }}]}, template=INV),
    Bad("samples-not-list", "agent", "POST", "nodes/sim-t4/samples", 422, "invalid_field",
        "samples", body={"samples": "x"}, template=SAMPLES),
    Bad("sample-unknown-gpu", "agent", "POST", "nodes/sim-t4/samples", 422, "invalid_field",
        "samples[0].gpu", body={"samples": [{"gpu": "GPU-nope", "ts": 1}]}, template=SAMPLES),
    Bad("sample-gpu-other-node", "agent", "POST", "nodes/sim-t4/samples", 422, "invalid_field",
        "samples[0].gpu", body={"samples": [{"gpu": "{h100}", "ts": 1}]}, template=SAMPLES),
    Bad("sample-util-over-100", "agent", "POST", "nodes/sim-t4/samples", 422, "invalid_field",
        "samples[0].util", body={"samples": [{"gpu": "{t4}", "ts": 1, "util": 101}]},
        template=SAMPLES),
    Bad("sample-processes-negative", "agent", "POST", "nodes/sim-t4/samples", 422,
        "invalid_field", "samples[0].processes",
        body={"samples": [{"gpu": "{t4}", "ts": 1, "processes": -1}]}, template=SAMPLES),
    Bad("sample-ts-missing", "agent", "POST", "nodes/sim-t4/samples", 422, "invalid_field",
        "samples[0].ts", body={"samples": [{"gpu": "{t4}"}]}, template=SAMPLES),
    Bad("mig-result-op-unknown", "agent", "POST", "nodes/sim-t4/mig-results", 422,
        "invalid_field", "results[0].op", body={"results": [{"op": "resize"}]},
        template=MIG_RESULTS),
    Bad("mig-result-gpu-other-node", "agent", "POST", "nodes/sim-t4/mig-results", 422,
        "invalid_field", "results[0].gpu", body={"results": [
            {"op": "create", "gpu": "{h100}", "profile": "1g.10gb", "start": 0, "ok": True}]},
        template=MIG_RESULTS),
    Bad("mig-result-node-unknown", "agent", "POST", "nodes/contract-nowhere/mig-results", 404,
        "not_found", "name", body={"results": [
            {"op": "create", "gpu": "{t4}", "profile": "1g.10gb", "start": 0, "ok": True}]},
        template=MIG_RESULTS),
    Bad("user-reports-mig-results", "carol", "POST", "nodes/sim-t4/mig-results", 403,
        "forbidden", body={"results": []}, template=MIG_RESULTS),
    Bad("keepalive-with-field", "carol", "POST", "allocations/{lease}/keepalive", 422,
        "unknown_field", "offer", body={"offer": "h100"}, setup="lease", template=KEEP,
        allowed="EmptyBody"),
    # unknown offer, user, lease, node
    Bad("unknown-offer", "carol", "POST", "allocations", 422, "unknown_offer", "offer",
        body={"offer": "no-such-offer"}, template=ALLOC),
    Bad("resize-unknown-offer", "carol", "POST", "allocations/{lease}/resize", 422,
        "unknown_offer", "offer", body={"offer": "no-such-offer"}, setup="lease",
        template=RESIZE),
    Bad("other-users-quota", "carol", "GET", "users/bob", 403, "forbidden",
        template="/users/{name}"),
    Bad("unknown-user-for-user", "carol", "GET", "users/no-such-user", 403, "forbidden",
        template="/users/{name}"),
    Bad("allocate-for-other-user", "carol", "POST", "allocations", 403, "forbidden",
        body={"user": "no-such-user", "offer": "a100-1g"}, template=ALLOC),
    Bad("list-other-users-leases", "carol", "GET", "allocations?user=bob", 403, "forbidden",
        template=ALLOC),
    Bad("service-me", "spawner", "GET", "users/me", 404, "not_found", "name",
        template="/users/{name}"),
    Bad("get-unknown-lease", "spawner", "GET", "allocations/no-such-lease", 404, "not_found",
        "id", template=LEASE),
    Bad("release-unknown-lease", "spawner", "DELETE", "allocations/no-such-lease", 404,
        "not_found", "id", template=LEASE),
    Bad("resize-unknown-lease", "carol", "POST", "allocations/no-such-lease/resize", 404,
        "not_found", "id", body={"offer": "h100"}, template=RESIZE),
    Bad("keepalive-unknown-lease", "carol", "POST", "allocations/no-such-lease/keepalive", 404,
        "not_found", "id", body={}, template=KEEP),
    Bad("utilization-unknown-lease", "carol", "GET", "utilization?lease=no-such-lease", 404,
        "not_found", "lease", template="/utilization"),
    Bad("get-others-lease", "carol", "GET", "allocations/{lease}", 404, "not_found", "id",
        setup="others", template=LEASE),
    Bad("release-others-lease", "carol", "DELETE", "allocations/{lease}", 404, "not_found", "id",
        setup="others", template=LEASE),
    Bad("resize-others-lease", "carol", "POST", "allocations/{lease}/resize", 404, "not_found",
        "id", body={"offer": "h100"}, setup="others", template=RESIZE),
    Bad("utilization-others-lease", "carol", "GET", "utilization?lease={lease}", 404,
        "not_found", "lease", setup="others", template="/utilization"),
    Bad("cordon-unknown-node", "admin", "POST", "nodes/no-such-node/cordon", 404, "not_found",
        "name", body={}, template=NODE),
    Bad("unknown-node-action", "admin", "POST", "nodes/sim-t4/reboot", 404, "not_found",
        body={}),
    Bad("unknown-endpoint", "admin", "GET", "gpus", 404, "not_found"),
    Bad("method-not-allowed", "admin", "PATCH", "allocations", 405, "method_not_allowed",
        body={}),
    Bad("get-resize", "carol", "GET", "allocations/{lease}/resize", 405, "method_not_allowed",
        setup="lease"),
    Bad("delete-resize", "carol", "DELETE", "allocations/{lease}/resize", 405,
        "method_not_allowed", setup="lease"),
    Bad("delete-keepalive", "carol", "DELETE", "allocations/{lease}/keepalive", 405,
        "method_not_allowed", setup="lease"),
    # impossible requests
    Bad("resize-same-offer", "carol", "POST", "allocations/{lease}/resize", 422, "same_offer",
        "offer", body={"offer": "t4-quarter"}, setup="lease", template=RESIZE),
    Bad("resize-beyond-limit", "carol", "POST", "allocations/{lease}/resize", 422,
        "exceeds_limit", body={"offer": "h100"}, setup="limited", template=RESIZE),
    Bad("resize-released", "carol", "POST", "allocations/{lease}/resize", 409, "not_live", "id",
        body={"offer": "h100"}, setup="released", template=RESIZE),
    Bad("keepalive-released", "carol", "POST", "allocations/{lease}/keepalive", 409, "not_live",
        "id", body={}, setup="released", template=KEEP),
    Bad("allocate-twice", "carol", "POST", "allocations", 409, "already_allocated", "server",
        body={"offer": "a100-1g", "server": "{server}"}, setup="lease", template=ALLOC),
    Bad("allocate-beyond-limit", "carol", "POST", "allocations", 422, "exceeds_limit",
        body={"offer": "h100", "server": "other"}, setup="limited", template=ALLOC),
    Bad("charge-group-not-member", "carol", "POST", "allocations", 403, "not_in_group",
        body={"offer": "a100-1g", "group": "physics"}, template=ALLOC),
    Bad("user-sets-priority", "carol", "POST", "allocations", 403, "forbidden",
        body={"offer": "a100-1g", "priority": 100}, template=ALLOC),
    # quotas
    Bad("quota-guarantee-above-limit", "admin", "PUT", f"quotas/users/{ACTOR}", 422,
        "invalid_config", body=whole(guarantee=3, limit=1), template=QUOTA),
    Bad("quota-negative", "admin", "PUT", f"quotas/users/{ACTOR}", 422, "invalid_config",
        body=whole(guarantee=-1), template=QUOTA),
    Bad("quota-period-unknown", "admin", "PUT", f"quotas/users/{ACTOR}", 422, "invalid_config",
        body=whole(period='year'), template=QUOTA),
    Bad("quota-unknown-kind", "admin", "GET", "quotas/teams/x", 404, "not_found", "kind",
        template=QUOTA),
    Bad("quota-put-unknown-kind", "admin", "PUT", "quotas/teams/x", 404, "not_found", "kind",
        body=whole(guarantee=1), template=QUOTA),
    Bad("quota-infinity", "admin", "PUT", f"quotas/users/{ACTOR}", 400, "invalid_json",
        raw=b'{"guarantee": Infinity}', template=QUOTA, ),
    Bad("quota-nan", "admin", "PUT", f"quotas/users/{ACTOR}", 400, "invalid_json",
        raw=b'{"limit": NaN}', template=QUOTA, ),
    Bad("quota-put-partial", "admin", "PUT", f"quotas/users/{ACTOR}", 422, "missing_field",
        "limit", body={"guarantee": 1}, template=QUOTA),
    Bad("quota-patch-unknown-field", "admin", "PATCH", f"quotas/users/{ACTOR}", 422,
        "unknown_field", "cap", body={"cap": 1}, template=QUOTA),
    Bad("quota-patch-above-limit", "admin", "PATCH", f"quotas/users/{ACTOR}", 422,
        "invalid_config", body={"guarantee": 99}, template=QUOTA),
    Bad("quota-by-user", "carol", "PUT", f"quotas/users/{ACTOR}", 403, "forbidden",
        body=whole(guarantee=7), template=QUOTA),
    # release reasons
    Bad("release-reason-unknown", "spawner", "DELETE", "allocations/{lease}?reason=bored", 422,
        "invalid_reason", "reason", setup="lease", template=LEASE),
    Bad("release-reason-admin-by-user", "carol", "DELETE", "allocations/{lease}?reason=admin",
        403, "forbidden", setup="lease", template=LEASE),
    # query arguments
    Bad("limit-zero", "carol", "GET", "allocations?limit=0", 400, "invalid_argument", "limit",
        template=ALLOC),
    Bad("limit-too-big", "carol", "GET", "allocations?limit=1001", 400, "invalid_argument",
        "limit", template=ALLOC),
    Bad("offset-negative", "admin", "GET", "events?offset=-1", 400, "invalid_argument",
        "offset", template="/events"),
    Bad("offset-not-integer", "admin", "GET", "events?offset=abc", 400, "invalid_argument",
        "offset", template="/events"),
    Bad("state-unknown", "carol", "GET", "allocations?state=sleeping", 400, "invalid_state",
        "state", template=ALLOC),
    Bad("usage-format-unknown", "admin", "GET", "usage?format=xml", 400, "invalid_argument",
        "format", template="/usage"),
    Bad("usage-by-unknown", "admin", "GET", "usage?by=node", 400, "invalid_by", "by",
        template="/usage"),
    Bad("usage-range-reversed", "admin", "GET", "usage?from=2030-01-01&to=2020-01-01", 400,
        "invalid_range", "to", template="/usage"),
    Bad("usage-from-not-a-time", "admin", "GET", "usage?from=yesterday", 400,
        "invalid_argument", "from", template="/usage"),
    Bad("since-not-a-time", "admin", "GET", "utilization?since=soon", 400, "invalid_argument",
        "since", template="/utilization"),
    Bad("since-beyond-year-9999", "admin", "GET", "utilization?since=99999999999999999999", 400,
        "invalid_argument", "since", template="/utilization", ),
    Bad("utilization-all-by-user", "carol", "GET", "utilization", 403, "forbidden",
        template="/utilization"),
    # inventory the database cannot hold
    Bad("inventory-cpu-beyond-int", "agent", "PUT", "nodes/contract-big/inventory", 422,
        "invalid_field", "cpu_milli", body={"cpu_milli": 2**63, "gpus": []}, template=INV,
        ),
    Bad("inventory-duplicate-index", "agent", "PUT", "nodes/contract-dup/inventory", 422,
        "invalid_field", "gpus[1].index", body={"gpus": [
            {"uuid": "GPU-dupi-0", "index": 0, "model": "T4"},
            {"uuid": "GPU-dupi-1", "index": 0, "model": "T4"}]}, template=INV),
    Bad("inventory-duplicate-uuid", "agent", "PUT", "nodes/contract-dup/inventory", 422,
        "invalid_field", "gpus[1].uuid",
        body={"gpus": [{"uuid": "GPU-dup", "model": "T4"}, {"uuid": "GPU-dup", "model": "T4"}]},
        template=INV, ),
    Bad("inventory-uuid-of-other-node", "agent", "PUT", "nodes/contract-thief/inventory", 409,
        "gpu_elsewhere", "uuid", body={"gpus": [{"uuid": "{h100}", "model": "H100-80GB"}]},
        template=INV, ),
    # authentication and scopes
    Bad("no-token", "anonymous", "GET", "allocations", 401, "unauthorized", template=ALLOC),
    Bad("forged-token", "forged", "POST", "allocations", 401, "unauthorized",
        body={"offer": "a100-1g"}, template=ALLOC),
    Bad("agent-allocates", "agent", "POST", "allocations", 403, "forbidden",
        body={"user": ACTOR, "offer": "a100-1g"}, template=ALLOC),
    Bad("spawner-cordons", "spawner", "POST", "nodes/sim-t4/cordon", 403, "forbidden", body={},
        template=NODE),
    Bad("user-reports-inventory", "carol", "PUT", "nodes/sim-t4/inventory", 403, "forbidden",
        body={"gpus": []}, template=INV),
    Bad("user-reads-events", "carol", "GET", "events", 403, "forbidden", template="/events"),
]
# fmt: on


def _params() -> list[Any]:
    return [
        pytest.param(
            case,
            id=case.id,
            marks=[pytest.mark.xfail(strict=True, reason=case.bug)] if case.bug else [],
        )
        for case in CASES
    ]


@pytest.fixture
def prepared(api: Api, request: pytest.FixtureRequest) -> Iterator[tuple[Bad, dict[str, str]]]:
    """The case's lease (and quota) set up, and everything it changed put back afterwards."""
    case: Bad = request.param
    server = new_server()
    values = {"server": server, "t4": api.gpu_of("sim-t4"), "h100": api.gpu_of("sim-h100")}
    owner = "bob" if case.setup == "others" else ACTOR
    try:
        if case.setup == "limited":
            api.ok("admin", "PUT", f"quotas/users/{ACTOR}", whole(guarantee=0, limit=0.5))
        if case.setup is not None:
            offer = "a100-1g" if case.setup == "limited" else "t4-quarter"
            body = {"user": owner, "server": server, "offer": offer}
            values["lease"] = api.ok("spawner", "POST", "allocations", body)["id"]
        if case.setup == "released":
            api.ok("spawner", "DELETE", f"allocations/{values['lease']}")
        yield case, values
    finally:
        api.release_all(ACTOR)
        if case.setup == "others":
            api.release_all("bob")
        api.call("admin", "DELETE", f"quotas/users/{ACTOR}")
        if case.path.startswith("nodes/sim-t4/"):
            api.call("admin", "POST", "nodes/sim-t4/uncordon", {})


def _fill(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, str):
        for key, sub in values.items():
            value = value.replace("{" + key + "}", sub)
        return value
    if isinstance(value, list):
        return [_fill(v, values) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    return value


def _send(api: Api, case: Bad, values: dict[str, str]) -> Response:
    body = case.body if case.body is NOTHING else _fill(case.body, values)
    return api.call(case.who, case.method, _fill(case.path, values), body, raw=case.raw)


@pytest.mark.parametrize("prepared", _params(), indirect=True)
def test_bad_input(api: Api, prepared: tuple[Bad, dict]):
    """The right 4xx, an error body naming the problem, and nothing changed."""
    case, values = prepared
    before = api.snapshot()
    r = _send(api, case, values)
    assert r.status == case.status, f"{r.status} {r.body[:400]!r}"
    assert header(r, "Content-Type").startswith("application/json")
    errors = schema_errors(ERROR_SCHEMA, r.json())
    assert not errors, errors
    if case.template is not None:
        check_against_spec(case.method, case.template, r)
    error = r.json()["error"]
    assert error["code"] == case.code, error
    if case.field is not None:
        assert error.get("field") == case.field, error
    if r.status != 405:  # tornado's own 405 says just "Method Not Allowed"
        # a message for humans about this request, not the bare reason phrase of the status
        assert error["message"] != REASONS[r.status], error
    if case.allowed is not None:
        schema = SPEC["components"]["schemas"][case.allowed]
        assert error["allowed"] == sorted(schema.get("properties", {})), error
    assert api.snapshot() == before, "a refused request changed the pool"


def drop_node_rows(api: Api, node: str) -> None:
    """Delete a node straight from the database: the API cannot while such a bug has the pool
    stuck. The store rebuilds its allocator from the rows at its next transaction."""
    with closing(sqlite3.connect(api.env.db_url.removeprefix("sqlite:///"))) as db, db:
        gpus = [(row[0],) for row in db.execute(GPUS_OF_NODE, (node,))]
        db.executemany("DELETE FROM mig_instances WHERE gpu_id = ?", gpus)
        db.executemany("DELETE FROM gpus WHERE id = ?", gpus)
        db.execute("DELETE FROM nodes WHERE name = ?", (node,))


GPUS_OF_NODE = "SELECT gpus.id FROM gpus JOIN nodes ON gpus.node_id = nodes.id WHERE nodes.name = ?"


@pytest.fixture
def scratch_node(api: Api) -> Iterator[str]:
    """A node name; the node is gone afterwards and the pool answers again."""
    yield "contract-scratch"
    drop_node_rows(api, "contract-scratch")
    api.ok("admin", "GET", "pool")


@pytest.mark.parametrize(
    "gpu",
    [
        pytest.param(
            {"uuid": "GPU-ws-0", "model": "\tNew GPU"},
            id="model-with-whitespace",
        ),
        pytest.param(
            {
                "uuid": "GPU-mig-off-0",
                "model": "A100-80GB",
                "mig": {"enabled": False, "instances": [{"profile": "1g.10gb", "start": 0}]},
            },
            id="mig-instances-with-mig-off",
        ),
        pytest.param(
            {"uuid": "GPU-mig-t4-0", "model": "T4", "mig": {"enabled": True}},
            id="mig-on-a-gpu-without-mig",
        ),
    ],
)
def test_inventory_never_breaks_the_pool(api: Api, scratch_node: str, gpu: dict):
    """An agent's report is accepted whole or refused with a 422; the pool answers either way."""
    r = api.call("agent", "PUT", f"nodes/{scratch_node}/inventory", {"gpus": [gpu]})
    assert r.status in (200, 422), r.body
    pool = api.call("admin", "GET", "pool")
    assert pool.status == 200, pool.body
    assert api.call("alice", "GET", "offers").status == 200


# -- fuzzing from the spec ---------------------------------------------------------------------

CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
]
SCHEMA = schemathesis.openapi.from_dict(SPEC)
OPERATIONS = {op.label: op for op in (r.ok() for r in SCHEMA.get_all_operations())}


@pytest.mark.parametrize("label", sorted(OPERATIONS))
@pytest.mark.parametrize("who", ["admin", "spawner", "alice"])
def test_fuzz_operation(api: Api, label: str, who: str):
    """Requests drawn from the spec (valid ones, then ones that break it): no 5xx, every status
    documented, every body valid against its schema; the pool still answers afterwards."""
    operation = OPERATIONS[label]
    token = api.token(who)

    def check(case: Any) -> None:
        response = case.call(base_url=api.env.api, headers={"Authorization": f"token {token}"})
        case.validate_response(response, checks=CHECKS)
        if 400 <= response.status_code < 500:
            errors = schema_errors(ERROR_SCHEMA, response.json())
            assert not errors, f"{response.status_code} {response.text[:300]}: {errors}"

    modes = [
        (schemathesis.GenerationMode.POSITIVE, FUZZ_EXAMPLES),
        (schemathesis.GenerationMode.NEGATIVE, FUZZ_NEGATIVE_EXAMPLES),
    ]
    try:
        for mode, examples in modes:
            if not examples:
                continue

            @settings(FUZZ_SETTINGS, max_examples=examples)
            @given(case=operation.as_strategy(generation_mode=mode))
            def fuzz(case: Any) -> None:
                check(case)

            fuzz()
        # no request of this operation may leave the pool unable to answer
        assert api.call("admin", "GET", "pool").status == 200, "the pool no longer answers"
    finally:
        api.release_all("alice")


FUZZ_SETTINGS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
