"""Admin endpoints: quotas, node cordon/uncordon/drain (by a deadline), usage reports, the audit
log (filtered by user, lease, kind and time)."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

from ...pool import commands
from ...store import utcnow
from ...store.chargeback import COLUMNS as USAGE_COLUMNS
from ...store.rows import check_quota_kind
from ...timeparse import format_time
from ..serialize.events import event_json
from ..serialize.leases import lease_json
from ..serialize.nodes import node_drain_json, node_set_json
from ..serialize.quotas import quota_json
from ..serialize.usage import idle_holders_json, usage_report_json, usage_rows_json
from .base import MAX_STR, APIError, APIHandler, needs, time_field


class QuotaHandler(APIHandler):
    """``GET|PUT quotas/{users|groups}/{name}``."""

    route_name = "quota"

    @needs("admin", "read quotas")
    def get(self, kind: str, name: str) -> None:
        self.write_json(quota_json(self.store.get_quota(kind, name)))

    @needs("admin", "change quotas")
    async def put(self, kind: str, name: str) -> None:
        """Replace the quota: every field is required, so a forgotten one cannot silently
        lift a cap (``limit: null`` says "no limit" on purpose)."""
        check_quota_kind(kind)  # the URL first: no such resource is a 404 whatever the body
        self._check_name(name)
        body = self.json_body(
            {
                "guarantee": ((int, float), True),
                "limit": ((int, float, type(None)), True),
                "budget": ((int, float, type(None)), True),
                "period": (str, True),
                "exception": ((int, float, type(None)), False),
                "budget_action": (str, False),
                "budget_minimum": ((int, float), False),
            }
        )
        actor = self.identity.describe()
        quota = await self.writer.run(commands.PutQuota(kind, name, body, actor=actor))
        self.write_json(quota_json(quota))

    @needs("admin", "change quotas")
    async def patch(self, kind: str, name: str) -> None:
        """Change only the fields named; the others keep their current values."""
        check_quota_kind(kind)
        self._check_name(name)
        body = self.json_body(
            {
                "guarantee": ((int, float), False),
                "limit": ((int, float, type(None)), False),
                "budget": ((int, float, type(None)), False),
                "period": (str, False),
                "exception": ((int, float, type(None)), False),
                "budget_action": (str, False),
                "budget_minimum": ((int, float), False),
            }
        )
        actor = self.identity.describe()
        quota = await self.writer.run(commands.PatchQuota(kind, name, body, actor=actor))
        self.write_json(quota_json(quota))

    @staticmethod
    def _check_name(name: str) -> None:
        if not 0 < len(name) <= MAX_STR:
            raise APIError(
                "invalid_field",
                f"name must be 1 to {MAX_STR} characters",
                field="name",
            )

    @needs("admin", "reset quotas")
    async def delete(self, kind: str, name: str) -> None:
        """Reset: drop the API override so the pool config file's quota applies again."""
        actor = self.identity.describe()
        quota = await self.writer.run(commands.ResetQuota(kind, name, actor=actor))
        self.write_json(quota_json(quota))


class NodeActionHandler(APIHandler):
    """``POST nodes/{name}/{cordon|uncordon|drain}``; a drain may name a ``deadline`` by
    which every lease on the node ends (each gets a reclaim notice ending then; ``noticed``
    counts them); an uncordon withdraws those notices (``withdrawn`` lists the leases)."""

    route_name = "node-action"

    @needs("admin", "{action} nodes")
    async def post(self, name: str, action: str) -> None:
        body = self.json_body({"deadline": (str, False), "action": (str, False)})
        actor = self.identity.describe()
        if action != "drain":
            if body:
                field = sorted(body)[0]
                raise APIError("invalid_field", f"only a drain takes {field}", field=field)
            out = await self.writer.run(commands.SetNode(name, action, actor=actor))
            for lease_id in out.withdrawn or ():  # an uncordon's withdrawn drain notices
                lease = lease_json(self.store.lease(lease_id))
                why = f"the node {name} is back in service"
                self.settings["notify"](
                    "notice-cancelled", lease, by=self.identity.name, reason=why
                )
            self.write_json(node_set_json(out))
            return
        deadline = None
        if body.get("deadline") is not None:
            deadline = time_field(body["deadline"], "deadline")
        drained = await self.writer.run(
            commands.DrainNode(name, deadline, action=body.get("action", "stop"), actor=actor)
        )
        self.write_json(node_drain_json(drained))


class UsageHandler(APIHandler):
    """``GET usage?from=&to=&by=user|group|offer|job&format=json|csv`` (unit-hours)."""

    route_name = "usage"

    @needs("admin", "read usage reports")
    def get(self) -> None:
        end = self.time_arg("to", utcnow())
        start = self.time_arg("from", end - timedelta(days=30))
        by = self.get_argument("by", "user")
        fmt = self.get_argument("format", "json")
        if fmt not in ("json", "csv"):
            raise APIError(
                "invalid_argument",
                f"unknown format {fmt!r}",
                field="format",
                allowed=["json", "csv"],
            )
        report = self.store.usage_report(start, end, by)
        if fmt == "json":
            self.write_json(usage_report_json(report))
            return
        out = io.StringIO()
        named = [by, "name"] if by == "job" else [by]  # a job's row: its id and its name
        writer = csv.DictWriter(out, [*named, "kind", *USAGE_COLUMNS], lineterminator="\n")
        writer.writeheader()
        writer.writerows(usage_rows_json(report.items, by))
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", f'attachment; filename="gpu-usage-by-{by}.csv"')
        self.finish(out.getvalue())


class IdleHoldersHandler(APIHandler):
    """``GET usage/idle-holders?from=&to=&limit=``: who held the most GPU unit-hours idle."""

    route_name = "idle-holders"

    @needs("admin", "read usage reports")
    def get(self) -> None:
        end = self.time_arg("to", utcnow())
        start = self.time_arg("from", end - timedelta(days=30))
        limit = self.int_arg("limit", 10, low=1, high=1000)
        items = self.store.idle_holders(start, end, limit)
        self.write_json(
            {
                "from": format_time(start),
                "to": format_time(end),
                "currency": self.store.prices.currency,
                "items": idle_holders_json(items),
            }
        )


class PricesHandler(APIHandler):
    """``GET prices``: the price table over time (each model's prices with their effective
    starts), as recorded from the pool config."""

    route_name = "prices"

    @needs("admin", "read prices")
    def get(self) -> None:
        self.write_json(self.store.prices.to_json())


class EventsHandler(APIHandler):
    """``GET events?lease=&user=&kind=&from=&to=&order=&offset=&limit=``: the audit log
    (admins)."""

    route_name = "events"

    @needs("admin", "read the audit log")
    def get(self) -> None:
        offset, limit = self.page_args()
        order = self.get_argument("order", "asc")
        if order not in ("asc", "desc"):
            raise APIError(
                "invalid_argument",
                "order must be asc or desc",
                field="order",
                allowed=["asc", "desc"],
            )
        items, total = self.store.events(
            offset=offset,
            limit=limit,
            lease=self.get_argument("lease", None),
            user=self.get_argument("user", None),
            kind=self.get_argument("kind", None),
            since=self.time_arg("from"),
            until=self.time_arg("to"),
            newest_first=order == "desc",
        )
        self.write_page([event_json(e) for e in items], total, offset, limit)


default_handlers = [
    (r"quotas/([^/]+)/([^/]+)", QuotaHandler),
    (r"nodes/([^/]+)/(cordon|uncordon|drain)", NodeActionHandler),
    (r"usage", UsageHandler),
    (r"usage/idle-holders", IdleHoldersHandler),
    (r"prices", PricesHandler),
    (r"events", EventsHandler),
]
