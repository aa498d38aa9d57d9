"""The pool service's HTML pages, behind hub OAuth: the user page at the service's prefix root.

The hub's **Services → gpupool** link opens ``/services/gpupool/``; without a page there it was
a bare 404. This one shows the logged-in user their own leases and quota, read from the store
like ``GET users/me``, with links to the docs, the token page and the API; a reclaim notice with
its deadline, reason and action and a "Keep my GPU" button (a form: the page runs no script),
and the reclaims of the last week (what, when, why, the files saved, the last hour's use).
Jinja autoescapes every value, so a server name or a pool message a user chose cannot inject
markup.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.services.auth import HubOAuthenticated, UserNotAllowed
from jupyterhub.utils import url_path_join
from tornado import web

from ..pool.codes import describe
from ..pool.errors import PoolError
from ..store import Store, StoreError
from ..wording import ordinal, units_text

#: The project's documentation (the tutorial, the REST reference), from the project page.
DOCS_URL = "https://github.com/jupyterhub-gpupool/jupyterhub-gpupool/tree/main/docs/source"

_jinja = Environment(
    loader=FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
    autoescape=select_autoescape(default=True, default_for_string=True),
)


def when(iso: str | None) -> str:
    """An ISO timestamp from the store as people read it: 2026-03-02 09:15 UTC."""
    if not iso:
        return ""
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


#: Eight levels of a text sparkline (the page draws no pictures and runs no script).
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


_jinja.filters["units"] = units_text
_jinja.filters["sparkline"] = sparkline
_jinja.filters["peak"] = peak
_jinja.filters["when"] = when
_jinja.filters["ordinal"] = ordinal


class UserPageHandler(HubOAuthenticated, web.RequestHandler):
    """``GET /services/gpupool/``: the logged-in user's leases and quota (HTML)."""

    @property
    def hub_auth(self) -> Any:
        """The service's ``HubOAuth`` (``HubOAuth.instance()``, the one the stock
        ``oauth_callback`` handler completes logins with: a login's state and its PKCE verifier
        live in the object that began it)."""
        return self.settings["hub_auth"]

    @property
    def store(self) -> Store:
        """The pool's store: this page only reads."""
        return self.settings["store"]

    async def prepare(self) -> None:
        """Identify the caller without blocking the event loop (``get_user(sync=False)``);
        ``@web.authenticated`` then sends strangers through the hub's OAuth login."""
        model = await self.hub_auth.get_user(self, sync=False)
        try:
            self._hub_auth_user_cache = self.check_hub_user(model) if model else None
        except UserNotAllowed:
            raise web.HTTPError(403, "not allowed to use the GPU pool's pages") from None

    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header(
            "Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
        )

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
        me = self.store.user(name, groups)
        offers = {o["name"]: o for o in self.store.offers_for(name, groups)}
        hub = self.hub_auth.hub_prefix
        names = {n: o.get("display_name") or n for n, o in offers.items()}
        leases = me.get("leases") or []
        html = _jinja.get_template("user.html").render(
            user=name,
            me=me,
            quota=me.get("quota") or {},
            leases=leases,
            notices=me.get("notices") or [],
            reclaims=me.get("reclaims") or [],
            notice_of={le["id"]: le["reclaim"] for le in leases if le.get("reclaim")},
            action_text=lambda action: action_text(action, names),
            done_text=lambda action: done_text(action, names),
            flash=self._flash(),
            xsrf_token=self.xsrf_token,
            display_names=names,
            api_url=f"{self.request.protocol}://{self.request.host}{self.request.path}api/v1/users/me",
            hub_home=url_path_join(hub, "home"),
            hub_token=url_path_join(hub, "token"),
            docs_url=DOCS_URL,
            rest_docs_url=f"{DOCS_URL}/reference/rest-api.md",
        )
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(html)

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
            owner = self.store.lease_owner(lease_id)
        except StoreError:
            owner = None
        if owner != name:  # another user's lease is as missing as one that does not exist
            raise web.HTTPError(404, "no such lease")
        page = self.request.path.rsplit("/keep/", 1)[0] + "/"
        try:
            await self.settings["writer"].call(self.store.keepalive, lease_id, actor=f"user:{name}")
        except PoolError as e:
            self.redirect(f"{page}?refused={e.code}")
            return
        self.redirect(f"{page}?kept={lease_id}")


def default_handlers(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    """The pages under the service ``prefix`` (``/services/gpupool/``), with or without its
    trailing slash: the hub's Services menu links to the prefix itself."""
    return [
        (prefix.rstrip("/") + "/?", UserPageHandler),
        (prefix.rstrip("/") + "/keep/([^/]+)", KeepHandler),
    ]
