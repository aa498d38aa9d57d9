"""The chart: lint, render with every option, Kubernetes' own schemas, and what each object must
hold (security, permissions, network access, the commands the image really has)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import ALL_ON, CHART, NAMESPACE, VARIANTS, by_kind, containers, helm, one, pod_specs

kubernetes_validate = pytest.importorskip("kubernetes_validate")

#: The chart's kubeVersion floor and the newest Kubernetes kubernetes-validate knows.
KUBE_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
#: Kinds that are not Kubernetes' own (CRDs): checked by hand below.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize(
    "case", ["defaults", "all-on", "gitops-external", "gitops-bundled-postgresql"]
)
def test_helm_lint_strict(case: str) -> None:
    report = helm.lint(CHART, VARIANTS[case], strict=True, namespace=NAMESPACE)
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("case", sorted(VARIANTS))
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_manifest_passes_kubernetes_schema(render, case: str, kube_version: str) -> None:
    manifests = render(VARIANTS[case])
    assert manifests
    for manifest in manifests:
        if manifest["kind"] in CRD_KINDS:
            continue
        kubernetes_validate.validate(manifest, desired_version=kube_version, strict=True)


def test_all_on_renders_every_template(render) -> None:
    """Every template file renders something with every option on (none is dead)."""
    rendered = {
        (m["kind"], m["metadata"]["name"])
        for case in ("all-on", "defaults")
        for m in render(VARIANTS[case])
    }
    kinds = {kind for kind, _ in rendered}
    templates = {
        p.relative_to(CHART / "templates").as_posix() for p in (CHART / "templates").rglob("*.yaml")
    }
    assert len(rendered) >= len(templates), (sorted(rendered), sorted(templates))
    assert kinds >= {
        "Deployment",
        "DaemonSet",
        "StatefulSet",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ConfigMap",
        "Secret",
        "PersistentVolumeClaim",
        "ServiceMonitor",
        "PrometheusRule",
    }


def test_labels_and_names_come_from_helpers(render) -> None:
    for case in ("defaults", "all-on"):
        for m in render(VARIANTS[case]):
            labels = m["metadata"]["labels"]
            assert labels["app.kubernetes.io/name"] == "jupyterhub-gpupool"
            assert labels["app.kubernetes.io/instance"] == "gpupool"
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["app.kubernetes.io/component"] in {
                "pool",
                "agent",
                "reclaimer",
                "postgresql",
                "upgrade-db",
                "kernels",
            }
            assert m["metadata"]["name"].startswith(("gpupool", f"{NAMESPACE}-gpupool"))


def test_names_without_fullname_override(render) -> None:
    names = {m["metadata"]["name"] for m in render(VARIANTS["minimal"])}
    assert "gpupool-jupyterhub-gpupool" in names  # release-chart, as z2jh with fullname null


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_security_context_resources_and_tmp_on_everything(render, case: str) -> None:
    for workload, spec in pod_specs(render(VARIANTS[case])):
        tmp = [v for v in spec["volumes"] if v["name"] == "tmp"]
        assert tmp == [{"name": "tmp", "emptyDir": {}}], workload
        for c in containers(spec):
            sc = c["securityContext"]
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], workload
            assert sc["readOnlyRootFilesystem"] is True, workload
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], workload
            if sc.get("privileged"):  # only the dynamic-MIG agent, checked below
                assert workload == "DaemonSet/gpupool-agent"
                continue
            assert spec["securityContext"]["runAsNonRoot"] is True, workload
            assert sc["capabilities"]["drop"] == ["ALL"], workload
            assert sc["allowPrivilegeEscalation"] is False, workload


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_every_gpupool_variable_given_to_a_container_is_read_by_the_package(render, case) -> None:
    """A ``GPUPOOL_*`` variable no code reads would only look like a setting (the service once
    got ``GPUPOOL_MIG_STRATEGY``, which nothing reads: the MIG strategy is the spawner's)."""
    package = Path(__file__).resolve().parents[2] / "jupyterhub_gpupool"
    # the package, and the Python config the chart's ConfigMap gives the service
    readers = [*package.rglob("*.py"), CHART / "templates/pool/configmap.yaml"]
    source = "\n".join(p.read_text() for p in readers)
    for workload, spec in pod_specs(render(VARIANTS[case])):
        for c in containers(spec):
            for e in c.get("env", []):
                if e["name"].startswith("GPUPOOL_"):
                    assert f'"{e["name"]}"' in source, (workload, e["name"])


def test_agent_unprivileged_without_dynamic_mig(render) -> None:
    ds = one(render({}), "DaemonSet", "gpupool-agent")
    spec = ds["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["runtimeClassName"] == "nvidia"
    assert "hostPID" not in spec
    assert "privileged" not in container["securityContext"]
    assert spec["securityContext"]["runAsUser"] == 1000
    assert "--dynamic-mig" not in container["args"]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])  # takes no GPU
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUPOOL_CLUSTER"]["value"] == "default"
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["GPUPOOL_SERVICE_URL"]["value"] == "http://gpupool:10101/services/gpupool/"


def test_agent_privileged_with_host_pid_only_with_dynamic_mig(render) -> None:
    values = VARIANTS["agent-dynamic-mig"]
    spec = one(render(values), "DaemonSet", "gpupool-agent")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert spec["hostPID"] is True
    assert container["securityContext"]["privileged"] is True
    assert "--dynamic-mig" in container["args"]
    assert "runtimeClassName" not in spec  # null: the nodes' default runtime
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUPOOL_CLUSTER"]["value"] == "default"
    all_on = one(render(ALL_ON), "DaemonSet", "gpupool-agent")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in all_on["containers"][0]["env"]}
    assert env["GPUPOOL_CLUSTER"]["value"] == "eu-west-1"
    # hostPID can be forced either way
    forced = render({"agent": {"hostPID": True}})
    spec = one(forced, "DaemonSet", "gpupool-agent")["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and "privileged" not in spec["containers"][0]["securityContext"]


def test_tokens_from_z2jh_hub_secret_by_default(render) -> None:
    manifests = render({})
    # SQLite, tokens from z2jh: the only Secret of ours is the replicas' cookie key
    (cookie,) = by_kind(manifests, "Secret")
    assert cookie["metadata"]["name"] == "gpupool-cookie"
    key = base64.b64decode(cookie["data"]["cookie-secret"]).decode()
    assert len(bytes.fromhex(key)) == 32  # generated: 32 bytes of hex, as the service wants
    refs = {}
    for _, spec in pod_specs(manifests):
        for c in spec["containers"]:
            for e in c["env"]:
                if "secretKeyRef" in e.get("valueFrom", {}):
                    refs[(c["name"], e["name"])] = e["valueFrom"]["secretKeyRef"]
    assert refs == {
        ("pool", "JUPYTERHUB_API_TOKEN"): {"name": "hub", "key": "hub.services.gpupool.apiToken"},
        ("pool", "GPUPOOL_COOKIE_SECRET"): {"name": "gpupool-cookie", "key": "cookie-secret"},
        ("agent", "GPUPOOL_AGENT_TOKEN"): {
            "name": "hub",
            "key": "hub.services.gpupool-agent.apiToken",
        },
        ("reclaimer", "GPUPOOL_RECLAIMER_TOKEN"): {
            "name": "hub",
            "key": "hub.services.gpupool-reclaimer.apiToken",
        },
    }


def _secret_data(manifests: list[dict], name: str) -> dict[str, str]:
    import base64

    secret = one(manifests, "Secret", name)
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_own_secret_and_bundled_postgresql(render) -> None:
    manifests = render(ALL_ON)
    data = _secret_data(manifests, "gpupool-secret")
    assert data["pool-token"] == "t-pool" and data["agent-token"] == "t-agent"
    # the password is URL-quoted in the URL
    assert data["db-url"] == "postgresql://gpupool:p%40ss%2Fword@gpupool-postgresql:5432/gpupool"
    assert data["postgresql-password"] == "p@ss/word"
    deployment = one(manifests, "Deployment", "gpupool")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPUPOOL_DB_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "gpupool-secret",
        "key": "db-url",
    }
    assert env["GPUPOOL_NAMED_SERVER_LIMIT"]["value"] == "3"
    assert by_kind(manifests, "PersistentVolumeClaim") == []


def test_generated_postgresql_password_matches_its_url(render) -> None:
    data = _secret_data(
        render({"database": {"type": "postgresql"}, "postgresql": {"enabled": True}}),
        "gpupool-secret",
    )
    assert len(data["postgresql-password"]) == 32
    assert f":{data['postgresql-password']}@" in data["db-url"]


def test_sqlite_deployment_recreates_on_its_volume(render) -> None:
    manifests = render({})
    deployment = one(manifests, "Deployment", "gpupool")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    claim = one(manifests, "PersistentVolumeClaim", "gpupool-db")
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"


def test_service_monitor(render) -> None:
    monitor = one(render(ALL_ON), "ServiceMonitor", "gpupool")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http"  # the Service's port name
    assert endpoint["path"] == "/services/gpupool/metrics"
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "prometheus-token", "key": "token"},
    }
    service = one(render(ALL_ON), "Service", "gpupool")
    assert service["spec"]["ports"][0]["name"] == "http"
    assert monitor["spec"]["selector"] == {"matchLabels": service["spec"]["selector"]}


def test_pool_config_in_the_configmap_loads(render) -> None:
    """The ConfigMap's pool.yaml is a pool config the service accepts."""
    from jupyterhub_gpupool.pool.catalog import default_catalog
    from jupyterhub_gpupool.poolconfig import parse_pool_config

    config_map = one(render(ALL_ON), "ConfigMap", "gpupool-config")
    config = parse_pool_config(yaml.safe_load(config_map["data"]["pool.yaml"]), default_catalog())
    assert [o.name for o in config.offers] == ["a100-1g", "h100"]


def _env_for_local_run(container: dict, values: dict[str, str]) -> dict[str, str]:
    """The container's env as plain values: secretKeyRefs from ``values``, the downward API
    faked."""
    env = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e["valueFrom"]:
            env[e["name"]] = values[e["valueFrom"]["secretKeyRef"]["key"]]
        else:
            env[e["name"]] = "node-1"
    return env


def _run_cli(args: list[str], env: dict[str, str], tmp_path: Path) -> dict:
    """Run ``jupyterhub-gpupool`` as the container would (its own args), printing its config."""
    assert args[0] == "jupyterhub-gpupool"
    cmd = [sys.executable, "-m", "jupyterhub_gpupool.cli", *args[1:]]
    proc = subprocess.run(
        cmd,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_service_runs_with_the_rendered_command_and_config(render, tmp_path: Path) -> None:
    """The Deployment's args, env and ConfigMap files, given to the real service: every flag
    exists, the config file loads, the pool config is accepted, pool.config is merged."""
    manifests = render(ALL_ON)
    config_map = one(manifests, "ConfigMap", "gpupool-config")
    spec = one(manifests, "Deployment", "gpupool")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "config")
    for name, text in config_map["data"].items():
        (tmp_path / name).write_text(text)
    args = [a.replace(mount, str(tmp_path)) for a in container["args"]]
    db = f"sqlite:///{tmp_path}/pool.sqlite"  # the service is given SQLite to start here
    env = _env_for_local_run(
        container, {"db-url": db, "pool-token": "t-pool", "cookie-secret": "cd" * 32}
    )
    shown = _run_cli([*args, "--PoolService.show_config_json=True"], env, tmp_path)
    service = shown["PoolService"]
    assert service["db_url"] == db  # from GPUPOOL_DB_URL, through the config file
    assert service["grant_timeout"] == 900  # pool.config
    assert service["aging_interval"] == 300  # pool.extraArgs
    assert service["port"] == 10101 and service["ip"] == "0.0.0.0"
    assert service["pool_config_file"] == f"{tmp_path}/pool.yaml"
    # the service never migrates (the hook Job or the init container does): it waits
    assert "upgrade_db" not in service
    assert service["schema_wait"] == 300
    # mig.repartition.enabled: the service writes nodes' nvidia.com/mig.config label
    assert shown["MigLabeller"]["enabled"] is True


def test_the_agent_runs_with_the_rendered_command(render, tmp_path: Path) -> None:
    spec = one(render(ALL_ON), "DaemonSet", "gpupool-agent")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = _env_for_local_run(container, {"agent-token": "t-agent"})
    shown = _run_cli([*container["args"], "--NodeAgent.show_config_json=True"], env, tmp_path)
    agent = shown["NodeAgent"]
    assert agent["interval"] == 2.5
    assert "dynamic_mig" not in agent  # shown: the config given, --dynamic-mig not given
    assert agent["inventory_interval"] == 60
    # dynamic MIG where the device plugin is off; an agents-only install's remote pool
    for case in ("agent-dynamic-mig", "agents-only"):
        ds = one(render(VARIANTS[case]), "DaemonSet", "gpupool-agent")
        (container,) = ds["spec"]["template"]["spec"]["containers"]
        tokens = {"agent-token": "t-agent", "hub.services.gpupool-agent.apiToken": "t-agent"}
        env = _env_for_local_run(container, tokens)
        shown = _run_cli([*container["args"], "--NodeAgent.show_config_json=True"], env, tmp_path)
        assert shown["NodeAgent"].get("dynamic_mig", False) is (case == "agent-dynamic-mig")


def test_the_reclaimer_runs_with_the_rendered_command(render, tmp_path: Path) -> None:
    spec = one(render(ALL_ON), "Deployment", "gpupool-reclaimer")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = _env_for_local_run(container, {"reclaimer-token": "t-rc"})
    shown = _run_cli([*container["args"], "--ReclaimerApp.show_config_json=True"], env, tmp_path)
    reclaimer = shown["ReclaimerApp"]
    assert reclaimer["proxy_url"] == "http://proxy-public"
    # /metrics and /health where the kubelet's probes reach them
    assert reclaimer["metrics_port"] == 10102 and reclaimer["metrics_ip"] == "0.0.0.0"
    assert env["GPUPOOL_SERVICE_URL"] == "http://gpupool:10101/services/gpupool/"
    assert env["JUPYTERHUB_API_URL"] == "http://hub:8081/hub/api"
    assert env["GPUPOOL_RECLAIMER_TOKEN"] == "t-rc"


def test_dockerfile_builds_the_image_the_chart_runs() -> None:
    """The Dockerfile makes the chart's default image: from the wheel, as the chart's user,
    on the chart's port."""
    dockerfile = (CHART.parents[1] / "Dockerfile").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert "python -m build --wheel" in dockerfile
    assert "jupyterhub_gpupool-*.whl)[postgres,nvml,kubelet]" in dockerfile
    uid = values["pool"]["podSecurityContext"]["runAsUser"]
    assert f"USER {uid}:{values['pool']['podSecurityContext']['runAsGroup']}" in dockerfile
    assert f"EXPOSE {values['pool']['port']}" in dockerfile
    source = "github.com/jupyterhub-gpupool/jupyterhub-gpupool"
    assert source in dockerfile
    for component in ("pool", "agent", "reclaimer"):
        assert values[component]["image"]["name"] == "ghcr.io/jupyterhub-gpupool/jupyterhub-gpupool"
        assert values[component]["podSecurityContext"]["runAsUser"] == uid
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    from jupyterhub_gpupool import __version__

    assert chart["appVersion"] == __version__  # the default tag is the package's version


def test_gpu_kernel_pods_role_only_when_enabled(render) -> None:
    """gpuKernels.kubernetes: the servers' service account may create, get and delete pods and
    ResourceClaims in the kernels' namespace, and nothing else; off, no such object."""
    assert not [m for m in render(VARIANTS["defaults"]) if "kernel" in m["metadata"]["name"]]
    values = {"gpuKernels": {"kubernetes": {"enabled": True, "namespace": "kernels"}}}
    manifests = render(values)
    role = one(manifests, "Role", "gpupool-kernels")
    assert role["metadata"]["namespace"] == "kernels"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims"],
            "verbs": ["create", "get", "delete"],
        },
    ]
    binding = one(manifests, "RoleBinding", "gpupool-kernels")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpupool-kernel-launcher", "namespace": NAMESPACE}
    ]
    assert one(manifests, "ServiceAccount", "gpupool-kernel-launcher")
    theirs = {"create": False, "name": "user-sa", "namespace": "jhub-users"}
    values["gpuKernels"]["kubernetes"]["serverServiceAccount"] = theirs
    manifests = render(values)
    assert not by_kind(manifests, "ServiceAccount", "user-sa")
    (subject,) = one(manifests, "RoleBinding", "gpupool-kernels")["subjects"]
    assert (subject["name"], subject["namespace"]) == ("user-sa", "jhub-users")
