"""The GPU kernelspecs: one "Python 3 (GPU: <offer>)" per GPU offer the user may use, written
by ``jupyterhub-gpupool kernelspecs`` and the server extension from the pool's real offers
(the service in-process), following the offers when they change."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyterhub_gpupool.cli import main
from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.kernels.extension import GpuKernelSpecs
from jupyterhub_gpupool.kernels.kernelspecs import PROVISIONER, write_kernelspecs
from jupyterhub_gpupool.service.scopes import USE
from tests.fakes import InProcessService, StoreClock, make_store

POOL: dict[str, Any] = {
    "nodes": [{"name": "n", "gpus": [{"model": "H100-80GB", "count": 1}]}],
    "offers": [
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"], "display_name": "1x H100"},
        {"name": "cpu-only", "kind": "cpu"},
        {"name": "secret", "kind": "gpu", "groups": ["staff"]},
    ],
}
MODELS = {"alice": {"kind": "user", "name": "alice", "scopes": [f"{USE}!user=alice"]}}


@pytest.fixture
def svc(sqlite_url: str, clock: StoreClock) -> Iterator[InProcessService]:
    upgrade(sqlite_url)
    with InProcessService(make_store(sqlite_url, clock, POOL), MODELS) as s:
        yield s


def test_specs_follow_the_offers_and_leave_other_kernels_alone(tmp_path: Path):
    (tmp_path / "python3").mkdir()  # someone else's kernel
    (tmp_path / "python3" / "kernel.json").write_text("{}")
    offers = [{"name": "A100 1g.10gb", "kind": "mig", "display_name": "A100 1g.10gb"}]
    assert write_kernelspecs(offers, tmp_path, "/py") == ["gpupool-a100-1g.10gb"]
    spec = json.loads((tmp_path / "gpupool-a100-1g.10gb" / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (GPU: A100 1g.10gb)"
    assert spec["argv"][:3] == ["/py", "-m", "ipykernel_launcher"]
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": PROVISIONER,
        "config": {"offer": "A100 1g.10gb", "offer_name": "A100 1g.10gb"},
    }
    assert write_kernelspecs(offers, tmp_path, "/py") == []  # unchanged: nothing rewritten
    assert write_kernelspecs([], tmp_path) == []  # the offer is gone: so is its kernel
    assert sorted(p.name for p in tmp_path.iterdir()) == ["python3"]


def test_the_command_and_the_server_extension_write_the_users_offers(svc, tmp_path, capsys):
    url = f"{svc.url}/api/v1"
    assert (
        main(["kernelspecs", "--dir", str(tmp_path / "a"), "--api-url", url, "--token", "alice"])
        == 0
    )
    assert "1 GPU kernelspec(s)" in capsys.readouterr().out
    # the CPU offer makes no GPU kernel; the staff-only offer is not alice's
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["gpupool-h100"]
    ext = GpuKernelSpecs(folder=str(tmp_path / "b"), api_url=url, api_token="alice")
    assert asyncio.run(ext.refresh()) == ["gpupool-h100"]
    assert main(["kernelspecs", "--dir", str(tmp_path), "--api-url", "", "--token", ""]) == 1
