"""helm/examples/z2jh-values.yaml: valid for zero-to-jupyterhub, and the hub it configures talks
to what the jupyterhub-gpupool chart installs."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
from traitlets.config import Config

from jupyterhub_gpupool.hubconfig import SPAWNERS
from jupyterhub_gpupool.service import scopes

from .conftest import ROOT, load_yaml, one, pod_specs

EXAMPLE = ROOT / "helm/examples/z2jh-values.yaml"
GPU_OPERATOR = ROOT / "helm/examples/gpu-operator-values.yaml"
EXCERPT = ROOT / "tests/helm/z2jh-values-schema-excerpt.yaml"
CHART_VALUES = ROOT / "helm/jupyterhub-gpupool/values.yaml"


@pytest.fixture(scope="module")
def example() -> dict[str, Any]:
    return load_yaml(EXAMPLE)


@pytest.fixture(scope="module")
def excerpt() -> dict[str, Any]:
    return load_yaml(EXCERPT)


def test_excerpt_names_the_z2jh_release_it_came_from(excerpt) -> None:
    assert excerpt["z2jh_chart_version"] == "4.4.0"
    assert "jupyterhub/values.schema.yaml" in EXCERPT.read_text().split("\n", 4)[2]


def test_example_is_valid_z2jh_values(example, excerpt) -> None:
    jsonschema.validate(example, excerpt, cls=jsonschema.Draft7Validator)


RENAMES = {
    "hub.loadRoles": "load_roles",
    "hub.extraConfig": "extra_config",
    "hub.services": "service",
    "hub.image": "images",
    "singleuser.image": "img",
    "singleuser.startTimeout": "start_timeout",
    "proxy.chp.networkPolicy.egress": "egres",
    "proxy.chp.networkPolicy": "netpol",
}


@pytest.mark.parametrize("path", sorted(RENAMES))
def test_a_key_z2jh_does_not_know_fails(example, excerpt, path: str) -> None:
    """The excerpt is closed along every path the example uses: a renamed key is refused."""
    bad = copy.deepcopy(example)
    *parents, key = path.split(".")
    node = bad
    for part in parents:
        node = node[part]
    node[RENAMES[path]] = node.pop(key)
    with pytest.raises(jsonschema.ValidationError, match=RENAMES[path]):
        jsonschema.validate(bad, excerpt, cls=jsonschema.Draft7Validator)


def _secret(key: str) -> str:
    return f"token-of-{key}"


def hub_config(values: dict[str, Any]) -> Config:
    """What z2jh's jupyterhub_config.py makes of ``values``' hub.services, hub.loadRoles and
    hub.extraConfig (the loops of jupyterhub/files/hub/jupyterhub_config.py in z2jh 4.4.0,
    L364-L439 and L539-L542), with the generated tokens faked."""
    import sys
    import types

    c = Config()
    c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
    c.JupyterHub.services = []
    c.JupyterHub.load_roles = []
    for key, service in copy.deepcopy(values["hub"].get("services", {})).items():
        service.setdefault("name", key)
        service.pop("apiToken", None)
        service["api_token"] = _secret(f"hub.services.{key}.apiToken")
        c.JupyterHub.services.append(service)
    for key, role in copy.deepcopy(values["hub"].get("loadRoles", {})).items():
        role.setdefault("name", key)
        c.JupyterHub.load_roles.append(role)
    z2jh = types.ModuleType("z2jh")
    z2jh.get_secret_value = _secret  # type: ignore[attr-defined]
    sys.modules["z2jh"] = z2jh
    try:
        for _, config_py in sorted(values["hub"].get("extraConfig", {}).items()):
            exec(compile(config_py, "extraConfig", "exec"), {"c": c})
    finally:
        del sys.modules["z2jh"]
    return c


def test_extra_config_selects_the_kube_spawner_and_the_pool(example) -> None:
    c = hub_config(example)
    assert c.JupyterHub.spawner_class == SPAWNERS["kube"]
    module, _, name = c.JupyterHub.spawner_class.rpartition(".")
    spawner = getattr(__import__(module, fromlist=[name]), name)
    assert spawner.__name__ == "GPUPoolKubeSpawner"
    assert c.JupyterHub.custom_scopes == scopes.CUSTOM_SCOPES
    assert c.GPUPoolSpawnerMixin.pool_api_token == _secret("hub.services.gpupool-spawner.apiToken")
    assert c.GPUPoolKubeSpawner.mig_strategy in spawner.mig_strategy.values


def test_every_service_once_with_the_token_z2jh_made(example) -> None:
    services = hub_config(example).JupyterHub.services
    names = [s["name"] for s in services]
    assert sorted(names) == ["gpupool", "gpupool-agent", "gpupool-reclaimer", "gpupool-spawner"]
    for service in services:
        assert service["api_token"] == _secret(f"hub.services.{service['name']}.apiToken")
    pool = next(s for s in services if s["name"] == "gpupool")
    assert pool["url"] == example["hub"]["services"]["gpupool"]["url"]


def test_roles_use_only_scopes_that_exist(example) -> None:
    roles = {r["name"]: r for r in hub_config(example).JupyterHub.load_roles}
    custom = set(scopes.CUSTOM_SCOPES)
    for role in roles.values():
        for scope in role["scopes"]:
            base = scope.split("!", 1)[0]
            if base.startswith("custom:"):
                assert base in custom, (role["name"], scope)
    assert roles["gpupool-agent"]["scopes"] == [scopes.AGENT]
    assert roles["gpupool-agent"]["services"] == ["gpupool-agent"]
    assert scopes.RECLAIM in roles["gpupool-reclaimer"]["scopes"]
    from jupyterhub_gpupool import hubconfig

    if not hasattr(hubconfig, "RECLAIMER_SCOPES"):
        pytest.skip("hubconfig has no RECLAIMER_SCOPES yet")
    assert roles["gpupool-reclaimer"]["scopes"] == list(hubconfig.RECLAIMER_SCOPES)
    assert scopes.SPAWN in roles["gpupool-spawner"]["scopes"]  # from configure_hub
    assert f"{scopes.USE}!user" in roles["user"]["scopes"]


def test_the_hub_and_the_chart_agree(example, render) -> None:
    """The URLs, tokens, MIG strategy and network access of the two charts match."""
    manifests = render({})
    c = hub_config(example)
    chart_values = load_yaml(CHART_VALUES)
    service = one(manifests, "Service", "gpupool")
    port = service["spec"]["ports"][0]["port"]
    assert example["hub"]["services"]["gpupool"]["url"] == f"http://gpupool:{port}"
    agent = one(manifests, "DaemonSet", "gpupool-agent")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in agent["containers"][0]["env"]}
    assert c.GPUPoolKubeSpawner.pool_api_url == env["GPUPOOL_SERVICE_URL"] + "api/v1/"
    # every token the chart's pods read is one z2jh writes to its hub Secret
    written = {f"hub.services.{key}.apiToken" for key in example["hub"]["services"]}
    for _, spec in pod_specs(manifests):
        for e in spec["containers"][0]["env"]:
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref and ref["key"] != "cookie-secret":  # the chart's own key, not a token
                assert ref["name"] == "hub" and ref["key"] in written, ref
    # one MIG strategy everywhere: device plugin, spawner, pool chart
    strategy = load_yaml(GPU_OPERATOR)["mig"]["strategy"]
    assert strategy == c.GPUPoolKubeSpawner.mig_strategy == chart_values["mig"]["strategy"]
    # the proxy may reach the pool's pods on their port
    (rule,) = example["proxy"]["chp"]["networkPolicy"]["egress"]
    pool_labels = one(manifests, "Deployment", "gpupool")["spec"]["template"]["metadata"]
    selector = rule["to"][0]["podSelector"]["matchLabels"]
    assert selector.items() <= pool_labels["labels"].items()
    assert rule["ports"][0]["port"] == port
