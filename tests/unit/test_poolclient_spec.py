"""Every call of the pool's one API client is in the OpenAPI spec, for the caller that makes it.

Each client method is called here as its caller calls it (the spawner with the spawn scope, the
lab server extension with its server's ``use`` token, the reclaimer, the node agent), over a
transport that records the request instead of sending it. Every request must name an
operation of ``docs/source/_static/rest-api.yml`` (method and path template), that operation
must list the caller's scope in ``x-scopes``, every query argument must be a documented
parameter, and every body must validate against the operation's request schema. A method added
to the client without a case here fails too.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import openapi_schema_validator as osv
import pytest
import yaml
from jupyterlab_gpupool.pool import LabPoolClient

from jupyterhub_gpupool.poolclient import PoolClient
from tests.fakes import FakeReader

ROOT = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((ROOT / "docs" / "source" / "_static" / "rest-api.yml").read_text())
API = "http://pool.example/services/gpupool/api/v1/"

#: The scope each caller's token holds (docs/source/howto/hub-config.md's roles).
SPAWNER, LAB = "custom:gpupool:spawn", "custom:gpupool:use"
RECLAIMER, AGENT = "custom:gpupool:reclaim", "custom:gpupool:agent"

_reader = FakeReader(gpus=2, slices=2)
_MIG_RESULT = {
    "op": "create",
    "gpu": "GPU-0",
    "profile": "1g.10gb",
    "start": 6,
    "ok": True,
    "error": None,
    "mig_uuid": "MIG-6",
}
_OBSERVED = {
    "L1": {
        "kernel": {"state": "idle", "last_activity": 1_700_000_000.0, "observed_at": 1.7e9},
        "presence": {"last_input": None, "connections": 0, "observed_at": 1.7e9},
    },
    "L2": {"kernel": None, "presence": None},
}

Call = Callable[[Any], Awaitable[Any]]
#: (caller's scope, the client it uses, what it calls): as spawner/, labextension/, reclaim/
#: and telemetry/agent.py call them.
CASES: list[tuple[str, type[PoolClient], str, Call]] = [
    (SPAWNER, PoolClient, "offers", lambda c: c.offers("alice", ["physics"], ["east"])),
    (
        SPAWNER,
        PoolClient,
        "allocate",
        lambda c: c.allocate(
            "alice",
            "gpu",
            "a100-1g",
            groups=["physics"],
            group="physics",
            clusters=["east"],
            reason="a deadline",
            duration=7200.0,
        ),
    ),
    (SPAWNER, PoolClient, "allocate", lambda c: c.allocate("alice", "", "a100-1g", groups=[])),
    (SPAWNER, PoolClient, "lease", lambda c: c.lease("L 1/2")),
    (SPAWNER, PoolClient, "leases", lambda c: c.leases(user="alice", state="active")),
    (SPAWNER, PoolClient, "release", lambda c: c.release("L1")),
    (SPAWNER, PoolClient, "release", lambda c: c.release("L1", "cancelled")),
    (SPAWNER, PoolClient, "keepalive", lambda c: c.keepalive("L1")),
    (SPAWNER, PoolClient, "rebind", lambda c: c.rebind("L1", ["GPU-0", "GPU-1"])),  # DRA
    (SPAWNER, PoolClient, "rebind", lambda c: c.rebind("L1", "GPU-1", exclusive=True)),
    (AGENT, PoolClient, "rebind", lambda c: c.rebind("L1", "MIG-6")),  # PodResources
    (
        SPAWNER,
        PoolClient,
        "set_server_url",
        lambda c: c.set_server_url("L1", "http://10.0.0.7:8888/"),
    ),
    (SPAWNER, PoolClient, "user", lambda c: c.user("alice")),
    (LAB, LabPoolClient, "me", lambda c: c.me()),
    (LAB, LabPoolClient, "offers", lambda c: c.offers()),
    (LAB, LabPoolClient, "lease", lambda c: c.lease("L1")),
    (LAB, LabPoolClient, "utilization", lambda c: c.utilization("L1", "1700000000.25")),
    (LAB, LabPoolClient, "utilization", lambda c: c.utilization("L1", "2026-12-01T10:00:00Z")),
    (LAB, LabPoolClient, "keepalive", lambda c: c.keepalive("L1")),
    (LAB, LabPoolClient, "presence", lambda c: c.presence("L1", 12.5)),
    (LAB, LabPoolClient, "presence", lambda c: c.presence("L1", None)),
    (LAB, LabPoolClient, "report_presence", lambda c: c.report_presence("L1", 0.0)),
    (LAB, LabPoolClient, "resize", lambda c: c.resize("L1", "h100")),
    (LAB, LabPoolClient, "allocate", lambda c: c.allocate("", "h100")),
    (LAB, LabPoolClient, "restart", lambda c: c.restart("L2")),
    (LAB, LabPoolClient, "cancel", lambda c: c.cancel("L2")),
    (LAB, LabPoolClient, "release", lambda c: c.release("L2", "cancelled")),
    (RECLAIMER, PoolClient, "take_reclaim_lead", lambda c: c.take_reclaim_lead("r-1", 60.0)),
    (RECLAIMER, PoolClient, "give_up_reclaim_lead", lambda c: c.give_up_reclaim_lead("r-1")),
    (RECLAIMER, PoolClient, "reclaim_leases", lambda c: c.reclaim_leases(page_size=50)),
    (
        RECLAIMER,
        PoolClient,
        "reclaim_round",
        lambda c: c.reclaim_round("r-1", (1.7e9 - 60, 1.7e9), _OBSERVED),
    ),
    (
        RECLAIMER,
        PoolClient,
        "reclaim_outcome",
        lambda c: c.reclaim_outcome("L1", "r-1", "done", ["a.ipynb"], "saved, then stopped"),
    ),
    (RECLAIMER, PoolClient, "reclaim_outcome", lambda c: c.reclaim_outcome("L1", "r-1", "failed")),
    (RECLAIMER, PoolClient, "lease", lambda c: c.lease("L1")),  # reclaim/actions.py: the target
    (AGENT, PoolClient, "put_inventory", lambda c: c.put_inventory("node-1", _reader.inventory())),
    (
        AGENT,
        PoolClient,
        "post_samples",
        lambda c: c.post_samples("node-1", _reader.samples(1.7e9)),
    ),
    (AGENT, PoolClient, "post_samples", lambda c: c.post_samples("node-1", [])),
    (AGENT, PoolClient, "post_mig_results", lambda c: c.post_mig_results("node-1", [_MIG_RESULT])),
    (
        LAB,
        PoolClient,
        "submit_job",
        lambda c: c.submit_job(
            "a100-1g",
            ["python", "train.py", "--epochs", "3"],
            workload="training",
            name="resnet",
            group="physics",
            env={"SEED": "1"},
        ),
    ),
    (LAB, PoolClient, "submit_job", lambda c: c.submit_job("a100-1g", ["python", "serve.py"])),
    (SPAWNER, PoolClient, "submit_job", lambda c: c.submit_job("h100", ["x"], user="alice")),
    (
        LAB,
        PoolClient,
        "submit_job",
        lambda c: c.submit_job("h100", ["python", "train.py"], image="pytorch:25.01"),
    ),
    (
        LAB,
        PoolClient,
        "submit_job",
        lambda c: c.submit_job("h100", ["serve"], workload="inference", replicas=2),
    ),
    (LAB, PoolClient, "jobs", lambda c: c.jobs()),
    (LAB, PoolClient, "jobs", lambda c: c.jobs(state="running", user="alice")),
    (LAB, PoolClient, "job", lambda c: c.job("j1")),
    (LAB, PoolClient, "cancel_job", lambda c: c.cancel_job("j1")),
    (LAB, PoolClient, "job_logs", lambda c: c.job_logs("j1", 1024)),
    (AGENT, PoolClient, "node_jobs", lambda c: c.node_jobs("node-1")),
    (AGENT, PoolClient, "job_status", lambda c: c.job_status("j1", "running", pid=4242)),
    (AGENT, PoolClient, "job_status", lambda c: c.job_status("j1", "exited", exit_code=1)),
    (AGENT, PoolClient, "job_log_append", lambda c: c.job_log_append("j1", 0, "epoch 1\n")),
    (LAB, PoolClient, "request_kernel", lambda c: c.request_kernel("a100-1g", "k-1")),
    (SPAWNER, PoolClient, "request_kernel", lambda c: c.request_kernel("h100", "k-1", user="al")),
    (LAB, PoolClient, "kernels", lambda c: c.kernels()),
    (LAB, PoolClient, "kernels", lambda c: c.kernels(user="alice")),
    (LAB, PoolClient, "kernel", lambda c: c.kernel("k-1")),
    (LAB, PoolClient, "release_kernel", lambda c: c.release_kernel("k-1")),
    (LAB, PoolClient, "kernel_activity", lambda c: c.kernel_activity("k-1", "busy")),
]


class Recorder:
    """A transport that records each request and answers an empty page."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any]] = []

    async def __call__(self, method: str, url: str, headers: dict[str, str], body: bytes | None):
        self.sent.append((method, url, None if body is None else json.loads(body)))
        return 200, b'{"items": [], "total": 0}'


def deref(node: Any) -> Any:
    """Follow local ``$ref``s of the spec."""
    while isinstance(node, dict) and "$ref" in node:
        target: Any = SPEC
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def template_regex(template: str) -> re.Pattern[str]:
    return re.compile(
        "^"
        + "/".join("[^/]+" if p.startswith("{") else re.escape(p) for p in template.split("/"))
        + "$"
    )


def operation_of(path: str) -> str:
    """The spec's path template for a request path: a literal segment wins over a parameter
    (``/nodes/{name}/inventory`` over ``/nodes/{name}/{action}``)."""
    matches = [t for t in SPEC["paths"] if template_regex(t).match(path)]
    assert matches, f"{path} is no path of the spec"
    return min(matches, key=lambda t: t.count("{"))


def run(client_type: type[PoolClient], call: Call) -> list[tuple[str, str, Any]]:
    recorder = Recorder()
    client = client_type(API, "secret", transport=recorder)
    asyncio.run(call(client))
    assert recorder.sent, "the call sent nothing"
    return recorder.sent


@pytest.mark.parametrize(
    ("scope", "client_type", "name", "call"),
    CASES,
    ids=[f"{scope.rsplit(':', 1)[1]}-{name}-{i}" for i, (scope, _, name, _) in enumerate(CASES)],
)
def test_every_call_is_a_documented_operation_for_its_caller(scope, client_type, name, call):
    for method, url, body in run(client_type, call):
        assert url.startswith(API)
        parts = urlsplit(url)
        path = "/" + parts.path.removeprefix(urlsplit(API).path)  # segments still quoted
        template = operation_of(path)
        item = SPEC["paths"][template]
        op = item.get(method.lower())
        assert op is not None, f"{name}: {method} {template} is not in the spec"
        assert scope in op["x-scopes"], f"{name}: {method} {template} does not allow {scope}"
        params = [deref(p) for p in item.get("parameters", []) + op.get("parameters", [])]
        query = {p["name"] for p in params if p["in"] == "query"}
        for key, _ in parse_qsl(parts.query, keep_blank_values=True):
            assert key in query, f"{name}: {method} {template} has no query parameter {key!r}"
        if "requestBody" not in op:
            assert body is None, f"{name}: {method} {template} takes no body, got {body!r}"
            continue
        schema = deref(op["requestBody"])["content"]["application/json"]["schema"]
        validator = osv.OAS30Validator(
            {**schema, "components": SPEC["components"]}, format_checker=osv.oas30_format_checker
        )
        errors = [
            f"{'/'.join(map(str, e.absolute_path)) or '<body>'}: {e.message}"
            for e in validator.iter_errors(body)
        ]
        assert not errors, f"{name}: {method} {template} body {body!r}:\n" + "\n".join(errors)


def _api_methods(cls: type) -> set[str]:
    return {
        n
        for n, f in inspect.getmembers(cls, inspect.iscoroutinefunction)
        if not n.startswith("_") and n != "request"
    }


def test_every_method_of_the_client_has_a_case():
    cased = {name for _, _, name, _ in CASES}
    lab_cased = {name for _, cls, name, _ in CASES if cls is LabPoolClient}
    missing = sorted(_api_methods(PoolClient) - cased)
    own = {n for n in _api_methods(LabPoolClient) if n in vars(LabPoolClient)}
    missing += [f"LabPoolClient.{n}" for n in sorted(own - lab_cased)]
    assert not missing, f"client methods without a spec case here: {missing}"


def test_a_path_outside_the_spec_fails_the_check():
    """The check can fail: a made-up path and a body with an unknown field are caught."""
    with pytest.raises(AssertionError, match="no path of the spec"):
        operation_of("/allocations/L1/teleport/now")
    schema = deref(SPEC["paths"]["/allocations"]["post"]["requestBody"])["content"][
        "application/json"
    ]["schema"]
    validator = osv.OAS30Validator({**schema, "components": SPEC["components"]})
    assert list(validator.iter_errors({"offer": "h100", "colour": "red"}))
