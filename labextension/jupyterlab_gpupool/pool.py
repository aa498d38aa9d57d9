"""The pool service's REST API as the user's server calls it, with the server's own token.

A small client of its own rather than ``jupyterhub_gpupool.poolclient``: this distribution
goes into every user image, which should not need the pool's database stack. It keeps that
client's split of failures: :class:`PoolDown` (no answer, 5xx, a timeout: show "the pool is not
answering" and try again later) and :class:`PoolRefused` (an answer with the pool's error code
and message, to show as it is).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest


class PoolError(Exception):
    """Any failure talking to the pool service."""

    def __init__(self, message: str, *, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class PoolDown(PoolError):
    """The service did not answer, or said it cannot right now (502/503/504, a timeout)."""


class PoolRefused(PoolError):
    """The service answered with an error body (its ``code`` and ``message``)."""


class LabPoolClient:
    """Calls ``{api_url}/…`` with ``Authorization: token <token>`` and counts its requests
    (``requests``: what the fan-out test and the benchmark read)."""

    def __init__(self, api_url: str, token: str, *, timeout: float = 10.0) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.requests = 0

    async def request(
        self, method: str, path: str, body: Any = None, **query: Any
    ) -> dict[str, Any]:
        """One call; the decoded JSON object (an empty dict for an empty body)."""
        url = f"{self.api_url}/{path}"
        query = {k: v for k, v in query.items() if v is not None}
        if query:
            url += "?" + urlencode(query)
        req = HTTPRequest(
            url,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=body is None and method in ("POST", "PUT", "PATCH"),
            connect_timeout=self.timeout,
            request_timeout=self.timeout,
            follow_redirects=False,
        )
        self.requests += 1
        try:
            response = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as e:
            raise _refusal(e) from None
        except OSError as e:
            raise PoolDown(f"the GPU pool could not be reached ({e.strerror or e})") from None
        text = response.body.decode("utf-8", "replace") if response.body else ""
        try:
            data = json.loads(text) if text else {}
        except ValueError:
            raise PoolDown("the GPU pool answered something that is not JSON") from None
        return data if isinstance(data, dict) else {"items": data}

    # -- the calls the lab makes ---------------------------------------------------------------

    async def me(self) -> dict[str, Any]:
        return await self.request("GET", "users/me")

    async def lease(self, lease_id: str) -> dict[str, Any]:
        return await self.request("GET", f"allocations/{quote(lease_id, safe='')}")

    async def offers(self) -> list[dict[str, Any]]:
        return list((await self.request("GET", "offers")).get("items") or [])

    async def utilization(self, lease_id: str, since: str | None) -> dict[str, Any]:
        return await self.request(
            "GET", "utilization", lease=lease_id, since=since, resolution="sample"
        )

    async def keepalive(self, lease_id: str) -> dict[str, Any]:
        return await self.request("POST", f"allocations/{quote(lease_id, safe='')}/keepalive", {})

    async def presence(self, lease_id: str, idle_for: float | None) -> dict[str, Any]:
        """The user's last input was ``idle_for`` seconds ago (None: this lab runs, no input
        yet)."""
        return await self.request(
            "POST", f"allocations/{quote(lease_id, safe='')}/presence", {"idle_for": idle_for}
        )

    async def resize(self, lease_id: str, offer: str) -> dict[str, Any]:
        return await self.request(
            "POST", f"allocations/{quote(lease_id, safe='')}/resize", {"offer": offer}
        )

    async def allocate(self, server: str, offer: str) -> dict[str, Any]:
        return await self.request("POST", "allocations", {"server": server, "offer": offer})

    async def restart(self, lease_id: str) -> dict[str, Any]:
        return await self.request("POST", f"allocations/{quote(lease_id, safe='')}/restart", {})

    async def cancel(self, lease_id: str) -> dict[str, Any]:
        return await self.request(
            "DELETE", f"allocations/{quote(lease_id, safe='')}", reason="cancelled"
        )


def _refusal(e: HTTPClientError) -> PoolError:
    status = e.code
    if status in (599,) or status >= 502:
        return PoolDown(f"the GPU pool is not answering (HTTP {status})", status=status)
    code, message = "", f"the GPU pool answered {status}"
    body = e.response.body if e.response is not None else b""
    try:
        err = json.loads(body or b"{}").get("error") or {}
        code, message = err.get("code", code), err.get("message", message)
    except (ValueError, AttributeError):
        pass
    return PoolRefused(message, status=status, code=code)
