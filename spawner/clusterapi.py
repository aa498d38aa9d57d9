"""The Kubernetes API of each pool cluster, for a hub that launches into several clusters.

KubeSpawner talks to one API server, configured once per process (``load_config``) and shared
by every spawner (``shared_client``, and one pod reflector per namespace). A pool spans several
clusters; a lease says which cluster its node is in, so the spawner must create, watch and
delete the pod through *that* cluster's API. KubeSpawner allows it at two seams: the spawner's
``self.api`` (every create/read/delete call goes through it) and the reflectors, which are
keyed by ``_get_reflector_key`` and built by ``_start_reflector`` — the cluster joins the key and
the reflector gets the cluster's client. Clusters without settings use KubeSpawner's own API.

Settings per cluster (``GPUPoolKubeSpawner.cluster_apis``), either a kube config context::

    {"eu": {"context": "eu-admin", "config_file": "/etc/kube/config"}}

or an API server address with its CA and a token (a mounted service-account token file is
re-read on every connection, so rotated tokens keep working)::

    {"us": {"host": "https://10.1.0.1:6443", "ssl_ca_cert": "/etc/us/ca.crt",
            "token_file": "/etc/us/token"}}
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

#: The keys a cluster's settings may have.
CONTEXT_KEYS = frozenset({"context", "config_file"})
HOST_KEYS = frozenset({"host", "ssl_ca_cert", "token", "token_file", "verify_ssl"})

_clients: dict[tuple[Any, str], k8s.ApiClient] = {}


class ClusterAPIError(ValueError):
    """Settings of a cluster's API that cannot work (the message names the cluster)."""


def check_settings(apis: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Validate ``cluster_apis`` when the config loads, not at the first spawn there."""
    out: dict[str, dict[str, Any]] = {}
    for cluster, raw in apis.items():
        if not isinstance(raw, Mapping):
            raise ClusterAPIError(f"cluster_apis[{cluster!r}] must be a mapping")
        keys = set(raw)
        if keys & CONTEXT_KEYS and keys & HOST_KEYS:
            raise ClusterAPIError(
                f"cluster_apis[{cluster!r}]: either a kube config context "
                f"({', '.join(sorted(CONTEXT_KEYS))}) or a host "
                f"({', '.join(sorted(HOST_KEYS))}), not both"
            )
        unknown = keys - CONTEXT_KEYS - HOST_KEYS
        if unknown:
            raise ClusterAPIError(
                f"cluster_apis[{cluster!r}]: unknown key(s) {', '.join(sorted(unknown))}"
            )
        if keys & HOST_KEYS and not raw.get("host"):
            raise ClusterAPIError(f"cluster_apis[{cluster!r}]: a host is needed")
        if "context" not in raw and keys & CONTEXT_KEYS:
            raise ClusterAPIError(f"cluster_apis[{cluster!r}]: a context is needed")
        if raw.get("token") and raw.get("token_file"):
            raise ClusterAPIError(f"cluster_apis[{cluster!r}]: token or token_file, not both")
        out[str(cluster)] = dict(raw)
    return out


class _TokenFileConfiguration(k8s.Configuration):
    """A client configuration that reads its bearer token from a file at each request."""

    token_file: str = ""

    def auth_settings(self) -> Coroutine[Any, Any, dict[Any, Any]]:
        """The bearer token, read now (service-account tokens rotate)."""
        token = Path(self.token_file).read_text().strip()
        self.api_key = {"BearerToken": token}
        self.api_key_prefix = {"BearerToken": "Bearer"}
        return super().auth_settings()


async def _build(settings: Mapping[str, Any]) -> k8s.ApiClient:
    if "context" in settings:
        return await k8s_config.new_client_from_config(
            config_file=settings.get("config_file"), context=settings["context"]
        )
    conf: k8s.Configuration
    if settings.get("token_file"):
        conf = _TokenFileConfiguration()
        conf.token_file = settings["token_file"]
    else:
        conf = k8s.Configuration()
        if settings.get("token"):
            conf.api_key = {"BearerToken": settings["token"]}
            conf.api_key_prefix = {"BearerToken": "Bearer"}
    conf.host = str(settings["host"]).rstrip("/")
    if settings.get("ssl_ca_cert"):
        conf.ssl_ca_cert = settings["ssl_ca_cert"]
    if settings.get("verify_ssl") is not None:
        conf.verify_ssl = bool(settings["verify_ssl"])
    return k8s.ApiClient(conf)


async def api_client(cluster: str, settings: Mapping[str, Any]) -> k8s.ApiClient:
    """The (shared, per event loop) API client of ``cluster``."""
    key = (asyncio.get_running_loop(), cluster)
    found = _clients.get(key)
    if found is None:
        found = _clients[key] = await _build(settings)
    return found


async def close_clients() -> None:
    """Close the clients of the running event loop (a hub closes them as it shuts down)."""
    loop = asyncio.get_running_loop()
    for key in [k for k in _clients if k[0] is loop]:
        await _clients.pop(key).close()


def bound_reflector(reflector_class: type, api: Any) -> type:
    """``reflector_class`` listing and watching through ``api`` (a CoreV1Api of one cluster)
    instead of KubeSpawner's shared client."""

    class ClusterReflector(reflector_class):  # type: ignore[misc]  # a class chosen at run time (KubeSpawner is untyped)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.api = api

    ClusterReflector.__name__ = f"Cluster{reflector_class.__name__}"
    return ClusterReflector
