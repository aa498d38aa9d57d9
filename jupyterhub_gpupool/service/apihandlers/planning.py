"""Capacity planning for admins: the recorded demand per offer and day, and the what-if replay
of the recorded requests with a changed inventory or reclaim policy (read-only: both only read
the store; the replay runs off the event loop)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from functools import partial
from typing import Any

from ...pool.errors import PoolError
from ...pool.reclaimpolicy import parse_policies
from ...simulate.whatif import Change, WhatIfError, parse_add, what_if
from ...store import utcnow
from ...store.rebuild import inventory_of
from ...timeparse import format_time
from ..serialize.planning import capacity_json
from .base import APIError, APIHandler, needs, time_field

#: The longest what-if window (days): a year of 400 requests a day replays in about 20 s of
#: one core (benchmarks/whatif_replay.py), in a thread beside the event loop.
MAX_DAYS = 366


class CapacityHandler(APIHandler):
    """``GET capacity?from=&to=&offer=``: per offer and UTC day, demand and waits."""

    route_name = "capacity"

    @needs("admin", "read capacity planning figures")
    def get(self) -> None:
        end = self.time_arg("to", utcnow())
        start = self.time_arg("from", end - timedelta(days=30))
        offer = self.get_argument("offer", None)
        items = self.store.capacity(start, end, offer)
        self.write_json(
            {"from": format_time(start), "to": format_time(end), "items": capacity_json(items)}
        )


class WhatIfHandler(APIHandler):
    """``POST capacity/what-if {days | hours, add?, remove?, mig_layout?, reclaim?, until?}``:
    the recorded requests of the last ``days`` days (or ``hours`` hours) replayed on a changed
    pool, beside what happened."""

    route_name = "what-if"

    @needs("admin", "run what-if replays")
    async def post(self) -> None:
        body = self.json_body(
            {
                "days": (int, False),
                "hours": (int, False),
                "add": (dict, False),
                "remove": (list, False),
                "reclaim": (dict, False),
                "mig_layout": (dict, False),
                "until": (str, False),
            }
        )
        days, hours = body.get("days"), body.get("hours")
        if days is not None and hours is not None:
            raise APIError("invalid_argument", "give days or hours, not both", field="hours")
        if days is None and hours is None:
            raise APIError("missing_field", "days (or hours) is required", field="days")
        if days is not None and (isinstance(days, bool) or not 1 <= days <= MAX_DAYS):
            raise APIError("invalid_argument", f"days must be from 1 to {MAX_DAYS}", field="days")
        if hours is not None and (isinstance(hours, bool) or not 1 <= hours <= MAX_DAYS * 24):
            raise APIError(
                "invalid_argument", f"hours must be from 1 to {MAX_DAYS * 24}", field="hours"
            )
        until = time_field(body["until"], "until") if body.get("until") is not None else None
        add_raw = body.get("add") or {}
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in add_raw.values()):
            raise APIError("invalid_argument", "add maps a GPU model to a count", field="add")
        remove = body.get("remove") or []
        if not all(isinstance(n, str) for n in remove):
            raise APIError("invalid_argument", "remove lists node names", field="remove")
        try:
            add = parse_add([f"{m}:{n}" for m, n in add_raw.items()], self.store.catalog.names)
            policy = None
            if "reclaim" in body:
                with self.store.read() as db:
                    _, offers = inventory_of(db, self.store.catalog)
                try:
                    policy = parse_policies(
                        body["reclaim"], {o.name: o for o in offers}, "reclaim", self.store.catalog
                    )
                except PoolError as e:
                    raise APIError(
                        "invalid_argument", e.message, field=e.field or "reclaim"
                    ) from None
            layouts = body.get("mig_layout") or {}
            for layout in layouts.values():
                if not (
                    layout == "dynamic"
                    or (
                        isinstance(layout, list)
                        and layout
                        and all(isinstance(p, str) for p in layout)
                    )
                ):
                    raise APIError(
                        "invalid_argument",
                        "mig_layout maps a node to a list of MIG profiles or 'dynamic'",
                        field="mig_layout",
                    )
            change = Change(
                add,
                tuple(remove),
                policy,
                {n: v if v == "dynamic" else tuple(v) for n, v in layouts.items()},
            )
            loop = asyncio.get_running_loop()
            result: dict[str, Any] = await loop.run_in_executor(
                None, partial(what_if, hours=hours), self.store, days or 0, change, until
            )
        except WhatIfError as e:
            raise APIError(
                "invalid_argument", str(e).removeprefix("--"), field=e.field or "days"
            ) from None
        self.write_json(result)


default_handlers = [
    (r"capacity", CapacityHandler),
    (r"capacity/what-if", WhatIfHandler),
]
