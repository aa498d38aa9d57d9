"""The chart's life cycle: health probes, the startup budget against the schema wait, the
migrations (hook Job or init container) and what runs them, byte-identical renders with
existing Secrets, and pinned images."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import (
    CHART,
    NAMESPACE,
    RELEASE,
    ROOT,
    VARIANTS,
    by_kind,
    containers,
    one,
    pod_specs,
)

EXTERNAL = VARIANTS["external-postgresql"]
DB_URL = VARIANTS["postgresql-url"]
BUNDLED = {"database": {"type": "postgresql"}, "postgresql": {"enabled": True}}
BUNDLED_OWN_SECRET = VARIANTS["gitops-bundled-postgresql"]


def pool_container(manifests: list[dict], name: str = "gpupool") -> dict[str, Any]:
    spec = one(manifests, "Deployment", name)["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "pool")


def port_number(container: dict[str, Any], port: int | str) -> int:
    """A probe's port as a number (a name resolves through the container's ports)."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return number


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of ``$(VAR)`` in an env value: variables defined before it are
    replaced, ``$$`` is one ``$``, anything else stays as written."""

    def one_ref(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one_ref, value)


def container_env(container: dict[str, Any], secrets: dict[tuple[str, str], str]) -> dict:
    """The environment the kubelet would give the container: Secrets from ``secrets`` by
    (name, key), values expanded in order."""
    env: dict[str, str] = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = secrets[(ref["name"], ref["key"])]
    return env


# -- probes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("service_name", ["gpupool", "gpus"])
def test_pool_probes_get_the_health_endpoint_under_the_service_prefix(render, service_name) -> None:
    values = {"hub": {"serviceName": service_name}, "pool": {"port": 10200}}
    manifests = render(values)
    container = pool_container(manifests)
    env = {e["name"]: e.get("value") for e in container["env"]}
    # the path the service serves: its prefix (JUPYTERHUB_SERVICE_PREFIX) + "health"
    assert env["JUPYTERHUB_SERVICE_PREFIX"] == f"/services/{service_name}/"
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[kind]
        assert set(probe) & {"tcpSocket", "exec", "grpc"} == set(), kind
        assert probe["httpGet"]["path"] == f"/services/{service_name}/health", kind
        assert port_number(container, probe["httpGet"]["port"]) == 10200, kind
        assert probe["timeoutSeconds"] < probe["periodSeconds"], kind
    assert "--port=10200" in container["args"]
    # liveness gives a stuck service 30 s, readiness takes it out of the Service sooner
    live, ready = container["livenessProbe"], container["readinessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] == 30
    assert ready["periodSeconds"] * ready["failureThreshold"] < 30


def test_reclaimer_probes_get_health_on_its_metrics_port(render) -> None:
    manifests = render({"reclaimer": {"metricsPort": 9102}})
    spec = one(manifests, "Deployment", "gpupool-reclaimer")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert "--metrics-port=9102" in container["args"]
    # the kubelet calls the pod's address, not 127.0.0.1 (the reclaimer's default)
    assert "--ReclaimerApp.metrics_ip=0.0.0.0" in container["args"]
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[kind]
        assert probe["httpGet"]["path"] == "/health", kind
        assert port_number(container, probe["httpGet"]["port"]) == 9102, kind


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_no_probe_only_opens_a_port(render, case: str) -> None:
    """A TCP probe passes while the event loop is wedged: every probe asks the process."""
    for workload, spec in pod_specs(render(VARIANTS[case])):
        for c in containers(spec):
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                if kind in c:
                    assert "tcpSocket" not in c[kind], (workload, c["name"], kind)


# -- the startup budget and the schema wait ---------------------------------------------------


def schema_wait_arg(container: dict[str, Any]) -> float:
    (arg,) = [a for a in container["args"] if a.startswith("--PoolService.schema_wait=")]
    return float(arg.split("=", 1)[1])


@pytest.mark.parametrize("wait", [0, 1, 7, 300, 3601])
@pytest.mark.parametrize("startup", [1, 60, 61])
def test_startup_budget_outlasts_the_schema_wait(render, wait: int, startup: int) -> None:
    """The kubelet never kills a service that waits for its schema (it exits by itself when
    the wait ends) nor one that is starting once the schema is there."""
    values = {"pool": {"schemaWaitSeconds": wait, "startupSeconds": startup}}
    container = pool_container(render(values))
    probe = container["startupProbe"]
    budget = (
        probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"]
    )
    given = schema_wait_arg(container)  # what the service is told, not the value
    assert given == wait
    assert budget > given
    assert budget >= given + startup
    assert budget < given + startup + probe["periodSeconds"]  # rounded up by one period at most


@pytest.mark.parametrize("case", sorted(c for c in VARIANTS if c != "agents-only"))
def test_the_service_never_migrates_itself(render, case: str) -> None:
    container = pool_container(render(VARIANTS[case]), pool_name(VARIANTS[case]))
    assert "--upgrade-db" not in container["args"]
    assert not any("upgrade_db" in a for a in container["args"])
    assert schema_wait_arg(container) == 300


def pool_name(values: dict) -> str:
    """The Deployment's name (release-chart when fullnameOverride is null)."""
    return "gpupool" if "fullnameOverride" not in values else "gpupool-jupyterhub-gpupool"


# -- the migrations: hook Job (PostgreSQL) or init container (SQLite) -------------------------


def hook_events(manifests: list[dict]) -> set[str] | None:
    jobs = by_kind(manifests, "Job")
    if not jobs:
        return None
    (job,) = jobs
    return set(job["metadata"]["annotations"]["helm.sh/hook"].split(","))


#: pre-install only where the database and its URL's Secret exist before the chart does
@pytest.mark.parametrize(
    ("case", "values", "events"),
    [
        ("external database, URL in an existing Secret", EXTERNAL, {"pre-install", "pre-upgrade"}),
        ("external database, URL in the values", DB_URL, {"pre-upgrade"}),
        ("bundled PostgreSQL", BUNDLED, {"pre-upgrade"}),
        ("bundled PostgreSQL, its password in a Secret", BUNDLED_OWN_SECRET, {"pre-upgrade"}),
        ("SQLite (an init container instead)", {}, None),
    ],
)
def test_migration_hook_per_database_mode(render, case, values, events) -> None:
    manifests = render(values)
    assert hook_events(manifests) == events, case
    init = one(manifests, "Deployment", "gpupool")["spec"]["template"]["spec"].get(
        "initContainers", []
    )
    assert [c["name"] for c in init] == ([] if events else ["upgrade-db"]), case


@pytest.mark.parametrize("values", [{}, EXTERNAL, BUNDLED], ids=["sqlite", "external", "bundled"])
def test_migrations_can_be_turned_off(render, values) -> None:
    off = {**values, "pool": {**values.get("pool", {}), "upgradeDb": {"enabled": False}}}
    manifests = render(off)
    assert by_kind(manifests, "Job") == []
    spec = one(manifests, "Deployment", "gpupool")["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    assert "--upgrade-db" not in pool_container(manifests)["args"]  # the service only waits


def test_hook_job_spec(render) -> None:
    values = {
        **EXTERNAL,
        "imagePullSecrets": ["registry"],
        "pool": {
            **EXTERNAL["pool"],
            "image": {"tag": "1.2.3"},
            "nodeSelector": {"pool": "core"},
            "upgradeDb": {
                "enabled": True,
                "backoffLimit": 5,
                "activeDeadlineSeconds": 900,
                "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi"},
                    "limits": {"memory": "2Gi"},
                },
            },
        },
    }
    manifests = render(values)
    job = one(manifests, "Job", "gpupool-upgrade-db")
    annotations = job["metadata"]["annotations"]
    assert int(annotations["helm.sh/hook-weight"]) < 0
    assert set(annotations["helm.sh/hook-delete-policy"].split(",")) == {
        "before-hook-creation",
        "hook-succeeded",
    }
    assert job["spec"]["backoffLimit"] == 5
    assert job["spec"]["activeDeadlineSeconds"] == 900
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    # the pool's ServiceAccount does not exist before an install: the namespace's default
    assert "serviceAccountName" not in spec
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["nodeSelector"] == {"pool": "core"}
    (container,) = spec["containers"]
    assert container["args"] == ["jupyterhub-gpupool", "upgrade-db"]
    assert container["resources"] == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"memory": "2Gi"},
    }
    # the same image, user, file system and database as the pool's pods
    pool_spec = one(manifests, "Deployment", "gpupool")["spec"]["template"]["spec"]
    pool = pool_container(manifests)
    assert (
        container["image"] == pool["image"] == "ghcr.io/jupyterhub-gpupool/jupyterhub-gpupool:1.2.3"
    )
    assert spec["securityContext"] == pool_spec["securityContext"]
    assert spec["securityContext"]["runAsUser"] == 1000
    assert container["securityContext"] == pool["securityContext"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    db_env = [e for e in pool["env"] if e["name"] == "GPUPOOL_DB_URL"]
    assert [e for e in container["env"] if e["name"] == "GPUPOOL_DB_URL"] == db_env
    # its pods are not the pool's: the Service and the PDB do not pick them up
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "upgrade-db"
    service = one(manifests, "Service", "gpupool")
    assert not set(service["spec"]["selector"].items()) <= set(labels.items())


def test_bundled_postgresql_admits_the_hook_job(render) -> None:
    manifests = render(BUNDLED)
    job = one(manifests, "Job", "gpupool-upgrade-db")
    job_labels = job["spec"]["template"]["metadata"]["labels"]
    policy = one(manifests, "NetworkPolicy", "gpupool-postgresql")
    peers = [p["podSelector"]["matchLabels"] for r in policy["spec"]["ingress"] for p in r["from"]]
    assert any(set(peer.items()) <= set(job_labels.items()) for peer in peers)


def run_cli(args: list[str], env: dict[str, str], cwd: Path) -> str:
    """``jupyterhub-gpupool`` as the container runs it (its args and env, nothing else)."""
    assert args[0] == "jupyterhub-gpupool"
    proc = subprocess.run(
        [sys.executable, "-m", "jupyterhub_gpupool.cli", *args[1:]],
        env={"PATH": os.environ["PATH"], "HOME": str(cwd), **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def schema_revision(url: str) -> tuple[str | None, str]:
    from jupyterhub_gpupool.dbutil import current_revision, head_revision, make_engine

    engine = make_engine(url)
    try:
        return current_revision(engine), head_revision()
    finally:
        engine.dispose()


def test_the_hook_job_migrates_the_database_its_secret_names(render, pg_url, tmp_path) -> None:
    """The Job's own command and env, the Secret resolved to a real PostgreSQL database."""
    (container,) = one(render(EXTERNAL), "Job", "gpupool-upgrade-db")["spec"]["template"]["spec"][
        "containers"
    ]
    env = container_env(container, {("pool-db", "u"): pg_url})
    assert schema_revision(pg_url)[0] is None
    run_cli(container["args"], env, tmp_path)
    current, head = schema_revision(pg_url)
    assert current == head


def test_the_sqlite_init_container_migrates_the_volume(render, tmp_path) -> None:
    spec = one(render({}), "Deployment", "gpupool")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    mount = next(m["mountPath"] for m in init["volumeMounts"] if m["name"] == "db")
    assert mount == next(
        m["mountPath"] for m in spec["containers"][0]["volumeMounts"] if m["name"] == "db"
    )
    volume = tmp_path / "volume"
    volume.mkdir()
    env = {k: v.replace(mount, str(volume)) for k, v in container_env(init, {}).items()}
    run_cli(init["args"], env, tmp_path)
    current, head = schema_revision(env["GPUPOOL_DB_URL"])
    assert current == head
    assert (volume / "jupyterhub-gpupool.sqlite").exists()


def test_bundled_postgresql_url_is_composed_from_its_existing_secret(render) -> None:
    manifests = render(BUNDLED_OWN_SECRET)
    secret = {("pool-pg", "postgresql-password"): "s3cret-Pw.1"}
    urls = set()
    for _, spec in pod_specs(manifests):
        for c in containers(spec):
            # the two variables in the container's order (the password must come first)
            db = [
                e
                for e in c.get("env", [])
                if e["name"] in {"POSTGRESQL_PASSWORD", "GPUPOOL_DB_URL"}
            ]
            if db:
                urls.add(container_env({"env": db}, secret)["GPUPOOL_DB_URL"])
    assert urls == {"postgresql://gpupool:s3cret-Pw.1@gpupool-postgresql:5432/gpupool"}
    database = one(manifests, "StatefulSet", "gpupool-postgresql")
    env = {e["name"]: e for e in database["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "pool-pg",
        "key": "postgresql-password",
    }


# -- stable renders ---------------------------------------------------------------------------

GITOPS = ["gitops-external", "gitops-bundled-postgresql"]


@pytest.mark.parametrize("case", GITOPS)
def test_renders_with_existing_secrets_are_byte_identical(chart, case: str) -> None:
    """Argo CD and Flux render offline on every sync: with every secret in an existing
    Secret, nothing rotates."""
    first = chart.render(values=VARIANTS[case], name=RELEASE, namespace=NAMESPACE)
    second = chart.render(values=VARIANTS[case], name=RELEASE, namespace=NAMESPACE)
    assert first == second
    assert "kind: Secret" not in "".join(first.values())  # the chart writes no secret at all


def test_renders_without_existing_secrets_rotate_the_generated_ones(chart) -> None:
    """Today's behaviour without them (documented): generated secrets differ per offline
    render, as the GitOps note says; the check above would see it."""
    values = {**BUNDLED}
    first = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    second = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    differ = {name for name in first if first[name] != second[name]}
    assert differ == {
        "jupyterhub-gpupool/templates/pool/cookie-secret.yaml",
        "jupyterhub-gpupool/templates/pool/secret.yaml",
    }


# -- pinned images ----------------------------------------------------------------------------

#: A full version: major.minor(.patch), a pre-release or build suffix, optionally a digest.
PINNED = re.compile(r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?([.-][0-9A-Za-z.]+)?(@sha256:[0-9a-f]{64})?$")


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_every_image_is_pinned_to_a_full_version(render, case: str) -> None:
    for workload, spec in pod_specs(render(VARIANTS[case])):
        for c in containers(spec):
            base, at, digest = c["image"].partition("@")
            name, _, tag = base.rpartition(":")
            assert name and "/" in name, (workload, c["image"])
            assert PINNED.match(tag + at + digest), (workload, c["image"])


def test_the_default_pool_tag_is_the_package_version_the_docs_build() -> None:
    """The chart's default tag is appVersion, which is the package's version, and the build
    command on the how-to page tags the image with exactly that."""
    from jupyterhub_gpupool import __version__

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    page = (ROOT / "docs/source/howto/helm-chart.md").read_text()
    (command,) = re.findall(r"^\$ VERSION=\$\((python3? -c '[^']+')\)$", page, re.M)
    assert re.search(r"^\$ docker build -t \S+:\$VERSION \.$", page, re.M)
    shell = subprocess.run(
        ["sh", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.strip() == chart["appVersion"]


# -- the rendered pod, run ----------------------------------------------------------------------


def http_status(url: str) -> int:
    """The status of a GET (0 while nothing answers)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def test_the_rendered_pod_answers_its_own_probes(render, tmp_path: Path) -> None:
    """The Deployment's init container, then its service, run with their rendered args, env
    and ConfigMap (a new SQLite file, no hub): the path and port every probe names answer 200."""
    from tests.fakes import free_port

    port = free_port()
    hub = f"http://127.0.0.1:{free_port()}/hub/api"  # no hub answers: the service starts anyway
    manifests = render({"hub": {"serviceName": "gpus", "apiUrl": hub}, "pool": {"port": port}})
    spec = one(manifests, "Deployment", "gpupool")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    (container,) = spec["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    here = {"config": tmp_path / "config", "db": tmp_path / "db"}
    for where in here.values():
        where.mkdir()
    for name, text in one(manifests, "ConfigMap", "gpupool-config")["data"].items():
        (here["config"] / name).write_text(text)

    def local(text: str) -> str:
        for name, where in here.items():
            text = text.replace(mounts[name], str(where))
        return text

    secrets = {
        ("hub", "hub.services.gpupool.apiToken"): "not-a-hub-token",
        ("gpupool-cookie", "cookie-secret"): "cd" * 32,
    }
    run_cli(init["args"], {k: local(v) for k, v in container_env(init, {}).items()}, tmp_path)
    env = {k: local(v) for k, v in container_env(container, secrets).items()}
    args = [*map(local, container["args"][1:])]
    run_and_probe(container, args, env, tmp_path, f"http://127.0.0.1:{port}/services/gpus/health")


def test_the_rendered_reclaimer_answers_its_own_probes(render, tmp_path: Path) -> None:
    """The reclaimer with its rendered args and env (no hub, no pool answer): its probes'
    path and port answer 200 at the pod's address."""
    from tests.fakes import free_port

    port = free_port()
    nowhere = f"http://127.0.0.1:{free_port()}"
    values = {
        "hub": {"apiUrl": f"{nowhere}/hub/api", "proxyUrl": nowhere},
        "reclaimer": {"metricsPort": port},
    }
    spec = one(render(values), "Deployment", "gpupool-reclaimer")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = container_env(container, {("hub", "hub.services.gpupool-reclaimer.apiToken"): "t"})
    env["GPUPOOL_SERVICE_URL"] = f"{nowhere}/services/gpupool/"  # the Service's name, here
    run_and_probe(
        container, container["args"][1:], env, tmp_path, f"http://127.0.0.1:{port}/health"
    )


def run_and_probe(
    container: dict, args: list[str], env: dict[str, str], where: Path, expected: str
) -> None:
    """Run the container's command (``jupyterhub-gpupool ...`` here) with its rendered
    ``args`` and ``env``; each of its probes names ``expected`` and gets 200 there."""
    from tests.fakes import wait_until

    log = where / "container.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub_gpupool.cli", *args],
            env={"PATH": os.environ["PATH"], "HOME": str(where), **env},
            cwd=where,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = container[kind]["httpGet"]
            url = f"http://127.0.0.1:{port_number(container, get['port'])}{get['path']}"
            assert url == expected
            wait_until(
                lambda url=url: http_status(url) == 200,
                what=f"{kind} {url} answering 200",
                info=lambda: log.read_text(errors="replace")[-3000:],
            )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
