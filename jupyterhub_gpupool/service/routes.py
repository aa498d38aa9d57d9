"""The service's routes: every route of the application (``routes``), and those beside API v1's
resources: Prometheus' ``/metrics`` and the JSON 404 of an unknown API path (the health check
is ``jupyterhub_gpupool.health``, shared with the reclaimer)."""

from __future__ import annotations

import json

from jupyterhub.services.auth import HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join
from tornado import web

from ..health import HealthHandler
from . import pages
from .apihandlers import (
    admin,
    agent,
    alerts,
    allocations,
    approvals,
    jobs,
    kernels,
    operate,
    planning,
    reclaim,
    restart,
    users,
)
from .apihandlers.base import APIHandler
from .apihandlers.errors import APIError
from .scopes import ADMIN, METRICS_SCOPE


class NotFoundHandler(APIHandler):
    """Unknown API paths answer JSON 404s too."""

    async def prepare(self) -> None:
        raise APIError("not_found", f"no such endpoint: {self.request.path}")


class MetricsHandler(web.RequestHandler):
    """Prometheus exposition of the pool. Like JupyterHub's own ``/metrics``
    (``authenticate_prometheus``), it needs a token by default: one holding ``read:metrics``
    (what a hub-registered Prometheus service gets) or the pool's admin scope."""

    async def get(self) -> None:
        if self.settings["authenticate_prometheus"]:
            model = await self.settings["hub_auth"].get_user(self, sync=False)
            if model is None:
                self._refuse(401, "unauthorized", "a JupyterHub token is required")
                return
            scopes = set(model.get("scopes") or ())
            if not scopes & {METRICS_SCOPE, ADMIN}:
                name = f"{model.get('kind', 'user')}:{model.get('name')}"
                self._refuse(403, "forbidden", f"{name} may not read the pool's metrics")
                return
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(self.settings["metrics"].render(self.settings["store"]))

    def _refuse(self, status: int, code: str, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps(APIError(code, message).to_dict()))


def routes(base_url: str) -> list[pages.Route]:
    """Every route of the service under ``base_url``: API v1's resources, ``/metrics``,
    ``/health``, the OAuth callback, the pages, and the JSON 404 of any other API path."""
    api = url_path_join(base_url, "api/v1/")
    handlers: list[pages.Route] = []
    for module in (
        allocations,
        approvals,
        restart,
        users,
        agent,
        admin,
        reclaim,
        operate,
        planning,
        alerts,
        jobs,
        kernels,
    ):
        handlers += [(api + pattern, handler) for pattern, handler in module.default_handlers]
    return [
        *handlers,
        (url_path_join(base_url, "metrics"), MetricsHandler),
        (url_path_join(base_url, "health"), HealthHandler),
        (url_path_join(base_url, "oauth_callback"), HubOAuthCallbackHandler),
        *pages.default_handlers(base_url),
        (api + r".*", NotFoundHandler),
    ]
