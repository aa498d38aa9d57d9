"""Clocks the test moves.

:class:`StoreClock` is the store's ``clock=`` (datetimes); :class:`SecondsClock` is a float
clock (the agent loop's ``clock=``/``sleep=``, the simulated NVML's ``clock=``) whose ``sleep``
moves time instead of waiting; :class:`ClockFile` is a float clock kept in a file, so a pool
service run as a process (:func:`clocked_service_python`) reads the test's time too (the
reclaim rig of :mod:`tests.fakes.reclaim`).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path

#: When a store test's day begins (its assertions name times from here).
STORE_T0 = datetime(2026, 3, 2, 9, 0, 0)


class StoreClock:
    """The store's ``clock=``: a naive UTC datetime that moves only when the test says."""

    def __init__(self, now: datetime = STORE_T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kw: float) -> None:
        """Move on by ``timedelta(**kw)``."""
        self.now += timedelta(**kw)


#: The agent tests' wall time (seconds since the epoch).
AGENT_T0 = 1_700_000_000.0


class SecondsClock:
    """A float clock (``time.time``-like) that moves only when the test, or a fake sleep, moves
    it: pass ``clock=clock, sleep=clock.sleep`` and a loop's backoffs take no real time."""

    def __init__(self, now: float = AGENT_T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move on by ``seconds``."""
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of this clock's time: no real time passes."""
        assert seconds >= 0
        self.now += seconds


class ClockFile:
    """A float clock (epoch seconds) that moves only when the test says, kept in a file so the
    pool service process reads the same time (:func:`clocked_service_python`)."""

    def __init__(self, path: Path, now: float) -> None:
        self.path = path
        self.now = now
        self._write()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move on by ``seconds`` (never back)."""
        assert seconds >= 0
        self.now += seconds
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(repr(self.now))
        tmp.replace(self.path)  # atomic: a reader never sees half a number

    def ahead(self) -> float:
        """Seconds this clock is ahead of the real one."""
        return self.now - time.time()


#: Run the pool service with its store reading the time from a :class:`ClockFile`: a subclass
#: whose :meth:`PoolService.make_store` gives the store that ``clock=`` (which every decision,
#: lease time and notice is taken from).
_CLOCKED_SERVICE = """
import sys
from datetime import datetime, timezone
from pathlib import Path

from jupyterhub_gpupool.service.app import PoolService
from jupyterhub_gpupool.store import Store

CLOCK = Path({path!r})


def clock():
    return datetime.fromtimestamp(float(CLOCK.read_text()), timezone.utc).replace(tzinfo=None)


class ClockedPoolService(PoolService):
    def make_store(self, engine):
        return Store(engine, self.catalog, clock=clock, **self.store_options())


# argv: -c -m jupyterhub_gpupool.cli service ... (HubEnv runs the service so)
ClockedPoolService.launch_instance(sys.argv[4:])
"""


def clocked_service_python(clock: ClockFile) -> tuple[str, ...]:
    """``HubEnv.python`` for a pool service on ``clock`` (decisions must run in its thread:
    ``--PoolService.decisions=thread``, so the store with that clock makes them)."""
    import sys

    return (sys.executable, "-c", _CLOCKED_SERVICE.format(path=str(clock.path)))
