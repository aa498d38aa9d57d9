"""The JSON API base handler: hub authentication, scope checks, body parsing, errors, pages.

Every error leaves as ``{"error": {"code", "message"[, "field", "allowed"]}}`` with a 4xx/5xx
status, never as an HTML traceback page. Handlers stay thin: check scope → parse → call the
store → write JSON.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from http.client import responses
from typing import Any

from jupyterhub.services.auth import HubOAuthenticated
from sqlalchemy.exc import DBAPIError
from tornado import web
from tornado.log import app_log

from ...pool.errors import PoolError
from ...store import Store, StoreError
from ..scopes import Identity

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    422: "unprocessable",
    500: "internal_error",
    503: "unavailable",
}


class APIError(web.HTTPError):
    """An HTTP error with a machine-readable code and, optionally, the field at fault."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        allowed: list[Any] | None = None,
    ) -> None:
        super().__init__(status, log_message=message)
        self.code, self.message, self.field, self.allowed = code, message, field, allowed


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not JSON")  # Infinity, -Infinity and NaN are not numbers here


#: Integers must fit the database's 32-bit columns; strings its 255-character names.
MAX_INT = 2**31 - 1
MAX_STR = 255


def lease_not_found(lease_id: str, field: str = "id") -> StoreError:
    """The 404 for a lease that does not exist, and for one the caller may not see: identical,
    so that the answer does not reveal another user's lease exists."""
    return StoreError(404, "not_found", f"no lease {lease_id!r}", field=field)


class APIHandler(HubOAuthenticated, web.RequestHandler):
    """Base of every ``/api/v1`` handler."""

    identity: Identity | None = None

    @property
    def store(self) -> Store:
        """The pool's store (one per service)."""
        return self.settings["store"]

    @property
    def writer(self):
        """Group commit for the hot write paths (allocate, release, keepalive)."""
        return self.settings["writer"]

    @property
    def hub_auth(self):
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
        """Token-authenticated API calls need no XSRF token; cookie calls do."""
        if self.request.headers.get("Authorization"):
            return
        super().check_xsrf_cookie()

    async def prepare(self) -> None:
        self._started = time.perf_counter()
        model = await self.hub_auth.get_user(self, sync=False)
        if model is None:
            raise APIError(401, "unauthorized", "a JupyterHub token is required")
        self.identity = Identity.from_hub_model(model)

    def on_finish(self) -> None:
        metrics = self.settings.get("metrics")
        if metrics is not None and hasattr(self, "_started"):
            route = getattr(self, "route_name", type(self).__name__)
            metrics.observe_request(
                self.request.method, route, self.get_status(), time.perf_counter() - self._started
            )

    # -- permissions -----------------------------------------------------------------------

    def require(self, allowed: bool, what: str) -> None:
        """403 unless ``allowed``."""
        if not allowed:
            assert self.identity is not None
            raise APIError(403, "forbidden", f"{self.identity.describe()} may not {what}")

    def require_admin(self, what: str) -> None:
        """403 unless the caller holds ``custom:gpupool:admin``."""
        self.require(self.identity is not None and self.identity.is_admin, what)

    # -- input -------------------------------------------------------------------------------

    def json_body(self, fields: Mapping[str, tuple[type | tuple[type, ...], bool]]) -> dict:
        """Parse the body as a JSON object with exactly ``fields`` ({name: (types, required)})."""
        try:
            body = json.loads(self.request.body or b"{}", parse_constant=_no_constants)
        except (ValueError, UnicodeDecodeError):
            raise APIError(400, "invalid_json", "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise APIError(400, "invalid_json", "the request body must be a JSON object")
        unknown = sorted(set(body) - set(fields))
        if unknown:
            raise APIError(
                422,
                "unknown_field",
                f"unknown field(s): {', '.join(unknown)}",
                field=unknown[0],
                allowed=sorted(fields),
            )
        for name, (types, required) in fields.items():
            if name not in body:
                if required:
                    raise APIError(422, "missing_field", f"{name} is required", field=name)
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
                raise APIError(422, "invalid_field", f"{name} must be {names}", field=name)
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
                raise APIError(422, "invalid_field", f"{name} is out of range", field=name)
            if isinstance(value, str) and len(value) > MAX_STR:
                raise APIError(
                    422, "invalid_field", f"{name} is longer than {MAX_STR} characters", field=name
                )
        return body

    def int_arg(self, name: str, default: int, *, low: int = 0, high: int = 10**9) -> int:
        """An integer query argument within [low, high]."""
        raw = self.get_argument(name, None)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise APIError(
                400, "invalid_argument", f"{name} must be an integer", field=name
            ) from None
        if not low <= value <= high:
            raise APIError(
                400, "invalid_argument", f"{name} must be between {low} and {high}", field=name
            )
        return value

    def time_arg(self, name: str, default: datetime | None = None) -> datetime | None:
        """An ISO 8601 (or epoch seconds) query argument, as naive UTC."""
        raw = self.get_argument(name, None)
        if raw is None:
            return default
        try:
            if raw.replace(".", "", 1).isdigit():
                return datetime.fromtimestamp(float(raw), timezone.utc).replace(tzinfo=None)
            dt = datetime.fromisoformat(raw.replace("Z", "+00:00"))
            if dt.tzinfo is not None:
                dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
            dt + timedelta(days=366)
            dt - timedelta(days=366)
        except (ValueError, OverflowError, OSError):
            raise APIError(
                400, "invalid_argument", f"{name} must be an ISO 8601 time", field=name
            ) from None
        return dt

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
        elif isinstance(exc, APIError):
            body = {"code": exc.code, "message": exc.message}
            if exc.field is not None:
                body["field"] = exc.field
            if exc.allowed is not None:
                body["allowed"] = exc.allowed
        elif isinstance(exc, web.HTTPError):
            body = {
                "code": _CODES.get(status_code, "error"),
                "message": exc.log_message or responses.get(status_code, "error"),
            }
        else:
            body = {
                "code": _CODES.get(status_code, "error"),
                "message": responses.get(status_code, "error"),
            }
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"error": body}, default=str))

    def _handle_request_exception(self, e: BaseException) -> None:
        """Store and domain errors answer with their own status (never a 500)."""
        if isinstance(e, DBAPIError) and not self._finished:
            self.set_status(503)
            app_log.error("Database error on %s %s: %s", self.request.method, self.request.uri, e)
            self.send_error(
                503,
                exc_info=(
                    None,
                    APIError(
                        503, "database_unavailable", "the pool database is unavailable; try again"
                    ),
                    None,
                ),
            )
            return
        if isinstance(e, PoolError) and not self._finished:
            status = e.status if isinstance(e, StoreError) else 422
            self.set_status(status)
            self.log_exception(*sys.exc_info())
            self.send_error(status, exc_info=sys.exc_info())
            return
        super()._handle_request_exception(e)

    def log_exception(self, typ, value, tb) -> None:  # noqa: ANN001
        """Expected API errors are one warning line, not a traceback."""
        if isinstance(value, (PoolError, APIError)):
            message = getattr(value, "message", str(value))
            app_log.warning(
                "%d %s %s: %s", self.get_status(), self.request.method, self.request.uri, message
            )
        else:
            super().log_exception(typ, value, tb)
