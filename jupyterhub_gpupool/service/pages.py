"""The pool service's HTML pages, behind hub OAuth: the user page at the service's prefix root.

The hub's **Services → gpupool** link opens ``/services/gpupool/``; without a page there it was
a bare 404. This one shows the logged-in user their own leases and quota, read from the store
like ``GET users/me``, with links to the docs, the token page and the API. Jinja autoescapes
every value, so a server name or a pool message a user chose cannot inject markup.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.services.auth import HubOAuthenticated, UserNotAllowed
from jupyterhub.utils import url_path_join
from tornado import web

from ..store import Store
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


_jinja.filters["units"] = units_text
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
        self.set_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")

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
        html = _jinja.get_template("user.html").render(
            user=name,
            me=me,
            quota=me.get("quota") or {},
            leases=me.get("leases") or [],
            notices=me.get("notices") or [],
            display_names={n: o.get("display_name") or n for n, o in offers.items()},
            api_url=f"{self.request.protocol}://{self.request.host}{self.request.path}api/v1/users/me",
            hub_home=url_path_join(hub, "home"),
            hub_token=url_path_join(hub, "token"),
            docs_url=DOCS_URL,
            rest_docs_url=f"{DOCS_URL}/reference/rest-api.md",
        )
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(html)


def default_handlers(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    """The pages under the service ``prefix`` (``/services/gpupool/``), with or without its
    trailing slash: the hub's Services menu links to the prefix itself."""
    return [(prefix.rstrip("/") + "/?", UserPageHandler)]
