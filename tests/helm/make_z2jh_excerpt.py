"""Make z2jh-values-schema-excerpt.yaml: the parts of zero-to-jupyterhub's values schema that
helm/examples/z2jh-values.yaml uses.

Kept as a script so the excerpt can be taken again from a newer z2jh release:

    python tests/helm/make_z2jh_excerpt.py PATH/TO/zero-to-jupyterhub-k8s 4.4.0

It reads ``jupyterhub/values.schema.yaml`` of that checkout and keeps, along every key path the
example values use, the object levels with their ``additionalProperties`` (so a key z2jh renamed
or removed is refused where z2jh refuses it) and, at the keys themselves, the whole sub-schema.
``description`` and ``required`` are left out: the example is merged over z2jh's defaults, so
z2jh's required keys come from there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
EXAMPLE = HERE.parents[1] / "helm" / "examples" / "z2jh-values.yaml"
EXCERPT = HERE / "z2jh-values-schema-excerpt.yaml"


def strip(node: Any) -> Any:
    """A sub-schema without its descriptions (and the titles of its keys kept)."""
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k not in {"description", "required"}}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def excerpt(schema: dict[str, Any], values: Any) -> dict[str, Any]:
    """The part of ``schema`` that validates ``values``."""
    closed = schema.get("additionalProperties") is False and "properties" in schema
    if not (closed and isinstance(values, dict)):
        return strip(schema)
    props = schema["properties"]
    out: dict[str, Any] = {k: strip(v) for k, v in schema.items() if k == "type"}
    out["additionalProperties"] = False
    out["properties"] = {k: excerpt(props[k], v) for k, v in values.items() if k in props}
    return out


def main(checkout: str, version: str) -> None:
    """Write the excerpt from the z2jh checkout at ``version`` (a git tag)."""
    text = subprocess.run(
        ["git", "-C", checkout, "show", f"{version}:jupyterhub/values.schema.yaml"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    schema = yaml.safe_load(text)
    values = yaml.safe_load(EXAMPLE.read_text())
    body = excerpt(schema, values)
    body["$schema"] = schema["$schema"]
    header = (
        "# An excerpt of zero-to-jupyterhub's values schema: the keys that\n"
        "# helm/examples/z2jh-values.yaml uses, made by tests/helm/make_z2jh_excerpt.py from\n"
        f"# jupyterhub/values.schema.yaml of the z2jh chart {version}\n"
        "# (github.com/jupyterhub/zero-to-jupyterhub-k8s, BSD-3-Clause). Descriptions left out.\n"
    )
    body = {"z2jh_chart_version": version, **body}
    EXCERPT.write_text(header + yaml.safe_dump(body, sort_keys=False, width=100))


if __name__ == "__main__":
    main(*sys.argv[1:3])
