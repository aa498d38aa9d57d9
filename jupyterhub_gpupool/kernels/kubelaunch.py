"""``launcher = "kubernetes"`` of the GPU kernel provisioner: the kernel in a pod on the node
that holds its GPU, its ZMQ ports connected back to the user's server.

Once the pool grants the kernel's lease, :class:`KubeLaunch` creates (through the Kubernetes
API, with the server's service account) the lease's ResourceClaim where ``device_backend`` is
``dra``, and a Pod (``kernels/kubepod.py``) on the granted node whose container runs our
launcher. The provisioner listens on a TCP port of its own for one answer: the launcher opens
the kernel's ports in the pod and sends back their address and key, signed with a one-time
token (the response-address pattern of gateway_provisioners; the kernel binds, so the server
must learn where). That answer is the kernel's connection info, which Jupyter Server's kernel
manager loads as any provisioner's (``_reconcile_connection_info``): its channels then connect
to the pod's IP. ``poll`` reads the pod's phase, ``terminate``/``kill`` delete the pod
(``kill`` with no grace), ``SIGINT`` is sent as the kernel protocol's ``interrupt_request``
on the control channel (no signal reaches another machine's process), and ``cleanup`` deletes
pod and claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import posixpath
import secrets
import signal
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from traitlets import Dict, Enum, Float, Integer, List, Unicode, default

from ..kube.client import KubeClient, KubeError
from ..kube.settings import api_traits, make_client
from ..spawner import dra, objects
from . import kubepod
from .launcher import PORTS, sign

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _connection_info(got: dict[str, Any]) -> KernelConnectionInfo:
    """The launcher's answer as connection info, its fields checked (ports are ports, the
    transport TCP): ``ValueError`` otherwise."""
    ports = {p: int(got[p]) for p in PORTS}
    if not all(0 < p < 65536 for p in ports.values()) or got.get("transport") != "tcp":
        raise ValueError("not a TCP kernel's connection info")
    info = KernelConnectionInfo(
        shell_port=ports["shell_port"],
        iopub_port=ports["iopub_port"],
        stdin_port=ports["stdin_port"],
        control_port=ports["control_port"],
        hb_port=ports["hb_port"],
        ip=str(got["ip"]),
        transport="tcp",
        signature_scheme=str(got.get("signature_scheme") or "hmac-sha256"),
        kernel_name=str(got.get("kernel_name") or ""),
    )
    info["key"] = str(got["key"]).encode()  # type: ignore[typeddict-item]  # the kernel manager compares it with its session's key, bytes
    return info


class KubeLaunch(LocalProvisioner):
    """The traits and calls of a GPU kernel in a pod (the GPU provisioner's base: a local
    provisioner that can also launch into a pod)."""

    launcher = Enum(
        ("local", "kubernetes"),
        default_value="local",
        help="Where a GPU kernel runs. local: a process of this server pinned to the granted "
        "device (CUDA_VISIBLE_DEVICES); the server must run on the granted node. kubernetes: a "
        "pod on the granted node holding the device (DRA claim or device-plugin limit), its "
        "ports connected back to this server.",
    ).tag(config=True)
    namespace = Unicode(
        help="Namespace of the kernel pods. Default: this server's own (its service account's "
        "namespace file), else 'default'."
    ).tag(config=True)
    image = Unicode(
        help="Image of the kernel pods: it needs Python with ipykernel and jupyterhub-gpupool. "
        "Default: this server's image ($JUPYTER_IMAGE_SPEC, as KubeSpawner sets it)."
    ).tag(config=True)
    image_pull_policy = Enum(
        ("IfNotPresent", "Always", "Never"),
        default_value="IfNotPresent",
        help="imagePullPolicy of the kernel pods.",
    ).tag(config=True)
    python = Unicode(
        "python", help="The Python of the kernel image that runs the launcher module."
    ).tag(config=True)
    service_account = Unicode(
        "",
        help="serviceAccountName of the kernel pods (its token is not mounted). Empty: the "
        "namespace's default.",
    ).tag(config=True)
    device_backend = Enum(
        kubepod.BACKENDS,
        default_value="device-plugin",
        help="How the kernel pod gets its device. device-plugin: the NVIDIA device plugin's "
        "nvidia.com/gpu or nvidia.com/mig-<profile> limit on the granted node (the plugin "
        "picks the device there); dra: a ResourceClaim selecting exactly the granted device "
        "(resource.k8s.io/v1 with NVIDIA's DRA driver), made and deleted with the pod.",
    ).tag(config=True)
    mig_strategy = Enum(
        objects.MIG_STRATEGIES,
        default_value="mixed",
        help="The device plugin's MIG strategy (device-plugin backend): mixed, single or none.",
    ).tag(config=True)
    node_label = Unicode(
        "kubernetes.io/hostname",
        help="Node label whose value is the pool's node name: the kernel pod's nodeSelector.",
    ).tag(config=True)
    tolerations = List(
        Dict(),
        default_value=[dict(t) for t in objects.DEFAULT_GPU_TOLERATIONS],
        help="Tolerations of the kernel pods (GPU nodes are often tainted).",
    ).tag(config=True)
    home_volume = Dict(
        help="A Kubernetes volume source for the user's files in the kernel pod, e.g. "
        "{'persistentVolumeClaim': {'claimName': 'claim-alice'}} ('{username}' is replaced "
        "by $JUPYTERHUB_USER). It must be mountable on the GPU node too: a ReadWriteMany "
        "volume (NFS, CephFS), as a ReadWriteOnce disk is attached to one node. Empty: none "
        "(the kernel sees the image's files only)."
    ).tag(config=True)
    home_mount_path = Unicode(
        "/home/jovyan",
        help="Where home_volume is mounted in the kernel pod; the notebook's directory under "
        "server_root becomes the same path under this one.",
    ).tag(config=True)
    server_root = Unicode(
        help="The directory of this server that home_volume holds. Default: $HOME."
    ).tag(config=True)
    extra_env = Dict(
        Unicode(), help="Environment variables of the kernel pods (beside the kernelspec's)."
    ).tag(config=True)
    response_ip = Unicode(
        help="The address kernel pods send their connection info to (this server, as pods "
        "reach it). Default: the local address this server uses towards the Kubernetes API."
    ).tag(config=True)
    response_port = Integer(
        0,
        help="The port this server listens on for a kernel pod's answer (0: any free one; "
        "fix it where a NetworkPolicy must allow it).",
    ).tag(config=True)
    owner_pod = Unicode(
        help="A pod in the kernels' namespace that owns the kernel pods and claims: when it is "
        "deleted, Kubernetes deletes them too (a server that died without shutting its "
        "kernels down leaves no GPU held). Default: this server's own pod ($HOSTNAME) when it "
        "runs in that namespace, else none."
    ).tag(config=True)
    launch_timeout = Float(
        300.0,
        help="Seconds a kernel pod may take from its creation to its answer (scheduling, "
        "image pull, start) before the start fails and the pod is deleted.",
    ).tag(config=True)
    grace_seconds = Integer(10, help="terminationGracePeriodSeconds of the kernel pods.").tag(
        config=True
    )
    api_host, token_file, ca_file = api_traits()

    @default("namespace")
    def _namespace(self) -> str:
        with contextlib.suppress(OSError):
            return NAMESPACE_FILE.read_text().strip() or "default"
        return "default"

    @default("image")
    def _image(self) -> str:
        return os.environ.get("JUPYTER_IMAGE_SPEC") or os.environ.get("JUPYTER_IMAGE", "")

    @default("owner_pod")
    def _owner_pod(self) -> str:
        with contextlib.suppress(OSError):
            if os.environ.get("KUBERNETES_SERVICE_HOST") and (
                NAMESPACE_FILE.read_text().strip() == self.namespace
            ):
                return os.environ.get("HOSTNAME", "")
        return ""

    @default("server_root")
    def _server_root(self) -> str:
        return os.path.expanduser("~")

    @default("response_ip")
    def _response_ip(self) -> str:
        host = urlparse(self.api_host).hostname or os.environ.get("KUBERNETES_SERVICE_HOST")
        if not host:
            return socket.gethostbyname(socket.gethostname())
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # no packet is sent
            s.connect((host, 443))
            return str(s.getsockname()[0])

    _pod: str | None = None
    _claim: str | None = None
    _pod_namespace: str | None = None
    _kube: KubeClient | None = None

    def kube_client(self) -> KubeClient:
        """The Kubernetes API client (made on first use; the server's service account
        unless api_host is set)."""
        if self._kube is None:
            self._kube = make_client(self.api_host, self.token_file, self.ca_file)
        return self._kube

    async def kube_close(self) -> None:
        """Close the API client's connections."""
        if self._kube is not None:
            await self._kube.close()
            self._kube = None

    # -- launch -------------------------------------------------------------------------------

    def _kube_working_dir(self, cwd: str | None) -> str:
        """The kernel's directory in the pod: ``cwd`` under server_root, moved under the
        mount (none without a home volume, or for a directory outside server_root)."""
        if not self.home_volume or not cwd:
            return self.home_mount_path if self.home_volume else ""
        rel = os.path.relpath(os.path.abspath(cwd), os.path.abspath(self.server_root))
        if rel.startswith(".."):
            return self.home_mount_path
        return posixpath.normpath(posixpath.join(self.home_mount_path, rel.replace(os.sep, "/")))

    def _kube_volume(self) -> dict[str, Any]:
        user = os.environ.get("JUPYTERHUB_USER", "")
        volume: dict[str, Any] = json.loads(
            json.dumps(self.home_volume).replace("{username}", user)
        )
        return volume

    async def kube_launch(
        self, lease: dict[str, Any], kernel_id: str, env: dict[str, str], cwd: str | None
    ) -> KernelConnectionInfo:
        """Create claim and pod, wait for the launcher's answer: the connection info (the
        pod's IP and ports, the key it made). On failure nothing is left behind."""
        client = self.kube_client()
        namespace = self.namespace
        name = kubepod.pod_name(kernel_id)
        self._pod_namespace = namespace
        token = secrets.token_urlsafe(32)
        answer: asyncio.Future[KernelConnectionInfo] = asyncio.get_running_loop().create_future()
        server = await asyncio.start_server(
            lambda r, w: self._kube_answer(r, w, token, kernel_id, answer),
            "0.0.0.0",
            self.response_port,
        )
        port = server.sockets[0].getsockname()[1]
        try:
            owner = await self._kube_owner()
            claim = None
            if self.device_backend == "dra":
                claim = dra.claim_name(name)
                body = kubepod.kernel_claim(lease, claim, namespace)
                if owner is not None:
                    kubepod.owned_by(body, owner)
                await client.create(self._kube_path("resourceclaims"), body)
                self._claim = claim
            pod = kubepod.kernel_pod(
                lease,
                name=name,
                namespace=namespace,
                kernel_id=kernel_id,
                image=self.image,
                python=self.python,
                response_address=f"{self.response_ip}:{port}",
                token=token,
                env={**env, **self.extra_env},
                backend=self.device_backend,
                claim_name=claim,
                node_label=self.node_label,
                tolerations=self.tolerations,
                mig_strategy=self.mig_strategy,
                service_account=self.service_account,
                volume=self._kube_volume() if self.home_volume else None,
                mount_path=self.home_mount_path,
                working_dir=self._kube_working_dir(cwd),
                grace_seconds=self.grace_seconds,
                pull_policy=self.image_pull_policy,
            )
            if owner is not None:
                kubepod.owned_by(pod, owner)
            await client.create(self._kube_path("pods"), pod)
            self._pod = name
            return await self._kube_wait_answer(answer)
        except BaseException:
            await self.kube_delete()
            raise
        finally:
            server.close()

    async def _kube_owner(self) -> dict[str, Any] | None:
        """The owner pod (None: none configured, or not readable: logged, the kernel starts
        without an owner)."""
        if not self.owner_pod:
            return None
        try:
            owner: dict[str, Any] = await self.kube_client().get(
                self._kube_path("pods", self.owner_pod)
            )
        except KubeError as e:
            self.log.warning("GPU kernel pods get no owner (%s): %s", self.owner_pod, e)
            return None
        return owner

    def _kube_path(self, plural: str, name: str = "") -> str:
        ns = self._pod_namespace or self.namespace
        prefix = f"/apis/{dra.API_VERSION}" if plural == "resourceclaims" else "/api/v1"
        return f"{prefix}/namespaces/{ns}/{plural}" + (f"/{name}" if name else "")

    async def _kube_answer(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        token: str,
        kernel_id: str,
        answer: asyncio.Future[KernelConnectionInfo],
    ) -> None:
        """One connection to the response port: a signed connection info for this kernel is
        taken once; anything else is refused (and logged)."""
        reply = "refused"
        try:
            line = await asyncio.wait_for(reader.readline(), 30)
            message = json.loads(line)
            payload = str(message["payload"]).encode()
            if not hmac.compare_digest(sign(token, payload), str(message["signature"])):
                raise ValueError("bad signature")
            body = json.loads(payload)
            if body.get("kernel_id") != kernel_id:
                raise ValueError("another kernel's answer")
            if answer.done():
                raise ValueError("answered already")
            answer.set_result(_connection_info(body["connection_info"]))
            reply = "ok"
        except (ValueError, KeyError, TypeError, asyncio.TimeoutError) as e:
            self.log.warning("GPU kernel %s: an answer was refused: %s", kernel_id, e)
        finally:
            with contextlib.suppress(OSError):
                writer.write((reply + "\n").encode())
                await writer.drain()
                writer.close()

    async def _kube_wait_answer(
        self, answer: asyncio.Future[KernelConnectionInfo]
    ) -> KernelConnectionInfo:
        """The launcher's answer, watching the pod meanwhile: a pod that ends, or no answer
        within launch_timeout, fails the start with what the pod says."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.launch_timeout
        pod: dict[str, Any] | None = None
        while not answer.done():
            pod = await self._kube_read_pod()
            if kubepod.pod_exit(pod) is not None:
                why = kubepod.why_not_running(pod) if pod else "it was deleted"
                raise RuntimeError(f"The kernel's pod {self._pod} ended before it started: {why}")
            left = deadline - loop.time()
            if left <= 0:
                why = kubepod.why_not_running(pod) if pod else "not found"
                raise RuntimeError(
                    f"The kernel's pod {self._pod} did not start within "
                    f"{self.launch_timeout:g} s ({why})"
                )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(answer), min(1.0, left))
        return answer.result()

    async def _kube_read_pod(self) -> dict[str, Any] | None:
        if self._pod is None:
            return None
        try:
            pod: dict[str, Any] = await self.kube_client().get(self._kube_path("pods", self._pod))
            return pod
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    # -- while it runs, and its end ----------------------------------------------------------

    async def kube_poll(self) -> int | None:
        """None while the pod may run; its exit status once ended or gone. An API server out
        of reach counts as running (the kernel's own heartbeat tells the server otherwise)."""
        if self._pod is None:
            return 0
        try:
            return kubepod.pod_exit(await self._kube_read_pod())
        except KubeError as e:
            self.log.warning("GPU kernel pod %s: %s", self._pod, e)
            return None

    async def kube_wait(self) -> int | None:
        """Wait for the pod to end (or go)."""
        while True:
            status = await self.kube_poll()
            if status is not None:
                return status
            await asyncio.sleep(0.5)

    async def kube_signal(self, signum: int) -> None:
        """SIGINT: the kernel protocol's interrupt_request on the control channel; SIGTERM and
        SIGKILL: delete the pod (SIGKILL with no grace); 0: nothing (a liveness check)."""
        if signum == signal.SIGINT:
            km = self.parent
            if km is None:
                return
            km._connect_control_socket()
            km.session.send(km._control_socket, km.session.msg("interrupt_request", content={}))
        elif signum in (signal.SIGTERM, signal.SIGKILL):
            await self.kube_delete_pod(0 if signum == signal.SIGKILL else None)
        elif signum != 0:
            self.log.warning(
                "GPU kernel pod %s: signal %s cannot be sent to a pod", self._pod, signum
            )

    async def kube_delete_pod(self, grace: int | None = None) -> None:
        """Delete the kernel's pod (the kubelet stops it; ``grace`` 0: at once)."""
        if self._pod is None:
            return
        try:
            await self.kube_client().delete(self._kube_path("pods", self._pod), grace_seconds=grace)
        except KubeError as e:
            if e.status != 404:
                raise

    async def kube_delete(self) -> None:
        """Delete pod and claim (what is gone already is fine); forget them."""
        try:
            await self.kube_delete_pod()
            if self._claim is not None:
                try:
                    await self.kube_client().delete(self._kube_path("resourceclaims", self._claim))
                except KubeError as e:
                    if e.status != 404:
                        raise
        except KubeError as e:
            self.log.error(
                "GPU kernel pod %s or claim %s not deleted: %s", self._pod, self._claim, e
            )
        self._pod = self._claim = None

    def kube_info(self) -> dict[str, Any]:
        """What a restarted server needs to find the pod and claim again."""
        return {"pod": self._pod, "claim": self._claim, "namespace": self._pod_namespace}

    def kube_load(self, info: dict[str, Any] | None) -> None:
        info = info or {}
        self._pod, self._claim = info.get("pod"), info.get("claim")
        self._pod_namespace = info.get("namespace")
