"""Every configurable trait has a help string and a default that works (house rule)."""

import pytest

from jupyterhub_gpupool.jobs.app import JobRunner
from jupyterhub_gpupool.reclaim.app import ReclaimerApp
from jupyterhub_gpupool.service.app import PoolService
from jupyterhub_gpupool.spawner.base import GPUPoolSpawnerMixin

CLASSES = [PoolService, ReclaimerApp, GPUPoolSpawnerMixin, JobRunner]
try:
    from jupyterhub_gpupool.spawner.drakube import DRAClaims
    from jupyterhub_gpupool.spawner.kube import GPUPoolKubeSpawner

    CLASSES += [GPUPoolKubeSpawner, DRAClaims]
except ImportError:  # the kubernetes extra is optional
    pass
try:
    from jupyterhub_gpupool.kernels.kubelaunch import KubeLaunch
    from jupyterhub_gpupool.kernels.provisioner import GpuPoolProvisioner

    CLASSES += [GpuPoolProvisioner, KubeLaunch]
except ImportError:  # the kernels extra (jupyter_client) is optional
    pass


@pytest.mark.parametrize("cls", CLASSES)
def test_every_trait_is_documented(cls):
    traits = cls.class_own_traits(config=True)
    assert traits
    undocumented = [name for name, t in traits.items() if not (t.help or "").strip()]
    assert undocumented == []


def test_defaults_work_without_a_hub(monkeypatch):
    for var in ("JUPYTERHUB_SERVICE_URL", "JUPYTERHUB_SERVICE_PREFIX", "JUPYTERHUB_API_URL"):
        monkeypatch.delenv(var, raising=False)
    app = PoolService()
    assert (app.ip, app.port, app.base_url) == ("127.0.0.1", 10101, "/services/gpupool/")
    assert app.db_url.startswith("sqlite:///")
    assert app.hub_api_url == "http://127.0.0.1:8081/hub/api"


def test_hub_environment_sets_where_to_listen(monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_SERVICE_URL", "http://10.1.2.3:9999")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/services/pool/")
    app = PoolService()
    assert (app.ip, app.port, app.base_url) == ("10.1.2.3", 9999, "/services/pool/")
