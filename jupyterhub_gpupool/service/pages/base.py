"""What every HTML page of the pool service shares: hub OAuth, the headers, the templates.

Like JupyterHub's own pages: a browser without a login goes through the hub's OAuth; forms and
the pages' script carry the hub's XSRF token (``_xsrf`` field or ``X-XSRFToken`` header,
checked by ``HubOAuth`` before it accepts the cookie); Jinja autoescapes every value; the
Content-Security-Policy allows scripts and styles from the service's own ``static/`` only (no
inline script, no inline style sheet, nothing from another origin). Every URL is built from the
service prefix, so the pages work under any hub base URL.
"""

from __future__ import annotations

import os
import re
from datetime import datetime
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.services.auth import HubOAuthenticated, UserNotAllowed
from jupyterhub.utils import url_path_join
from markupsafe import Markup
from tornado import web

from ...store import Store
from ...timeparse import parse_time
from ...wording import ordinal, units_text
from ..scopes import Identity

HERE = os.path.dirname(os.path.dirname(__file__))
TEMPLATES = os.path.join(HERE, "templates")
STATIC = os.path.join(HERE, "static")

#: The project's documentation (the tutorial, the REST reference), from the project page.
DOCS_URL = "https://github.com/jupyterhub-gpupool/jupyterhub-gpupool/tree/main/docs/source"

#: No inline script or style sheet, nothing from elsewhere; ``connect-src 'self'`` for the
#: script's API calls; charts draw on canvas (``img-src data:`` for their exports).
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'self'"
)


def when(iso: str | datetime | None) -> str:
    """A time (ISO text, or a read model's naive UTC ``datetime``) as people read it:
    2026-03-02 09:15 UTC."""
    if not iso:
        return ""
    try:
        moment = parse_time(iso)
    except ValueError:
        return str(iso)
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else ""


def duration(seconds: float | None) -> str:
    """Seconds as people read them: 45 s, 12 min, 3 h 05 min, 2 d 4 h."""
    if seconds is None:
        return ""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


#: The admin page an alert links to (its ``page``), as the banner names it.
ALERT_PAGES = {
    "": "the pool map",
    "nodes": "Nodes",
    "leases": "Queue and leases",
    "quotas": "Quotas",
    "usage": "Usage and cost",
}


#: Bidirectional controls: the embeddings and overrides (U+202A–U+202E) and the isolates
#: (U+2066–U+2069). In a name or a reason they would reverse what a page shows.
BIDI_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069]")


def shown(value: Any) -> Any:
    """The one display rule for text from users, agents and admins: every bidirectional
    control is shown as a visible ``[U+202E]`` instead of being obeyed (the pages' script,
    ``gpupool.js``'s ``visible``, and the lab panel, ``visible`` in ``labextension/src``, apply
    the same). Jinja applies it to every ``{{ … }}`` (``finalize``); an identifier a script
    sends back to the API is rendered with ``|ident`` instead (escaped, exact)."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return BIDI_CONTROLS.sub(lambda m: f"[U+{ord(m.group()):04X}]", value)
    return value


def ident(value: Any) -> Markup:
    """An identifier for an attribute a script reads back (``data-node``, a filter's value):
    escaped, exact, so the API call names the very object; never shown as text."""
    return Markup.escape("" if value is None else str(value))


jinja = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=select_autoescape(default=True, default_for_string=True),
    finalize=shown,
)
jinja.filters["ident"] = ident
jinja.filters["units"] = units_text
jinja.filters["when"] = when
jinja.filters["ordinal"] = ordinal
jinja.filters["duration"] = duration


class PageHandler(HubOAuthenticated, web.RequestHandler):  # type: ignore[misc]  # jupyterhub ships no type information: its classes are Any here
    """Base of the pool service's HTML pages."""

    #: Only for ``custom:gpupool:admin`` (every admin page).
    admin_only = False

    @property
    def hub_auth(self) -> Any:
        """The service's ``HubOAuth`` (``HubOAuth.instance()``, the one the stock
        ``oauth_callback`` handler completes logins with)."""
        return self.settings["hub_auth"]

    @property
    def store(self) -> Store:
        """The pool's store: pages only read; changes go through the API (or the writer)."""
        store: Store = self.settings["store"]
        return store

    @property
    def prefix(self) -> str:
        """The service prefix (``/services/gpupool/``, under the hub's base URL)."""
        prefix: str = self.settings["pages_prefix"]
        return prefix

    async def prepare(self) -> None:
        """Identify the caller without blocking the event loop (``get_user(sync=False)``);
        ``@web.authenticated`` then sends strangers through the hub's OAuth login."""
        model = await self.hub_auth.get_user(self, sync=False)
        try:
            self._hub_auth_user_cache = self.check_hub_user(model) if model else None
        except UserNotAllowed:
            raise web.HTTPError(403, "not allowed to use the GPU pool's pages") from None
        self.identity = identity = Identity.from_hub_model(model) if model else None
        if self.admin_only and model is not None and (identity is None or not identity.is_admin):
            raise web.HTTPError(403, "the GPU pool's admin pages need custom:gpupool:admin")

    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "same-origin")
        self.set_header("Content-Security-Policy", CSP)

    def int_arg(self, name: str, default: int, *, low: int, high: int) -> int:
        """An integer query argument within [low, high]; anything else is a 400 page saying
        so (like the API's ``int_arg``: never a 500 for a number the database cannot take)."""
        raw = self.get_argument(name, None)
        if raw is None or raw.strip() == "":
            return default
        raw = raw.strip()
        if len(raw) > 12 or not raw.isascii() or not raw.lstrip("-").isdigit():
            raise web.HTTPError(400, f"{name} must be a whole number from {low} to {high}")
        value = int(raw)
        if not low <= value <= high:
            raise web.HTTPError(400, f"{name} must be a whole number from {low} to {high}")
        return value

    def render_page(self, template: str, **context: Any) -> None:
        """Render ``template`` with what every page needs (links, the XSRF token, the user)."""
        hub = self.hub_auth.hub_prefix
        model = self.current_user or {}
        is_admin = bool(self.identity and self.identity.is_admin)
        monitor = self.settings.get("alerts")  # the service's own alerts: a banner for admins
        html = jinja.get_template(template).render(
            prefix=self.prefix,
            static=lambda path: url_path_join(self.prefix, "static", path),
            api=url_path_join(self.prefix, "api/v1/"),
            xsrf_token=self.xsrf_token.decode("ascii"),  # bytes: as text, not "b'...'"
            user=model.get("name", ""),
            is_admin=is_admin,
            alerts=monitor.active() if is_admin and monitor is not None else [],
            alert_pages=ALERT_PAGES,
            hub_home=url_path_join(hub, "home"),
            hub_token=url_path_join(hub, "token"),
            hub_admin=url_path_join(hub, "admin"),
            docs_url=DOCS_URL,
            rest_docs_url=f"{DOCS_URL}/reference/rest-api.md",
            view=template.rsplit(".", 1)[0],
            **context,
        )
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(html)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """An error as a small page (its message escaped), never a traceback."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(
            jinja.get_template("error.html").render(
                status=status_code,
                message=message,
                static=lambda path: url_path_join(self.prefix, "static", path),
                prefix=self.prefix,
            )
        )


class StaticHandler(web.StaticFileHandler):
    """The pages' script, styles and the vendored chart library (public, like the hub's own
    ``/hub/static``), with the same headers as the pages."""

    def set_default_headers(self) -> None:
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Content-Security-Policy", CSP)
