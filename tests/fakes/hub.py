"""The hub environment, reached by tests through :mod:`tests.fakes` only.

:class:`HubEnv` (a real JupyterHub + proxy + the pool service as processes) and
:func:`request`, defined in ``tests/integration/hubenv.py`` — the harness the benchmarks and
the docs name — are re-exported here; :func:`wait_reconciled` waits for the service's reconcile
at start; :func:`write_pool` writes a pool config file a test may edit (the demo pool's by
default).
"""

from __future__ import annotations

from pathlib import Path

from tests.fakes.waiting import wait_until
from tests.integration.hubenv import (
    ROOT,
    SPAWNER_CONFIG,
    HubEnv,
    Response,
    chp_command,
    free_port,
    request,
    wait_http,
)

__all__ = [
    "ROOT",
    "SPAWNER_CONFIG",
    "HubEnv",
    "Response",
    "chp_command",
    "free_port",
    "reconciles",
    "request",
    "wait_http",
    "wait_reconciled",
    "write_pool",
]


def reconciles(env: HubEnv, admin: str) -> int:
    """How many times the service reconciled its leases with the hub (``reconciled`` events)."""
    items = request("GET", f"{env.api}/events?limit=1000", admin).json()["items"]
    return sum(e["kind"] == "reconciled" for e in items)


def wait_reconciled(env: HubEnv, before: int = 0) -> None:
    """Wait until the service has reconciled its leases with the hub at start: more than
    ``before`` ``reconciled`` audit events (count them before restarting a service), with a
    generous bound.

    The reconcile at start releases, as ``stopped``, the leases of servers the hub does not
    know, so a test that makes such leases must not begin before it. HubEnv starts the service
    before the hub: that reconcile fails once and runs again at a housekeeping round after the
    hub answers (a short ``housekeeping_interval`` keeps this wait short); a restarted service
    runs it while it already answers requests.
    """
    admin = env.token("admin")
    wait_until(
        lambda: reconciles(env, admin) > before,
        what="the service's reconcile at start",
        step=0.1,
        info=env.logs,
    )


def write_pool(where: Path, text: str | None = None, name: str = "pool.yaml") -> Path:
    """Write a pool config file into ``where`` (``text``, else the shipped demo pool's) and
    return its path: a test may edit it and restart the service on it."""
    from jupyterhub_gpupool.data import data_path

    path = where / name
    path.write_text(text if text is not None else Path(data_path("demo-pool.yaml")).read_text())
    return path
