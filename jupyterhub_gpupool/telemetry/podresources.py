"""The device each pod really got, from the kubelet's PodResources API (device-plugin path).

With the device plugin the pool's choice of device is advisory: the plugin picks which GPU (or
MIG device, or time-slicing replica) a container gets. The kubelet says what it handed out on a
read-only unix socket (``/var/lib/kubelet/pod-resources/kubelet.sock``, gRPC service
``v1.PodResourcesLister``, method ``List``; stable since Kubernetes 1.21). The agent reads it,
learns which pods are the pool's servers from the API server (their
``gpupool.jupyter.org/lease`` annotation), and tells the pool each lease's real devices
(``POST allocations/{id}/device``), so idle judgement, the panel and chargeback follow them.

The three messages used are decoded here by hand (``k8s.io/kubelet/pkg/apis/podresources/v1/
api.proto``: ``ListPodResourcesResponse{1: repeated PodResources}``, ``PodResources{1: name,
2: namespace, 3: repeated ContainerResources}``, ``ContainerResources{1: name, 2: repeated
ContainerDevices}``, ``ContainerDevices{1: resource_name, 2: repeated device_ids}``); other
fields are skipped, so newer kubelets' additions (CPU ids, memory, DRA resources) do no harm.
The transport is ``grpcio`` (``pip install jupyterhub-gpupool[kubelet]``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: The kubelet's socket for it (a read-only hostPath mount in the agent's pod).
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
#: Resources that are GPUs the pool hands out (whole, MIG, shared replicas).
GPU_PREFIX = "nvidia.com/"


class ProtobufError(ValueError):
    """A message that is not valid protobuf wire format."""


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(buf) or shift > 63:
            raise ProtobufError("truncated varint")
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, at
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a message: ints for varints and fixed widths,
    bytes for length-delimited fields (strings, messages, packed repeats)."""
    at = 0
    value: int | bytes
    while at < len(buf):
        key, at = _varint(buf, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(buf, at)
        elif wire == 1:
            value, at = int.from_bytes(buf[at : at + 8], "little"), at + 8
        elif wire == 5:
            value, at = int.from_bytes(buf[at : at + 4], "little"), at + 4
        elif wire == 2:
            size, at = _varint(buf, at)
            if at + size > len(buf):
                raise ProtobufError("truncated field")
            value, at = buf[at : at + size], at + size
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        if at > len(buf):
            raise ProtobufError("truncated field")
        yield number, wire, value


def _text(value: Any) -> str:
    return bytes(value).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ContainerDevices:
    """Devices of one resource one container of one pod got."""

    namespace: str
    pod: str
    container: str
    resource: str
    devices: tuple[str, ...]


def decode_list(buf: bytes) -> list[ContainerDevices]:
    """A ``ListPodResourcesResponse``, flattened to one entry per container and resource."""
    out: list[ContainerDevices] = []
    for number, wire, pod in fields(buf):
        if number != 1 or wire != 2:
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for n, w, v in fields(pod):
            if w != 2:
                continue
            if n == 1:
                name = _text(v)
            elif n == 2:
                namespace = _text(v)
            elif n == 3:
                containers.append(v)
        for c in containers:
            cname, devs = "", []
            for n, w, v in fields(c):
                if n == 1 and w == 2:
                    cname = _text(v)
                elif n == 2 and w == 2:
                    devs.append(v)
            for d in devs:
                resource, ids = "", []
                for n, w, v in fields(d):
                    if n == 1 and w == 2:
                        resource = _text(v)
                    elif n == 2 and w == 2:
                        ids.append(_text(v))
                out.append(ContainerDevices(namespace, name, cname, resource, tuple(ids)))
    return out


class PodResourcesClient:
    """``List`` on the kubelet's PodResources socket (grpcio's asyncio channel)."""

    def __init__(self, socket: str = DEFAULT_SOCKET, timeout: float = 10.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self._channel: Any = None
        self._list: Any = None

    def _connect(self) -> None:
        try:
            import grpc.aio
        except ImportError:  # pragma: no cover - the extra is declared
            raise RuntimeError(
                "reading the kubelet's PodResources API needs grpcio: "
                "pip install jupyterhub-gpupool[kubelet]"
            ) from None
        self._channel = grpc.aio.insecure_channel(f"unix://{self.socket}")
        self._list = self._channel.unary_unary(
            LIST_METHOD,
            request_serializer=lambda _: b"",  # ListPodResourcesRequest has no fields
            response_deserializer=decode_list,
        )

    async def list(self) -> list[ContainerDevices]:
        """Every container's devices; raises on an unreachable kubelet or a failed call."""
        if self._list is None:
            self._connect()
        devices: list[ContainerDevices] = await self._list(None, timeout=self.timeout)
        return devices

    async def close(self) -> None:
        """Close the channel."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._list = None


Post = Callable[[str, list[str]], Awaitable[tuple[int | None, bytes]]]


class PodDevices:
    """Tells the pool the real devices of the pool's pods on one node, once per change.

    ``kubelet`` lists what each container got; ``pods`` (async, no arguments) lists the
    node's pods from the API server, for their lease annotation. A lease whose devices the
    pool answered for (accepted or refused) is not sent again until they change; a pool that
    is away is asked again next time.
    """

    def __init__(
        self,
        kubelet: Any,
        pods: Callable[[], Awaitable[list[dict[str, Any]]]],
        lease_annotation: str = "gpupool.jupyter.org/lease",
    ) -> None:
        self.kubelet = kubelet
        self.pods = pods
        self.lease_annotation = lease_annotation
        self.sent: dict[str, tuple[str, ...]] = {}
        self._error: str | None = None

    def _failed(self, what: str, e: Exception) -> None:
        text = f"{what}: {type(e).__name__}: {e}"
        if text != self._error:
            self._error = text
            log.warning("Could not read the pods' devices (%s)", text)

    async def step(self, post: Post) -> dict[str, tuple[str, ...]]:
        """One round; returns the devices sent per lease (for logs and tests)."""
        try:
            got = await self.kubelet.list()
        except Exception as e:  # the kubelet restarts, the socket is missing
            self._failed("kubelet PodResources", e)
            return {}
        try:
            pods = await self.pods()
        except Exception as e:  # the API server is away
            self._failed("Kubernetes API", e)
            return {}
        self._error = None
        lease_of = {}
        for pod in pods:
            meta = pod.get("metadata") or {}
            lease = (meta.get("annotations") or {}).get(self.lease_annotation)
            if lease:
                lease_of[(meta.get("namespace", ""), meta.get("name", ""))] = lease
        devices: dict[str, list[str]] = {}
        for c in got:
            lease = lease_of.get((c.namespace, c.pod))
            if lease and c.resource.startswith(GPU_PREFIX) and c.devices:
                devices.setdefault(lease, []).extend(c.devices)
        out = {}
        for lease, devs in devices.items():
            ids = tuple(sorted(dict.fromkeys(devs)))
            if self.sent.get(lease) == ids:
                continue
            status, body = await post(lease, list(ids))
            if status is None or status >= 500 or status in (401, 403, 429):
                continue  # away or not allowed: ask again next round
            self.sent[lease] = ids
            out[lease] = ids
            if status >= 400:
                log.warning(
                    "The pool refused lease %s's devices %s: %d %s",
                    lease,
                    ", ".join(ids),
                    status,
                    body[:200].decode(errors="replace"),
                )
        for gone in set(self.sent) - set(devices):
            del self.sent[gone]
        return out
