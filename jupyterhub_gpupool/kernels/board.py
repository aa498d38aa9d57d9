"""What this server's GPU kernels are waiting for or have been told, for the notebook to show
(issue 36): the starts waiting in the pool's queue (position, estimate; each cancellable) and
the pool's idle notices to running GPU kernels.

One board per server process (:data:`BOARD`): the ``gpupool`` provisioners of the kernels this
server starts write it, the kernels extension's routes (``GET gpupool/kernel-starts``,
``DELETE gpupool/kernel-starts/<kernel id>``) read and cancel, and the lab extension pushes
every change to the open labs over its event stream (``listeners``). Imports nothing but the
standard library: the lab package reads it without jupyter_client.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

log = logging.getLogger(__name__)

Listener = Callable[[dict[str, Any]], None]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


class KernelBoard:
    """The waiting starts and the notices, keyed by kernel id."""

    def __init__(self) -> None:
        self._waiting: dict[str, dict[str, Any]] = {}
        self._cancels: dict[str, asyncio.Event] = {}
        self._notices: dict[str, dict[str, Any]] = {}
        #: called with :meth:`snapshot` after every change (the lab's event stream)
        self.listeners: list[Listener] = []

    def snapshot(self) -> dict[str, Any]:
        """``{"waiting": [...], "notices": [...]}``, oldest first (plain JSON)."""
        return {
            "waiting": [dict(w) for w in self._waiting.values()],
            "notices": [dict(n) for n in self._notices.values()],
        }

    def _changed(self) -> None:
        snap = self.snapshot()
        for listener in list(self.listeners):
            try:
                listener(snap)
            except Exception:  # a listener's failure never stops a kernel start
                log.exception("GPU kernel board listener failed")

    # -- waiting starts: the provisioner's pre_launch -------------------------------------------

    def wait(self, kernel_id: str, **entry: Any) -> asyncio.Event:
        """Record (or update) a start waiting for its GPU: ``entry`` is what the notebook shows
        (kernel_name, display_name, offer, offer_name, lease_id, state, position, eta_seconds).
        Answers the event :meth:`cancel` sets."""
        old = self._waiting.get(kernel_id)
        new = {**(old or {"kernel_id": kernel_id, "since": _now()}), **entry}
        if new != old:
            self._waiting[kernel_id] = new
            self._changed()
        return self._cancels.setdefault(kernel_id, asyncio.Event())

    def cancel(self, kernel_id: str) -> dict[str, Any] | None:
        """Ask the waiting start of ``kernel_id`` to give up (its provisioner releases the
        queued lease and fails the start); None if no start of that kernel waits."""
        entry = self._waiting.get(kernel_id)
        if entry is None:
            return None
        self._cancels[kernel_id].set()
        return dict(entry)

    def done(self, kernel_id: str) -> None:
        """The start no longer waits (started, failed or cancelled)."""
        self._cancels.pop(kernel_id, None)
        if self._waiting.pop(kernel_id, None) is not None:
            self._changed()

    # -- notices: the provisioner's reports -----------------------------------------------------

    def notice(self, kernel_id: str, notice: dict[str, Any] | None, **info: Any) -> None:
        """The pool's notice to the running kernel ``kernel_id`` (``{"message", "deadline"}``;
        None: no notice, or the one it had was cancelled by an execution)."""
        old = self._notices.get(kernel_id)
        new = None if not notice else {"kernel_id": kernel_id, **info, **notice}
        if new == old:
            return
        if new is None:
            self._notices.pop(kernel_id, None)
        else:
            self._notices[kernel_id] = new
        self._changed()

    def forget(self, kernel_id: str) -> None:
        """The kernel is gone: nothing of it is shown any more."""
        self.done(kernel_id)
        self.notice(kernel_id, None)


#: This server's board.
BOARD = KernelBoard()
