"""The JSON API base handler: hub authentication, scope checks, body parsing, errors, pages.

Every error leaves as ``{"error": {"code", "message"[, "field", "allowed"]}}`` with the status
its code maps to (``errors.STATUS``), never as an HTML traceback page. Handlers stay thin: the
scope they need is declared on the method (``@needs``) → parse → the writer (changes) or the
store (reads) → write JSON.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta, timezone
from http.client import responses
from types import TracebackType
from typing import Any, overload

from jupyterhub.services.auth import HubOAuthenticated
from sqlalchemy.exc import InterfaceError, OperationalError
from tornado import web
from tornado.log import app_log

from ...logredact import redact
from ...pool.errors import PoolError
from ...store import Store
from ...timeparse import parse_time
from ..scopes import Identity
from ..writer import Writer
from .errors import GENERIC, status_of
from .errors import APIError as APIError  # the handlers import it from here

#: What each ``@needs`` ability asks of the caller's identity.
ABILITIES: dict[str, Callable[[Identity], bool]] = {
    "use": lambda i: i.may_use,
    "spawn": lambda i: i.is_spawner,
    "admin": lambda i: i.is_admin,
    "agent": lambda i: i.is_agent,
    "reclaim": lambda i: i.is_reclaimer,
    "use-or-agent": lambda i: i.may_use or i.is_agent,
    "spawn-or-agent": lambda i: i.is_spawner or i.is_agent,
    "use-or-reclaim": lambda i: i.may_use or i.is_reclaimer,
    "identified": lambda i: True,
}


def needs(ability: str, what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare what a handler method's caller must hold (like JupyterHub's ``@needs_scope``):
    one of ``ABILITIES``; otherwise 403 "<caller> may not <what>" (``what`` may name the
    method's path arguments, e.g. ``"{action} nodes"``). Checks that depend on the request
    (whose lease, which user) stay in the method, after it."""
    check = ABILITIES[ability]

    def decorator(method: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(method)

        @functools.wraps(method)
        def checked(self: APIHandler, *args: Any, **kwargs: Any) -> Any:
            if self.identity is None:
                raise APIError("unauthorized", "a JupyterHub token is required")
            if not check(self.identity):
                text = what
                if "{" in what:
                    text = what.format(**signature.bind(self, *args, **kwargs).arguments)
                raise APIError("forbidden", f"{self.identity.describe()} may not {text}")
            return method(self, *args, **kwargs)

        checked.needs = (ability, what)  # type: ignore[attr-defined]  # a mark on the function, read back by name
        return checked

    return decorator


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not JSON")  # Infinity, -Infinity and NaN are not numbers here


#: Integers must fit the database's 32-bit columns; strings its 255-character names.
MAX_INT = 2**31 - 1
MIN_INT = -(2**31)
MAX_STR = 255
#: The earliest and latest times a query argument stands for (``time_arg`` clamps to them).
EARLIEST = datetime.min + timedelta(days=366)
LATEST = datetime.max - timedelta(days=366)
#: The latest epoch seconds a time may be (9999-12-31T23:59:59Z, the spec's ``Time`` maximum).
MAX_EPOCH = 253402300799
#: Epoch seconds as a query argument: a decimal number (a fraction, an exponent allowed).
_EPOCH = re.compile(r"[0-9]{1,20}(\.[0-9]{1,20})?([eE][-+]?[0-9]{1,3})?")
#: The largest request body (an agent's batch of 10,000 samples is about 1.2 MiB).
MAX_BODY = 4 * 1024 * 1024
#: How deep a request body may nest (the deepest real one, an inventory, nests 5).
MAX_DEPTH = 32


def _too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether a parsed JSON value nests deeper than ``limit`` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _nul_at(value: Any) -> str | None:
    """The path (``gpus[0].uuid``) of the first string or key holding NUL, or None."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return path or "<body>"
        elif isinstance(item, dict):
            for key, child in item.items():
                at = f"{path}.{key}" if path else key
                if "\x00" in key:
                    return at.replace("\x00", "\\0")
                stack.append((child, at))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


def time_field(raw: str | int, name: str, code: str = "invalid_field") -> datetime:
    """An ISO 8601 time or epoch seconds (a query argument or a body field) as naive UTC,
    clamped within ``EARLIEST`` and ``LATEST``; ``code`` names the field when it is neither."""
    try:
        if isinstance(raw, int) or _EPOCH.fullmatch(raw):
            seconds = float(raw)  # a fraction allowed (the lab extension's last sample time)
            if not 0 <= seconds <= MAX_EPOCH:
                raise ValueError(name)
            dt = datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None)
        else:  # an offset past year 1 or 9999 reads as the end it passes
            moment = parse_time(raw)
            if moment is None:
                raise ValueError(name)
            dt = moment.replace(tzinfo=None)
    except (ValueError, OverflowError, OSError):
        raise APIError(
            code, f"{name} must be an ISO 8601 time or epoch seconds (0 to {MAX_EPOCH})", field=name
        ) from None
    return min(max(dt, EARLIEST), LATEST)


class APIHandler(HubOAuthenticated, web.RequestHandler):  # type: ignore[misc]  # jupyterhub ships no type information: its classes are Any here
    """Base of every ``/api/v1`` handler."""

    #: The caller (set by ``prepare`` before any method runs).
    identity: Identity = None  # type: ignore[assignment]  # prepare sets it first

    @property
    def store(self) -> Store:
        """The pool's store (one per service): reads."""
        store: Store = self.settings["store"]
        return store

    @property
    def writer(self) -> Writer:
        """The one write path: every change is a command (``pool/commands.py``) that
        ``writer.run(command)`` applies."""
        writer: Writer = self.settings["writer"]
        return writer

    @property
    def hub_auth(self) -> Any:
        """The service's ``HubOAuth`` instance."""
        return self.settings["hub_auth"]

    @property
    def hub_scopes(self) -> None:
        """Any identified hub user or service passes; handlers check the pool scopes."""
        return None

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    def check_xsrf_cookie(self) -> None:
        """The XSRF check is skipped only for a request that a token actually authenticated
        (``HubAuth`` sets ``_token_authenticated`` after the hub accepted the header's token),
        as JupyterHub's own handlers do. An ``Authorization`` header alone is not enough: a
        browser behind a Basic-auth (or Negotiate) proxy attaches one by itself, to
        cross-site forms too, so a cookie call with any other header still needs the token."""
        if getattr(self, "_token_authenticated", False):
            return
        super().check_xsrf_cookie()

    async def prepare(self) -> None:
        self._started = time.perf_counter()
        model = await self.hub_auth.get_user(self, sync=False)
        if model is None:
            raise APIError("unauthorized", "a JupyterHub token is required")
        self.identity = Identity.from_hub_model(model)
        # PostgreSQL cannot store NUL in text, SQLite would: refuse it alike, up front; and no
        # path segment names anything longer than the database's names (the spec's maxLength)
        for name, arg in zip(self._path_names(), self.path_args, strict=False):
            if "\x00" in arg:
                raise APIError("invalid_argument", f"{name} contains NUL", field=name)
            if len(arg) > MAX_STR:
                raise APIError(
                    "invalid_argument", f"{name} is longer than {MAX_STR} characters", field=name
                )
        for name, values in self.request.query_arguments.items():
            if "\x00" in name or any(b"\x00" in value for value in values):
                raise APIError("invalid_argument", f"{name} contains NUL", field=name)

    def _path_names(self) -> list[str]:
        """The names of the handler method's path arguments (``name``, ``kind``, ``id``…), for
        refusals that name the one at fault."""
        method = getattr(self, self.request.method.lower(), None)
        try:
            params = list(inspect.signature(method).parameters)  # type: ignore[arg-type]  # None: TypeError, below
        except (TypeError, ValueError):
            params = []
        names = [p for p in params if p != "self"]
        return names + ["path"] * (len(self.path_args) - len(names))

    def on_finish(self) -> None:
        metrics = self.settings.get("metrics")
        if metrics is not None and hasattr(self, "_started"):
            route = getattr(self, "route_name", type(self).__name__)
            metrics.observe_request(
                self.request.method, route, self.get_status(), time.perf_counter() - self._started
            )

    # -- permissions -----------------------------------------------------------------------

    @property
    def asking_hub(self) -> str | None:
        """The hub the caller acts for: None for the pool's own hub (its users, admins and
        spawner, ``PoolService.hub_spawners``), else the name of the other hub's spawner
        service. Leases keep it; a spawner sees and acts on its own hub's leases only."""
        ident = self.identity
        if (
            ident.kind == "service"
            and ident.is_spawner
            and not ident.is_admin
            and ident.name not in self.settings["hub_spawners"]
        ):
            return ident.name
        return None

    @property
    def lease_hub_filter(self) -> dict[str, Any]:
        """The ``hub`` argument of a lease listing for this caller: admins list every hub's
        leases, everyone else those of the hub they act for."""
        return {} if self.identity.is_admin else {"hub": self.asking_hub}

    def may_see_lease(self, lease_id: str) -> bool:
        """Whether the caller may see (and, holding the scope, act on) the lease: admins any;
        a spawner any user's of its own hub; a user their own (the pool's hub's). A lease
        that does not exist is the store's 404."""
        ident = self.identity
        if ident.is_admin:
            return True
        user, hub = self.store.lease_holder(lease_id)
        return hub == self.asking_hub and ident.may_use_for(user)

    def require(self, allowed: bool, what: str) -> None:
        """403 unless ``allowed``: for checks that depend on the request (whose lease, which
        user); what every call of a method needs is declared with ``@needs``."""
        if not allowed:
            raise APIError("forbidden", f"{self.identity.describe()} may not {what}")

    def require_owner(self, owner: str, missing: Exception) -> None:
        """Raise ``missing`` (the thing's 404) unless the caller is an admin or may act for
        ``owner``: a job or kernel of someone else is answered as one that does not exist."""
        if self.identity.is_admin:
            return
        if not self.identity.may_use_for(owner):
            raise missing

    # -- input -------------------------------------------------------------------------------

    def json_body(
        self,
        fields: Mapping[str, tuple[type | tuple[type, ...], bool]],
        *,
        long: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """Parse the body as a JSON object with exactly ``fields`` ({name: (types, required)});
        strings are at most ``MAX_STR`` characters, but those named in ``long`` (a job's log).

        At most ``MAX_BODY`` bytes (413 ``body_too_large``) nested at most ``MAX_DEPTH`` deep
        (400 ``too_deep``): JSON nested a thousand levels would otherwise exhaust the parser's
        recursion.
        """
        raw = self.request.body or b"{}"
        if len(raw) > MAX_BODY:
            raise APIError("body_too_large", f"the request body is over {MAX_BODY // 1024} KiB")
        try:
            body = json.loads(raw, parse_constant=_no_constants)
        except RecursionError:
            body = None  # deeper than the parser goes: certainly deeper than MAX_DEPTH
        except (ValueError, UnicodeDecodeError):
            raise APIError("invalid_json", "the request body is not valid JSON") from None
        if body is None or _too_deep(body):
            raise APIError("too_deep", f"the request body nests deeper than {MAX_DEPTH} levels")
        if not isinstance(body, dict):
            raise APIError("invalid_json", "the request body must be a JSON object")
        where = _nul_at(body)
        if where is not None:
            raise APIError("invalid_field", f"{where} contains NUL", field=where)
        unknown = sorted(set(body) - set(fields))
        if unknown:
            raise APIError(
                "unknown_field",
                f"unknown field(s): {', '.join(unknown)}",
                field=unknown[0],
                allowed=sorted(fields),
            )
        for name, (types, required) in fields.items():
            if name not in body:
                if required:
                    raise APIError("missing_field", f"{name} is required", field=name)
                continue
            value = body[name]
            expected = types if isinstance(types, tuple) else (types,)
            if value is None and type(None) in expected:
                continue
            if isinstance(value, bool) and bool not in expected:
                ok = False
            else:
                ok = isinstance(value, tuple(t for t in expected if t is not type(None)))
            if not ok:
                names = " or ".join("null" if t is type(None) else t.__name__ for t in expected)
                raise APIError("invalid_field", f"{name} must be {names}", field=name)
            if (
                isinstance(value, int)
                and not isinstance(value, bool)
                and not MIN_INT <= value <= MAX_INT
            ):
                raise APIError("invalid_field", f"{name} is out of range", field=name)
            if isinstance(value, str) and len(value) > MAX_STR and name not in long:
                raise APIError(
                    "invalid_field", f"{name} is longer than {MAX_STR} characters", field=name
                )
        return body

    def int_arg(self, name: str, default: int, *, low: int = 0, high: int = 10**9) -> int:
        """An integer query argument within [low, high]."""
        raw = self.get_argument(name, None)
        if raw is None:
            return default
        # ASCII digits only, and few enough of them (int() takes "1_0", "١", 4,300 digits)
        digits = raw.strip()
        if len(digits) > 20 or not digits.isascii() or not digits.lstrip("-").isdigit():
            raise APIError("invalid_argument", f"{name} must be an integer", field=name)
        value = int(digits)
        if not low <= value <= high:
            raise APIError(
                "invalid_argument", f"{name} must be between {low} and {high}", field=name
            )
        return value

    @overload
    def time_arg(self, name: str, default: datetime) -> datetime: ...

    @overload
    def time_arg(self, name: str, default: None = None) -> datetime | None: ...

    def time_arg(self, name: str, default: datetime | None = None) -> datetime | None:
        """An ISO 8601 (or epoch seconds) query argument, as naive UTC.

        Times at the ends of what ``datetime`` holds (year 1 with a positive offset, year
        9999) are clamped to a year inside them, so later arithmetic (a default range, minute
        buckets) cannot overflow: such a bound means "as far back (or ahead) as there is".
        """
        raw = self.get_argument(name, None)
        if raw is None:
            return default
        return time_field(raw, name, "invalid_argument")

    def page_args(self) -> tuple[int, int]:
        """``offset`` and ``limit`` (1–1000, default 200)."""
        return self.int_arg("offset", 0), self.int_arg("limit", 200, low=1, high=1000)

    # -- output ------------------------------------------------------------------------------

    def write_json(self, data: Any, status: int = 200) -> None:
        """Write ``data`` as the JSON response."""
        self.set_status(status)
        self.finish(json.dumps(data))

    def write_page(self, items: list[Any], total: int, offset: int, limit: int) -> None:
        """A page of a list: items plus where the next page starts (null at the end)."""
        nxt = offset + limit if offset + limit < total else None
        self.write_json(
            {"items": items, "total": total, "offset": offset, "limit": limit, "next_offset": nxt}
        )

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        body: dict[str, Any]
        if isinstance(exc, PoolError):
            body = exc.to_dict()["error"]
        elif isinstance(exc, web.HTTPError):
            body = {
                "code": GENERIC.get(status_code, "error"),
                "message": exc.log_message or responses.get(status_code, "error"),
            }
        else:
            body = {
                "code": GENERIC.get(status_code, "error"),
                "message": responses.get(status_code, "error"),
            }
        self.set_header("Content-Type", "application/json; charset=utf-8")
        if status_code == 405:  # RFC 9110: a 405 says which methods the resource serves
            self.set_header("Allow", ", ".join(sorted(self.allowed_methods())))
        self.finish(json.dumps({"error": body}, default=str))

    @classmethod
    def allowed_methods(cls) -> set[str]:
        """The HTTP methods this handler implements (tornado answers 405 to the others)."""
        return {
            method
            for method in cls.SUPPORTED_METHODS
            if getattr(cls, method.lower(), None) is not getattr(web.RequestHandler, method.lower())
        }

    def _handle_request_exception(self, e: BaseException) -> None:
        """Refusals answer with their code's status (never a 500)."""
        # the database away (down, restarting): 503; bad data is a bug, answered 500 and logged
        if isinstance(e, (OperationalError, InterfaceError)) and not self._finished:
            self.set_status(503)
            app_log.error(
                "Database error on %s %s: %s", self.request.method, redact(self.request.uri), e
            )
            self.send_error(
                503,
                exc_info=(
                    None,
                    APIError("store_unavailable", "the pool database is unavailable; try again"),
                    None,
                ),
            )
            return
        if isinstance(e, PoolError) and not self._finished:
            status = status_of(e)
            self.set_status(status)
            self.log_exception(*sys.exc_info())
            self.send_error(status, exc_info=sys.exc_info())
            return
        super()._handle_request_exception(e)

    def log_exception(
        self,
        typ: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Expected API errors are one warning line, not a traceback."""
        if isinstance(value, PoolError):
            message = getattr(value, "message", str(value))
            app_log.warning(
                "%d %s %s: %s",
                self.get_status(),
                self.request.method,
                redact(self.request.uri or ""),
                message,
            )
        else:
            super().log_exception(typ, value, tb)
