"""The device-plugin path tells the truth: the node agent reads the kubelet's PodResources API
(a fake kubelet serving real gRPC on a unix socket), finds the pool's server pods through the
fake Kubernetes API server (real HTTP), and rebinds the lease over the pool's real HTTP API when
the plugin gave another device than the pool chose; from then on the lease is judged on the
device it really has (its samples, busy time and the reclaimer's devices)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from jupyterhub_gpupool import orm
from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.kube.client import KubeAPI, KubeClient
from jupyterhub_gpupool.poolconfig import gpu_uuid
from jupyterhub_gpupool.service.scopes import ADMIN, AGENT, SPAWN
from jupyterhub_gpupool.telemetry.agent import AgentLoop, TornadoTransport
from jupyterhub_gpupool.telemetry.podresources import PodDevices, PodResourcesClient, decode_list
from tests.fakekubelet import FakeKubelet, encode_list
from tests.fakes import FakeKubeAPI, InProcessService, StoreClock, kube_node, make_store

NODE = "kube-a100"
GPU0, GPU1 = gpu_uuid(NODE, 0), gpu_uuid(NODE, 1)
POOL = {
    "nodes": [{"name": NODE, "gpus": [{"model": "A100-80GB"}, {"model": "A100-80GB"}]}],
    "offers": [{"name": "a100", "kind": "gpu", "models": ["A100-80GB"]}],
    "quotas": {"default": {"guarantee": 0, "limit": 4}},
}
MODELS: dict[str, dict[str, Any]] = {
    "spawner": {"kind": "service", "name": "gpupool-spawner", "scopes": [SPAWN]},
    "agent": {"kind": "service", "name": "gpupool-agent", "scopes": [AGENT]},
    "root": {"kind": "user", "name": "root", "scopes": [ADMIN], "groups": []},
}


class Node:
    """The node's two GPUs: GPU 0 idle, GPU 1 busy (the notebook runs there)."""

    def inventory(self) -> dict[str, Any]:
        gpus = [
            {
                "uuid": g,
                "index": i,
                "model": "NVIDIA A100-SXM4-80GB",
                "memory_mib": 81920,
                "mig": {"enabled": False, "instances": []},
            }
            for i, g in enumerate((GPU0, GPU1))
        ]
        return {"cpu_milli": 64000, "memory_mib": 524288, "gpus": gpus}

    def samples(self, now: float | None = None) -> list[dict[str, Any]]:
        return [
            {"gpu": GPU0, "start": None, "ts": now, "util": 0.0, "memory_used_mib": 0},
            {"gpu": GPU1, "start": None, "ts": now, "util": 95.0, "memory_used_mib": 30000},
        ]


def test_the_decoder_reads_what_a_kubelet_sends_and_skips_the_rest():
    body = encode_list(
        [
            {
                "name": "jupyter-alice",
                "namespace": "jhub",
                "containers": [
                    {"name": "notebook", "devices": {"nvidia.com/gpu": [GPU1, GPU0]}},
                    {"name": "sidecar"},
                ],
            }
        ]
    )
    (got,) = decode_list(body)
    assert (got.namespace, got.pod, got.container) == ("jhub", "jupyter-alice", "notebook")
    assert got.resource == "nvidia.com/gpu" and got.devices == (GPU1, GPU0)
    assert decode_list(b"") == []


def test_the_plugin_gave_gpu_1_where_the_pool_chose_gpu_0(tmp_path: Path, sqlite_url: str):
    pytest.importorskip("grpc", reason="the kubelet's gRPC needs grpcio (the test extra)")
    upgrade(sqlite_url)
    store = make_store(sqlite_url, StoreClock(), POOL)
    with (
        InProcessService(store, MODELS) as svc,
        FakeKubeAPI([kube_node(NODE, gpus=2)]) as kube,
        FakeKubelet(str(tmp_path / "kubelet.sock")) as kubelet,
    ):
        r = svc.call("spawner", "POST", "allocations", {"user": "alice", "offer": "a100"})
        lease = r.json()
        assert lease["slots"][0]["gpu"] == GPU0  # the pool's choice
        assert svc.call("spawner", "POST", f"allocations/{lease['id']}/keepalive", {}).status == 200
        # the spawner's pod, annotated with the lease; the device plugin hands it GPU 1
        pod = {
            "metadata": {"name": "jupyter-alice", "annotations": {
                "gpupool.jupyter.org/lease": lease["id"]}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE},
                "containers": [{"name": "notebook", "image": "lab",
                                "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            },
        }  # fmt: skip
        created = httpx.post(
            f"{kube.url}/api/v1/namespaces/jhub/pods",
            json=pod,
            headers={"Authorization": f"Bearer {kube.token}"},
        )
        assert created.status_code == 201
        kubelet.pods = [
            {
                "name": "jupyter-alice",
                "namespace": "jhub",
                "containers": [{"name": "notebook", "devices": {"nvidia.com/gpu": [GPU1]}}],
            },
            {  # not the pool's: never rebinds anything
                "name": "train-0",
                "namespace": "ml",
                "containers": [{"name": "main", "devices": {"nvidia.com/gpu": [GPU0]}}],
            },
        ]
        t = [time.time()]

        async def agent_rounds() -> list[dict[str, Any]]:
            kubeapi = KubeClient(KubeAPI(kube.url, token=kube.token))
            devices = PodDevices(
                PodResourcesClient(kubelet.socket),
                lambda: kubeapi.list_pods(f"spec.nodeName={NODE}"),
            )
            loop = AgentLoop(
                Node(), TornadoTransport(), f"{svc.url}/api/v1", NODE, "agent",
                clock=lambda: t[0], devices=devices,
            )  # fmt: skip
            sent = []
            try:
                for _ in range(3):  # inventory, samples and devices; then samples twice more
                    await loop.step()
                    sent.append(dict(devices.sent))
                    t[0] += 5.0
                    loop.next_sample = loop.next_send = loop.next_devices = t[0]
            finally:
                await devices.kubelet.close()
                await kubeapi.close()
            assert loop.stats.errors == 0 and loop.stats.sent == 6
            return sent

        sent = asyncio.run(agent_rounds())
        assert sent == [{lease["id"]: (GPU1,)}] * 3  # told once, not again while unchanged
        assert kubelet.calls == 3
        after = svc.call("root", "GET", f"allocations/{lease['id']}").json()
        assert [s["gpu"] for s in after["slots"]] == [GPU1]
        events = svc.call("root", "GET", f"events?lease={lease['id']}").json()["items"]
        (rebound,) = [e for e in events if e["kind"] == "rebound"]
        assert rebound["actor"].endswith("gpupool-agent") and rebound["data"]["moved"] == [
            [GPU0, GPU1]
        ]
        # judged on GPU 1: the reclaimer's devices, the lease's samples and busy time
        assert store.reclaim_devices()[lease["id"]] == [(GPU1, None)]
        util = svc.call("root", "GET", f"utilization?lease={lease['id']}&since=0").json()
        assert util["samples"] and {s["util"] for s in util["samples"]} == {95.0}
        with store.read() as db:  # busy time: GPU 1's two later busy intervals, not GPU 0's
            busy = db.get(orm.LeaseRow, lease["id"]).busy_hours
        assert busy == pytest.approx(10 / 3600)
