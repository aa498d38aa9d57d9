"""The pool service in-process (chargeback, planning): :class:`InProcessService` runs the
service's real tornado app and writer on a loopback port; :class:`TokenHubAuth` stands for the
hub's OAuth (a token names a hub model).
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from tests.fakes.hub import Response, request

if TYPE_CHECKING:
    from jupyterhub_gpupool.store import Store


class TokenHubAuth:
    """The service's ``HubOAuth`` as the API handlers use it: a token names a hub model (the
    hub itself is the one thing these store-level API tests leave out; the integration tests
    run the real one)."""

    hub_prefix = "/hub/"
    base_url = "/services/gpupool/"
    #: No access scopes to check: the pages' own authorization (scopes on the model) decides.
    access_scopes: set[str] = set()

    def __init__(self, models: dict[str, dict[str, Any]]) -> None:
        self.models = models

    async def get_user(self, handler: Any, sync: bool = True) -> dict[str, Any] | None:
        token = handler.request.headers.get("Authorization", "").removeprefix("token ").strip()
        model = self.models.get(token)
        return None if model is None else {**model, "scopes": list(model["scopes"])}


class InProcessService:
    """The service's real tornado app and writer over ``store`` on a loopback port, on its own
    event loop in a thread; ``call`` sends one request with a token of ``models``."""

    def __init__(self, store: Store, models: dict[str, dict[str, Any]]) -> None:
        from tornado.netutil import bind_sockets

        from jupyterhub_gpupool.service.app import PoolService
        from jupyterhub_gpupool.service.metrics import PoolMetrics
        from jupyterhub_gpupool.service.utilization import MinuteAggregator, UtilizationBuffer
        from jupyterhub_gpupool.service.writer import BatchWriter

        self.store = store
        self.svc = PoolService(authenticate_prometheus=False, check_user_servers=False)
        self.svc.base_url = "/services/gpupool/"
        self.svc.store, self.svc.hub_auth, self.svc.hub = store, TokenHubAuth(models), None
        self.svc.metrics = PoolMetrics()
        store.listeners.append(self.svc.metrics.on_event)
        self.svc.utilization, self.svc.minutes = UtilizationBuffer(86400), MinuteAggregator()
        self.svc.writer = BatchWriter(store)
        self.loop = asyncio.new_event_loop()
        self.sockets = bind_sockets(0, "127.0.0.1")
        self.url = f"http://127.0.0.1:{self.sockets[0].getsockname()[1]}/services/gpupool"
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from tornado.httpserver import HTTPServer

        asyncio.set_event_loop(self.loop)

        async def listen() -> None:
            HTTPServer(self.svc.make_app()).add_sockets(self.sockets)

        self.loop.run_until_complete(listen())
        self.loop.run_forever()

    def __enter__(self) -> InProcessService:
        self.svc.writer.start()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.svc.writer.stop()

    def call(self, who: str | None, method: str, path: str, body: object = None) -> Response:
        """One request to ``api/v1/<path>``."""
        return request(method, f"{self.url}/api/v1/{path}", who, body)

    def run(self, command: Any) -> Any:
        """Run one command through the service's writer, from the test's thread, as a loop of
        the service would (housekeeping, the reaper); its answer."""
        return asyncio.run_coroutine_threadsafe(self.svc.writer.run(command), self.loop).result(60)
