"""The kernels extension's routes: this server's GPU kernel starts waiting for their GPU, and
Cancel (issue 36).

====================================================  ==============================================
``GET    gpupool/kernel-starts``                      ``{"waiting": [...], "notices": [...]}``:
                                                      the starts in the pool's queue (position,
                                                      estimate) and the pool's idle notices
``DELETE gpupool/kernel-starts/<kernel id>``          cancel a waiting start: its queued lease is
                                                      given back, the start fails with "GPU
                                                      kernel start cancelled"
====================================================  ==============================================

Authenticated as every route of the server, and authorized on the ``kernels`` resource (read
to look, write to cancel), as Jupyter Server's own kernel routes are. Errors are JSON
``{"error": {"code", "message"}}``, as the lab extension's.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from .board import BOARD


class _Base(APIHandler):
    auth_resource = "kernels"

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        code = {403: "forbidden", 404: "not_found", 405: "not_allowed"}.get(status_code, "error")
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": {"code": code, "message": message}}))


class KernelStartsHandler(_Base):
    """``GET gpupool/kernel-starts``: what the notebook shows while GPU kernels wait."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(BOARD.snapshot())

    def update_api_activity(self) -> None:
        return  # a lab looking is not the user's activity


class KernelStartHandler(_Base):
    """``DELETE gpupool/kernel-starts/<kernel id>``: give the waiting start's place up."""

    @web.authenticated
    @authorized
    async def delete(self, kernel_id: str) -> None:
        entry = BOARD.cancel(kernel_id)
        if entry is None:
            raise web.HTTPError(404, f"no GPU kernel start of {kernel_id} is waiting")
        self.set_status(202)
        self.finish({"cancelled": entry})


def handlers(base_url: str) -> list[tuple[str, type]]:
    """The routes under ``base_url``."""
    at = url_path_join(base_url, "gpupool", "kernel-starts")
    return [
        (at, KernelStartsHandler),
        (at + r"/([A-Za-z0-9][A-Za-z0-9._-]{0,199})", KernelStartHandler),
    ]
