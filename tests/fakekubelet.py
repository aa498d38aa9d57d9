"""A fake kubelet serving the PodResources API (``v1.PodResourcesLister/List``) over real gRPC
on a unix socket, as the kubelet does at ``/var/lib/kubelet/pod-resources/kubelet.sock``.

The response is encoded here with its own protobuf writer (independent of the decoder under
test), from ``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``; the CPU ids and topology
fields a real kubelet also sends are included, so the reader must skip what it does not use.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent import futures
from typing import Any


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _bytes(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _str(number: int, text: str) -> bytes:
    return _bytes(number, text.encode())


def _packed(number: int, values: Sequence[int]) -> bytes:
    return _bytes(number, b"".join(_varint(v) for v in values))


def encode_list(pods: Sequence[Mapping[str, Any]]) -> bytes:
    """A ``ListPodResourcesResponse``: ``pods`` as ``{name, namespace, containers: [{name,
    devices: {resource: [ids]}}]}``."""
    out = b""
    for pod in pods:
        body = _str(1, pod["name"]) + _str(2, pod["namespace"])
        for c in pod["containers"]:
            cbody = _str(1, c["name"])
            for resource, ids in c.get("devices", {}).items():
                dev = _str(1, resource) + b"".join(_str(2, i) for i in ids)
                dev += _bytes(3, _bytes(1, _varint(0 << 3 | 0) + _varint(0)))  # topology: node 0
                cbody += _bytes(2, dev)
            cbody += _packed(3, [2, 3])  # cpu_ids
            body += _bytes(3, cbody)
        out += _bytes(1, body)
    return out


class FakeKubelet:
    """``List`` answers what ``pods`` holds now (change it between calls); ``calls`` counts."""

    def __init__(self, socket: str, pods: Sequence[Mapping[str, Any]] = ()) -> None:
        import grpc  # the test extra's; the encoder above needs nothing

        self.socket = socket
        self.pods = list(pods)
        self.calls = 0
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list,
                    request_deserializer=lambda b: b,
                    response_serializer=lambda b: b,
                )
            },
        )
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{socket}")

    def _list(self, request: bytes, context: Any) -> bytes:
        assert request == b""  # ListPodResourcesRequest has no fields
        with self._lock:
            self.calls += 1
            return encode_list(self.pods)

    def __enter__(self) -> FakeKubelet:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(None).wait(10)
