"""Fuzzing the REST API from its OpenAPI spec with schemathesis, on SQLite and PostgreSQL.

The spec (docs/source/_static/rest-api.yml) is the contract. One hub + proxy + pool service per
database (the module fixture, parametrized) takes three of schemathesis' phases, over every
operation of the spec, the agent ones included:

* ``test_coverage_phase``: schemathesis' coverage cases, deterministic: the default request,
  every enum value and boundary the schemas name (positive), every way to break them — wrong
  types, missing and unknown fields, values beyond the bounds — and the methods a path does
  not serve (negative).
* ``test_generate_phase``: ``GPUPOOL_FUZZ_EXAMPLES`` valid requests per operation drawn by
  Hypothesis (derandomized).
* ``test_stateful_phase``: schemathesis' state machine along the spec's ``links`` (a new
  lease's ``id`` into reading, releasing, resizing and keeping it alive; a reported node into
  its samples, MIG plan and results and cordon/drain; a set quota into reading, patching and
  resetting it): ``GPUPOOL_FUZZ_SCENARIOS`` scenarios of up to ``GPUPOOL_FUZZ_STEPS`` calls,
  with fixed seeds, reaching real leases, nodes and quotas (asserted).

Every request carries the token its operation is for (``CALLERS``): the agent's for the agent
operations, an admin's for the admin ones, the spawner's and a user's (alice; the stateful
phase: the spawner's, which reaches every lease) for the others — except the negative cases
that leave the token out on purpose. Every answer is checked: no 5xx, a documented status and
content type, a body valid against its schema, a 405 with an ``Allow`` header, and
``positive_data_acceptance``: a request the spec allows is not refused as malformed (no 400,
405, 413 or 422). The only refusals of valid requests let through are those the spec cannot
express (``STATE_DEPENDENT``, each with why) and NUL in a string, which the spec forbids in
words. The old per-operation fuzz (valid and invalid requests with three callers) stays in
test_api_contract.py.

About 1,350 coverage, 300 generated and 330 stateful requests per database: 1.5 minutes for
both databases on the 2-core test machine when quiet, 2.3 under a load of 9 (raise the bounds
locally to fuzz harder; 60 scenarios of 10 steps found the 1 TiB bound on a GPU's memory).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from schemathesis.core import NOT_SET
from schemathesis.core.failures import AcceptedNegativeData, Failure, FailureGroup
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi import stateful as stateful_openapi

from jupyterhub_gpupool.data import data_path
from tests.fakes import HubEnv, request

ROOT = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((ROOT / "docs" / "source" / "_static" / "rest-api.yml").read_text())
USERS = ("admin", "alice", "bob")
PG_ADMIN_URL = os.environ.get("GPUPOOL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
EXAMPLES = int(os.environ.get("GPUPOOL_FUZZ_EXAMPLES", "10"))
SCENARIOS = int(os.environ.get("GPUPOOL_FUZZ_SCENARIOS", "40"))
STEPS = int(os.environ.get("GPUPOOL_FUZZ_STEPS", "8"))

pytestmark = pytest.mark.slow

#: Who calls each tag's operations: the agent operations with the agent's token, the admin
#: ones with an admin's, the rest with the spawner's and a user's.
CALLERS = {
    "agent": ("agent",),
    "admin": ("admin",),
    "offers": ("spawner", "alice"),
    "allocations": ("spawner", "alice"),
    "users": ("spawner", "alice"),
    "pool": ("spawner", "alice"),
    "reclaim": ("admin",),  # admin includes custom:gpupool:reclaim
    "jobs": ("spawner", "alice"),
    "kernels": ("spawner", "alice"),
}

#: Refusals of requests the spec allows that depend on what a schema cannot say — the pool's
#: configuration and state, the caller, or a relation between values: (operation, error
#: code, field at fault, message; the last two regular expressions) → why.
STATE_DEPENDENT: dict[tuple[str, str, str, str], str] = {
    ("POST /allocations", "missing_field", "user", ".*"): "a service must name the user, a "
    "user's token names its own (the spec says so; a schema cannot tell callers apart)",
    ("POST /allocations", "unknown_offer", ".*", ".*"): "the offers are the pool's config",
    ("POST /jobs", "missing_field", "user", ".*"): "a service must name the user, a user's "
    "token names its own (as for an allocation)",
    ("POST /jobs", "unknown_offer", ".*", ".*"): "the offers are the pool's config",
    ("POST /jobs", "unknown_class", ".*", ".*"): "the workload classes are the pool's config",
    ("POST /jobs", "class_not_allowed", ".*", ".*"): "which groups a class allows is the pool's "
    "config",
    (
        "POST /jobs",
        "invalid_env",
        r"env.*",
        ".*not an environment variable name|.*set by the job runner",
    ): "OpenAPI 3.0 cannot constrain property names (the spec says the rule)",
    (
        "POST /jobs",
        "invalid_replicas",
        "replicas",
        ".*only class .* has replicas.*|.*replicas need whole GPUs",
    ): "more than one replica depends on the class and the offer (the pool's config; the "
    "spec says the rule)",
    ("POST /kernels", "missing_field", "user", ".*"): "a service must name the user, a user's "
    "token names its own (as for an allocation)",
    ("POST /kernels", "unknown_offer", ".*", ".*"): "the offers are the pool's config",
    ("POST /allocations/{id}/resize", "unknown_offer", ".*", ".*"): "the pool's config",
    ("POST /allocations", "exceeds_limit", ".*", ".*"): "the user's quota",
    ("POST /allocations/{id}/resize", "exceeds_limit", ".*", ".*"): "the user's quota",
    ("POST /allocations/{id}/resize", "same_offer", ".*", ".*"): "the lease's current offer",
    ("POST /nodes/{name}/samples", "invalid_field", r"samples\[\d+\]\.gpu", ".*"): "the pool's "
    "GPUs and the node holding each",
    (
        "POST /nodes/{name}/mig-results",
        "invalid_field",
        r"results\[\d+\]\.gpu",
        ".*not a GPU.*",
    ): "the node's GPUs",
    ("PUT /nodes/{name}/inventory", "invalid_config", "mig", ".*does not support MIG"): "which "
    "models have MIG is the catalog's",
    ("PUT /nodes/{name}/inventory", "invalid_config", "mig", ".*MIG is off"): "instances with "
    "MIG off: a relation between two fields",
    (
        "PUT /nodes/{name}/inventory",
        "invalid_field",
        r"gpus\[\d+\]\.(uuid|index)",
        ".*appears twice.*",
    ): "uniqueItems cannot say 'unique by uuid' (or by index)",
    ("PUT /nodes/{name}/inventory", "invalid_field", r"labels\..*", ".*"): "a label key empty "
    "or over 255 characters: OpenAPI 3.0 has no propertyNames",
    ("GET /usage", "invalid_range", "to", ".*"): "`to` not after `from`: a relation between "
    "two arguments",
    ("PUT /quotas/{kind}/{name}", "invalid_config", ".*", ".*above limit.*"): "a guarantee "
    "above the limit: a relation between two fields",
    ("PATCH /quotas/{kind}/{name}", "invalid_config", ".*", ".*above limit.*"): "the same, "
    "with the fields not named taken from the quota in effect",
    ("PUT /quotas/{kind}/{name}", "invalid_config", r".*\.exception", ".*above a limit.*"): "an "
    "exception ceiling not above the limit (or with no limit): a relation between two fields",
    ("PATCH /quotas/{kind}/{name}", "invalid_config", r".*\.exception", ".*above a limit.*"): "the "
    "same, with the fields not named taken from the quota in effect",
    ("POST /quotas/{kind}/{name}/preview", "invalid_config", ".*", ".*above limit.*"): "the "
    "same relation between guarantee and limit, previewed",
    (
        "POST /quotas/{kind}/{name}/preview",
        "invalid_config",
        r".*\.exception",
        ".*above a limit.*",
    ): "the same relation, previewed",
    (
        "PUT /quotas/{kind}/{name}",
        "invalid_config",
        r".*\.budget_minimum",
        ".*above the budget.*",
    ): ("a budget minimum above the budget: a relation between two fields"),
    (
        "PATCH /quotas/{kind}/{name}",
        "invalid_config",
        r".*\.budget_minimum",
        ".*above the budget.*",
    ): "the same, with the fields not named taken from the quota in effect",
    (
        "POST /quotas/{kind}/{name}/preview",
        "invalid_config",
        r".*\.budget_minimum",
        ".*above the budget.*",
    ): "the same relation, previewed",
    ("POST /allocations", "exceeds_exception_ceiling", ".*", ".*"): "the user's quota",
    ("POST /allocations", "missing_field", "duration|reason", ".*"): "an offer that needs "
    "approval needs a reason, an exception beyond the quota's limit a duration: relations to "
    "the pool's config and the user's quota",
    ("POST /allocations", "invalid_field", "reason", ".*"): "a reason of spaces only",
    ("POST /allocations/{id}/approve", "not_awaiting_approval", ".*", ".*"): "the lease's state",
    ("POST /allocations/{id}/deny", "not_awaiting_approval", ".*", ".*"): "the lease's state",
    ("POST /allocations/{id}/approve", "invalid_field", "duration|offer", ".*"): "at most the "
    "duration asked, a smaller offer of the same kind: relations to the request",
    ("POST /allocations/{id}/approve", "unknown_offer", ".*", ".*"): "the pool's config",
    ("POST /allocations/{id}/deny", "missing_field", "reason", ".*"): "a reason of spaces only",
    ("POST /allocations/{id}/device", "unknown_device", ".*", ".*"): "the devices the pool "
    "knows on the lease's node",
    ("POST /allocations/{id}/device", "device_mismatch", ".*", ".*"): "the kind, profile and "
    "number of the lease's devices",
    ("POST /allocations/{id}/device", "device_held", ".*", ".*"): "what holds the device now",
    ("GET /capacity", "invalid_range", "to|from", ".*"): "`to` not after `from`, or more than "
    "366 days between them: relations between two arguments",
    ("GET /usage/idle-holders", "invalid_range", "to|from", ".*"): "the same relation",
    ("GET /offers", "unknown_cluster", "cluster", ".*"): "the clusters are the pool's config",
    ("POST /allocations", "unknown_cluster", "clusters", ".*"): "the pool's config",
    ("PUT /nodes/{name}/inventory", "unknown_cluster", "cluster", ".*"): "the pool's config",
    ("POST /capacity/what-if", "invalid_argument", "until", ".*first recorded.*"): (
        "the range must lie within what was recorded: relative to the pool's clock and records"
    ),
    (
        "POST /capacity/what-if",
        "invalid_argument",
        "days|hours",
        ".*(days?|hours?|less than an hour) of recorded.*|no request has been recorded.*",
    ): "how many days (or hours) the database has recorded",
    ("POST /capacity/what-if", "invalid_argument", "hours", ".*days or hours, not both.*"): (
        "days or hours, not both: a relation between two fields"
    ),
    ("POST /capacity/what-if", "missing_field", "days", r".*days \(or hours\) is required.*"): (
        "one of days or hours: a relation between two fields"
    ),
    ("POST /capacity/what-if", "invalid_argument", r"(add|remove|mig_layout|reclaim)\b.*", ".*"): (
        "GPU models, nodes, layouts and policies are the catalog's, the inventory's and the "
        "pool config's"
    ),
    ("PUT /reclaim/policies", "invalid_field", r"reclaim\..*", ".*"): "offers and priority "
    "classes are the pool config's; a policy's fields are checked against each other and a "
    "shrink target against its offer (relations a schema cannot state)",
    ("POST /nodes/{name}/{action}", "invalid_field", "deadline|action", ".*only a drain.*"): (
        "a deadline or action with cordon/uncordon: a relation between the path and the body"
    ),
    ("POST /nodes/{name}/{action}", "invalid_field", "deadline", ".*deadline has passed.*"): (
        "a drain deadline already past: relative to the pool's clock"
    ),
    ("POST /reclaim/rounds", "invalid_field", "window", ".*after window.start.*"): "a window "
    "ending before it starts: a relation between two fields",
}

CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.positive_data_acceptance,
    # the other way round: what the spec forbids (a path name over 255 characters, NUL, a
    # cluster that is no DNS label, a time past 9999) is refused, so spec and server agree
    schemathesis.checks.negative_data_rejection,
    schemathesis.checks.unsupported_method,
    schemathesis.checks.allow_header_conformance,
]


def callers(operation: Any) -> tuple[str, ...]:
    """Who calls the operation (by its first tag)."""
    return CALLERS[operation.definition.raw["tags"][0]]


@dataclass
class Fuzz:
    """The running service, the callers' tokens and what the checks found."""

    env: HubEnv
    offers: list[str]
    tokens: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    #: (failure, operation, status, code, field) already reported: one example of each
    seen: set[tuple[Any, ...]] = field(default_factory=set)
    #: (operation, status) → requests
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    last_response: Any = None
    scenarios: int = 0

    def token(self, who: str) -> str:
        if who not in self.tokens:
            services = {"agent": self.env.agent_token, "spawner": self.env.spawner_token}
            self.tokens[who] = services.get(who) or self.env.token(who)
        return self.tokens[who]

    def send(self, case: Any, who: str) -> Any:
        """Send the case with ``who``'s token, run the checks, record what they find."""
        headers = {"Authorization": f"token {self.token(who)}"}
        response = case.call(base_url=self.env.api, headers=headers)
        self.last_response = response
        self.statuses[(case.operation.label, response.status_code)] += 1
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except FailureGroup as group:
            for failure in group.exceptions:
                if accepted(failure, response, case):
                    continue
                key = (
                    type(failure).__name__,
                    case.operation.label,
                    response.status_code,
                    error_code(response),
                    error_field(response),
                )
                if key in self.seen:
                    continue
                self.seen.add(key)
                body = "-" if case.body is NOT_SET else json.dumps(case.body, default=str)
                self.failures.append(
                    f"{who}: {case.method} {case.formatted_path} query={case.query} "
                    f"body={body[:2000]} -> {response.status_code} {response.text[:300]}\n"
                    f"    {type(failure).__name__}: {failure.title}"
                )
        return response

    def assert_no_failures(self) -> None:
        assert not self.failures, f"{len(self.failures)} kinds of failure:\n" + "\n".join(
            self.failures
        )


def error_code(response: Any) -> str | None:
    try:
        return response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def error_field(response: Any) -> str | None:
    try:
        return response.json()["error"].get("field")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def has_nul(case: Any) -> bool:
    """Whether a string of the request (path, query or body) holds NUL."""
    parts = [case.path_parameters, case.query, None if case.body is NOT_SET else case.body]
    return "\\u0000" in json.dumps(parts, default=str)


def declared_query(case: Any) -> set[str]:
    """The query arguments the spec declares for the case's operation."""
    item = SPEC["paths"][case.operation.path]
    params = [*item.get("parameters", []), *item[case.method.lower()].get("parameters", [])]
    names = set()
    for param in params:
        if "$ref" in param:
            param = SPEC["components"]["parameters"][param["$ref"].rsplit("/", 1)[-1]]
        if param["in"] == "query":
            names.add(param["name"])
    return names


def accepted(failure: Failure, response: Any, case: Any) -> bool:
    """Whether a failed check is one of the refusals ``STATE_DEPENDENT`` explains, or of NUL,
    which the spec forbids in words (its introduction) rather than in every string's schema;
    or a request "violating" the spec only by a query argument it does not declare, which the
    API ignores, as JupyterHub's does (OpenAPI leaves undeclared query arguments open)."""
    if isinstance(failure, AcceptedNegativeData):
        return bool(set(case.query or {}) - declared_query(case))
    if not isinstance(failure, RejectedPositiveData):
        return False
    code, at = error_code(response), error_field(response) or ""
    message = response.json()["error"]["message"]
    if code in ("invalid_argument", "invalid_field") and message.endswith("contains NUL"):
        return has_nul(case)
    return any(
        label == case.operation.label
        and code == want
        and re.fullmatch(where, at, re.DOTALL)
        and re.fullmatch(what, message, re.DOTALL)
        for label, want, where, what in STATE_DEPENDENT
    )


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fuzz]:
    """A hub + pool service (demo pool, reconcile off, any server name) on each database."""
    where = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    database = None
    if request.param == "sqlite":
        url = f"sqlite:///{where}/pool.sqlite"
    else:
        import psycopg

        database = f"gpupool_fuzz_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        url = f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{database}"
    env = HubEnv(where, url, data_path("demo-pool.yaml"), USERS)
    env.service_args = (
        "--PoolService.reconcile_on_start=False",  # no real servers run
        "--PoolService.reconcile_interval=0",
        "--PoolService.check_user_servers=False",  # fuzzed server names are not the hub's
    )
    try:
        with env.running():
            offers = get(env, "offers")["items"]
            yield Fuzz(env, [offer["name"] for offer in offers])
    finally:
        if database is not None:
            import psycopg

            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def get(env: HubEnv, path: str) -> Any:
    """A GET with the spawner's token that must succeed; its JSON."""
    r = request("GET", f"{env.api}/{path}", env.spawner_token)
    assert r.status == 200, r.body
    return r.json()


@pytest.fixture
def fuzz(service: Fuzz) -> Iterator[Fuzz]:
    """The module's service with a clean record for the test; the pool answers after it."""
    service.failures.clear()
    service.seen.clear()
    service.statuses.clear()
    yield service
    get(service.env, "pool")


SCHEMA = schemathesis.openapi.from_dict(SPEC)
OPERATIONS = {op.label: op for op in (r.ok() for r in SCHEMA.get_all_operations())}


def test_coverage_phase(fuzz: Fuzz):
    """Every operation's coverage cases, valid and invalid, with each of its callers."""
    SCHEMA.coverage_unexpected_methods_seen.clear()  # probe each path's other methods again
    for _, operation in sorted(OPERATIONS.items()):
        generation = SCHEMA.config.generation_for(operation=operation, phase="coverage")
        for case in SCHEMA.iter_coverage_cases(
            operation,
            generation_modes=list(schemathesis.GenerationMode),
            generation_config=generation,
        ):
            for who in callers(operation):
                fuzz.send(case, who)
    fuzz.assert_no_failures()
    assert set(OPERATIONS) == {label for label, _ in fuzz.statuses}


def test_generate_phase(fuzz: Fuzz):
    """Requests Hypothesis draws from each operation's schemas, all valid: none refused as
    malformed (the coverage phase sends the invalid ones)."""
    for _, operation in sorted(OPERATIONS.items()):

        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],
        )
        @given(case=operation.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE))
        def fuzz_operation(case: Any) -> None:
            for who in callers(case.operation):
                fuzz.send(case, who)

        fuzz_operation()
    fuzz.assert_no_failures()


#: Operations that start scenarios besides those schemathesis picks (it starts from POSTs and
#: from GETs without path parameters): a node's report and a quota are made with a PUT.
ROOTS = {"PUT /nodes/{name}/inventory", "PUT /quotas/{kind}/{name}"}


def free_the_pool(fuzz: Fuzz) -> None:
    """End what the earlier phases left holding GPUs (jobs and leases are never released by
    a request drawn at random), so the scenarios' own requests can be granted."""
    api, admin = fuzz.env.api, fuzz.token("admin")
    jobs = request("GET", f"{api}/jobs", admin).json().get("jobs") or []
    for job in jobs:
        if job["state"] in ("running", "cancelling", "preempting"):
            body = {"state": "exited", "exit_code": 0}
            request("POST", f"{api}/jobs/{job['id']}/status", fuzz.token("agent"), body)
        elif job["state"] in ("queued", "granted"):
            request("DELETE", f"{api}/jobs/{job['id']}", admin)
    leases = request("GET", f"{api}/allocations?limit=1000", admin).json().get("items") or []
    for lease in leases:
        if lease["state"] != "released":
            request("DELETE", f"{api}/allocations/{lease['id']}?reason=admin", admin)


def test_stateful_phase(fuzz: Fuzz, monkeypatch: pytest.MonkeyPatch):
    """Sequences of calls along the spec's links: real leases, nodes and quotas."""
    free_the_pool(fuzz)
    likely = stateful_openapi.is_likely_root_transition
    monkeypatch.setattr(
        stateful_openapi,
        "is_likely_root_transition",
        lambda operation, *args: operation.label in ROOTS or likely(operation, *args),
    )

    class Machine(SCHEMA.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            fuzz.scenarios += 1

        def before_call(self, case: Any) -> None:
            label = case.operation.label
            if (
                label in ("POST /allocations", "POST /allocations/{id}/resize")
                and isinstance(case.body, dict)
                and isinstance(case.body.get("offer"), str)
                and case.meta is not None
                and case.meta.generation.mode.is_positive
            ):
                # one of the pool's offers (by the drawn name's length), so valid requests
                # reach the allocator and make leases; drawn offer names never exist
                body = dict(case.body)
                body["offer"] = fuzz.offers[len(body["offer"]) % len(fuzz.offers)]
                if label == "POST /allocations":
                    body.pop("group", None)  # the spawner's users belong to no group
                    # the spawner asks for a user's server: a drawn body without one is refused
                    # (422), and one server asked twice is (409); each scenario asks for its own
                    body.setdefault("user", USERS[fuzz.scenarios % len(USERS)])
                    body.setdefault("server", f"fuzz-{fuzz.scenarios}")
                case.body = body

        def call(self, case: Any, **kwargs: Any) -> Any:
            return fuzz.send(case, callers(case.operation)[0])

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            pass  # checked (and recorded) by send

    # Each scenario changes the pool, so when Hypothesis replays one to vary it, it can take
    # another path, which Hypothesis calls flaky: like schemathesis' own runner, go on (with
    # the next seed) until the scenarios are run.
    wanted = [
        ("POST /allocations", 201),
        ("GET /allocations/{id}", 200),
        ("DELETE /allocations/{id}", 200),
        ("PUT /nodes/{name}/inventory", 200),
        ("PUT /quotas/{kind}/{name}", 200),
    ]

    def reached() -> set[tuple[str, int]]:
        return {key for key, n in fuzz.statuses.items() if n}

    # Which transitions a seed's scenarios take shifts with every operation the spec gains:
    # past SCENARIOS, more scenarios run (up to three times as many) until the lease's own
    # calls have all been reached, instead of a seed's luck deciding the coverage.
    fuzz.scenarios = 0
    for seed in range(20):
        covered = all(w in reached() for w in wanted)
        if fuzz.scenarios >= 3 * SCENARIOS or (fuzz.scenarios >= SCENARIOS and covered):
            break
        Machine._hypothesis_internal_use_seed = seed
        with contextlib.suppress(Flaky):
            Machine.run(
                settings=settings(
                    max_examples=max(SCENARIOS - fuzz.scenarios, SCENARIOS // 4),
                    stateful_step_count=STEPS,
                    database=None,
                    deadline=None,
                    suppress_health_check=list(HealthCheck),
                    phases=[Phase.generate],
                )
            )
    fuzz.assert_no_failures()
    for want in wanted:
        assert want in reached(), f"the scenarios never got {want}: {sorted(reached())}"


#: The HTML pages (relative to the service prefix) and the query arguments each reads.
PAGES = {
    "": ("kept", "refused"),
    "admin/": (),
    "admin/leases": (),
    "admin/nodes": (),
    "admin/quotas": (),
    "admin/audit": ("page", "user", "lease", "kind", "from", "to"),
    "admin/approvals": (),
    "admin/usage": ("from", "to", "by"),
    "admin/capacity": ("from", "to", "offer"),
    "admin/what-if": (),
}
#: What a query argument may be: numbers of every size and sign (the database's integers end
#: at 2**63), times, words, control and bidirectional characters.
QUERY_VALUES = st.one_of(
    st.integers().map(str),
    st.integers(min_value=10**15, max_value=10**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["", "-1", "0", "1e308", "1_000", "\u0661", "2026-03-02", "9999-12-31T23:59"]),
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=40),
)


def test_html_pages(fuzz: Fuzz):
    """Every HTML page with drawn query arguments (huge and negative numbers, times, any
    text), with an admin's token: an answer of 200, or 400 with a page saying what is wrong;
    never a 5xx, never anything but HTML."""
    prefix = f"{fuzz.env.hub_url}{fuzz.env.service_prefix}"
    token = fuzz.token("admin")
    seen: Counter[int] = Counter()

    @settings(
        max_examples=EXAMPLES * 4,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        path=st.sampled_from(sorted(PAGES)),
        values=st.lists(QUERY_VALUES, min_size=6, max_size=6),
    )
    def fuzz_page(path: str, values: list[str]) -> None:
        query = dict(zip(PAGES[path], values, strict=False))
        url = prefix + path + ("?" + urllib.parse.urlencode(query) if query else "")
        r = request("GET", url, token)
        seen[r.status] += 1
        assert r.status in (200, 400), (url, r.status, r.body[:300])
        kind = {k.lower(): v for k, v in r.headers.items()}.get("content-type", "")
        assert kind.startswith("text/html"), (url, r.headers)
        if r.status == 400:
            assert b"must be" in r.body or b"is not" in r.body, (url, r.body[:300])

    # the cases the outside probe found, then the drawn ones
    for huge in ("999999999999999999999999999999", "-5", "0", "1" * 5000):
        r = request("GET", f"{prefix}admin/audit?page={huge}", token)
        assert r.status == 400 and b"page must be a whole number" in r.body, (huge, r.status)
    fuzz_page()
    assert seen[200] > 0 and seen[400] > 0, seen
