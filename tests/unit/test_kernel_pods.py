"""The objects of a GPU kernel pod (``kernels/kubepod.py``) against Kubernetes' schemas, and
the launcher's answer protocol over a real socket (``kernels/launcher.py`` and the
provisioner's listener): a signed answer for this kernel is taken once, anything else refused."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from jupyterhub_gpupool.kernels import kubepod
from jupyterhub_gpupool.kernels.launcher import connection_info, send_back

kubernetes_validate = pytest.importorskip("kubernetes_validate")

GPU = "GPU-0d7a0000-0000-4000-8000-000000000001"
KID = "38607483-d50a-47a0-a6f0-d0b170818d24"


def lease(kind: str = "gpu", **slot: Any) -> dict[str, Any]:
    one = {"kind": kind, "gpu": GPU, "profile": None, "start": None, "milli": None, **slot}
    return {"id": "L1", "offer": "h100", "node": "gpu-1", "state": "granted", "slots": [one]}


def pod(the_lease: dict[str, Any], **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "name": kubepod.pod_name(KID),
        "namespace": "kernels",
        "kernel_id": KID,
        "image": "registry.example/notebook:1",
        "python": "python",
        "response_address": "10.0.0.5:9911",
        "token": "t0k3n",
        "env": {"MY_VAR": "1"},
        **kw,
    }
    return kubepod.kernel_pod(the_lease, **args)


def valid(obj: dict[str, Any]) -> None:
    for version in ("1.34", "1.35"):
        kubernetes_validate.validate(copy.deepcopy(obj), desired_version=version, strict=True)


def test_device_plugin_pods_ask_for_the_granted_kind_on_the_granted_node():
    whole = pod(lease(), volume={"persistentVolumeClaim": {"claimName": "home"}}, mount_path="/h")
    valid(whole)
    spec, (c,) = whole["spec"], whole["spec"]["containers"]
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "gpu-1"}
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert spec["automountServiceAccountToken"] is False
    assert c["command"] == ["python", "-m", kubepod.LAUNCHER_MODULE]
    assert c["volumeMounts"] == [{"name": "home", "mountPath": "/h"}]
    assert {
        "name": kubepod.POD_IP_ENV,
        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
    } in c["env"]
    mig = pod(lease("mig", profile="1g.10gb", start=3))
    valid(mig)
    assert mig["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
    shared = pod(lease("shared", milli=250))
    valid(shared)
    assert shared["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu.shared": "1"}


def test_dra_pods_reference_a_claim_selecting_exactly_the_device():
    mig = lease("mig", profile="1g.10gb", start=3)
    claim = kubepod.kernel_claim(mig, "k-gpu", "kernels")
    valid(claim)
    (request,) = claim["spec"]["devices"]["requests"]
    cel = request["exactly"]["selectors"][0]["cel"]["expression"]
    assert GPU in cel and '"1g.10gb"' in cel and "memorySlice3" in cel
    p = pod(mig, backend="dra", claim_name="k-gpu")
    valid(p)
    server = {"metadata": {"name": "jupyter-alice", "uid": "9f1c0000-0000-4000-8000-000000000001"}}
    for owned in (kubepod.owned_by(p, server), kubepod.owned_by(claim, server)):
        valid(owned)
        assert owned["metadata"]["ownerReferences"][0]["name"] == "jupyter-alice"
    assert p["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "k-gpu"}]
    assert p["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpu"}]}
    with pytest.raises(ValueError, match="device-plugin"):
        kubepod.kernel_claim(lease("shared", milli=250), "k-gpu", "kernels")


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"image": ""}, "no image"),
        ({"backend": "dra"}, "needs its claim"),
        ({"backend": "cdi"}, "device backend"),
        ({"volume": {"emptyDir": {}}}, "mount path"),
        ({"env": {"BAD NAME": "1"}}, "not an environment variable name"),
    ],
)
def test_what_cannot_make_a_pod_is_refused(kw, words):
    with pytest.raises(ValueError, match=words):
        pod(lease(), **kw)


def test_pod_names_are_dns_labels_and_fresh_per_launch():
    names = {kubepod.pod_name(KID) for _ in range(5)}
    assert len(names) == 5
    assert all(len(n) <= 63 and n.startswith("gpupool-kernel-38607483") for n in names)
    assert kubepod.pod_name("Weird ID/..").startswith("gpupool-kernel-weird-id-")


def test_pod_exit_from_phase_and_container_state():
    running = {"status": {"phase": "Running"}}
    assert kubepod.pod_exit(running) is None
    assert kubepod.pod_exit({"status": {"phase": "Pending"}}) is None
    assert kubepod.pod_exit(None) == 0  # deleted
    killed = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "kernel",
                    "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                }
            ],
        }
    }
    assert kubepod.pod_exit(killed) == 137
    assert "OOMKilled" in kubepod.why_not_running(killed)
    assert kubepod.pod_exit({"status": {"phase": "Failed"}}) == 1
    assert kubepod.pod_exit({"status": {"phase": "Succeeded"}}) == 0


def test_the_answer_is_taken_once_signed_for_this_kernel():
    from jupyterhub_gpupool.kernels.provisioner import GpuPoolProvisioner

    prov = GpuPoolProvisioner(kernel_id=KID, kernel_spec=None)
    info = connection_info("127.0.0.1")

    async def scenario() -> None:
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        server = await asyncio.start_server(
            lambda r, w: prov._kube_answer(r, w, "right", KID, answer), "127.0.0.1", 0
        )
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"

        async def send(token: str, kid: str = KID, body: dict[str, Any] = info) -> None:
            await asyncio.to_thread(send_back, address, token, kid, body)

        try:
            with pytest.raises(RuntimeError, match="refused"):
                await send("wrong")
            with pytest.raises(RuntimeError, match="refused"):
                await send("right", kid="another-kernel")
            with pytest.raises(RuntimeError, match="refused"):
                await send("right", body={**info, "shell_port": 70000})
            assert not answer.done()
            await send("right")
            got = answer.result()
            assert got["ip"] == "127.0.0.1" and got["key"] == info["key"].encode()
            assert got["shell_port"] == info["shell_port"]
            with pytest.raises(RuntimeError, match="refused"):
                await send("right")  # once only
        finally:
            server.close()

    asyncio.run(scenario())
