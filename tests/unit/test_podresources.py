"""The agent's report of its pods' real devices (``PodDevices``): once per change, again after
the pool was away, never for pods that are not the pool's, forgotten when the pod goes; and
the PodResources decoder on malformed input."""

from __future__ import annotations

import asyncio

import pytest

from jupyterhub_gpupool.telemetry.podresources import (
    ContainerDevices,
    PodDevices,
    ProtobufError,
    decode_list,
    fields,
)


class Kubelet:
    def __init__(self) -> None:
        self.got: list[ContainerDevices] = []

    async def list(self) -> list[ContainerDevices]:
        return list(self.got)


def pod(name: str, lease: str | None) -> dict:
    meta = {"name": name, "namespace": "jhub"}
    if lease:
        meta["annotations"] = {"gpupool.jupyter.org/lease": lease}
    return {"metadata": meta}


def test_devices_are_told_once_per_change_and_again_after_the_pool_was_away():
    kubelet = Kubelet()
    pods = [pod("jupyter-a", "L1"), pod("train", None)]

    async def list_pods():
        return pods

    devices = PodDevices(kubelet, list_pods)
    posted: list[tuple[str, list[str]]] = []
    answers = [None, 200, 422]

    async def post(lease, ids):
        posted.append((lease, ids))
        return answers.pop(0), b'{"error": {"code": "unknown_device"}}'

    kubelet.got = [
        ContainerDevices("jhub", "jupyter-a", "nb", "nvidia.com/gpu", ("GPU-1",)),
        ContainerDevices("jhub", "jupyter-a", "nb", "cpu", ("3",)),  # not a GPU
        ContainerDevices("jhub", "train", "main", "nvidia.com/gpu", ("GPU-0",)),  # not ours
    ]

    async def rounds():
        out = [await devices.step(post)]  # the pool is away: not recorded
        out.append(await devices.step(post))  # accepted
        out.append(await devices.step(post))  # unchanged: nothing sent
        kubelet.got[0] = ContainerDevices("jhub", "jupyter-a", "nb", "nvidia.com/gpu", ("X",))
        out.append(await devices.step(post))  # changed, refused: not sent again
        out.append(await devices.step(post))
        pods.pop(0)  # the server stopped
        out.append(await devices.step(post))
        return out

    out = asyncio.run(rounds())
    assert posted == [("L1", ["GPU-1"]), ("L1", ["GPU-1"]), ("L1", ["X"])]
    assert out == [{}, {"L1": ("GPU-1",)}, {}, {"L1": ("X",)}, {}, {}]
    assert devices.sent == {}


def test_a_kubelet_or_api_server_that_is_away_changes_nothing():
    class Away:
        async def list(self):
            raise ConnectionError("no socket")

    async def no_pods():
        raise AssertionError("not asked when the kubelet is away")

    async def post(lease, ids):
        raise AssertionError("nothing to post")

    assert asyncio.run(PodDevices(Away(), no_pods).step(post)) == {}


def test_malformed_protobuf_is_refused_not_misread():
    with pytest.raises(ProtobufError):
        list(fields(b"\x0a\x05ab"))  # a 5-byte string with 2 bytes
    with pytest.raises(ProtobufError):
        list(fields(b"\x0b"))  # wire type 3 (groups) is not used by this API
    with pytest.raises(ProtobufError):
        decode_list(b"\x0a\x80")  # a length whose varint never ends
    # unknown fields of every wire type are skipped
    assert decode_list(b"\x10\x01\x19" + b"\0" * 8 + b"\x25" + b"\0" * 4) == []
