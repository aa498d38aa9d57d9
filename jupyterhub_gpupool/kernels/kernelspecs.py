"""Kernelspecs "Python 3 (GPU: <offer>)", one per GPU offer the user may use, each starting
a local ipykernel through the ``gpupool-provisioner`` with its offer.

Written into a kernelspec folder the server reads (default: the user's
``<jupyter data dir>/kernels``), named ``gpupool-<offer>``; a ``gpupool-*`` spec whose offer
is gone is removed, others are never touched. ``jupyterhub-gpupool kernelspecs`` writes them
once; the server extension in this package (``jupyterhub_gpupool.kernels``) writes them at
server start and again every ``refresh_interval``, so the launcher follows the offers.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: The provisioner's entry point name (``jupyter_client.kernel_provisioners``).
PROVISIONER = "gpupool-provisioner"
PREFIX = "gpupool-"
_UNSAFE = re.compile(r"[^a-z0-9._-]+")


def spec_name(offer: str) -> str:
    """The kernelspec folder of ``offer`` (kernelspec names are lowercase, no spaces)."""
    return PREFIX + (_UNSAFE.sub("-", offer.lower()).strip("-") or "offer")


def kernelspec(offer: Mapping[str, Any], python: str = sys.executable) -> dict[str, Any]:
    """The ``kernel.json`` of a GPU kernel for ``offer`` (an item of ``GET offers``)."""
    shown = offer.get("display_name") or offer["name"]
    return {
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python 3 (GPU: {shown})",
        "language": "python",
        "metadata": {
            "debugger": True,
            "kernel_provisioner": {
                "provisioner_name": PROVISIONER,
                "config": {"offer": offer["name"], "offer_name": shown},
            },
        },
    }


def gpu_offers(offers: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The offers that hold a GPU (a CPU-only offer makes no GPU kernel)."""
    return [o for o in offers if o.get("kind") != "cpu"]


def write_kernelspecs(
    offers: Iterable[Mapping[str, Any]], folder: Path, python: str = sys.executable
) -> list[str]:
    """Write one kernelspec per GPU offer into ``folder``; remove ``gpupool-*`` specs of offers
    no longer there. Returns the spec names written (a spec already as wanted is left as is)."""
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {spec_name(str(o["name"])): kernelspec(o, python) for o in gpu_offers(offers)}
    written = []
    for name, spec in sorted(wanted.items()):
        path = folder / name / "kernel.json"
        text = json.dumps(spec, indent=1, sort_keys=True)
        if path.is_file() and path.read_text() == text:
            continue
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        written.append(name)
    for old in folder.glob(PREFIX + "*"):
        if old.is_dir() and old.name not in wanted:
            shutil.rmtree(old, ignore_errors=True)
    return written


def default_folder() -> Path:
    """The user's own kernelspec folder (Jupyter's data dir)."""
    from ..extras import require

    paths = require("jupyter_core.paths", "writing kernelspecs without --dir")
    return Path(paths.jupyter_data_dir()) / "kernels"
