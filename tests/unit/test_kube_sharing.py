"""On Kubernetes a GPU's ``sharing`` must be declared: ``auto`` is refused, naming the field.

Whether a GPU is shared is decided by the node before any request (the device plugin's
time-slicing config, or the GPU's DRA shared claim), so the pool cannot turn a GPU whole or
shared as requests come there. The service runs with ``PoolService.on_kubernetes`` (default: in
a pod) and refuses such a pool config when it starts, in one line, exit status 1.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from jupyterhub_gpupool.kube.kubejobs import KubeJobs
from jupyterhub_gpupool.kube.kueue import KueueAdmission
from jupyterhub_gpupool.kube.labeller import MigLabeller
from jupyterhub_gpupool.kube.occupancy import KubeOccupancy
from jupyterhub_gpupool.kube.sharing import KubeSharing
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.errors import ConfigError
from jupyterhub_gpupool.poolconfig import parse_pool_config
from jupyterhub_gpupool.service.app import PoolService

POOL = {
    "nodes": [
        {
            "name": "n1",
            "gpus": [
                {"model": "H100-80GB", "count": 2, "sharing": "exclusive"},
                {"model": "A100-80GB", "mig": {"enabled": True}},  # MIG: never shared
                {"model": "L4", "sharing": "shared"},
            ],
        }
    ],
    "offers": [{"name": "l4-q", "kind": "shared", "fraction": 0.25, "models": ["L4"]}],
}


def with_gpu(gpu):
    pool = {**POOL, "nodes": [{**POOL["nodes"][0], "gpus": [*POOL["nodes"][0]["gpus"], gpu]}]}
    return pool


def test_declared_sharing_and_mig_gpus_are_fine_on_kubernetes():
    config = parse_pool_config(POOL, default_catalog(), kubernetes=True)
    assert [g.sharing for g in config.nodes[0].gpus] == ["exclusive", "exclusive", "auto", "shared"]


@pytest.mark.parametrize("gpu", [{"model": "L4"}, {"model": "L4", "sharing": "auto"}])
def test_auto_is_refused_on_kubernetes_naming_the_field(gpu):
    with pytest.raises(ConfigError) as info:
        parse_pool_config(with_gpu(gpu), default_catalog(), kubernetes=True)
    assert info.value.field == "nodes[0].gpus[3].sharing"
    assert info.value.allowed == ["exclusive", "shared"]
    assert "nodes[0].gpus[3].sharing: sharing 'auto' cannot work on Kubernetes" in str(
        info.value.message
    )
    assert "nvidia.com/device-plugin.config" in info.value.message
    # elsewhere (one machine, simulated pools) auto stays the default
    config = parse_pool_config(with_gpu(gpu), default_catalog())
    assert config.nodes[0].gpus[-1].sharing == "auto"


def test_the_service_knows_it_runs_in_a_pod(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert PoolService().on_kubernetes is False
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert PoolService().on_kubernetes is True
    # a demo on one machine's (simulated or real) GPUs that happens to run in a pod
    assert PoolService(telemetry_source="sim").on_kubernetes is False
    assert PoolService(telemetry_source="sim", on_kubernetes=True).on_kubernetes is True


def test_the_service_in_a_pod_refuses_auto_in_one_line(tmp_path):
    (tmp_path / "pool.yaml").write_text(
        "nodes:\n  - name: n1\n    gpus:\n      - {model: L4, count: 2}\n"
    )
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyterhub_gpupool.cli",
            "service",
            "--PoolService.pool_config_file=pool.yaml",
            f"--PoolService.db_url=sqlite:///{tmp_path}/pool.sqlite",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(
        "pool config: pool.yaml: nodes[0].gpus[0].sharing: sharing 'auto' cannot work on Kubernetes"
    ), done.stderr


def test_a_stopping_service_closes_its_kubernetes_clients():
    """The labeller's, the cluster readers' and the Kueue controller's clients are closed on
    stop (each opened lazily on first use; closing one never opened is a no-op)."""
    svc = PoolService()
    svc.mig_labeller = MigLabeller(parent=svc, api_host="http://127.0.0.1:1")
    svc.occupancy = KubeOccupancy(parent=svc, api_host="http://127.0.0.1:1")
    svc.kube_sharing = KubeSharing(parent=svc, api_host="http://127.0.0.1:1")
    svc.kueue = KueueAdmission(parent=svc, api_host="http://127.0.0.1:1")
    svc.kube_jobs = KubeJobs(parent=svc, api_host="http://127.0.0.1:1")

    async def scenario():
        opened = [svc.mig_labeller.client(), svc.occupancy.client(), svc.kueue.client()]
        # sharing never used
        assert not any(c._http.is_closed for c in opened)
        await svc.close_kube_clients()
        assert all(c._http.is_closed for c in opened)
        assert svc.occupancy.client() is not opened[1]  # a later use opens a new one
        await svc.close_kube_clients()

    asyncio.run(scenario())
