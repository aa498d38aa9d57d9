"""Group commit: one thread applies the hot store calls in batches, handlers await the results.

Under load, many allocate/release requests wait for the pool lock at once. Running them in one
transaction (one lock, one version bump, one commit) instead of one each multiplies throughput,
and moving the database work off the event loop lets tornado parse and authenticate the next
requests meanwhile. A grant is still answered only after its commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from ..store import Store

log = logging.getLogger("jupyterhub_gpupool.writer")


class _Failed:
    """A batch that failed as a whole (its exception is raised in every caller)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class BatchWriter:
    """A single writer thread in front of ``Store.run_batch``."""

    def __init__(self, store: Store, max_batch: int = 64) -> None:
        self.store = store
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="gpupool-writer", daemon=True)

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def stop(self) -> None:
        """Finish what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout=30)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` in the next batch; its StoreError is raised here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._queue.put((fn, args, kwargs, (loop, future)))
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    @staticmethod
    def _deliver(pairs: list[tuple[asyncio.Future, Any]]) -> None:
        """On the event loop: settle a whole batch's futures in one callback."""
        for future, result in pairs:
            if future.cancelled():
                continue
            if isinstance(result, _Failed):
                future.set_exception(result.error)
            else:
                future.set_result(result)

    def _settle(self, batch: list[tuple], results: list[Any]) -> None:
        """Hand the results to their loops: one thread-safe wake-up per loop and batch, not one
        per request (each wake-up is a pipe write and a hand-over of the interpreter lock)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Any]]] = {}
        for (*_, (loop, future)), result in zip(batch, results, strict=True):
            by_loop.setdefault(loop, []).append((future, result))
        for loop, pairs in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(self._deliver, pairs)

    def _take(self) -> list[tuple] | None:
        first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        while len(batch) < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # stop after this batch
                break
            batch.append(item)
        return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            try:
                results = self.store.run_batch([(fn, a, kw) for fn, a, kw, _ in batch])
            except BaseException as e:  # nothing of the batch was committed
                log.warning(
                    "A batch of %d pool changes failed and was rolled back: %s", len(batch), e
                )
                self._settle(batch, [_Failed(e)] * len(batch))
                continue
            self._settle(batch, results)
