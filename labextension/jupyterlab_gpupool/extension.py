"""The Jupyter server extension: configuration, and wiring the routes into the server."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from traitlets import Float, TraitError, Unicode, default, validate
from traitlets.config import Configurable

from jupyterhub_gpupool.kernels.board import BOARD

from .fanout import Fanout
from .handlers import handlers
from .localgpu import LocalGPU
from .pool import LabPoolClient
from .presence import PresenceRelay
from .saving import SaveAll


class GPUPoolLab(Configurable):
    """``c.GPUPoolLab.…`` in ``jupyter_server_config.py`` (or ``--GPUPoolLab.…``)."""

    api_url = Unicode(
        help="The pool service's API as this server reaches it. Default: $GPUPOOL_API_URL, "
        "which the pool's spawners set.",
    ).tag(config=True)

    @default("api_url")
    def _api_url(self) -> str:
        return os.environ.get("GPUPOOL_API_URL", "")

    page_url = Unicode(
        help="The pool's user page as the user's browser reaches it (a path on the hub's "
        "origin): once this server is gone, the lab asks its ended/<lease> page how the lease "
        "ended. Default: $GPUPOOL_PAGE_URL, else the path of api_url without api/v1/ (the hub "
        "proxies the service's prefix, /services/gpupool/).",
    ).tag(config=True)

    @default("page_url")
    def _page_url(self) -> str:
        return os.environ.get("GPUPOOL_PAGE_URL", "") or page_from_api(self.api_url)

    lease_id = Unicode(
        help="The lease this server was started on. Default: $GPUPOOL_LEASE_ID (empty: a "
        "CPU-only server, which the panel offers to move onto a GPU).",
    ).tag(config=True)

    @default("lease_id")
    def _lease_id(self) -> str:
        return os.environ.get("GPUPOOL_LEASE_ID", "")

    api_token = Unicode(
        help="The token the pool is asked with. Default: $JUPYTERHUB_API_TOKEN, the server's "
        "own token (the hub's server role gives it custom:gpupool:use for its owner).",
    ).tag(config=True)

    @default("api_token")
    def _api_token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    server_name = Unicode(
        help="This server's name on the hub (empty: the default server). Default: "
        "$JUPYTERHUB_SERVER_NAME.",
    ).tag(config=True)

    @default("server_name")
    def _server_name(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVER_NAME", "")

    interval = Float(
        5.0,
        help="Seconds between asks of the pool while a lab is open (one ask: users/me and the "
        "lease's new samples, two requests), shared by every open tab.",
    ).tag(config=True)

    offers_interval = Float(
        60.0, help="Seconds between reads of the offers (the resize choices)."
    ).tag(config=True)

    max_backoff = Float(
        60.0,
        help="Longest wait between asks while the pool does not answer (the wait doubles from "
        "the interval up to this).",
    ).tag(config=True)

    idle_after = Float(
        30.0,
        help="Seconds the pool is still asked after the last state request from a widget or "
        "status() when no lab is open; then nothing is asked until someone looks.",
    ).tag(config=True)

    save_timeout = Float(
        10.0,
        help="How long save-all waits for the open labs to answer before it answers itself "
        "(the reclaimer's own timeout for the call should be longer).",
    ).tag(config=True)

    request_timeout = Float(10.0, help="Timeout of one request to the pool.").tag(config=True)

    presence_interval = Float(
        60.0,
        help="Shortest time between two reports of the user's input to the pool (keyboard or "
        "pointer in a visible lab tab, whatever the number of tabs), at most 60 s: the pool "
        "counts a reported input for a minute after it, the longest a report may be late.",
    ).tag(config=True)

    @validate("presence_interval")
    def _valid_presence_interval(self, proposal: dict[str, Any]) -> float:
        value = float(proposal["value"])
        if not 0 < value <= 60:
            raise TraitError("presence_interval must be more than 0 and at most 60 seconds")
        return value

    nvml_module = Unicode(
        "pynvml",
        help="Module with pynvml's functions to read the local device with (empty: do not "
        "read NVML). The demo points it at a simulated NVML.",
    ).tag(config=True)


def page_from_api(api_url: str) -> str:
    """``http://pool:8080/services/gpupool/api/v1/`` → ``/services/gpupool/`` (empty: none)."""
    path = urlsplit(api_url).path if api_url else ""
    head, sep, _ = path.rstrip("/").rpartition("/api/v1")
    return f"{head}/" if sep and head else ""


def load(server_app: Any) -> None:
    """Add the routes and start nothing until a lab or a widget asks."""
    config = GPUPoolLab(parent=server_app)
    web_app = server_app.web_app
    client = None
    why = ""
    if not config.api_url:
        why = "this server was not told where the GPU pool is ($GPUPOOL_API_URL)"
    elif not config.api_token:
        why = "this server has no token for the GPU pool ($JUPYTERHUB_API_TOKEN)"
    else:
        client = LabPoolClient(config.api_url, config.api_token, timeout=config.request_timeout)
    fanout = Fanout(
        client,
        lease_id=config.lease_id,
        server=config.server_name,
        interval=config.interval,
        offers_interval=config.offers_interval,
        max_backoff=config.max_backoff,
        idle_after=config.idle_after,
        local=LocalGPU(config.nvml_module),
        log=server_app.log,
        why_no_pool=why,
        page_url=config.page_url,
    )
    saver = SaveAll(
        fanout,
        server_app.contents_manager,
        server_app.session_manager,
        config.save_timeout,
    )
    web_app.settings["gpupool_fanout"] = fanout
    web_app.settings["gpupool_saver"] = saver
    presence = PresenceRelay(
        client, config.lease_id, min_interval=config.presence_interval, log=server_app.log
    )
    web_app.settings["gpupool_presence"] = presence
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"]))
    # the GPU kernels' waits and notices reach every open lab at once (kernel-starts events)
    BOARD.listeners.append(lambda snapshot: fanout.publish("kernel-starts", snapshot))
    fanout.start()
    presence.start()
    server_app.log.info(
        "jupyterlab-gpupool: %s (lease %s, every %gs while a lab is open)",
        f"pool at {config.api_url}" if client else why,
        config.lease_id or "none: CPU only",
        config.interval,
    )
