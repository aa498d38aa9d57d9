"""The Jupyter server extension that keeps the GPU kernelspecs in step with the pool's offers:
written at server start and every ``refresh_interval`` seconds (a pool out of reach leaves the
specs as they were and says so in the log); it also serves this server's GPU kernel starts
waiting for their GPU, and their Cancel (``handlers``). Enable it with
``--ServerApp.jpserver_extensions=jupyterhub_gpupool.kernels=True`` (the spawner's
``args``) or ``jupyter server extension enable jupyterhub_gpupool.kernels``."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from traitlets import Float, Unicode, default
from traitlets.config import Configurable

from ..poolclient import PoolClient, PoolClientError
from .handlers import handlers
from .kernelspecs import default_folder, write_kernelspecs


class GpuKernelSpecs(Configurable):
    """Where the GPU kernelspecs go and how often they follow the offers."""

    folder = Unicode(help="The kernelspec folder written (default: the user's own).").tag(
        config=True
    )
    refresh_interval = Float(
        300.0, help="Seconds between refreshes of the GPU kernelspecs from the pool's offers."
    ).tag(config=True)
    api_url = Unicode(help="The pool's API. Default: $GPUPOOL_API_URL.").tag(config=True)
    api_token = Unicode(help="The pool token. Default: $JUPYTERHUB_API_TOKEN.").tag(config=True)

    @default("folder")
    def _folder(self) -> str:
        return str(default_folder())

    @default("api_url")
    def _api_url(self) -> str:
        return os.environ.get("GPUPOOL_API_URL", "")

    @default("api_token")
    def _api_token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    async def refresh(self) -> list[str]:
        """Write the specs from the offers now; answers the names written."""
        client = PoolClient(self.api_url, self.api_token)
        return write_kernelspecs(await client.offers(), Path(self.folder))

    async def run(self, log: Any) -> None:
        """Refresh now and every ``refresh_interval``."""
        while True:
            try:
                written = await self.refresh()
                if written:
                    log.info("GPU kernelspecs written: %s", ", ".join(written))
            except PoolClientError as e:
                log.warning("GPU kernelspecs not refreshed: %s", e.message)
            await asyncio.sleep(self.refresh_interval)


def _load_jupyter_server_extension(server_app: Any) -> None:
    web_app = server_app.web_app
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"]))
    specs = GpuKernelSpecs(parent=server_app)
    if not specs.api_url or not specs.api_token:
        server_app.log.warning("GPU kernelspecs off: no $GPUPOOL_API_URL or token")
        return
    server_app.io_loop.add_callback(specs.run, server_app.log)
