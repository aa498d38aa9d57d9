"""Reaching this server's ``gpupool/`` routes from a kernel or a script: :func:`status`.

A kernel started by the server inherits its environment: under JupyterHub,
``JUPYTERHUB_SERVICE_URL`` (this server) and ``JUPYTERHUB_API_TOKEN`` (its token). Outside a
hub, the running server is found with ``jupyter_server``'s list of running servers.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any


class GPUPoolUnavailable(RuntimeError):
    """The server's ``gpupool`` routes could not be reached (not installed, no server)."""


def server_address() -> tuple[str, str]:
    """(this server's base URL ending in ``/``, a token for it)."""
    url = os.environ.get("JUPYTERHUB_SERVICE_URL", "")
    token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
    if url and token:
        return url.rstrip("/") + "/", token
    try:
        from jupyter_server.serverapp import list_running_servers
    except ImportError:
        raise GPUPoolUnavailable(
            "no Jupyter server found (jupyter_server is not installed)"
        ) from None
    for info in list_running_servers():
        return info["url"].rstrip("/") + "/", info.get("token", "")
    raise GPUPoolUnavailable("no running Jupyter server found")


def call(method: str, path: str, body: Any = None, timeout: float = 15.0) -> dict[str, Any]:
    """One call of ``<server>/gpupool/<path>``; the decoded JSON (errors raise, with the
    server's message)."""
    base, token = server_address()
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{base}gpupool/{path}", data=data, method=method)
    if token:
        req.add_header("Authorization", f"token {token}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            answer: dict[str, Any] = json.loads(r.read() or b"{}")
            return answer
    except urllib.error.HTTPError as e:
        try:
            err = json.loads(e.read() or b"{}").get("error") or {}
        except ValueError:
            err = {}
        if e.code == 404 and not err:
            raise GPUPoolUnavailable("this server has no jupyterlab-gpupool extension") from None
        raise RuntimeError(err.get("message") or f"HTTP {e.code}") from None
    except OSError as e:
        raise GPUPoolUnavailable(f"this server could not be reached ({e})") from None


def status() -> dict[str, Any]:
    """What the lab panel shows, as a plain dict: ``lease`` (None on a CPU-only server),
    ``quota``, ``notice`` (a reclaim notice or None), ``utilization``, ``pool`` (whether the
    pool answers), ``offers``, ``pending`` (a move waiting)."""
    return call("GET", "state")


def keep_my_gpu() -> dict[str, Any]:
    """Keep my GPU: extend the reclaim notice (the pool's refusal is raised as it is)."""
    return call("POST", "keepalive", {})
