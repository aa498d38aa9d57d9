"""The pool config's bounds (issue 30): every name is one the REST API can address, every count
and amount has a documented maximum, and a value beyond is refused with one line naming the
file, the field and the bound. A Hypothesis fuzz over the parser finds no accepted config the
API would refuse, and none with more objects than the bounds (so start-up time and memory are
bounded by construction).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyterhub_gpupool.pool import limits
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.errors import PoolError
from jupyterhub_gpupool.pool.quota import QuotaSpec
from jupyterhub_gpupool.poolconfig import load_pool_config, parse_pool_config
from jupyterhub_gpupool.service.apihandlers.base import MAX_INT, MAX_STR

CATALOG = default_catalog()


def api_takes_name(name: object) -> bool:
    """What the API takes as a name in a body and in a path segment (``[^/]+``, at most
    ``MAX_STR`` characters, NUL refused up front)."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_STR
        and "\x00" not in name
        and ("/" not in name)
    )


#: (a config, the field the refusal names, the bound its message states)
REFUSED = [
    ({"nodes": [{"name": "n", "gpus": [{"model": "T4", "count": 10**12}]}]}, "count", "64"),
    ({"nodes": [{"name": "a\x00b"}]}, "nodes[0].name", "255"),
    ({"nodes": [{"name": "rack/1"}]}, "nodes[0].name", "'/'"),
    ({"nodes": [{"name": "tab\there"}]}, "nodes[0].name", "control"),
    ({"offers": [{"name": "o" * 10_000, "kind": "gpu"}]}, "offers[0].name", "255"),
    ({"offers": [{"name": "o", "kind": "gpu", "count": 65}]}, "offers[0].count", "64"),
    ({"offers": [{"name": "o", "kind": "gpu", "cpu_milli": 2**40}]}, "cpu_milli", "2,147,483,647"),
    ({"offers": [{"name": "o", "kind": "gpu", "groups": ["a/b"]}]}, "groups[0]", "'/'"),
    ({"quotas": {"default": {"limit": 1e308}}}, "quotas.default.limit", "1,000,000"),
    ({"quotas": {"users": {"x": {"budget": 1e10}}}}, "quotas.users.x.budget", "1,000,000,000"),
    ({"quotas": {"groups": {"a\nb": {"limit": 1}}}}, "quotas.groups", "control"),
    ({"nodes": [{"name": "n", "cpu_milli": 2**31}]}, "nodes[0].cpu_milli", "2,147,483,647"),
    ({"prices": {"models": {"T4": 10**7}}}, "prices.models.T4", "1,000,000"),
    ({"nodes": [{"name": "n", "labels": {f"k{i}": "v" for i in range(300)}}]}, "labels", "256"),
]


@pytest.mark.parametrize(("config", "field", "bound"), REFUSED)
def test_a_value_beyond_a_bound_is_one_line_naming_file_field_and_bound(
    tmp_path: Path, config: dict[str, Any], field: str, bound: str
) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    with pytest.raises(PoolError) as e:
        load_pool_config(path, CATALOG)
    line = str(e.value)
    assert "\n" not in line and len(line) < 400, line
    assert line.startswith(f"{path}: ") or str(path) in line, line
    assert field in (e.value.field or "") and bound in line, (field, bound, line)


def test_the_largest_pools_are_refused_before_they_are_built() -> None:
    """Counts are checked before objects are made: 10¹² GPUs on a node, more than
    ``MAX_NODES`` nodes, more than ``MAX_GPUS`` GPUs in all."""
    node = {"name": "n", "gpus": [{"model": "T4", "count": limits.MAX_GPUS_PER_NODE}]}
    many = [dict(node, name=f"n{i}") for i in range(limits.MAX_GPUS // 64 + 1)]
    with pytest.raises(PoolError, match="at most 100,000 GPUs in the pool"):
        parse_pool_config({"nodes": many}, CATALOG)
    nodes = [{"name": f"n{i}"} for i in range(limits.MAX_NODES + 1)]
    with pytest.raises(PoolError, match="at most 10,000 nodes"):
        parse_pool_config({"nodes": nodes}, CATALOG)
    two = {"name": "n", "gpus": [{"model": "T4", "count": 40}, {"model": "T4", "count": 40}]}
    with pytest.raises(PoolError, match="at most 64 GPUs per node"):
        parse_pool_config({"nodes": [two]}, CATALOG)


# -- the fuzz ------------------------------------------------------------------------------------

#: Mostly plausible names and numbers (so configs get through and the accepted ones are
#: checked), with every kind of hostile one mixed in.
PLAIN = st.from_regex(r"[a-z][a-z0-9._-]{0,12}", fullmatch=True)
NAMES = st.one_of(
    PLAIN,
    PLAIN,
    PLAIN,
    st.text(max_size=8),
    st.text(min_size=250, max_size=300),
    st.sampled_from(["a/b", "a\x00b", "ok", "\u202eevil", "x\ny", " ", ""]),
)
NUMBERS = st.one_of(
    st.integers(min_value=1, max_value=8),
    st.integers(min_value=1, max_value=8),
    st.integers(min_value=-5, max_value=100),
    st.integers(min_value=2**30, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, 0.5, 64, 65, 10**12]),
)
MODELS = st.sampled_from(["T4", "A100-80GB", "H100-80GB"])


def gpus() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"model": MODELS}, optional={"count": NUMBERS})


def nodes() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"name": NAMES},
        optional={
            "gpus": st.lists(gpus(), max_size=3),
            "cpu_milli": NUMBERS,
            "memory_mib": NUMBERS,
            "labels": st.dictionaries(NAMES, NAMES, max_size=3),
        },
    )


def offers() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"name": NAMES, "kind": st.sampled_from(["gpu", "shared", "cpu"])},
        optional={
            "count": NUMBERS,
            "cpu_milli": NUMBERS,
            "memory_mib": NUMBERS,
            "fraction": NUMBERS,
            "min_memory_gb": NUMBERS,
            "groups": st.lists(NAMES, max_size=3),
            "display_name": NAMES,
            "priority_class": st.one_of(NAMES, NUMBERS),
        },
    )


def quotas() -> st.SearchStrategy[dict[str, Any]]:
    spec = st.fixed_dictionaries(
        {}, optional={"guarantee": NUMBERS, "limit": NUMBERS, "budget": NUMBERS}
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "default": spec,
            "users": st.dictionaries(NAMES, spec, max_size=3),
            "groups": st.dictionaries(NAMES, spec, max_size=3),
        },
    )


CONFIGS = st.fixed_dictionaries(
    {},
    optional={
        "nodes": st.lists(nodes(), max_size=3),
        "offers": st.lists(offers(), max_size=3),
        "quotas": quotas(),
    },
)


def api_takes_quota(spec: QuotaSpec) -> bool:
    """A quota the API would take back (``PUT quotas/...`` with the fields ``GET`` shows)."""
    body = spec.to_dict()
    numbers = [v for k, v in body.items() if k not in ("period", "budget_action") and v is not None]
    if not all(math.isfinite(v) and v <= limits.MAX_BUDGET for v in numbers):  # type: ignore[arg-type]
        return False
    try:
        QuotaSpec.parse(body)
    except PoolError:
        return False
    return True


@settings(
    max_examples=400,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(config=CONFIGS)
def test_no_accepted_config_is_one_the_api_would_refuse(config: dict[str, Any]) -> None:
    try:
        pool = parse_pool_config(config, CATALOG)
    except PoolError as e:
        assert "\n" not in str(e) and len(str(e)) < 1000, str(e)  # one short line
        return
    # structural bounds: so many objects at most, whatever the file says
    assert len(pool.nodes) <= limits.MAX_NODES
    assert sum(len(n.gpus) for n in pool.nodes) <= limits.MAX_GPUS
    assert all(len(n.gpus) <= limits.MAX_GPUS_PER_NODE for n in pool.nodes)
    assert len(pool.offers) <= limits.MAX_OFFERS
    # names the API can be asked about, numbers its columns hold
    for node in pool.nodes:
        assert api_takes_name(node.name), node.name
        assert 0 <= node.cpu_milli <= MAX_INT and 0 <= node.memory_mib <= MAX_INT
        for key, value in node.labels.items():
            assert (
                0 < len(key) <= MAX_STR and 0 < len(value) <= MAX_STR and "\x00" not in key + value
            )
    for offer in pool.offers:
        assert api_takes_name(offer.name), offer.name
        assert all(api_takes_name(g) for g in offer.groups), offer.groups
        assert 1 <= offer.count <= limits.MAX_GPUS_PER_NODE
        assert 0 <= offer.cpu_milli <= MAX_INT and 0 <= offer.memory_mib <= MAX_INT
        assert "\x00" not in offer.display_name
    for name, spec in (*pool.users.items(), *pool.groups.items()):
        assert api_takes_name(name), name
        assert api_takes_quota(spec), (name, spec)
    if pool.default is not None:
        assert api_takes_quota(pool.default)
