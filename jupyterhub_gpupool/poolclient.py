"""Async client of the pool service's REST API v1, shared by the spawners and other services.

It speaks HTTP only (through tornado's ``AsyncHTTPClient``, which the hub already runs on) and
turns answers into plain dicts or into one small exception tree, so callers can tell a refusal
they should show to the user (:class:`PoolRefused`) from a pool that is not there right now
(:class:`PoolUnavailable`)::

    PoolClientError
    ├── PoolUnavailable   connection refused, timeout, 502/503/504: try again later
    └── PoolRefused       any other 4xx/5xx, with the service's ``code``, ``message``, ``field``
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .logredact import redact


class PoolClientError(Exception):
    """Any failure talking to the pool service."""

    def __init__(self, message: str, *, status: int = 0, code: str = "", field: str | None = None):
        message = redact(message)  # it reaches logs and the spawn page: never with a token
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.field = field


class PoolUnavailable(PoolClientError):
    """The service could not be reached or said it is temporarily unavailable."""


class PoolRefused(PoolClientError):
    """The service answered with an error (quota, unknown offer, not allowed, ...)."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str,
        field: str | None = None,
        allowed: list | None = None,
    ):
        super().__init__(message, status=status, code=code, field=field)
        self.allowed = allowed


class PoolClient:
    """Calls ``{api_url}/…`` with a hub API token (``Authorization: token …``)."""

    def __init__(self, api_url: str, token: str, *, timeout: float = 10.0) -> None:
        self.api_url = api_url.rstrip("/") + "/"
        self.token = token
        self.timeout = timeout

    async def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    ) -> Any:
        """One call; returns the decoded JSON (or text for non-JSON answers)."""
        url = self.api_url + path
        if params:
            items = params.items() if isinstance(params, Mapping) else params
            url += "?" + urlencode([(k, v) for k, v in items if v is not None])
        req = HTTPRequest(
            url,
            method=method,
            headers={
                "Authorization": f"token {self.token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=body is None and method in ("POST", "PUT"),
            connect_timeout=self.timeout,
            request_timeout=self.timeout,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req, raise_error=False)
        except (OSError, HTTPClientError) as e:  # refused, reset, DNS, timeout (599)
            raise PoolUnavailable(f"GPU pool service unreachable at {self.api_url}: {e}") from e
        if resp.code == 599:
            raise PoolUnavailable(
                f"GPU pool service unreachable at {self.api_url}: {resp.error}"
            ) from resp.error
        text = resp.body.decode("utf-8", "replace") if resp.body else ""
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = text
        if resp.code < 400:
            return data
        err = data.get("error") if isinstance(data, dict) else None
        if not isinstance(err, dict):
            err = {"code": "http_error", "message": f"HTTP {resp.code}: {text[:200]}"}
        message = str(err.get("message") or f"HTTP {resp.code}")
        if resp.code in (502, 503, 504):
            raise PoolUnavailable(message, status=resp.code, code=str(err.get("code", "")))
        raise PoolRefused(
            message,
            status=resp.code,
            code=str(err.get("code", "")),
            field=err.get("field"),
            allowed=err.get("allowed"),
        )

    # -- the calls the spawners make -------------------------------------------------------

    async def offers(
        self, user: str | None = None, groups: Iterable[str] = (), clusters: Iterable[str] = ()
    ) -> list[dict]:
        """Offers ``user`` may use, with availability, queue length, units and quota fit (for
        a hub launching into ``clusters``: only the offers it can serve, counted there)."""
        params: list[tuple[str, Any]] = [("user", user)] + [("group", g) for g in groups]
        params += [("cluster", c) for c in clusters]
        return (await self.request("GET", "offers", params=params))["items"]

    async def allocate(
        self,
        user: str,
        server: str,
        offer: str,
        *,
        groups: Iterable[str] | None = None,
        group: str | None = None,
        clusters: Iterable[str] = (),
        reason: str = "",
        duration: float | None = None,
    ) -> dict:
        """Ask for ``offer`` for ``user``'s ``server``: a lease, granted or queued (only in
        ``clusters``, when given), or awaiting approval (``reason``, ``duration``: an ask an
        administrator decides on)."""
        body: dict[str, Any] = {"user": user, "server": server, "offer": offer}
        if reason:
            body["reason"] = reason
        if duration is not None:
            body["duration"] = duration
        if groups is not None:
            body["groups"] = list(groups)
        clusters = list(clusters)
        if clusters:
            body["clusters"] = clusters
        if group is not None:
            body["group"] = group
        return await self.request("POST", "allocations", body)

    async def lease(self, lease_id: str) -> dict:
        """One lease."""
        return await self.request("GET", f"allocations/{quote(lease_id, safe='')}")

    async def leases(
        self, user: str | None = None, state: str | None = None, limit: int = 200
    ) -> list[dict]:
        """Leases, newest first (one page is plenty for one user's servers)."""
        params = {"user": user, "state": state, "limit": limit}
        return (await self.request("GET", "allocations", params=params))["items"]

    async def release(self, lease_id: str, reason: str = "stopped") -> dict:
        """Give a lease back (or leave the queue with ``reason="cancelled"``)."""
        return await self.request(
            "DELETE", f"allocations/{quote(lease_id, safe='')}", params={"reason": reason}
        )

    async def keepalive(self, lease_id: str) -> dict:
        """The server runs on its lease: binds a grant (granted → active)."""
        return await self.request("POST", f"allocations/{quote(lease_id, safe='')}/keepalive", {})

    async def set_server_url(self, lease_id: str, url: str) -> dict:
        """Where the lease's server listens (the spawner): the reclaimer reads it there."""
        path = f"allocations/{quote(lease_id, safe='')}/server"
        return await self.request("PUT", path, {"url": url})

    async def report_presence(self, lease_id: str, idle_for: float | None) -> dict:
        """The user's last input was ``idle_for`` seconds ago (the lab's report)."""
        path = f"allocations/{quote(lease_id, safe='')}/presence"
        return await self.request("POST", path, {"idle_for": idle_for})

    async def rebind(self, lease_id: str, device: str) -> dict:
        """The lease's server got ``device`` (a GPU uuid, a MIG device uuid or a replica id),
        not necessarily what the pool chose: the lease moves there (``POST
        allocations/{id}/device``). Returns the lease."""
        path = f"allocations/{quote(lease_id, safe='')}/device"
        return await self.request("POST", path, {"device": device})

    async def user(self, name: str) -> dict:
        """A user's quota, use, leases and notices."""
        return await self.request("GET", f"users/{quote(name, safe='')}")

    # -- the calls the reclaimer makes -------------------------------------------------------

    async def take_reclaim_lead(self, holder: str, ttl: float = 60.0) -> dict:
        """Take or renew the reclaimer's leader lock; another holder's raises ``PoolRefused``
        with code ``not_leader``."""
        return await self.request("POST", "reclaim/leader", {"holder": holder, "ttl": ttl})

    async def give_up_reclaim_lead(self, holder: str) -> dict:
        """Give the leader lock up (a replica that stops lets the next one lead at once)."""
        return await self.request("DELETE", "reclaim/leader", params={"holder": holder})

    async def reclaim_leases(self, page_size: int = 200) -> list[dict]:
        """Every lease the reclaimer watches (``active`` or ``reclaiming``), all pages."""
        items: list[dict] = []
        offset = 0
        while True:
            page = await self.request(
                "GET", "reclaim/leases", params={"offset": offset, "limit": page_size}
            )
            items += page["items"]
            offset += len(page["items"])
            if not page["items"] or offset >= page["total"]:
                return items

    async def reclaim_round(
        self, holder: str, window: tuple[float, float], observed: Mapping[str, Any]
    ) -> dict:
        """Post one window's observations; the pool answers its decisions."""
        body = {
            "holder": holder,
            "window": {"start": window[0], "end": window[1]},
            "observed": dict(observed),
        }
        return await self.request("POST", "reclaim/rounds", body)

    async def reclaim_outcome(
        self, lease_id: str, holder: str, result: str, saved: Iterable[str] = (), detail: str = ""
    ) -> dict:
        """Report a claimed action done or failed (``saved``: the files saved first)."""
        return await self.request(
            "POST",
            f"reclaim/leases/{quote(lease_id, safe='')}/outcome",
            {"holder": holder, "result": result, "saved": list(saved), "detail": detail},
        )
