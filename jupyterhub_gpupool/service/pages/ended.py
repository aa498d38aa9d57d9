"""``GET /services/gpupool/ended/{lease}``: how one of the caller's leases ended, for a
JupyterLab page whose server is gone.

Why a page and not the API: once the reclaimer has stopped a server, the lab page still open in
the browser cannot ask that server anything, and a script's cookie request to the pool's API
needs the service's XSRF token, which a page under ``/user/…`` cannot read. A page load (the
lab's hidden frame, same origin) is a navigation: the hub's OAuth signs the browser in without
a prompt (the service is ``oauth_no_confirm``) and no XSRF token is asked for a read. The page
says it in words for a person and carries the same facts as JSON
(``<script type="application/json" id="gpupool-lease-end">``, data, never run) for the lab.
Only the caller's own leases: another user's is a 404, as a missing one.
"""

from __future__ import annotations

import json
from typing import Any

from markupsafe import Markup
from tornado import web

from ...store import StoreError
from ..serialize.leases import lease_json
from ..serialize.reclaim import past_reclaim_json
from .base import PageHandler
from .user import done_text


def lease_end(
    lease: dict[str, Any], reclaim: dict[str, Any] | None, names: dict[str, str]
) -> dict[str, Any]:
    """The facts the lab shows once its server is gone: whether the lease ended, when, whether
    a reclaim ended it (its reason, what it did, the files it saved) or else the release
    reason."""
    offer = lease.get("offer") or ""
    ended = lease.get("state") == "released"
    out: dict[str, Any] = {
        "lease": lease["id"],
        "state": lease.get("state"),
        "ended": ended,
        "offer": offer,
        "offer_name": names.get(offer, offer),
        "at": lease.get("released") if ended else None,
        "release_reason": lease.get("release_reason") if ended else None,
        "reclaimed": reclaim is not None,
        "kind": None,
        "reason": None,
        "action": None,
        "saved": [],
        "outcome": None,
    }
    if reclaim is not None:
        out.update(
            at=reclaim.get("at") or out["at"],
            reason=reclaim.get("reason"),
            action=reclaim.get("action"),
            saved=list(reclaim.get("saved") or []),
            outcome=reclaim.get("outcome"),
            kind=reclaim.get("kind"),
        )
    return out


class LeaseEndPage(PageHandler):
    """One lease's end, in words and as JSON (see the module's docstring)."""

    @web.authenticated
    def get(self, lease_id: str) -> None:
        model = self.current_user
        if model.get("kind", "user") != "user":
            raise web.HTTPError(404, "services have no leases")
        name = model["name"]
        try:
            holder, _ = self.store.lease_holder(lease_id)
        except StoreError:
            holder = None
        if holder != name:
            raise web.HTTPError(404, "you have no such lease")
        lease = lease_json(self.store.lease(lease_id))
        groups = tuple(model.get("groups") or ())
        names = {
            o["name"]: o.get("display_name") or o["name"]
            for o in self.store.offers_for(name, groups)
        }
        reclaim = next(
            (past_reclaim_json(r) for r in self.store.recent_reclaims(name) if r.lease == lease_id),
            None,
        )
        end = lease_end(lease, reclaim, names)
        self.render_page(
            "ended.html",
            end=end,
            done=done_text(end["action"], names) if end["reclaimed"] else "",
            # no "<" at all: "</script>" or "<!--" in a file name cannot end the element early
            end_json=Markup(json.dumps(end).replace("<", "\\u003c")),
        )
