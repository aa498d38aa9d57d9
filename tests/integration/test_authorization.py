"""The authorization matrix against a real JupyterHub: who may call which endpoint.

One hub + proxy + pool service (the reference config of ``hubenv.HUB_CONFIG``) serves the whole
module. Every cell of ``MATRIX`` is one request through the proxy with one caller's real hub
token; cells that use a lease get a fresh lease of alice's first, and the leases and node flags a
cell changed are put back after it. ``test_authorization_matrix`` then fails once, listing every
mismatching cell with the whole observed matrix.

The module builds its ``HubEnv`` itself (module scope: starting a hub costs seconds) and starts
the service with ``reconcile_on_start=False``: otherwise the service, seeing that none of the
test's servers run in the hub, releases every lease at its first housekeeping pass.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from jupyterhub_gpupool.data import data_path
from jupyterhub_gpupool.poolconfig import gpu_uuid
from tests.fakes import HubEnv, request

#: Callers, in the matrix's column order. ``alice_srv``/``bob_srv``: tokens with exactly the hub's
#: ``server`` role; ``no_scope``: alice's token holding no pool scope at all.
COLUMNS = ("anon", "alice", "bob", "alice_srv", "bob_srv", "no_scope", "spawner", "agent", "admin")

# The expected status of every endpoint × caller, as the scopes say. "{id}" is a fresh
# lease of alice's; words after the path name a variant of the request (see _body).
# fmt: off
MATRIX: list[tuple[str, int, int, int, int, int, int, int, int, int]] = [
    # request                                 anon alice   bob a_srv b_srv no_sc spawn agent admin
    ("GET offers",                             401,  200,  200,  200,  200,  403,  200,  403,  200),
    ("GET offers?user=alice",                  401,  200,  403,  200,  403,  403,  200,  403,  200),
    ("POST allocations",                       401,  201,  403,  201,  403,  403,  201,  403,  201),
    ("POST allocations +priority",             401,  403,  403,  403,  403,  403,  201,  403,  201),
    ("GET allocations",                        401,  200,  200,  200,  200,  403,  200,  403,  200),
    ("GET allocations?user=alice",             401,  200,  403,  200,  403,  403,  200,  403,  200),
    ("GET allocations/{id}",                   401,  200,  404,  200,  404,  403,  200,  403,  200),
    ("DELETE allocations/{id}",                401,  200,  404,  200,  404,  403,  200,  403,  200),
    ("DELETE allocations/{id}?reason=admin",   401,  403,  404,  403,  404,  403,  200,  403,  200),
    ("POST allocations/{id}/resize",           401,  201,  404,  201,  404,  403,  201,  403,  201),
    ("POST allocations/{id}/keepalive",        401,  200,  404,  200,  404,  403,  200,  403,  200),
    # the device a server really got: agents and spawners; a device not in the pool is 422
    ("POST allocations/{id}/device",           401,  403,  403,  403,  403,  403,  422,  422,  422),
    # the lab's restart into a reserved lease: allowed, then refused for a server not running
    ("POST allocations/{id}/restart",          401,  422,  404,  422,  404,  403,  422,  403,  422),
    ("GET users/alice",                        401,  200,  403,  200,  403,  403,  200,  403,  200),
    ("GET users/me",                           401,  200,  200,  200,  200,  403,  404,  404,  200),
    ("GET pool",                               401,  200,  200,  200,  200,  403,  200,  200,  200),
    ("GET utilization?lease={id}",             401,  200,  404,  200,  404,  403,  200,  403,  200),
    ("GET utilization",                        401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("GET quotas/users/alice",                 401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("PUT quotas/users/alice",                 401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("PATCH quotas/users/alice",               401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("POST nodes/sim-h100/cordon",             401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("POST nodes/sim-h100/uncordon",           401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("POST nodes/sim-h100/drain",              401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("PUT nodes/authz-node/inventory",         401,  403,  403,  403,  403,  403,  403,  200,  200),
    ("POST nodes/authz-node/samples",          401,  403,  403,  403,  403,  403,  403,  200,  200),
    ("GET nodes/sim-a100/mig-plan",            401,  403,  403,  403,  403,  403,  403,  200,  200),
    ("POST nodes/sim-a100/mig-results",        401,  403,  403,  403,  403,  403,  403,  200,  200),
    ("GET usage",                              401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("GET usage/idle-holders",                 401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("GET prices",                             401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("GET capacity",                           401,  403,  403,  403,  403,  403,  403,  403,  200),
    # a what-if wants whole recorded days: today's hub has none (400 days, past the scopes)
    ("POST capacity/what-if",                  401,  403,  403,  403,  403,  403,  403,  403,  400),
    ("GET events",                             401,  403,  403,  403,  403,  403,  403,  403,  200),
    # the admin panel's actions (a fresh lease is a grant: reclaim releases it at once)
    ("POST allocations/{id}/reclaim",          401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("POST allocations/{id}/extend",           401,  403,  403,  403,  403,  403,  403,  403,  409),
    ("POST nodes/sim-h100/drain +deadline",    401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("POST nodes/sim-a100/repartitions",       401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("GET repartitions",                       401,  403,  403,  403,  403,  403,  403,  200,  200),
    ("DELETE repartitions/999999",             401,  403,  403,  403,  403,  403,  403,  403,  404),
    ("GET pool/map",                           401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("GET pool/history",                       401,  403,  403,  403,  403,  403,  403,  403,  200),
    # the reclaimer's endpoints: custom:gpupool:reclaim, which admin includes
    ("GET reclaim/leases",                     401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("POST reclaim/leader",                    401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("POST reclaim/rounds",                    401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("POST reclaim/leases/{id}/outcome",       401,  403,  403,  403,  403,  403,  403,  403,  409),
    ("DELETE reclaim/leader?holder=authz",     401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("GET reclaim/policies",                   401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("PUT reclaim/policies",                   401,  403,  403,  403,  403,  403,  403,  403,  200),
    ("DELETE reclaim/policies",                401,  403,  403,  403,  403,  403,  403,  403,  200),
    # jobs: "{job}" is a fresh granted job of alice's; the runner's side is the agent's
    ("POST jobs",                              401,  201,  403,  201,  403,  403,  201,  403,  201),
    ("GET jobs",                               401,  200,  200,  200,  200,  403,  200,  403,  200),
    ("GET jobs?user=alice",                    401,  200,  403,  200,  403,  403,  200,  403,  200),
    ("GET jobs/{job}",                         401,  200,  404,  200,  404,  403,  200,  403,  200),
    ("DELETE jobs/{job}",                      401,  200,  404,  200,  404,  403,  200,  403,  200),
    ("GET jobs/{job}/logs",                    401,  200,  404,  200,  404,  403,  200,  200,  200),
    ("POST jobs/{job}/logs",                   401,  403,  403,  403,  403,  403,  403,  200,  200),
    ("POST jobs/{job}/status",                 401,  403,  403,  403,  403,  403,  403,  200,  200),
    ("GET nodes/sim-a100/jobs",                401,  403,  403,  403,  403,  403,  403,  200,  200),
    # GPU kernels: "{kernel}" is a fresh granted kernel lease of alice's; her server asks
    ("POST kernels",                           401,  201,  403,  201,  403,  403,  201,  403,  201),
    ("GET kernels",                            401,  200,  200,  200,  200,  403,  200,  403,  200),
    ("GET kernels/{kernel}",                   401,  200,  404,  200,  404,  403,  200,  403,  200),
    ("DELETE kernels/{kernel}",                401,  200,  404,  200,  404,  403,  200,  403,  200),
    ("POST kernels/{kernel}/activity",         401,  200,  404,  200,  404,  403,  200,  403,  200),
]
# fmt: on

#: Cells where the handlers disagree with the design and a fix is pending: none today. A cell
#: listed here is reported as ``got~want`` and left out of the pass/fail summary.
KNOWN_BUGS: dict[tuple[str, str], str] = {}

EXPECTED: dict[tuple[str, str], int] = {
    (row[0], col): status for row in MATRIX for col, status in zip(COLUMNS, row[1:], strict=True)
}

#: Bodies of the requests that take one (the variant after " +" adds to it).
BODIES: dict[str, object] = {
    "POST capacity/what-if": {"days": 1},
    "POST allocations": {"user": "alice", "offer": "t4-quarter"},
    "POST allocations/{id}/resize": {"offer": "a100-1g"},
    "POST allocations/{id}/keepalive": {},
    "POST allocations/{id}/device": {"device": "GPU-not-in-the-pool"},
    "POST allocations/{id}/restart": {},
    "PUT quotas/users/alice": {"guarantee": 0, "limit": 2, "budget": None, "period": "month"},
    "PATCH quotas/users/alice": {"limit": 2},
    "POST nodes/sim-h100/cordon": {},
    "POST nodes/sim-h100/uncordon": {},
    "POST nodes/sim-h100/drain": {},
    "PUT nodes/authz-node/inventory": {
        "gpus": [{"uuid": "GPU-authz-0", "model": "T4", "memory_mib": 15360}]
    },
    "POST nodes/authz-node/samples": {"samples": []},
    "POST nodes/sim-a100/mig-results": {"results": []},
    "POST allocations/{id}/extend": {"seconds": 60},
    # a dry run: the plan of making the first A100 one 7g.80gb instance
    "POST nodes/sim-a100/repartitions": {
        "gpu": gpu_uuid("sim-a100", 0),
        "layout": [{"profile": "7g.80gb", "start": 0}],
        "dry_run": True,
    },
    "POST reclaim/leader": {"holder": "authz"},
    "POST reclaim/rounds": {"holder": "authz", "window": {"start": 1, "end": 2}},
    "POST reclaim/leases/{id}/outcome": {"holder": "authz", "result": "done"},
    "PUT reclaim/policies": {"default": {"idle_timeout": "2h"}},
    "POST jobs": {"user": "alice", "offer": "t4-quarter", "command": ["python", "train.py"]},
    "POST jobs/{job}/logs": {"offset": 0, "data": "epoch 1\n"},
    "POST jobs/{job}/status": {"state": "running", "pid": 4242},
    "POST kernels": {"user": "alice", "offer": "t4-quarter", "kernel_id": "authz-kernel"},
    "POST kernels/{kernel}/activity": {"state": "busy"},
}


@dataclass(frozen=True)
class Outcome:
    """What a cell answered: the status and, for errors, the JSON error code."""

    status: int
    code: str | None = None

    def __str__(self) -> str:
        return f"{self.status}" + (f" ({self.code})" if self.code else "")


def _outcome(status: int, body: bytes) -> Outcome:
    if status < 400:
        return Outcome(status)
    try:
        return Outcome(status, json.loads(body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return Outcome(status, "<not a JSON error body>")


_servers = itertools.count()


def _server() -> str:
    """A server name never used before in this module."""
    return f"nb{next(_servers)}"


def _call(hub: HubEnv, method: str, path: str, token: str | None, body: object = None):
    """One request through the proxy, as browsers and servers reach the pool."""
    return request(method, f"{hub.proxied_api}/{path}", token, body)


def _admin(hub: HubEnv) -> str:
    return hub.user_tokens.setdefault("admin", hub.token("admin"))


def _leases(hub: HubEnv, user: str = "alice") -> list[dict]:
    """A user's leases that are not released yet."""
    r = _call(hub, "GET", f"allocations?user={user}&limit=1000", _admin(hub))
    assert r.status == 200, r.body
    return [le for le in r.json()["items"] if le["state"] != "released"]


def _new_lease(hub: HubEnv) -> str:
    """A fresh granted lease of alice's (a quarter of the T4)."""
    body = {"user": "alice", "server": _server(), "offer": "t4-quarter"}
    r = _call(hub, "POST", "allocations", hub.spawner_token, body)
    assert r.status == 201 and r.json()["state"] == "granted", r.body
    return r.json()["id"]


def _new_job(hub: HubEnv) -> str:
    """A fresh granted job of alice's (on a quarter of the T4)."""
    body = {"user": "alice", "offer": "t4-quarter", "command": ["sleep", "1"]}
    r = _call(hub, "POST", "jobs", hub.spawner_token, body)
    assert r.status == 201 and r.json()["state"] == "granted", r.body
    return r.json()["id"]


def _new_kernel(hub: HubEnv) -> str:
    """A fresh granted kernel lease of alice's (on a quarter of the T4)."""
    kernel = f"k-{_server()}"
    body = {"user": "alice", "offer": "t4-quarter", "kernel_id": kernel}
    r = _call(hub, "POST", "kernels", hub.spawner_token, body)
    assert r.status == 201 and r.json()["state"] == "granted", r.body
    return kernel


def _release_all(hub: HubEnv) -> None:
    """Release every lease the module made, so each cell starts from the same pool."""
    for user in hub.users:
        for lease in _leases(hub, user):
            assert _call(hub, "DELETE", f"allocations/{lease['id']}", _admin(hub)).status == 200


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubEnv]:
    """One hub + proxy + pool service for the module (reconcile off: no real servers run)."""
    where = tmp_path_factory.mktemp("authz")
    env = HubEnv(where, f"sqlite:///{where}/pool.sqlite", data_path("demo-pool.yaml"))
    env.service_args = (
        "--PoolService.reconcile_on_start=False",
        "--PoolService.reconcile_interval=0",
        # the matrix is about scopes: its made-up server names are not the hub's (the check
        # that a user names only their own servers is tested in test_hardening)
        "--PoolService.check_user_servers=False",
    )
    with env.running():
        yield env


@pytest.fixture(scope="module")
def tokens(hub: HubEnv) -> dict[str, str | None]:
    """One real hub token per column of the matrix."""
    return {
        "anon": None,
        "alice": hub.token("alice"),
        "bob": hub.token("bob"),
        "alice_srv": hub.server_token("alice"),
        "bob_srv": hub.server_token("bob"),
        "no_scope": hub.token("alice", ["read:users:name!user=alice"]),
        "spawner": hub.spawner_token,
        "agent": hub.agent_token,
        "admin": _admin(hub),
    }


@pytest.fixture(scope="module")
def matrix_results(hub: HubEnv, tokens: dict[str, str | None]) -> dict[tuple[str, str], Outcome]:
    """Run every cell once; put back what a cell changed (leases, node flags)."""
    results = {}
    for label, *_ in MATRIX:
        method, rest = label.split(" ", 1)
        path, _, variant = rest.partition(" +")
        body = BODIES.get(f"{method} {path}")
        for col in COLUMNS:
            lease = _new_lease(hub) if "{id}" in path else None
            job = _new_job(hub) if "{job}" in path else None
            kernel = _new_kernel(hub) if "{kernel}" in path else None
            call_body = body
            if method == "POST" and path == "allocations":
                call_body = {**body, "server": _server()}  # type: ignore[dict-item]
                if variant == "priority":
                    call_body["priority"] = 5
            if variant == "deadline":
                call_body = {"deadline": "2099-01-01T00:00:00Z"}
            where = path.format(id=lease, job=job, kernel=kernel)
            r = _call(hub, method, where, tokens[col], call_body)
            results[label, col] = _outcome(r.status, r.body)
            made = lease is not None or job is not None or kernel is not None
            if made or path in ("allocations", "jobs", "kernels"):
                _release_all(hub)
            if path.startswith("nodes/sim-h100/"):
                _call(hub, "POST", "nodes/sim-h100/uncordon", _admin(hub), {})
    return results


def _render(results: dict[tuple[str, str], Outcome]) -> str:
    """The observed matrix; a mismatching cell reads ``got!=want`` (``got~want``: known bug)."""
    width = max(len(row[0]) for row in MATRIX)
    lines = [f"{'request':<{width}}  " + " ".join(f"{c:>9}" for c in COLUMNS)]
    for label, *_ in MATRIX:
        cells = []
        for col in COLUMNS:
            got, want = results[label, col].status, EXPECTED[label, col]
            mark = "~" if (label, col) in KNOWN_BUGS else "!="
            cells.append(f"{got:>9}" if got == want else f"{f'{got}{mark}{want}':>9}")
        lines.append(f"{label:<{width}}  " + " ".join(cells))
    return "\n".join(lines)


def test_authorization_matrix(matrix_results: dict[tuple[str, str], Outcome]) -> None:
    """Every cell answers as the scopes say (known handler bugs are checked separately)."""
    mismatches, bad_bodies = [], []
    for (label, col), want in EXPECTED.items():
        got = matrix_results[label, col]
        if got.code == "<not a JSON error body>":
            bad_bodies.append(f"  {label} × {col}: {got}")
        if (label, col) in KNOWN_BUGS:
            continue
        if got.status != want:
            mismatches.append(f"  {label} × {col}: expected {want}, got {got}")
    assert not mismatches and not bad_bodies, (
        f"{len(mismatches)} cell(s) differ from the matrix:\n"
        + "\n".join(mismatches)
        + ("\nerrors without the JSON error body:\n" + "\n".join(bad_bodies) if bad_bodies else "")
        + "\n\nobserved (got!=expected; got~expected: a known bug):\n"
        + _render(matrix_results)
    )


def test_known_bugs_name_real_cells() -> None:
    """KNOWN_BUGS only names cells of the matrix."""
    assert set(KNOWN_BUGS) <= set(EXPECTED)
    assert len(EXPECTED) == len(MATRIX) * len(COLUMNS)  # no duplicate rows


# -- what the matrix cannot show ---------------------------------------------------------------


def _comparable(lease: dict) -> dict:
    """A lease without the fields that move on their own (queue position, ETA)."""
    return {k: v for k, v in lease.items() if k not in ("position", "eta_seconds")}


#: What another user's token may try on alice's lease ("{id}": the lease).
LEASE_REQUESTS = [
    ("GET", "allocations/{id}", None),
    ("DELETE", "allocations/{id}", None),
    ("DELETE", "allocations/{id}?reason=admin", None),
    ("POST", "allocations/{id}/resize", {"offer": "a100-1g"}),
    ("POST", "allocations/{id}/keepalive", {}),
    ("GET", "utilization?lease={id}", None),
]


def test_no_token_reaches_another_users_lease(hub: HubEnv, tokens: dict[str, str | None]) -> None:
    """Bob's user and server tokens get 404 on alice's lease for every request, cannot list
    or read her leases or quota, and leave her leases exactly as they were."""
    lease = _new_lease(hub)
    assert _call(hub, "POST", f"allocations/{lease}/keepalive", hub.spawner_token, {}).status == 200
    before = {le["id"]: _comparable(le) for le in _leases(hub)}
    failures = []
    for col in ("bob", "bob_srv"):
        token = tokens[col]
        for method, path, body in LEASE_REQUESTS:
            r = _call(hub, method, path.format(id=lease), token, body)
            if _outcome(r.status, r.body) != Outcome(404, "not_found"):
                failures.append(f"{col} {method} {path}: {r.status} {r.body[:200]!r}")
        r = _call(hub, "GET", "allocations?user=alice", token)
        if r.status != 403:
            failures.append(f"{col} GET allocations?user=alice: {r.status}")
        r = _call(hub, "GET", "allocations", token)
        if r.status != 200 or any(le["user"] != "bob" for le in r.json()["items"]):
            failures.append(f"{col} GET allocations: {r.status} {r.body[:200]!r}")
        r = _call(hub, "GET", "users/alice", token)
        if r.status != 403:
            failures.append(f"{col} GET users/alice: {r.status}")
    after = {le["id"]: _comparable(le) for le in _leases(hub)}
    _release_all(hub)
    assert not failures, "\n".join(failures)
    assert after == before, "alice's leases changed after bob's attempts"
    assert after[lease]["state"] == "active"
    assert after[lease]["slots"], "alice's lease lost its slots"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [pytest.param(*req, id=f"{req[0]} {req[1]}") for req in LEASE_REQUESTS],
)
def test_hidden_lease_looks_missing(
    hub: HubEnv, tokens: dict[str, str | None], method: str, path: str, body: object
) -> None:
    """Bob's 404 on alice's lease is the very 404 of a lease that never existed (id aside)."""
    lease, missing = _new_lease(hub), "0" * 32
    try:
        for col in ("bob", "bob_srv"):
            hidden = _call(hub, method, path.format(id=lease), tokens[col], body)
            ghost = _call(hub, method, path.format(id=missing), tokens[col], body)
            assert hidden.status == ghost.status == 404, (col, hidden.body, ghost.body)
            assert hidden.json() == json.loads(ghost.body.replace(missing.encode(), lease.encode()))
    finally:
        _release_all(hub)


def test_users_cannot_act_for_others_or_raise_their_standing(
    hub: HubEnv, tokens: dict[str, str | None]
) -> None:
    """A user (or their server) cannot allocate for another user, set a priority, or claim
    groups: ``groups`` is ignored for them, ``group`` must be one they are in."""
    whole = {"guarantee": 1, "limit": 2, "budget": None, "period": "month"}
    r = _call(hub, "PUT", "quotas/groups/ml", tokens["admin"], whole)
    assert r.status == 200, r.body  # "ml" has a quota, so a lease would be charged to it
    for col in ("alice", "alice_srv"):
        token = tokens[col]
        base = {"server": _server(), "offer": "t4-quarter"}
        r = _call(hub, "POST", "allocations", token, {**base, "user": "bob"})
        assert (r.status, _outcome(r.status, r.body).code) == (403, "forbidden"), (col, r.body)
        r = _call(hub, "POST", "allocations", token, {**base, "priority": 100})
        assert (r.status, _outcome(r.status, r.body).code) == (403, "forbidden"), (col, r.body)
        r = _call(hub, "POST", "allocations", token, {**base, "group": "ml"})
        assert (r.status, _outcome(r.status, r.body).code) == (403, "not_in_group"), (col, r.body)
        r = _call(hub, "POST", "allocations", token, {**base, "groups": ["ml"]})
        assert r.status == 201, (col, r.body)
        assert r.json()["user"] == "alice"
        assert r.json()["group"] is None, f"{col} claimed group ml: {r.body!r}"
        _release_all(hub)
    assert _leases(hub, "bob") == []
    # the control: the spawner passes the user's groups, and then the group is charged
    body = {"user": "alice", "server": _server(), "offer": "t4-quarter", "groups": ["ml"]}
    r = _call(hub, "POST", "allocations", hub.spawner_token, body)
    assert r.status == 201, r.body
    assert r.json()["group"] == "ml"
    _release_all(hub)


def test_pool_shows_holders_to_admins_only(hub: HubEnv, tokens: dict[str, str | None]) -> None:
    """Users (and the spawner and agents) see aggregates; admins see clusters and holders."""
    lease = _new_lease(hub)
    try:
        for col in ("alice", "bob", "alice_srv", "bob_srv", "spawner", "agent"):
            r = _call(hub, "GET", "pool", tokens[col])
            assert r.status == 200, (col, r.body)
            view = r.json()
            assert "totals" in view and "models" in view, (col, view)
            assert "clusters" not in view, col
            text = r.body.decode()
            for secret in ("holders", lease, '"alice"', "sim-t4"):
                assert secret not in text, f"{col} sees {secret}"
        r = _call(hub, "GET", "pool", tokens["admin"])
        assert r.status == 200, r.body
        holders = [
            h
            for cluster in r.json()["clusters"]
            for node in cluster["nodes"]
            for gpu in node["gpus"]
            for h in gpu["holders"]
        ]
        assert {"lease": lease, "user": "alice"}.items() <= next(
            h for h in holders if h["lease"] == lease
        ).items()
    finally:
        _release_all(hub)


def test_unknown_token_is_unauthorized(hub: HubEnv) -> None:
    """A token the hub never issued is a 401 with the JSON error body, like no token."""
    for method, path in (("GET", "offers"), ("POST", "allocations"), ("GET", "pool")):
        r = _call(hub, method, path, "not-a-hub-token", {} if method == "POST" else None)
        assert _outcome(r.status, r.body) == Outcome(401, "unauthorized"), (path, r.body)
