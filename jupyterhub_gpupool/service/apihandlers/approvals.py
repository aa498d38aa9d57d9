"""Approvals: an administrator approves (optionally for less) or denies a request awaiting
approval; the user hears of the decision through the service's ``notify_hook``. The list of
waiting requests is ``GET allocations?state=awaiting_approval``."""

from __future__ import annotations

from ...pool import commands
from ..serialize.leases import lease_json
from .base import APIHandler, needs


class ApproveHandler(APIHandler):
    """``POST allocations/{id}/approve {duration?, offer?, note?}``."""

    route_name = "approve"

    @needs("admin", "approve requests")
    async def post(self, lease_id: str) -> None:
        body = self.json_body(
            {
                "duration": ((int, float, type(None)), False),
                "offer": ((str, type(None)), False),
                "note": (str, False),
            }
        )
        lease = await self.writer.run(
            commands.Approve(
                lease_id,
                duration=body.get("duration"),
                offer=body.get("offer"),
                note=body.get("note", ""),
                actor=self.identity.describe(),
            )
        )
        out = lease_json(lease)
        self.settings["notify"]("approved", out, by=self.identity.name)
        self.write_json(out)


class DenyHandler(APIHandler):
    """``POST allocations/{id}/deny {reason}``."""

    route_name = "deny"

    @needs("admin", "deny requests")
    async def post(self, lease_id: str) -> None:
        body = self.json_body({"reason": (str, True)})
        lease = await self.writer.run(
            commands.Deny(lease_id, body["reason"], actor=self.identity.describe())
        )
        out = lease_json(lease)
        self.settings["notify"]("denied", out, by=self.identity.name)
        self.write_json(out)


default_handlers = [
    (r"allocations/([^/]+)/approve", ApproveHandler),
    (r"allocations/([^/]+)/deny", DenyHandler),
]
