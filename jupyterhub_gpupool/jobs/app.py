"""``jupyterhub-gpupool job-runner``: the local job runner as a long-running application.

It runs beside the node agent of a one-machine pool (the demo starts one) with the agent's
token (``custom:gpupool:agent``), and runs the node's granted jobs (``jobs.runner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import tempfile
import time
from pathlib import Path

from traitlets import Float, List, Unicode, default

from .._version import __version__
from ..poolclient import PoolClient, TornadoTransport
from ..strictcli import StrictCommandLine
from .runner import RunnerLoop


class JobRunner(StrictCommandLine):
    """Run the pool's granted jobs on this machine, pinned to their devices."""

    name = "jupyterhub-gpupool-job-runner"
    command = "job-runner"
    version = __version__
    description = "Run the GPU pool's granted jobs on this node as processes on their devices."

    aliases = {
        "config": "JobRunner.config_file",
        "service-url": "JobRunner.service_url",
        "node": "JobRunner.node",
        "nodes": "JobRunner.nodes",
        "interval": "JobRunner.interval",
        "workdir": "JobRunner.workdir",
        "log-level": "Application.log_level",
    }

    config_file = Unicode(
        "jupyterhub_gpupool_job_runner_config.py",
        help="Python config file to load (a missing default file is fine).",
    ).tag(config=True)
    service_url = Unicode(
        help="URL of the pool service, e.g. http://hub:8000/services/gpupool/ (its API is "
        "{service_url}api/v1/; a URL already ending in /api/v1 is used as is), else "
        "$GPUPOOL_SERVICE_URL."
    ).tag(config=True)
    node = Unicode(
        help="This node's name in the pool (as its agent reports it), else $NODE_NAME, else "
        "the host name."
    ).tag(config=True)
    nodes = List(
        Unicode(),
        help="Several pool nodes this machine runs the jobs of (the demo's simulated nodes are "
        "all this machine); empty: just ``node``.",
    ).tag(config=True)
    api_token = Unicode(
        help="Token with the custom:gpupool:agent scope, else $GPUPOOL_AGENT_TOKEN, else "
        "$JUPYTERHUB_API_TOKEN. Prefer the environment: a flag shows in `ps`."
    ).tag(config=True)
    interval = Float(
        2.0,
        help="Seconds between rounds: how soon a granted job starts, a preemption or cancel "
        "is acted on, and an ended job's lease is given back.",
    ).tag(config=True)
    cancel_grace = Float(
        10.0,
        help="Seconds between SIGTERM and SIGKILL for a cancelled job (a preempted one gets "
        "its class's grace, the pool's notice deadline).",
    ).tag(config=True)
    workdir = Unicode(
        help="Where each job's log and preemption notice file are kept (a folder per job), "
        "else $GPUPOOL_JOB_DIR, else <temp>/jupyterhub-gpupool-jobs."
    ).tag(config=True)
    home_template = Unicode(
        "/tmp/{username}",
        help="A job submitted from elsewhere than this machine runs in its user's home, this "
        "folder (``{username}``) when it exists; the default matches the demo's "
        "SimpleLocalProcessSpawner homes. Else the job's own folder under workdir.",
    ).tag(config=True)
    request_timeout = Float(30.0, help="Seconds before a request to the service is abandoned.").tag(
        config=True
    )

    @default("service_url")
    def _service_url_default(self) -> str:
        return os.environ.get("GPUPOOL_SERVICE_URL", "")

    @default("node")
    def _node_default(self) -> str:
        return os.environ.get("NODE_NAME") or socket.gethostname()

    @default("api_token")
    def _api_token_default(self) -> str:
        return os.environ.get("GPUPOOL_AGENT_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN", "")

    @default("workdir")
    def _workdir_default(self) -> str:
        return os.environ.get("GPUPOOL_JOB_DIR") or str(
            Path(tempfile.gettempdir()) / "jupyterhub-gpupool-jobs"
        )

    @default("log_level")
    def _log_level_default(self) -> int:
        return logging.INFO

    @property
    def api_url(self) -> str:
        """The pool API's base URL, ending in ``/``."""
        url = self.service_url.rstrip("/")
        return url + "/" if url.endswith("/api/v1") else url + "/api/v1/"

    def initialize(self, argv: list[str] | None = None) -> None:
        """Refuse to start without the service's URL or a token."""
        super().initialize(argv)
        if not self.service_url:
            raise SystemExit("The job runner needs --service-url (or $GPUPOOL_SERVICE_URL)")
        if not self.api_token:
            raise SystemExit(
                "The job runner needs a token with the custom:gpupool:agent scope: "
                "$GPUPOOL_AGENT_TOKEN or $JUPYTERHUB_API_TOKEN"
            )

    def make_loops(self) -> list[RunnerLoop]:
        """One runner per node, with this application's settings (built inside the event
        loop: tornado's client belongs to it)."""
        client = PoolClient(
            self.api_url,
            self.api_token,
            transport=TornadoTransport(self.request_timeout),
        )
        return [
            RunnerLoop(
                client,
                node,
                Path(self.workdir),
                clock=time.time,
                cancel_grace=self.cancel_grace,
                home_template=self.home_template,
            )
            for node in (self.nodes or [self.node])
        ]

    async def start_async(self) -> None:
        """Run rounds until SIGTERM/SIGINT; then stop this runner's jobs and report them."""
        loops = self.make_loops()
        stop = asyncio.Event()
        aio = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            aio.add_signal_handler(sig, stop.set)
        self.log.info(
            "GPU pool job runner for %s (%s), jobs in %s",
            ", ".join(lp.node for lp in loops),
            self.api_url,
            self.workdir,
        )
        while not stop.is_set():
            for loop in loops:
                await loop.step()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
        for loop in loops:
            await loop.close()
        self.log.info("Job runner stopped")

    def start(self) -> None:
        """Run the runner."""
        asyncio.run(self.start_async())


main = JobRunner.launch_instance
