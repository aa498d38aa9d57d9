"""The pool service's REST API as the user's server calls it, with the server's own token.

The client is the pool's one API client, ``jupyterhub_gpupool.poolclient`` (this distribution
depends on ``jupyterhub-gpupool`` for it: beyond JupyterHub, which every user image has for
``jupyterhub-singleuser``, that adds PyYAML and nothing heavy at import time). Its split of
failures, under the lab's names: :class:`PoolDown` (no answer, 502/503/504, a timeout: show
"the pool is not answering" and try again later) and :class:`PoolRefused` (an answer with the
pool's error code and message, to show as it is).
"""

from __future__ import annotations

from typing import Any

from jupyterhub_gpupool.poolclient import PoolClient, PoolRefused, PoolUnavailable
from jupyterhub_gpupool.poolclient import PoolClientError as PoolError

PoolDown = PoolUnavailable

__all__ = ["LabPoolClient", "PoolDown", "PoolError", "PoolRefused"]


class LabPoolClient(PoolClient):
    """The pool's client, with the lab's short names for the calls made as the token's own
    user (no user name to pass: the token says whose)."""

    async def me(self) -> dict[str, Any]:
        return await self.user("me")

    async def presence(self, lease_id: str, idle_for: float | None) -> dict[str, Any]:
        return await self.report_presence(lease_id, idle_for)

    async def cancel(self, lease_id: str) -> dict[str, Any]:
        return await self.release(lease_id, reason="cancelled")

    async def allocate(  # type: ignore[override]  # the lab's own server: no user to name
        self, server: str, offer: str, **ask: Any
    ) -> dict[str, Any]:
        return await super().allocate(None, server, offer, **ask)
