"""Every pool config shown in the docs parses: an example that the service would refuse to start
on teaches the wrong thing, and nothing else would notice it going stale."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.poolconfig import parse_pool_config

DOCS = Path(__file__).resolve().parents[2] / "docs" / "source"
TOP = {
    "nodes",
    "offers",
    "quotas",
    "reclaim",
    "simulation",
    "clusters",
    "prices",
    "classes",
    "borrowing",
}


def pool_configs() -> list[tuple[str, dict]]:
    """The YAML blocks of the docs that are whole pool configs (top-level keys of one, with
    offers or nodes), by page and position."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        blocks = re.findall(r"^```yaml\n(.*?)^```", page.read_text(), re.S | re.M)
        for i, block in enumerate(blocks):
            try:
                raw = yaml.safe_load(block)
            except yaml.YAMLError:
                continue  # a fragment with placeholders, not a file
            if isinstance(raw, dict) and set(raw) <= TOP and {"offers", "nodes"} & set(raw):
                found.append((f"{page.relative_to(DOCS)}#{i}", raw))
    return found


CONFIGS = pool_configs()


def test_the_docs_show_pool_configs():
    pages = {where.split("#")[0] for where, _ in CONFIGS}
    assert "reference/pool-config.md" in pages and "howto/reclaim-policies.md" in pages


@pytest.mark.parametrize(("where", "raw"), CONFIGS, ids=[w for w, _ in CONFIGS])
def test_every_pool_config_in_the_docs_parses(where, raw):
    config = parse_pool_config(raw, default_catalog())
    assert [o.name for o in config.offers] == [o["name"] for o in raw.get("offers", [])]
