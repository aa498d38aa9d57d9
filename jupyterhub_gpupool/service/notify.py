"""The service's ``notify_hook``: tells people about approvals (admins of a new request, the
user of the decision), about a reclaim notice an administrator withdrew (the user), budgets
(80 % and 100 % of a period's unit-hours: the ``lease`` is ``{"id": "", "user" | "group":
name}``) and the pool's alerts (admins: ``alert``, ``alert-resolved``, with an empty lease; see
``service/alerts.py``), through the same kind of hook the reclaimer calls for its notices.

The hook is called as ``hook(event, lease, details)``; a callable (may be async) or its import
name. It runs in the background with a time limit: a slow or failing hook is logged and never
delays or fails the request that triggered it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from traitlets.utils.importstring import import_item

#: Events the service notifies: who they are for.
EVENTS = {
    "approval-requested": "admins",
    "approved": "user",
    "denied": "user",
    # the service's own alerts (service/alerts.py): ``lease`` is empty, ``details`` the alert
    "alert": "admins",
    "alert-resolved": "admins",
    # a budget reached 80 % or 100 % of this period's unit-hours (details: subject user|group,
    # name, level, used_unit_hours, budget, period, period_start, action)
    "budget-warning": "user",
    "notice-cancelled": "user",
}


def resolve_hook(hook: object) -> Callable[..., Any] | None:
    """``hook`` as a callable: an import name is imported; empty means none."""
    if isinstance(hook, str):
        hook = import_item(hook) if hook else None
    if hook is None:
        return None
    if not callable(hook):
        raise ValueError(f"notify_hook is not callable: {hook!r}")
    return hook


class Notifier:
    """Calls the hook off the request path; keeps the tasks so none is garbage-collected."""

    def __init__(
        self, hook: Callable[..., Any] | None, timeout: float, log: logging.Logger
    ) -> None:
        self.hook, self.timeout, self.log = hook, timeout, log
        self._tasks: set[asyncio.Task[None]] = set()
        self.failures = 0

    def __call__(self, event: str, lease: dict[str, Any], **details: Any) -> None:
        """Notify ``event`` about ``lease`` (``details`` add to what the hook gets)."""
        if self.hook is None:
            return
        info = {"for": EVENTS.get(event, "user"), **details}
        task = asyncio.ensure_future(self._call(event, lease, info))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, event: str, lease: dict[str, Any], info: dict[str, Any]) -> None:
        hook = self.hook
        if hook is None:  # never: __call__ schedules no call without a hook
            return
        try:
            result = hook(event, lease, info)
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, self.timeout)
        except Exception as e:  # a hook never breaks the pool
            self.failures += 1
            about = f"lease {lease['id']}" if lease.get("id") else info.get("subject", "the pool")
            self.log.warning("notify_hook failed for %s of %s: %r", event, about, e)

    async def drain(self) -> None:
        """Wait for the hooks in flight (shutdown, tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
