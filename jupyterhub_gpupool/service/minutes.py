"""The service's minute aggregates on their way to the database: flushed every few seconds,
pruned past retention, and flushed once more when the service stops; and the raw samples the
reclaim rounds read, pruned once they are older than the window."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from ..pool import commands
from ..store.rows import epoch
from .utilization import MinuteAggregator


class MinuteFlusher:
    """Moves what ``minutes`` accumulated into ``utilization_minutes`` through the writer."""

    def __init__(
        self,
        minutes: MinuteAggregator,
        run: Callable[[commands.Command], Awaitable[Any]],
        clock: Callable[[], datetime],
        *,
        interval: float,
        retention_days: float,
        log: logging.Logger,
        sample_window: float = 900.0,
    ) -> None:
        self.minutes, self.run, self.clock = minutes, run, clock
        self.interval, self.retention_days, self.log = interval, retention_days, log
        self.sample_window = sample_window

    async def flush(self) -> int:
        """Write the accumulated minute aggregates (through the writer, in a short transaction
        of their own, never under the pool lock).

        ``take()`` runs here on the event loop, where samples are added. What a failed write
        took is put back for the next flush, so nothing is lost to a database hiccup.
        """
        taken = self.minutes.take()
        try:
            written: int = await self.run(commands.WriteMinutes(taken))
        except Exception:
            self.minutes.restore(taken)
            raise
        return written

    async def prune(self) -> int:
        """Delete minute aggregates past ``retention_days`` (0: keep them all)."""
        if self.retention_days <= 0:
            return 0
        pruned: int = await self.run(
            commands.PruneMinutes(self.clock() - timedelta(days=self.retention_days))
        )
        return pruned

    async def prune_samples(self) -> int:
        """Delete the raw samples older than ``sample_window`` seconds (no round reads them)."""
        before = epoch(self.clock()) - self.sample_window
        pruned: int = await self.run(commands.PruneSamples(before))
        return pruned

    async def loop(self, stop: asyncio.Event) -> None:
        """Flush every ``interval`` seconds (and prune the raw samples), prune the minutes
        hourly, until ``stop``."""
        loop = asyncio.get_running_loop()
        next_prune = 0.0
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
            try:
                await self.flush()
            except Exception:
                self.log.exception("Flushing utilization minutes failed (kept for next time)")
            try:
                await self.prune_samples()
            except Exception:
                self.log.exception("Pruning raw utilization samples failed")
            if loop.time() >= next_prune:
                next_prune = loop.time() + 3600
                try:
                    pruned = await self.prune()
                    if pruned:
                        self.log.info("Deleted %d utilization minutes past retention", pruned)
                except Exception:
                    self.log.exception("Pruning utilization minutes failed")
