"""The admins' list of requests awaiting approval, with approve (for less, if need be) and deny;
both are calls of the REST API from the page's script, audited with the admin's name."""

from __future__ import annotations

from typing import Any

from tornado import web

from ..serialize.leases import leases_json
from .admin import AdminPage, naive_utc


class ApprovalsPage(AdminPage):
    """``GET admin/approvals``: waiting requests, oldest first, with why and for how long."""

    @web.authenticated
    def get(self) -> None:
        offers = self.store.offers_for(None, ())
        by_name = {o["name"]: o for o in offers}
        now = self.store.clock()
        asks: list[dict[str, Any]] = []
        for le in leases_json(self.store.awaiting_approval()):
            ask = le.get("approval") or {}
            asked = ask.get("asked")
            mine = by_name.get(le["offer"], {})
            asks.append(
                {
                    **le,
                    "ask": ask,
                    "waited_s": (now - naive_utc(asked)).total_seconds() if asked else 0.0,
                    # what an approval may lower it to: smaller offers of the same kind
                    "smaller": [
                        [o["name"], o.get("display_name") or o["name"]]
                        for o in offers
                        if o.get("kind") == mine.get("kind")
                        and o["name"] != le["offer"]
                        and o["units"] < mine.get("units", 0)
                    ],
                }
            )
        self.render_page(
            "admin_approvals.html",
            title="Approvals",
            asks=asks,
            offers={n: o.get("display_name") or n for n, o in by_name.items()},
        )
