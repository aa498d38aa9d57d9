"""``POST allocations/{id}/restart``: restart the lease's server into it once it is granted."""

from __future__ import annotations

from ...hubclient import HubUnavailable
from ..restarts import WAITING
from .allocations import _LeaseHandler
from .base import APIError, needs


class RestartHandler(_LeaseHandler):
    """Wait for a reserved lease (a resize target, or a GPU asked for by a CPU-only server) to
    be granted, then have the hub restart its server into it (``service/restarts.py``)."""

    route_name = "restart"

    @needs("use", "restart servers")
    async def post(self, lease_id: str) -> None:
        self._check(lease_id)
        self.json_body({})
        lease = self.store.lease(lease_id)
        if lease.state not in WAITING:
            raise APIError(
                "not_live",
                f"lease {lease_id} is {lease.state}: there is nothing to restart into",
                field="id",
            )
        try:
            server = await self.settings["hub"].server(lease.user, lease.server)
        except HubUnavailable as e:
            raise APIError(
                "hub_unavailable", f"JupyterHub did not answer ({e}); try again"
            ) from None
        if server is None:
            raise APIError(
                "unknown_server",
                f"{lease.user} has no running server {lease.server!r} to restart",
                field="id",
            )
        state = self.settings["restarts"].request(lease)
        self.write_json({"lease": lease_id, "restart": state}, 202)


default_handlers = [(r"allocations/([^/]+)/restart", RestartHandler)]
