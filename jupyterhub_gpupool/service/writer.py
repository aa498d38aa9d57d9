"""Group commit: one thread applies the hot store calls in batches, handlers await the results.

Under load, many allocate/release requests wait for the pool lock at once. Running them in one
transaction (one lock, one version bump, one commit) instead of one each multiplies throughput,
and moving the database work off the event loop lets tornado parse and authenticate the next
requests meanwhile. A grant is still answered only after its commit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from ..store import Store

log = logging.getLogger("jupyterhub_gpupool.writer")


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
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fn, args, kwargs, future))
        result = await asyncio.wrap_future(future)
        if isinstance(result, BaseException):
            raise result
        return result

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
                for *_, future in batch:
                    future.set_exception(e)
                continue
            for (*_, future), result in zip(batch, results, strict=True):
                future.set_result(result)
