"""One call that wires the pool into a ``jupyterhub_config.py``.

``configure_hub(c, ...)`` writes exactly what docs/source/howto/hub-config.md spells out by hand:
the custom scopes, the pool service (managed, or external when ``command`` is None), the
spawner's and agents' service tokens, the idle-GPU reclaimer (opt-in), the roles, and the
spawner class. It *adds* to roles and services already configured rather than replacing them,
so it composes with other services (the idle culler, say).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from .service.scopes import ADMIN, AGENT, CUSTOM_SCOPES, RECLAIM, SPAWN, USE

#: The reclaimer's role, scope by scope (docs/source/reference/reclaimer.md says why each).
RECLAIMER_SCOPES = (
    "list:users",  # page GET /users?state=active: whose servers run
    "read:servers",  # the users' servers field: each server's url, ready, pending
    "servers",  # stop a server, and start it again without a GPU or on a smaller offer
    "access:servers",  # the server's /api/kernels and /api/status, save-all and checkpoints
    RECLAIM,  # the pool's reclaim endpoints: leader lock, leases, rounds, outcomes
)

SPAWNERS = {
    "local": "jupyterhub_gpupool.spawner.local.GPUPoolLocalProcessSpawner",
    "simple": "jupyterhub_gpupool.spawner.local.GPUPoolSimpleLocalProcessSpawner",
    "kube": "jupyterhub_gpupool.spawner.kube.GPUPoolKubeSpawner",
}


def _merge_role(roles: list[dict[str, Any]], role: dict[str, Any]) -> None:
    """Add a role, or extend one of the same name (scopes and holders are unions)."""
    for existing in roles:
        if existing.get("name") == role["name"]:
            for key in ("scopes", "users", "groups", "services"):
                if key in role:
                    merged = list(existing.get(key, []))
                    merged += [v for v in role[key] if v not in merged]
                    existing[key] = merged
            return
    roles.append(role)


def configure_hub(
    c: Any,
    *,
    spawner_token: str,
    pool_config: str | None = None,
    db_url: str = "sqlite:///jupyterhub-gpupool.sqlite",
    service_name: str = "gpupool",
    service_url: str = "http://127.0.0.1:10101",
    service_token: str | None = None,
    command: Sequence[str] | None = (),
    service_args: Sequence[str] = (),
    agent_token: str | None = None,
    admin_users: Sequence[str] = (),
    admin_groups: Sequence[str] = (),
    spawner: str | None = "local",
    reclaimer: bool = False,
    reclaimer_token: str | None = None,
    reclaimer_args: Sequence[str] = (),
) -> None:
    """Configure hub ``c`` for the pool.

    ``command=()`` runs the service managed by the hub with ``jupyterhub-gpupool service``
    (this Python); ``command=None`` registers an external service at ``service_url`` that
    authenticates with ``service_token``. ``spawner`` is ``local``, ``simple`` (all users share
    the hub's system user: demos), ``kube``, a class path, or None to leave it alone.
    ``reclaimer=True`` adds the idle-GPU reclaimer (:func:`configure_reclaimer`): off by
    default, since it stops servers, as jupyterhub-idle-culler is something one adds.
    """
    c.JupyterHub.custom_scopes = {**dict(c.JupyterHub.get("custom_scopes", {})), **CUSTOM_SCOPES}
    service: dict[str, Any] = {
        "name": service_name,
        "url": service_url,
        "oauth_no_confirm": True,
        # what a browser's login to the pool's pages may carry: the user's own pool access, and
        # the admin scope for those who hold it (the admin panel); the hub grants only the
        # scopes the user has
        "oauth_client_allowed_scopes": [f"{USE}!user", ADMIN],
    }
    if command is None:
        if not service_token:
            raise ValueError("an external pool service needs service_token")
        service["api_token"] = service_token
    else:
        argv = list(command) or [sys.executable, "-m", "jupyterhub_gpupool.cli", "service"]
        argv.append(f"--db-url={db_url}")
        if pool_config:
            argv.append(f"--pool-config={pool_config}")
        service["command"] = argv + list(service_args)
        # the per-user request cap follows the hub's named-server limit (set it before this)
        limit = c.JupyterHub.get("named_server_limit_per_user", None)
        if c.JupyterHub.get("allow_named_servers", False) and isinstance(limit, int):
            service["environment"] = {"GPUPOOL_NAMED_SERVER_LIMIT": str(limit)}
    services = [s for s in c.JupyterHub.get("services", []) if s.get("name") != service_name]
    services.append(service)
    services.append({"name": f"{service_name}-spawner", "api_token": spawner_token})
    if agent_token:
        services.append({"name": f"{service_name}-agent", "api_token": agent_token})
    c.JupyterHub.services = services

    roles = list(c.JupyterHub.get("load_roles", []))
    # users reach the pool's own page (the hub's Services menu) and API with their cookie
    _merge_role(
        roles,
        {
            "name": "user",
            "scopes": ["self", f"{USE}!user", f"access:services!service={service_name}"],
        },
    )
    _merge_role(
        roles,
        {
            "name": "server",
            # the lab package's server extension asks the pool with the server's own token
            "scopes": [
                "users:activity!user",
                "access:servers!server",
                f"{USE}!user",
                f"access:services!service={service_name}",
            ],
        },
    )
    _merge_role(
        roles,
        {
            "name": service_name,
            "services": [service_name],
            # servers: restart a user's server into a lease reserved for it (a resize from the
            # lab, service/restarts.py), as the reclaimer restarts one into a shrink's target
            "scopes": ["list:users", "read:users:groups", "read:servers", "servers"],
        },
    )
    _merge_role(
        roles,
        {
            "name": f"{service_name}-spawner",
            "services": [f"{service_name}-spawner"],
            "scopes": [SPAWN],
        },
    )
    if agent_token:
        _merge_role(
            roles,
            {
                "name": f"{service_name}-agent",
                "services": [f"{service_name}-agent"],
                "scopes": [AGENT],
            },
        )
    if admin_users or admin_groups:
        _merge_role(
            roles,
            {
                "name": f"{service_name}-admin",
                "users": list(admin_users),
                "groups": list(admin_groups),
                "scopes": [ADMIN],
            },
        )
    c.JupyterHub.load_roles = roles

    if reclaimer:
        configure_reclaimer(
            c,
            service_name=service_name,
            service_url=service_url,
            token=reclaimer_token,
            args=reclaimer_args,
        )
    if spawner is not None:
        c.JupyterHub.spawner_class = SPAWNERS.get(spawner, spawner)
    c.GPUPoolSpawnerMixin.pool_api_token = spawner_token
    c.GPUPoolSpawnerMixin.pool_service_name = service_name


def _proxy_origin(c: Any) -> str:
    """Where this hub's proxy listens (its public side), as the reclaimer should reach it."""
    from urllib.parse import urlparse

    bind = c.JupyterHub.get("bind_url", None)
    if isinstance(bind, str) and bind:
        url = urlparse(bind)
        host = url.hostname if url.hostname not in (None, "", "0.0.0.0", "::") else "127.0.0.1"
        return f"{url.scheme or 'http'}://{host}:{url.port or 8000}"
    ip = c.JupyterHub.get("ip", "") or "127.0.0.1"
    ip = "127.0.0.1" if ip in ("0.0.0.0", "::") else ip
    return f"http://{ip}:{c.JupyterHub.get('port', 8000)}"


def configure_reclaimer(
    c: Any,
    *,
    service_name: str = "gpupool",
    service_url: str = "http://127.0.0.1:10101",
    token: str | None = None,
    command: Sequence[str] | None = (),
    args: Sequence[str] = (),
    proxy_url: str | None = None,
) -> None:
    """Register the idle-GPU reclaimer as service ``<service_name>-reclaimer`` with a role of
    exactly :data:`RECLAIMER_SCOPES`.

    ``command=()`` lets the hub run it (``jupyterhub-gpupool reclaimer``, this Python, told
    where the pool and the proxy are); ``command=None`` only registers ``token`` for a
    reclaimer run elsewhere. Call it after the hub's ``ip``/``port``/``bind_url`` are set.
    """
    name = f"{service_name}-reclaimer"
    service: dict[str, Any] = {"name": name}
    if token:
        service["api_token"] = token
    if command is not None:
        argv = list(command) or [sys.executable, "-m", "jupyterhub_gpupool.cli", "reclaimer"]
        argv += [
            f"--service-url={service_url.rstrip('/')}/services/{service_name}/",
            f"--proxy-url={proxy_url or _proxy_origin(c)}",
        ]
        service["command"] = argv + list(args)
    elif not token:
        raise ValueError("an external reclaimer needs its token")
    c.JupyterHub.services = [
        *(s for s in c.JupyterHub.get("services", []) if s.get("name") != name),
        service,
    ]
    roles = list(c.JupyterHub.get("load_roles", []))
    _merge_role(roles, {"name": name, "services": [name], "scopes": list(RECLAIMER_SCOPES)})
    c.JupyterHub.load_roles = roles


def configure_job_runner(
    c: Any,
    nodes: Sequence[str],
    *,
    service_name: str = "gpupool",
    service_url: str = "http://127.0.0.1:10101",
    args: Sequence[str] = (),
) -> None:
    """Let the hub run the job runner (``jupyterhub-gpupool job-runner``, this Python) for
    ``nodes`` as service ``<service_name>-job-runner``, with a role of exactly the agent scope
    (it reads its nodes' jobs and reports them, as an agent reports its GPUs). For a pool on
    one machine, where nothing else would run the jobs."""
    name = f"{service_name}-job-runner"
    argv = [
        sys.executable,
        "-m",
        "jupyterhub_gpupool.cli",
        "job-runner",
        f"--service-url={service_url.rstrip('/')}/services/{service_name}/",
        *(f"--JobRunner.nodes={n}" for n in nodes),
        *args,
    ]
    c.JupyterHub.services = [
        *(s for s in c.JupyterHub.get("services", []) if s.get("name") != name),
        {"name": name, "command": argv},
    ]
    roles = list(c.JupyterHub.get("load_roles", []))
    _merge_role(roles, {"name": name, "services": [name], "scopes": [AGENT]})
    c.JupyterHub.load_roles = roles
