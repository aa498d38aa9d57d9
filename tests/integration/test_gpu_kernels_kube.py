"""GPU kernels in pods (``GpuPoolProvisioner.launcher = "kubernetes"``, issue 36 item 2).

Jupyter Server's kernel manager starts a kernel through the ``gpupool-provisioner``; the pool
(its real tornado app, in-process) grants a kernel lease; the provisioner creates the lease's
ResourceClaim and the kernel's Pod through the fake Kubernetes API server (real HTTP, RBAC from
the chart's own render: the single-user servers' service account gets exactly what the chart
grants). The test then does what a kubelet does: reads the pod spec from the API server, runs
its container's command with its environment (the downward API's pod IP resolved, the claim's
allocated device injected as NVIDIA's runtime does, the home volume mounted at its path), and
reports the container's exit. The launcher connects back to the server with the kernel's ports;
a cell reads the device and the notebook's directory; shutdown deletes pod and claim and
releases the lease. Manifests validate with kubernetes-validate (1.34 and 1.35).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.kernels import kubepod
from jupyterhub_gpupool.kernels.kernelspecs import spec_name, write_kernelspecs
from jupyterhub_gpupool.kernels.provisioner import GpuKernelError
from jupyterhub_gpupool.poolconfig import gpu_uuid
from tests.fakekube_dra import FakeDRA, nvidia_slice
from tests.fakekube_rbac import CHART_NAMESPACE, from_render, render_chart
from tests.fakes import FakeKubeAPI, InProcessService, kube_node, make_store
from tests.fakes.clocks import StoreClock
from tests.fakes.kernels import (
    MODELS,
    RULES,
    kernels,
    provisioner_entry_point,  # noqa: F401  (autouse, module-wide)
    run_cell,
    until,
)

kubernetes_validate = pytest.importorskip("kubernetes_validate")
pytest.importorskip("helm_python", reason="the test extra's helm-python-sdk")

NODE = "gpu-h100"
GPU = gpu_uuid(NODE, 0)
NS = CHART_NAMESPACE
SERVER_SA_TOKEN = "user-server-token"
ADMIN = "admin-token"
GPU_RES = "nvidia.com/gpu"
POOL: dict[str, Any] = {
    "nodes": [{"name": NODE, "gpus": [{"model": "H100-80GB", "count": 1}]}],
    "offers": [{"name": "h100", "kind": "gpu", "models": ["H100-80GB"]}],
    "quotas": {"default": {"guarantee": 0, "limit": 1}},
}
CHART_VALUES = {"gpuKernels": {"kubernetes": {"enabled": True}}}
READ = (
    "import os; print(os.environ.get('NVIDIA_VISIBLE_DEVICES'), os.getcwd(), "
    "open('data.txt').read(), sep='|', end='')"
)


class Kubelet:
    """Runs the containers of the kernel pods the fake API server scheduled, as local
    processes, and reports their exit; stops a process whose pod was deleted. (Other pods,
    such as a server's, are left alone.)"""

    def __init__(self, api: FakeKubeAPI, volumes: dict[str, Path]) -> None:
        self.api = api
        self.node_gpus = {NODE: [GPU]}
        self.volumes = volumes  # claimName → the directory backing that volume
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.seen: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def device_of(self, pod: dict[str, Any]) -> str:
        """What NVIDIA's runtime puts in NVIDIA_VISIBLE_DEVICES: the uuids the pod's claims
        were allocated (read from the claim and the driver's ResourceSlice), or, for a
        device-plugin limit, the plugin's pick among the node's GPUs (it has one)."""
        ns = pod["metadata"]["namespace"]
        wanted = int(pod["spec"]["containers"][0]["resources"].get("limits", {}).get(GPU_RES, 0))
        uuids = self.node_gpus[pod["spec"]["nodeName"]][:wanted]
        with self.api._lock:
            slices = [o for k, o in self.api.objects.items() if k[0] == "resourceslices"]
            for ref in pod["spec"].get("resourceClaims") or ():
                claim = self.api.objects[("resourceclaims", ns, ref["resourceClaimName"])]
                for r in claim["status"]["allocation"]["devices"]["results"]:
                    for s in slices:
                        for d in s["spec"].get("devices") or ():
                            if s["spec"]["pool"]["name"] == r["pool"] and d["name"] == r["device"]:
                                uuids.append(d["attributes"]["uuid"]["string"])
        return ",".join(uuids) or "void"

    def _start(self, pod: dict[str, Any]) -> None:
        spec, (container,) = pod["spec"], pod["spec"]["containers"]
        env = {
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            "HOME": str(next(iter(self.volumes.values()))),
            "NVIDIA_VISIBLE_DEVICES": self.device_of(pod),
        }
        for var in container.get("env") or ():
            if "valueFrom" in var:
                assert var["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
                env[var["name"]] = "127.0.0.1"  # this "pod" runs on the loopback
            else:
                env[var["name"]] = var["value"]
        for mount in container.get("volumeMounts") or ():
            (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
            backing = self.volumes[volume["persistentVolumeClaim"]["claimName"]]
            target = Path(mount["mountPath"])
            if not target.exists():
                target.symlink_to(backing)  # the same volume, at the pod's path
        cmd = [*container["command"], *container.get("args", ())]
        self.procs[pod["metadata"]["name"]] = subprocess.Popen(
            cmd, env=env, cwd=container.get("workingDir") or None
        )

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            pods = self.api.objects_of("pods")
            for pod in pods.values():
                name = pod["metadata"]["name"]
                kernel = kubepod.KERNEL_LABEL in pod["metadata"].get("labels", {})
                if kernel and name not in self.procs and pod["status"].get("phase") == "Running":
                    self.seen.append(pod)
                    self._start(pod)
            for name, proc in self.procs.items():
                if f"{NS}/{name}" not in pods:
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGTERM)
                        try:
                            proc.wait(5)
                        except subprocess.TimeoutExpired:
                            proc.kill()
                elif proc.poll() is not None and pods[f"{NS}/{name}"]["status"]["phase"] == (
                    "Running"
                ):
                    self.api.terminate(NS, name, proc.returncode)


@pytest.fixture
def svc(sqlite_url: str) -> Iterator[InProcessService]:
    upgrade(sqlite_url)
    store = make_store(sqlite_url, StoreClock(), POOL, kernel_rules=RULES)
    with InProcessService(store, MODELS) as s:
        yield s


@pytest.fixture(scope="module")
def chart() -> list[dict[str, Any]]:
    return render_chart(CHART_VALUES)


@pytest.fixture
def kube(chart: list[dict[str, Any]]) -> Iterator[FakeKubeAPI]:
    rbac = from_render(
        chart, {SERVER_SA_TOKEN: f"{NS}/gpupool-kernel-launcher"}, namespace=NS, admin_token=ADMIN
    )
    dra = FakeDRA([nvidia_slice(NODE, [{"uuid": GPU}])], validate_version="1.35")
    with FakeKubeAPI([kube_node(NODE)], authorizer=rbac, dra=dra) as api:
        yield api


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home" / "project").mkdir(parents=True)
    (tmp_path / "home" / "project" / "data.txt").write_text("from the user's volume")
    return tmp_path / "home"


def setup_server(
    tmp_path: Path, svc: InProcessService, kube: FakeKubeAPI, home: Path, **config: Any
) -> Any:
    """Jupyter Server's kernel manager for alice's server, its GPU kernelspec configured for
    kernel pods (the kernelspec's provisioner config, as an admin would set it)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

    offers = svc.call("alice", "GET", "offers").json()["items"]
    write_kernelspecs(offers, tmp_path / "kernels")
    path = tmp_path / "kernels" / spec_name("h100") / "kernel.json"
    spec = json.loads(path.read_text())
    token_file = tmp_path / "sa-token"
    token_file.write_text(SERVER_SA_TOKEN)
    spec["metadata"]["kernel_provisioner"]["config"].update(
        launcher="kubernetes",
        namespace=NS,
        image="ghcr.io/jupyterhub-gpupool/jupyterhub-gpupool:test",
        api_host=kube.url,
        token_file=str(token_file),
        response_ip="127.0.0.1",
        home_volume={"persistentVolumeClaim": {"claimName": "claim-{username}"}},
        home_mount_path=str(tmp_path / "pod-home"),
        server_root=str(home),
        **config,
    )
    path.write_text(json.dumps(spec))
    os.environ.update(
        GPUPOOL_API_URL=f"{svc.url}/api/v1", JUPYTERHUB_API_TOKEN="alice", JUPYTERHUB_USER="alice"
    )
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return AsyncMappingKernelManager(kernel_spec_manager=specs, root_dir=str(home))


@pytest.fixture
def server_env() -> Iterator[None]:
    keep = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(keep)


async def interrupted(mkm: Any, kid: str) -> bool:
    """A cell that sleeps is interrupted (the control channel's interrupt_request reaches
    the kernel in its pod): its reply is a KeyboardInterrupt."""
    kc = mkm.get_kernel(kid).client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        started = asyncio.Event()

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                started.set()

        code = "import time; print('sleeping', flush=True); time.sleep(60)"
        running = asyncio.ensure_future(kc.execute_interactive(code, output_hook=hook, timeout=60))
        await asyncio.wait_for(started.wait(), 60)  # executing: an interrupt now counts
        await mkm.interrupt_kernel(kid)
        reply = await asyncio.wait_for(running, 60)
        return reply["content"].get("ename") == "KeyboardInterrupt"
    finally:
        kc.stop_channels()


def validate(obj: dict[str, Any]) -> None:
    for version in ("1.34", "1.35"):
        kubernetes_validate.validate(obj, desired_version=version, strict=True)


@pytest.mark.parametrize("backend", ["dra", "device-plugin"])
def test_a_kernel_pod_on_the_granted_device_connects_back(
    tmp_path, svc, kube, home, server_env, backend
):
    mkm = setup_server(tmp_path, svc, kube, home, device_backend=backend)

    async def scenario() -> None:
        with Kubelet(kube, {"claim-alice": home}) as kubelet:
            kid = await mkm.start_kernel(kernel_name=spec_name("h100"), path="project")
            try:
                (lease,) = kernels(svc, "alice")
                assert lease["kernel_id"] == kid and lease["node"] == NODE
                pods = kube.objects_of("pods")
                (pod,) = pods.values()
                validate({k: v for k, v in pod.items() if k != "status"})
                assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": NODE}
                assert pod["metadata"]["labels"][kubepod.KERNEL_LABEL] == kid
                env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
                assert "JUPYTERHUB_API_TOKEN" not in env  # the server's token stays there
                claims = kube.objects_of("resourceclaims")
                if backend == "dra":
                    (claim,) = claims.values()
                    validate({k: v for k, v in claim.items() if k != "status"})
                    assert GPU in json.dumps(claim["spec"])  # exactly the granted GPU
                else:
                    assert claims == {}
                    limits = pod["spec"]["containers"][0]["resources"]["limits"]
                    assert limits == {"nvidia.com/gpu": "1"}
                km = mkm.get_kernel(kid)
                assert km.ip == "127.0.0.1"  # the pod's IP, from the launcher's answer
                device, cwd, data = (await run_cell(km, READ)).split("|")
                assert device == GPU
                # the notebook's directory, at the mount's path in the pod (a symlink to the
                # volume here: the process sees its target)
                assert pod["spec"]["containers"][0]["workingDir"] == str(
                    tmp_path / "pod-home" / "project"
                )
                assert Path(cwd) == (home / "project").resolve()
                assert data == "from the user's volume"
                assert await interrupted(mkm, kid)
                # a restart: a new pod, the same lease (the old pod is gone)
                await mkm.restart_kernel(kid)
                (again,) = kube.objects_of("pods").values()
                assert again["metadata"]["name"] != pod["metadata"]["name"]
                assert [k["lease_id"] for k in kernels(svc, "alice")] == [lease["lease_id"]]
                assert (await run_cell(mkm.get_kernel(kid), "print(1 + 1, end='')")) == "2"
            finally:
                await mkm.shutdown_kernel(kid)
            assert kube.objects_of("pods") == {}
            assert kube.objects_of("resourceclaims") == {}
            assert kernels(svc, "alice") == []
            procs = list(kubelet.procs.values())
            assert len(procs) == 2  # the first pod's and the restarted one's
            await until("the kernels ended", lambda: all(p.poll() is not None for p in procs))

    asyncio.run(scenario())


def test_a_pod_that_cannot_start_fails_the_kernel_and_leaves_nothing(
    tmp_path, svc, kube, home, server_env
):
    """No kubelet runs the pod: past launch_timeout the start fails with the pod's state,
    pod and claim are deleted, the lease released."""
    mkm = setup_server(tmp_path, svc, kube, home, device_backend="dra", launch_timeout=1.0)

    async def scenario() -> None:
        with pytest.raises(GpuKernelError, match="did not start within 1 s"):
            await mkm.start_kernel(kernel_name=spec_name("h100"), path="project")
        assert kube.objects_of("pods") == {}
        assert kube.objects_of("resourceclaims") == {}
        assert kernels(svc, "alice") == []

    asyncio.run(scenario())


def test_without_the_charts_role_the_start_fails_clearly(tmp_path, svc, home, server_env):
    """The chart without gpuKernels.kubernetes: the API server refuses the pod (403), the
    kernel does not start and its lease is released."""
    rbac = from_render(
        render_chart({}), {SERVER_SA_TOKEN: f"{NS}/gpupool-kernel-launcher"}, namespace=NS
    )
    with FakeKubeAPI([kube_node(NODE)], authorizer=rbac) as api:
        mkm = setup_server(tmp_path, svc, api, home)

        async def scenario() -> None:
            with pytest.raises(GpuKernelError, match="403"):
                await mkm.start_kernel(kernel_name=spec_name("h100"), path="project")
            assert kernels(svc, "alice") == []

        asyncio.run(scenario())


def test_kernel_pods_go_with_the_server_pod_that_owns_them(tmp_path, svc, kube, home, server_env):
    """A server that dies without shutting its kernels down: its pod's deletion takes the
    kernel pod and claim with it (Kubernetes' garbage collector, by ownerReferences)."""
    import httpx

    admin = {"Authorization": f"Bearer {ADMIN}"}
    server_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "jupyter-alice"},
        "spec": {"containers": [{"name": "notebook", "image": "registry.example/nb:1"}]},
    }
    r = httpx.post(f"{kube.url}/api/v1/namespaces/{NS}/pods", json=server_pod, headers=admin)
    assert r.status_code == 201, r.text
    uid = r.json()["metadata"]["uid"]
    mkm = setup_server(tmp_path, svc, kube, home, device_backend="dra", owner_pod="jupyter-alice")

    async def scenario() -> None:
        with Kubelet(kube, {"claim-alice": home}) as kubelet:
            kid = await mkm.start_kernel(kernel_name=spec_name("h100"), path="project")
            try:
                pods = kube.objects_of("pods")
                del pods[f"{NS}/jupyter-alice"]
                kernel_objects = [*pods.values(), *kube.objects_of("resourceclaims").values()]
                assert len(kernel_objects) == 2  # the kernel's pod and claim
                for obj in kernel_objects:
                    (ref,) = obj["metadata"]["ownerReferences"]
                    assert (ref["kind"], ref["name"], ref["uid"]) == ("Pod", "jupyter-alice", uid)
                mkm.get_kernel(kid).stop_restarter()  # a dead server restarts nothing
                r = httpx.delete(
                    f"{kube.url}/api/v1/namespaces/{NS}/pods/jupyter-alice", headers=admin
                )
                assert r.status_code == 200, r.text
                assert kube.objects_of("pods") == {}
                assert kube.objects_of("resourceclaims") == {}
                (proc,) = kubelet.procs.values()
                await until("the kubelet stopped the kernel", lambda: proc.poll() is not None)
                assert await mkm.get_kernel(kid).provisioner.poll() == 0  # the kernel is gone
            finally:
                await mkm.shutdown_kernel(kid, now=True)
            assert kernels(svc, "alice") == []

    asyncio.run(scenario())


def test_a_pod_the_api_server_refuses_fails_the_start_and_leaves_nothing(
    tmp_path, svc, kube, home, server_env
):
    """A toleration Kubernetes does not know: the API server's schema check refuses the pod
    (422); the claim made before it is deleted and the lease released."""
    bad = [{"key": "nvidia.com/gpu", "operator": "Exists", "when": "always"}]
    mkm = setup_server(tmp_path, svc, kube, home, device_backend="dra", tolerations=bad)

    async def scenario() -> None:
        with pytest.raises(GpuKernelError, match=r"422 .*is invalid"):
            await mkm.start_kernel(kernel_name=spec_name("h100"), path="project")
        assert kube.objects_of("pods") == {}
        assert kube.objects_of("resourceclaims") == {}
        assert kernels(svc, "alice") == []

    asyncio.run(scenario())
