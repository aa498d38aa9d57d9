"""The reclaimer's hands: save what is open, then stop the server or restart it on less.

Every step goes through the hub (stop, start with ``user_options``) or through the proxy to the
user's own server (save), with the reclaimer's token. A step that cannot be done raises
:class:`ActionFailed` *before* anything irreversible happened where that is possible: the
save and the shrink's target come first, so a failure there leaves the user their GPU.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from tornado.httpclient import HTTPClientError

from ..hubclient import HubClient, HubUnavailable, ServerUnavailable
from ..poolclient import PoolClient, PoolClientError

#: The lab package's endpoint in the user's server that saves every open document.
SAVE_ALL = "gpupool/save-all"
#: The ``user_options`` key the pool's spawners read (``spawner/base.py``'s ``OPTION``).
OFFER_OPTION = "gpupool_offer"


class ActionFailed(Exception):
    """An action could not be carried out; ``irreversible`` once the server was stopped."""

    def __init__(self, message: str, *, irreversible: bool = False) -> None:
        super().__init__(message)
        self.irreversible = irreversible


@dataclass
class Outcome:
    """What came of one action: the body of ``POST reclaim/leases/{id}/outcome``."""

    result: str  # done | failed
    saved: list[str] = field(default_factory=list)
    detail: str = ""


async def save_all(hub: HubClient, server_url: str, timeout: float) -> list[str]:
    """Save every open document of the server; the paths saved.

    The lab package's ``save-all`` saves what the browser holds; without it (404), every file
    open in a Jupyter Server session gets a contents checkpoint of what is on disk.
    """
    try:
        status, data = await hub.call_server(server_url, SAVE_ALL, "POST", {}, timeout=timeout)
        if status < 300:
            saved = data.get("saved") if isinstance(data, dict) else None
            return [str(p) for p in saved or []]
        if status not in (404, 405):
            raise ActionFailed(f"save-all answered {status}")
        status, sessions = await hub.call_server(
            server_url, "api/sessions?no_track_activity=1", timeout=timeout
        )
        if status != 200 or not isinstance(sessions, list):
            raise ActionFailed(f"the server's sessions could not be read ({status})")
        paths = sorted({p for s in sessions if isinstance(s, dict) and (p := _session_path(s))})
        saved = []
        for path in paths:
            status, _ = await hub.call_server(
                server_url, f"api/contents/{quote(path)}/checkpoints", "POST", timeout=timeout
            )
            if status == 201:
                saved.append(path)
            elif status != 404:  # 404: never written to disk (a new, unsaved notebook)
                raise ActionFailed(f"the checkpoint of {path} answered {status}")
        return saved
    except ServerUnavailable as e:
        raise ActionFailed(f"the server could not be reached to save: {e}") from None


def _session_path(session: dict[str, Any]) -> str | None:
    path = session.get("path") or (session.get("notebook") or {}).get("path")
    return str(path) if path else None


async def stop(hub: HubClient, user: str, server: str, timeout: float) -> None:
    """Stop the server through the hub and wait until the hub shows it stopped."""
    try:
        await hub.stop_server(user, server)
        if not await hub.wait_server(user, server, running=False, timeout=timeout):
            raise ActionFailed(f"the server did not stop within {timeout:g} s")
    except (HubUnavailable, HTTPClientError) as e:
        raise ActionFailed(f"the hub could not stop the server: {e}") from None


async def start(
    hub: HubClient, user: str, server: str, options: dict[str, Any], timeout: float
) -> None:
    """Start the server with ``options`` and wait until it is ready (the server is stopped
    already, so a failure here is irreversible)."""
    try:
        await hub.start_server(user, server, options)
        if not await hub.wait_server(user, server, running=True, timeout=timeout):
            raise ActionFailed(
                f"the server did not start again within {timeout:g} s", irreversible=True
            )
    except (HubUnavailable, HTTPClientError) as e:
        raise ActionFailed(
            f"the hub could not start the server again: {e}", irreversible=True
        ) from None


async def wait_target(pool: PoolClient, lease_id: str, timeout: float, poll: float) -> None:
    """Wait until a shrink's reserved target lease is granted and ready (make-before-break);
    raises ``ActionFailed`` when it is withdrawn or does not come within ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            target = await pool.lease(lease_id)
        except PoolClientError as e:
            raise ActionFailed(f"the target lease {lease_id} could not be read: {e}") from None
        if target.get("state") in ("granted", "active") and target.get("ready", True):
            return
        if target.get("state") == "released":
            why = target.get("release_reason") or "released"
            raise ActionFailed(f"the target lease {lease_id} was withdrawn ({why})")
        if loop.time() >= deadline:
            raise ActionFailed(f"the target lease {lease_id} was not ready within {timeout:g} s")
        await asyncio.sleep(poll)
