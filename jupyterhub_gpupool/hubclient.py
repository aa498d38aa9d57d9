"""An async client of the JupyterHub REST API, shared by the pool service and the reclaimer.

It asks only what the pool needs: which servers run or spawn (paged, like jupyterhub-idle-culler
pages ``GET /users``), and which servers a user has. It speaks HTTP through tornado's
``AsyncHTTPClient``; a hub that cannot be reached raises ``HubUnavailable``, so callers can tell
"the hub is down" (act on nothing) from "the hub says no such server".
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest


class HubUnavailable(Exception):
    """The hub did not answer (refused, timed out, 5xx): nothing it said can be trusted."""


class HubClient:
    """The hub API at ``api_url`` with a service token."""

    def __init__(
        self, api_url: str, token: str, *, timeout: float = 20.0, page_size: int = 200
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.page_size = page_size

    async def _get(self, path: str, **query: Any) -> Any:
        url = f"{self.api_url}/{path}"
        if query:
            url += "?" + urlencode(query)
        request = HTTPRequest(
            url,
            headers={
                "Authorization": f"token {self.token}",
                "Accept": "application/jupyterhub-pagination+json",
            },
            request_timeout=self.timeout,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            if e.code == 404:
                return None
            if e.code >= 500 or e.code == 599:
                raise HubUnavailable(f"the hub answered {e.code}") from None
            raise
        except OSError as e:
            raise HubUnavailable(str(e)) from None
        return json.loads(response.body)

    async def users(self, *, state: str | None = None) -> list[dict[str, Any]]:
        """Every user (those with an ``active`` server when ``state="active"``), all pages."""
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
