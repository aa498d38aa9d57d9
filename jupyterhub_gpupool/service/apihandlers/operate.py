"""The admin panel's endpoints: reclaim now, extend or cancel a notice, MIG re-partitions, the
pool map and its history (every one for ``custom:gpupool:admin``; the re-partition list for
agents too, so a label writer can follow them)."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from datetime import timedelta

from ...pool import commands
from ...store import utcnow
from ...store.rows import epoch
from ..serialize.headroom import headroom_json
from ..serialize.leases import lease_json
from ..serialize.panel import quota_effect_json, unit_series_json
from ..serialize.poolmap import pool_map_text
from ..serialize.repartitions import repartition_json, repartition_plan_json
from .base import APIError, APIHandler, needs


class ReclaimNowHandler(APIHandler):
    """``POST allocations/{id}/reclaim``: an admin's reclaim (a notice, or ``immediately``)."""

    route_name = "reclaim-now"

    @needs("admin", "reclaim leases")
    async def post(self, lease_id: str) -> None:
        body = self.json_body(
            {
                "immediately": (bool, False),
                "grace": ((int, float, type(None)), False),
                "action": (str, False),
                "reason": (str, False),
            }
        )
        lease = await self.writer.run(
            commands.AdminReclaim(
                lease_id,
                immediately=body.get("immediately", False),
                grace=body.get("grace"),
                action=body.get("action", "stop"),
                reason=body.get("reason", ""),
                actor=self.identity.describe(),
            )
        )
        self.write_json(lease_json(lease))


class ExtendNoticeHandler(APIHandler):
    """``POST allocations/{id}/extend {seconds}``: push a reclaim notice's deadline later."""

    route_name = "extend-notice"

    @needs("admin", "extend reclaim notices")
    async def post(self, lease_id: str) -> None:
        body = self.json_body({"seconds": ((int, float), True)})
        lease = await self.writer.run(
            commands.ExtendNotice(lease_id, float(body["seconds"]), actor=self.identity.describe())
        )
        self.write_json(lease_json(lease))


class CancelNoticeHandler(APIHandler):
    """``POST allocations/{id}/notice/cancel {reason?}``: withdraw a reclaim notice of any
    kind; the user is told (``notify_hook`` event ``notice-cancelled``, and the notice leaves
    their page and JupyterLab)."""

    route_name = "cancel-notice"

    @needs("admin", "cancel reclaim notices")
    async def post(self, lease_id: str) -> None:
        body = self.json_body({"reason": (str, False)})
        lease = await self.writer.run(
            commands.CancelNotice(
                lease_id,
                body.get("reason", ""),
                actor=self.identity.describe(),
            )
        )
        reason = body.get("reason", "").strip() or "no reason given"
        out = lease_json(lease)
        self.settings["notify"]("notice-cancelled", out, by=self.identity.name, reason=reason)
        self.write_json(out)


class NodeRepartitionHandler(APIHandler):
    """``POST nodes/{name}/repartitions {gpu, layout, dry_run?, notice_seconds?}``."""

    route_name = "repartition"

    @needs("admin", "re-partition GPUs")
    async def post(self, node: str) -> None:
        body = self.json_body(
            {
                "gpu": (str, True),
                "layout": (list, True),
                "dry_run": (bool, False),
                "notice_seconds": ((int, float, type(None)), False),
            }
        )
        if body.get("dry_run"):
            preview = self.store.repartition_plan(node, body["gpu"], body["layout"])
            self.write_json(repartition_plan_json(preview))
            return
        rep = await self.writer.run(
            commands.RequestRepartition(
                node,
                body["gpu"],
                body["layout"],
                notice_seconds=body.get("notice_seconds"),
                actor=self.identity.describe(),
            )
        )
        self.write_json(repartition_json(rep), 201)


class RepartitionsHandler(APIHandler):
    """``GET repartitions?node=&state=``: newest first."""

    route_name = "repartitions"

    @needs("agent", "read re-partitions")
    def get(self) -> None:
        self.write_json(
            {
                "items": [
                    repartition_json(r)
                    for r in self.store.repartitions(
                        node=self.get_argument("node", None),
                        state=self.get_argument("state", None),
                        limit=self.int_arg("limit", 200, low=1, high=1000),
                    )
                ]
            }
        )


class RepartitionHandler(APIHandler):
    """``DELETE repartitions/{id}``: cancel one still waiting."""

    route_name = "repartition-cancel"

    @needs("admin", "cancel re-partitions")
    async def delete(self, rep_id: str) -> None:
        if not rep_id.isdigit() or len(rep_id) > 9:
            raise APIError("not_found", f"no re-partition {rep_id!r}", field="id")
        rep = await self.writer.run(
            commands.CancelRepartition(int(rep_id), actor=self.identity.describe())
        )
        self.write_json(repartition_json(rep))


class PoolMapHandler(APIHandler):
    """``GET pool/map``: every GPU with its slices and holders, every live lease (idle since
    when, notices), and the latest utilization of each device.

    The structure is the store's ``map_view`` (kept until the pool version moves) as the map
    writer's text (kept for the same view: ``serialize.poolmap.MapWriter``); only ``util`` (from
    the samples in memory), ``headroom`` (``Store.headroom``: it changes with the clock, as
    waiters age) and ``now`` are added per request, so a refresh of a large, quiet pool costs
    the service little more than writing the answer."""

    route_name = "pool-map"

    @needs("admin", "see the pool map")
    def get(self) -> None:
        body = pool_map_text(self.store.map_view())
        buffer = self.settings["utilization"]
        now = time.time()
        util = {}
        for (gpu, start), sample in buffer.latest(now - 120):
            util[gpu if start is None else f"{gpu}/{start}"] = sample.util
        room = json.dumps(headroom_json(self.store.headroom()))  # by the clock, not cached
        # ``now`` on the store's clock, as the times the map subtracts it from (a waiter's
        # waiting_since, a lease's idle_since); the samples' window is on the wall clock
        at = self.store.clock()
        self.set_status(200)
        self.finish(f'{body[:-1]},"util":{json.dumps(util)},"headroom":{room},"now":{epoch(at)}}}')


class PoolHistoryHandler(APIHandler):
    """``GET pool/history?hours=24&step=900``: units used and queued over time and a heatmap
    of each GPU's mean utilization per step."""

    route_name = "pool-history"

    @needs("admin", "see the pool's history")
    def get(self) -> None:
        hours = self.int_arg("hours", 24, low=1, high=24 * 31)
        step = self.int_arg("step", 900, low=60, high=86400)
        end = utcnow()
        start = end - timedelta(hours=hours)
        t0 = epoch(start)
        buckets = int((epoch(end) - t0) // step) + 1
        times = [t0 + i * step for i in range(buckets)]
        series = unit_series_json(self.store.unit_series(start, end, step))
        heat: dict[str, list[float | None]] = {}
        sums: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0])
        for m in self.store.minutes(None, start, end):
            util = m.util_mean
            if util is None:
                continue
            i = int((epoch(m.minute) - t0) // step)
            acc = sums[(m.gpu, i)]
            acc[0] += util
            acc[1] += 1
        for (gpu, i), (total, n) in sums.items():
            row = heat.setdefault(gpu, [None] * buckets)
            if 0 <= i < buckets:
                row[i] = round(total / n, 1)
        totals = self.store.pool(detail=False).totals
        self.write_json(
            {
                "from": start.isoformat() + "Z",
                "to": end.isoformat() + "Z",
                "step": step,
                "times": times,
                "capacity": float(totals.total),
                **series,
                "heatmap": heat,
            }
        )


class QuotaPreviewHandler(APIHandler):
    """``POST quotas/{kind}/{name}/preview``: the effect of a quota change, changing nothing."""

    route_name = "quota-preview"

    @needs("admin", "preview quota changes")
    def post(self, kind: str, name: str) -> None:
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
        self.write_json(quota_effect_json(self.store.quota_effect(kind, name, body)))


default_handlers = [
    (r"quotas/([^/]+)/([^/]+)/preview", QuotaPreviewHandler),
    (r"allocations/([^/]+)/reclaim", ReclaimNowHandler),
    (r"allocations/([^/]+)/extend", ExtendNoticeHandler),
    (r"allocations/([^/]+)/notice/cancel", CancelNoticeHandler),
    (r"nodes/([^/]+)/repartitions", NodeRepartitionHandler),
    (r"repartitions", RepartitionsHandler),
    (r"repartitions/([^/]+)", RepartitionHandler),
    (r"pool/map", PoolMapHandler),
    (r"pool/history", PoolHistoryHandler),
]
