"""The user page at the service's prefix root (the hub's **Services → gpupool** link): the
logged-in user's own quota (bars), leases (with their last hour's use as a sparkline), queue
positions, reclaim notices with a "Keep my GPU" form, the last 30 days (held vs busy GPU-hours)
and what was reclaimed and why. Only the caller's own data: the name comes from the hub's
login, never from the URL.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from tornado import web

from ...orm import JOB_FINAL
from ...pool import commands
from ...pool.codes import describe
from ...pool.errors import PoolError
from ...store import StoreError
from ...store.read.jobs import JobView
from ...wording import last_hour_text
from ..serialize.leases import leases_json
from ..serialize.panel import day_uses_json
from ..serialize.users import user_json
from .base import PageHandler

#: Ended jobs the page lists (the newest); the API and ``job list`` give all.
ENDED_JOBS = 10
#: Job states in which Cancel does something (the store's ``cancel_job``).
CANCELLABLE = ("queued", "granted", "running", "preempting")

#: Eight levels of a text sparkline (the page's fallback when scripts are off).
SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(minutes: list[dict[str, Any]]) -> str:
    """A lease's minute utilization as one line of block characters (· for no reading)."""
    out = []
    for m in minutes:
        util = m.get("util_mean")
        out.append("·" if util is None else SPARKS[min(7, int(float(util) / 100 * 8))])
    return "".join(out)


def peak(minutes: list[dict[str, Any]]) -> float | None:
    """The highest minute mean (None when no minute had a reading)."""
    values = [float(m["util_mean"]) for m in minutes if m.get("util_mean") is not None]
    return max(values) if values else None


def action_text(action: str | None, names: dict[str, str] | None = None) -> str:
    """What a reclaim does, as the page says it."""
    if action == "release-gpu":
        return "restart your server without a GPU"
    if action and action.startswith("shrink:"):
        target = action.partition(":")[2]
        return f"restart your server on {(names or {}).get(target, target)}"
    return "stop your server (your open notebooks are saved first)"


def done_text(action: str | None, names: dict[str, str] | None = None) -> str:
    """What a finished reclaim did, as the page says it."""
    if action == "release-gpu":
        return "Restarted your server without a GPU"
    if action and action.startswith("shrink:"):
        target = action.partition(":")[2]
        return f"Restarted your server on {(names or {}).get(target, target)}"
    return "Stopped your server"


def user_jobs(jobs: list[JobView], ended: int = ENDED_JOBS) -> list[JobView]:
    """The jobs the page lists (newest first): every one not ended, and the last ``ended``
    that did, so the page stays short for a user with thousands of finished jobs."""
    out, done = [], 0
    for j in jobs:
        if j.state in JOB_FINAL:
            done += 1
            if done > ended:
                continue
        out.append(j)
    return out


class UserPageHandler(PageHandler):
    """``GET /services/gpupool/``: the logged-in user's leases and quota (HTML)."""

    @web.authenticated
    def get(self) -> None:
        if not self.request.path.endswith("/"):  # so the page's relative links resolve
            self.redirect(self.request.path + "/", permanent=True)
            return
        model = self.current_user
        if model.get("kind", "user") != "user":
            raise web.HTTPError(404, "services have no user page")
        name = model["name"]
        groups = tuple(model.get("groups") or ())
        me = user_json(self.store.user(name, groups, hub=None))  # the pool's hub's leases
        offers = {o["name"]: o for o in self.store.offers_for(name, groups)}
        names = {n: o.get("display_name") or n for n, o in offers.items()}
        leases = me.get("leases") or []
        since = self.store.clock() - timedelta(hours=1)
        sparks, last_hour = {}, {}
        for le in leases:
            devices = [(s["gpu"], s["start"] if s["kind"] == "mig" else None) for s in le["slots"]]
            if devices and le["state"] in ("active", "reclaiming"):
                minutes = self.store.minutes(devices, since)
                last_hour[le["id"]] = last_hour_text(minutes)
                if any(m.util_mean is not None for m in minutes):
                    sparks[le["id"]] = [m.util_mean for m in minutes]
        jobs = user_jobs(self.store.list_jobs(user=name))
        history = day_uses_json(self.store.user_history(name, days=30))
        recent, _ = self.store.leases(user=name, state="released", limit=100, hub=None)
        decided = leases_json([le for le in recent if le.approval][:10])  # asks that ended
        self.render_page(
            "user.html",
            me=me,
            quota=me.get("quota") or {},
            leases=leases,
            notices=me.get("notices") or [],
            reclaims=me.get("reclaims") or [],
            withdrawn=me.get("withdrawn") or [],
            notice_of={le["id"]: le["reclaim"] for le in leases if le.get("reclaim")},
            action_text=lambda action: action_text(action, names),
            done_text=lambda action: done_text(action, names),
            sparkline=sparkline,
            peak=peak,
            flash=self._flash(),
            display_names=names,
            sparks={k: json.dumps(v) for k, v in sparks.items()},
            last_hour=last_hour,
            history=history,
            history_json=json.dumps(history),
            decided=decided,
            jobs=jobs,
            job_of={j.lease_id: j for j in jobs if j.lease_id},
            cancellable=CANCELLABLE,
            api_url=f"{self.request.protocol}://{self.request.host}{self.prefix}api/v1/users/me",
        )

    def _flash(self) -> str | None:
        """The line about the last "Keep my GPU" (after its redirect back here)."""
        if self.get_argument("kept", None):
            return "Kept: your GPU stays yours for now; the notice is gone."
        refused = self.get_argument("refused", None)
        if refused:
            return f"Your GPU could not be kept: {describe(refused).meaning}"
        return None


class KeepHandler(UserPageHandler):
    """``POST /services/gpupool/keep/{lease}``: the page's "Keep my GPU" button (the form's
    ``_xsrf`` is checked by the hub's cookie auth); then back to the page."""

    SUPPORTED_METHODS = ("POST",)

    @web.authenticated
    async def post(self, lease_id: str) -> None:
        name = self.current_user["name"]
        try:
            holder = self.store.lease_holder(lease_id)
        except StoreError:
            holder = None
        # another user's lease (or another hub's user's) is as missing as one that does not exist
        if holder != (name, None):
            raise web.HTTPError(404, "no such lease")
        try:
            await self.settings["writer"].run(commands.Keepalive(lease_id, actor=f"user:{name}"))
        except PoolError as e:
            self.redirect(f"{self.prefix}?refused={e.code}")
            return
        self.redirect(f"{self.prefix}?kept={lease_id}")
