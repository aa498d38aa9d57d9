"""An async client of the JupyterHub REST API, shared by the pool service and the reclaimer.

It asks only what the pool and the reclaimer need: which servers run or spawn (paged, like
jupyterhub-idle-culler pages ``GET /users``), which servers a user has, stopping and starting a
server, and calling a user's server through the hub's proxy (``access:servers``). It speaks HTTP
through tornado's ``AsyncHTTPClient``; a hub that cannot be reached raises ``HubUnavailable``, so
callers can tell "the hub is down" (act on nothing) from "the hub says no such server".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest


class HubUnavailable(Exception):
    """The hub did not answer (refused, timed out, 5xx): nothing it said can be trusted."""


class ServerUnavailable(Exception):
    """A user's server did not answer through the proxy (stopped, starting, refused, 5xx)."""


class HubClient:
    """The hub API at ``api_url`` with a service token; users' servers through ``proxy_url``
    (the proxy's public origin, where ``/user/<name>/`` is routed)."""

    def __init__(
        self,
        api_url: str,
        token: str,
        *,
        timeout: float = 20.0,
        page_size: int = 200,
        proxy_url: str = "",
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.page_size = page_size
        self.proxy_url = proxy_url.rstrip("/")

    async def _request(
        self, method: str, path: str, body: Any = None, timeout: float | None = None, **query: Any
    ) -> tuple[int, Any]:
        """One hub API call: (status, decoded JSON or None). 404 is an answer; 5xx and no
        answer raise ``HubUnavailable``; another 4xx raises tornado's ``HTTPClientError``."""
        url = f"{self.api_url}/{path}"
        if query:
            url += "?" + urlencode(query)
        request = HTTPRequest(
            url,
            method=method,
            headers={
                "Authorization": f"token {self.token}",
                "Accept": "application/jupyterhub-pagination+json",
                "Content-Type": "application/json",
            },
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=body is None and method in ("POST", "PUT", "PATCH"),
            connect_timeout=self.timeout,
            request_timeout=timeout or self.timeout,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            if e.code == 404:
                return 404, None
            if e.code >= 500 or e.code == 599:
                raise HubUnavailable(f"the hub answered {e.code}") from None
            raise
        except OSError as e:
            raise HubUnavailable(str(e)) from None
        text = response.body.decode("utf-8", "replace") if response.body else ""
        try:
            return response.code, json.loads(text) if text else None
        except ValueError:
            return response.code, None

    async def _get(self, path: str, **query: Any) -> Any:
        return (await self._request("GET", path, **query))[1]

    async def users(self, *, state: str | None = None) -> list[dict[str, Any]]:
        """Every user (those with an ``active`` server when ``state="active"``), all pages
        (``page_size`` each, following the hub's ``_pagination.next``)."""
        users: list[dict[str, Any]] = []
        offset = 0
        while True:
            query: dict[str, Any] = {"offset": offset, "limit": self.page_size}
            if state:
                query["state"] = state
            page = await self._get("users", **query)
            users += page["items"]
            nxt = (page.get("_pagination") or {}).get("next")
            if not nxt:
                return users
            offset = nxt["offset"]

    async def running_servers(self) -> set[tuple[str, str]]:
        """(user, server) of every server the hub runs or is spawning."""
        return {
            (user["name"], name)
            for user in await self.users(state="active")
            for name in user.get("servers") or {}
        }

    async def server_names(self, user: str) -> set[str] | None:
        """The names of ``user``'s servers the hub knows, stopped ones included (the default
        server ``""`` always); None when the hub has no such user."""
        model = await self._get(f"users/{quote(user, safe='')}", include_stopped_servers=1)
        if model is None:
            return None
        return {"", *(model.get("servers") or {})}

    @staticmethod
    def _server_path(user: str, server: str) -> str:
        name = quote(user, safe="")
        if not server:
            return f"users/{name}/server"
        return f"users/{name}/servers/{quote(server, safe='')}"

    async def server(self, user: str, server: str = "") -> dict[str, Any] | None:
        """The hub's model of ``user``'s ``server`` while it runs, starts or stops (None: it
        is stopped, or there is no such user)."""
        model = await self._get(f"users/{quote(user, safe='')}")
        if model is None:
            return None
        return (model.get("servers") or {}).get(server)

    async def stop_server(self, user: str, server: str = "") -> int:
        """Ask the hub to stop a server (the spawner releases its lease): 202 stopping, 204
        stopped (or was not running). The hub answers only after the stop or its
        ``slow_stop_timeout`` (10 s), and a loaded hub takes longer: this waits at least 30 s,
        as a start does (with the 20 s default a busy hub answered too late, and the reclaimer
        reported a stop still under way as failed)."""
        wait = max(self.timeout, 30.0)
        return (await self._request("DELETE", self._server_path(user, server), timeout=wait))[0]

    async def start_server(
        self, user: str, server: str = "", options: Mapping[str, Any] | None = None
    ) -> int:
        """Start a server with ``user_options`` ``options`` (the body both JupyterHub 5 and 6
        read as user_options): 201 started, 202 starting. The hub answers only after the
        spawn or its ``slow_spawn_timeout`` (10 s), so this waits at least 30 s."""
        path = self._server_path(user, server)
        wait = max(self.timeout, 30.0)
        return (await self._request("POST", path, dict(options or {}), timeout=wait))[0]

    async def wait_server(
        self, user: str, server: str, *, running: bool, timeout: float, poll: float = 0.5
    ) -> bool:
        """Wait (real time, at most ``timeout`` s) until the server is ready (``running``) or
        stopped; whether it got there."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            model = await self.server(user, server)
            if running and model is not None and model.get("ready") and not model.get("pending"):
                return True
            if not running and model is None:
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(poll)

    async def call_server(
        self,
        server_url: str,
        path: str,
        method: str = "GET",
        body: Any = None,
        *,
        timeout: float | None = None,
    ) -> tuple[int, Any]:
        """Call a user's server with this client's token (the hub's ``access:servers``):
        ``server_url`` is the hub's ``url`` of the server (``/user/alice/``), called through the
        proxy, or the server's own address (``http://10.0.0.7:8888/user/alice/``), called
        directly. Returns (status, JSON or None) for any HTTP answer below 500 (401/403: the
        token is refused); no answer, or 5xx (the proxy's 503 for a server that is not there),
        raises ``ServerUnavailable``."""
        if server_url.startswith(("http://", "https://")):
            url = f"{server_url.rstrip('/')}/{path.lstrip('/')}"
        elif not self.proxy_url:
            raise ServerUnavailable("no proxy_url: the users' servers cannot be reached")
        else:
            url = f"{self.proxy_url}/{server_url.strip('/')}/{path.lstrip('/')}"
        request = HTTPRequest(
            url,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=body is None and method in ("POST", "PUT", "PATCH"),
            follow_redirects=False,
            connect_timeout=timeout or self.timeout,
            request_timeout=timeout or self.timeout,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except OSError as e:
            raise ServerUnavailable(str(e)) from None
        if response.code == 599 or response.code >= 500:
            raise ServerUnavailable(f"{server_url} answered {response.code}")
        text = response.body.decode("utf-8", "replace") if response.body else ""
        try:
            return response.code, json.loads(text) if text else None
        except ValueError:
            return response.code, None
