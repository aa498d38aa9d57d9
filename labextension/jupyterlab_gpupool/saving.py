"""Save-all: what the reclaimer calls before it stops a server, and what a resize does first.

Where labs are open, what the browser holds (edits not yet written) can only be saved by the
browser: every lab listening on the event stream is sent a ``save`` event and answers with the
paths it saved; the server waits at most ``timeout`` seconds for the answers. Where no lab
answers, every file open in a kernel session gets a checkpoint of what is on disk, through the
contents manager. Either way the answer lists the paths saved.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from jupyter_core.utils import ensure_async

from .fanout import Fanout


class SaveAll:
    """Asks the open labs to save, waiting a bounded time, else checkpoints."""

    def __init__(
        self, fanout: Fanout, contents_manager: Any, session_manager: Any, timeout: float
    ) -> None:
        self.fanout = fanout
        self.contents = contents_manager
        self.sessions = session_manager
        self.timeout = timeout
        self._waiting: dict[str, dict[str, asyncio.Future[dict[str, Any]]]] = {}

    def answer(self, request_id: str, client_id: str, body: dict[str, Any]) -> bool:
        """A lab's answer to save request ``request_id``; False when nobody waits for it."""
        future = self._waiting.get(request_id, {}).get(client_id)
        if future is None or future.done():
            return False
        future.set_result(body)
        return True

    async def run(self, reason: str = "") -> dict[str, Any]:
        """Save everything; ``{"saved", "unchanged", "failed", "via", "labs", "answered"}``."""
        labs = list(self.fanout.listeners)
        saved: set[str] = set()
        unchanged: set[str] = set()
        failed: list[dict[str, str]] = []
        answered = 0
        if labs:
            request_id = uuid.uuid4().hex
            loop = asyncio.get_running_loop()
            futures: dict[str, asyncio.Future[dict[str, Any]]] = {
                cid: loop.create_future() for cid in labs
            }
            self._waiting[request_id] = futures
            try:
                for cid in labs:
                    self.fanout.publish("save", {"id": request_id, "reason": reason}, only=cid)
                done, _ = await asyncio.wait(futures.values(), timeout=self.timeout)
            finally:
                self._waiting.pop(request_id, None)
            for future in done:
                body = future.result()
                answered += 1
                saved.update(str(p) for p in body.get("saved") or [])
                unchanged.update(str(p) for p in body.get("unchanged") or [])
                failed += [
                    {"path": str(f.get("path")), "error": str(f.get("error"))[:255]}
                    for f in body.get("failed") or []
                    if isinstance(f, dict)
                ]
        via = "lab"
        if not answered:
            via = "checkpoints"
            for path in await self._session_paths():
                try:
                    await ensure_async(self.contents.create_checkpoint(path))
                    saved.add(path)
                except Exception as e:  # never written to disk (a new notebook), gone, ...
                    failed.append({"path": path, "error": str(e)[:255]})
        result = {
            "saved": sorted(saved),
            "unchanged": sorted(unchanged - saved),
            "failed": failed,
            "via": via,
            "labs": len(labs),
            "answered": answered,
            "reason": reason,
            "at": time.time(),
        }
        self.fanout.last_save = result
        self.fanout.publish("saved", result)
        return result

    async def _session_paths(self) -> list[str]:
        sessions = await ensure_async(self.sessions.list_sessions())
        paths = set()
        for s in sessions:
            path = s.get("path") or (s.get("notebook") or {}).get("path")
            if path and await ensure_async(self.contents.file_exists(path)):
                paths.add(path)
        return sorted(paths)
