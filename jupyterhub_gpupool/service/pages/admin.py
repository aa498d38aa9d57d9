"""The hub admin's panel: the pool map, the queue and leases, nodes (cordon, drain by a
deadline, MIG re-partition with its plan), quotas (with the effect of an edit) and the audit
log. Every page needs ``custom:gpupool:admin``; every action is a call of the REST API from the
page's script (with the hub's XSRF token), so the panel can do nothing the API would refuse,
and each action is audited with the admin's name.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from tornado import web

from ...pool.errors import PoolError
from ...pool.workloads import INTERACTIVE
from ...timeparse import parse_time
from ...wording import estimate_text, wait_text
from ..apihandlers.base import time_field
from ..serialize.leases import leases_json
from ..serialize.panel import live_lease_json, quota_use_json
from ..serialize.poolmap import pool_json
from .base import PageHandler

#: Audit events per page.
AUDIT_PAGE = 50
#: The last page the audit page asks for (50 million events back); beyond: a 400 page.
MAX_AUDIT_PAGE = 1_000_000


class AdminPage(PageHandler):
    """Base of the admin pages (403 for anyone without ``custom:gpupool:admin``)."""

    admin_only = True

    def offers(self) -> dict[str, str]:
        """Offer name → display name."""
        return {
            o["name"]: o.get("display_name") or o["name"] for o in self.store.offers_for(None, ())
        }


class MapPage(AdminPage):
    """``GET admin/``: clusters → nodes → GPUs as their MIG memory-slice layout, refreshed live
    by the script from ``pool/map``; the utilization heatmap and the units over time."""

    @web.authenticated
    def get(self) -> None:
        self.render_page("admin_map.html", title="Pool map")


class LeasesPage(AdminPage):
    """``GET admin/leases``: the queue in order and the live leases (sortable), with reclaim
    now, extend and release; a job's lease shows its job's name and class."""

    @web.authenticated
    def get(self) -> None:
        views, _ = self.store.leases(state="queued", limit=1000)
        queued = leases_json(views)
        queued.sort(key=lambda le: (le["position"] is None, le["position"] or 0))
        now = self.store.clock()
        for le in queued:
            created = le["created"]
            le["waited_s"] = (now - naive_utc(created)).total_seconds() if created else 0.0
        # a job's queued lease is named by its job (class, name), not its ``job:<id>`` server
        jobs = {j.lease_id: j for j in self.store.list_jobs(state="queued")}
        for le in queued:
            job = jobs.get(le["id"])
            le["job"], le["class"] = (job.name, job.workload) if job else (None, INTERACTIVE)
        live = sorted(self.store.live_leases(), key=lambda le: -le.idle_s)
        leases = [live_lease_json(le) for le in live]
        self.render_page(
            "admin_leases.html",
            title="Queue and leases",
            queued=queued,
            leases=leases,
            offers=self.offers(),
            wait_text=wait_text,
            estimate_text=estimate_text,
        )


class NodesPage(AdminPage):
    """``GET admin/nodes``: every node and GPU with cordon, uncordon, drain (by a deadline) and
    the MIG re-partition form (preview, then run); the re-partitions and their outcome."""

    @web.authenticated
    def get(self) -> None:
        pool = pool_json(self.store.pool(detail=True))
        profiles: dict[str, list[dict[str, Any]]] = {
            m.model: [
                {"name": p.name, "starts": list(p.starts), "slices": p.memory_slices}
                for p in m.profiles
            ]
            for m in self.store.mig_profiles(fresh=False)
        }
        self.render_page(
            "admin_nodes.html",
            title="Nodes",
            clusters=pool["clusters"],
            profiles=profiles,
            repartitions=self.store.repartitions(limit=50),
            simulated=simulated_nodes(self.settings.get("telemetry")),
            layout_json=lambda instances: json.dumps(
                [{"profile": i["profile"], "start": i["start"]} for i in instances]
            ),
        )


class QuotasPage(AdminPage):
    """``GET admin/quotas``: every quota in effect with current use, and its edit form (the
    effect previewed before saving; errors inline, naming the field)."""

    @web.authenticated
    def get(self) -> None:
        self.render_page(
            "admin_quotas.html",
            title="Quotas",
            quotas=[quota_use_json(q) for q in self.store.quota_table()],
            default=self.store.get_quota("users", ""),
        )


class AuditPage(AdminPage):
    """``GET admin/audit?user=&lease=&kind=&from=&to=&page=``: the audit log, newest first."""

    @web.authenticated
    def get(self) -> None:
        filters = {
            k: self.get_argument(k, "").strip() for k in ("user", "lease", "kind", "from", "to")
        }
        error = None
        since = until = None
        try:
            if filters["from"]:
                since = time_field(filters["from"], "from")
            if filters["to"]:
                until = time_field(filters["to"], "to")
        except PoolError as e:  # a time that is none: said above the table, filter dropped
            error = e.message
        page = self.int_arg("page", 1, low=1, high=MAX_AUDIT_PAGE)
        items, total = self.store.events(
            offset=(page - 1) * AUDIT_PAGE,
            limit=AUDIT_PAGE,
            lease=filters["lease"] or None,
            user=filters["user"] or None,
            kind=filters["kind"] or None,
            since=since,
            until=until,
            newest_first=True,
        )
        self.render_page(
            "admin_audit.html",
            title="Audit log",
            items=items,
            total=total,
            page=page,
            pages=max(1, math.ceil(total / AUDIT_PAGE)),
            filters=filters,
            query="".join(f"{urlencode({k: v})}&" for k, v in filters.items() if v),
            error=error,
        )


def naive_utc(iso: str) -> datetime:
    """A store timestamp (``...Z``) as the naive UTC datetime of the store's clock."""
    moment = parse_time(iso)
    if moment is None:
        raise ValueError("no time")
    return moment.replace(tzinfo=None)


def simulated_nodes(telemetry: Any) -> set[str]:
    """Nodes the service reads from the simulated NVML itself (the demo): their GPUs get a
    button that makes them fall off the bus, or come back (``simulated-fault``)."""
    if telemetry is None:
        return set()
    return {name for name in telemetry.readers if telemetry.simulates(name)}
