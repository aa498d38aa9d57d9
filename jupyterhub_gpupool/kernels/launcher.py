"""The kernel pod's entry point: ``python -m jupyterhub_gpupool.kernels.launcher
--response-address HOST:PORT --kernel-id ID``.

ZMQ kernels bind and their clients connect, so a kernel in a pod must open its ports where it
runs and tell the server where they are (the response-address pattern of Jupyter Enterprise
Gateway's and gateway_provisioners' launchers). This launcher picks five free ports on the
pod's IP (``$GPUPOOL_KERNEL_POD_IP``, the downward API's ``status.podIP``), makes a fresh
message-signing key, writes the connection file, sends the connection info to the server's
response address signed with the one-time token from ``$GPUPOOL_KERNEL_RESPONSE_TOKEN``
(HMAC-SHA256; the token itself never crosses the network), and on the server's ``ok``
replaces itself with ``ipykernel_launcher -f <file>``: the kernel is the container's process,
so the pod ends with it. The key is made here and sent once: it is not in the pod spec, which
everyone who may read pods in the namespace can read. Only the standard library is imported
(the image needs ipykernel, nothing of this package beyond this module).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import socket
import sys
import tempfile
import uuid
from typing import Any

#: Where the launcher reads its one-time response token, and the pod's own IP (set in the
#: pod spec by ``kubepod.kernel_pod``).
TOKEN_ENV = "GPUPOOL_KERNEL_RESPONSE_TOKEN"
POD_IP_ENV = "GPUPOOL_KERNEL_POD_IP"
PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


def sign(token: str, payload: bytes) -> str:
    """The HMAC-SHA256 of ``payload`` with the response token (hex)."""
    return hmac.new(token.encode(), payload, hashlib.sha256).hexdigest()


def free_ports(ip: str, n: int = len(PORTS)) -> list[int]:
    """``n`` distinct ports free on ``ip`` now (held open together, so none repeats)."""
    held = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((ip, 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def connection_info(ip: str, kernel_name: str = "") -> dict[str, Any]:
    """A kernel's connection info on ``ip``: free ports and a new key."""
    info: dict[str, Any] = dict(zip(PORTS, free_ports(ip), strict=True))
    info.update(
        ip=ip,
        key=str(uuid.uuid4()),
        transport="tcp",
        signature_scheme="hmac-sha256",
        kernel_name=kernel_name,
    )
    return info


def send_back(address: str, token: str, kernel_id: str, info: dict[str, Any]) -> None:
    """Send ``info`` to the server's response address; raise unless it answers ``ok``."""
    host, _, port = address.rpartition(":")
    payload = json.dumps({"kernel_id": kernel_id, "connection_info": info}).encode()
    line = json.dumps({"payload": payload.decode(), "signature": sign(token, payload)}) + "\n"
    with socket.create_connection((host.strip("[]"), int(port)), timeout=30) as s:
        s.sendall(line.encode())
        answer = s.makefile("r").readline().strip()
    if answer != "ok":
        raise RuntimeError(f"the server refused the kernel's connection info: {answer!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--response-address", required=True, help="HOST:PORT of the server")
    parser.add_argument("--kernel-id", required=True)
    args = parser.parse_args(argv)
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        sys.exit(f"launcher: ${TOKEN_ENV} is not set")
    ip = os.environ.get(POD_IP_ENV) or socket.gethostbyname(socket.gethostname())
    info = connection_info(ip)
    folder = tempfile.mkdtemp(prefix="gpupool-kernel-")
    path = os.path.join(folder, f"kernel-{args.kernel_id}.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    try:
        send_back(args.response_address, token, args.kernel_id, info)
    except (OSError, RuntimeError, ValueError) as e:
        sys.exit(f"launcher: {e}")
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", path])


if __name__ == "__main__":
    main()
