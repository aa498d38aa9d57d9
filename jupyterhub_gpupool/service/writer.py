"""The one write path: every command that changes state runs here, off the event loop.

Handlers and background loops ``await writer.run(commands.Release(lease_id, actor=...))``
(``pool/commands.py``); reads go to the store directly. One thread applies the commands in
order, each by the store method its type names (``store/dispatch.py``). Under load, many
allocate/release requests wait for the pool lock at once: consecutive commands whose type is
``batchable`` (those that refuse before they write) run in one transaction (one lock, one
version bump, one commit) instead of one each,
which multiplies throughput; every other write (inventory, quotas, node actions, MIG results,
minutes) runs in a transaction of its own, in the same queue. Moving the database work off the
event loop lets tornado parse and authenticate the next requests meanwhile. A change is still
answered only after its commit.

``ProcessBatchWriter`` runs the same batches in a child process with its own ``Store``: in one
process, HTTP handling and the decisions share one interpreter lock (one core); in two they use
two. It needs no thread of its own: the event loop sends a batch down the pipe when the child
is idle and reads the answer when the pipe wakes it. The service's own ``Store`` stays for
everything else and follows the child's commits as another replica would, told of each batch
the child committed (``Store.commits_elsewhere``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing as mp
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError

from ..pool.commands import Command
from ..store import Store, StoreError

log = logging.getLogger("jupyterhub_gpupool.writer")


def settle_garbage_collector() -> None:
    """Keep what start-up made (modules, mappings, the allocator), which lives as long as the
    process, out of the garbage collector's full passes: they stalled request handling for tens
    of milliseconds now and then (the p99 of the load benchmark). The young generation is
    collected less often (each pass is cheap; there are fewer of them)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


class Progress:
    """How long the writer has owed answers without giving any: the health check's view.

    A writer that is wedged (a transaction waiting on a lock forever, a hung store process)
    leaves the port open and the event loop free, so only this tells it: calls are
    outstanding and none has been answered for a while. Counted from the later of the first
    outstanding call and the last answer, so a steady stream of work never looks stuck.
    Thread-safe (``BatchWriter`` answers from its own thread).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._outstanding = 0
        self._since = clock()

    def submitted(self) -> None:
        """A call joined the queue."""
        with self._lock:
            if self._outstanding == 0:
                self._since = self._clock()
            self._outstanding += 1

    def answered(self, n: int) -> None:
        """``n`` calls were answered (or failed)."""
        with self._lock:
            self._outstanding = max(0, self._outstanding - n)
            self._since = self._clock()

    def stalled_for(self) -> float:
        """Seconds without an answer while calls wait (0 when nothing is owed)."""
        with self._lock:
            if self._outstanding == 0:
                return 0.0
            return max(0.0, self._clock() - self._since)

    @property
    def outstanding(self) -> int:
        """Calls submitted and not answered yet."""
        return self._outstanding


class _Failed:
    """A batch that failed as a whole (its exception is raised in every caller)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _deliver(pairs: list[tuple[asyncio.Future[Any], Any]]) -> None:
    """Settle a batch's futures (on their loop): results, refusals, and each call of a batch
    that failed as a whole; a caller that gave up (cancelled) or whose loop closed is gone."""
    for future, result in pairs:
        if future.done():
            continue
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            if isinstance(result, _Failed):
                future.set_exception(result.error)
            else:
                future.set_result(result)


def _batchable(command: Command) -> bool:
    return type(command).batchable


def _check(command: object) -> Command:
    """Refuse anything but a pool command (a programming error, raised in the caller)."""
    if not isinstance(command, Command) or type(command) is Command:
        raise ValueError(f"not a store write (a pool command): {command!r}")
    return command


def apply_commands(
    store: Store, batch: list[Command], events: list[tuple[str, dict[str, Any]]] | None = None
) -> list[Any]:
    """Run the commands of ``batch`` in order: each run of consecutive batchable ones in one
    transaction, every other command alone. Returns each one's result, refusal, or
    ``_Failed`` (its transaction rolled back; the events it produced, when collected in
    ``events``, are dropped). A database that is down answers ``store_unavailable``.
    """
    results: list[Any] = []
    i = 0
    while i < len(batch):
        j = i + 1
        if _batchable(batch[i]):
            while j < len(batch) and _batchable(batch[j]):
                j += 1
        segment, mark = batch[i:j], len(events) if events is not None else 0
        try:
            if j - i == 1 and not _batchable(segment[0]):
                results.append(store.run_solo(segment[0]))
            else:
                results += store.run_batch(segment)
        except Exception as e:  # nothing of the segment was committed
            log.warning("%d pool change(s) failed and were rolled back: %s", len(segment), e)
            if events is not None:
                del events[mark:]
            failed: Any = _Failed(e)
            if isinstance(e, (OperationalError, InterfaceError)):  # away, not bad data
                failed = StoreError(
                    "store_unavailable", "the pool database is unavailable; try again"
                )
            results += [failed] * len(segment)
        i = j
    return results


#: A queued command and where its answer goes (the caller's loop and future).
_Queued = tuple[Command, tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]"]]
#: A pending command of the process writer and its caller's future.
_Pending = tuple[Command, "asyncio.Future[Any]"]


class BatchWriter:
    """A single writer thread in front of the store's writes."""

    def __init__(self, store: Store, max_batch: int = 64) -> None:
        self.store = store
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[_Queued | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="gpupool-writer", daemon=True)
        #: what the health check reads
        self.progress = Progress()
        #: Called as observe_batch(calls, seconds) after each batch, on the writer's thread
        #: (the service's metrics: how well group commit batches under load).
        self.observe_batch: Callable[[int, float], None] | None = None

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def stop(self) -> None:
        """Finish what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout=30)

    async def run(self, command: Command) -> Any:
        """Run ``command`` in the next batch; its refusal is raised here."""
        _check(command)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self.progress.submitted()
        self._queue.put((command, (loop, future)))
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    def _settle(self, batch: list[_Queued], results: list[Any]) -> None:
        """Hand the results to their loops: one thread-safe wake-up per loop and batch, not one
        per request (each wake-up is a pipe write and a hand-over of the interpreter lock)."""
        self.progress.answered(len(batch))
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
        for (_, (loop, future)), result in zip(batch, results, strict=True):
            by_loop.setdefault(loop, []).append((future, result))
        for loop, pairs in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_deliver, pairs)

    def _take(self) -> list[_Queued] | None:
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
            began = time.perf_counter()
            try:
                results = self._apply(batch)
            except Exception as e:  # the batch never reached the store
                log.warning("%d pool changes failed: %s", len(batch), e)
                results = [_Failed(e)] * len(batch)
            self._settle(batch, results)
            if self.observe_batch is not None:
                try:
                    self.observe_batch(len(batch), time.perf_counter() - began)
                except Exception:
                    log.exception("The writer's batch observer failed")

    def _apply(self, batch: list[_Queued]) -> list[Any]:
        """Run one batch; returns each call's result, refusal or ``_Failed``."""
        return apply_commands(self.store, [command for command, _ in batch])


class ProcessBatchWriter:
    """The batches run by a child process (``spawn``: a clean interpreter, no inherited threads
    or database connections) that has its own ``Store`` on the same database.

    The writer itself lives on the event loop, not on a thread: a call joins the pending list
    and, when the child is idle, the batch goes to it at the end of the loop's current pass (a
    ``call_soon``), so the requests read together are decided together; the child's answer
    wakes the loop through the pipe (``add_reader``), which settles the batch's futures and at
    once sends what piled up meanwhile. A writer thread in the service had to win the
    interpreter lock from the busy loop at both hand-overs, which Python grants only every
    5 ms (``sys.getswitchinterval``): under load the loop and the child took turns (all 32
    clients' requests in one batch, then the child idle while the loop answered them), and
    neither ran while the other did.

    The store's listeners (metrics, the telemetry loop's wake-ups) are called here in the
    service with the events each batch produced, after its commit. The child knows the pool
    config file as the service loaded it (a reset quota returns to it). A child that dies fails
    the batch it had (``503 store_restarting``: whether it was committed is unknown, as after a
    crash of the whole service) and is started again.
    """

    def __init__(
        self, store: Store, db_url: str, options: dict[str, Any], max_batch: int = 64
    ) -> None:
        self.store = store
        self.db_url = db_url
        self.options = options
        self.max_batch = max_batch
        #: Called as observe_batch(calls, seconds) after each batch, on the event loop.
        self.observe_batch: Callable[[int, float], None] | None = None
        self.restarts = 0
        self._ctx = mp.get_context("spawn")
        self._conn: Any = None
        self._child: Any = None
        #: The loop the writer serves (the first caller's; another may take over when idle).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[_Pending] = []
        self._inflight: list[_Pending] | None = None
        self._began = 0.0
        self._scheduled = False
        self._drained: asyncio.Future[Any] | None = None
        self._stopped = False
        #: what the health check reads
        self.progress = Progress()

    def start(self) -> None:
        """Start the child."""
        self._stopped = False
        self._spawn()

    def _spawn(self) -> None:
        parent, child = self._ctx.Pipe()
        self._child = self._ctx.Process(
            target=store_process,
            args=(
                child,
                self.db_url,
                self.options,
                log.getEffectiveLevel(),
                self.store.file_config,
            ),
            name="gpupool-store",
            daemon=True,
        )
        self._child.start()
        child.close()
        self._conn = parent

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._child.pid if self._child is not None else None

    async def run(self, command: Command) -> Any:
        """Run ``command`` in the next batch; its refusal is raised here."""
        _check(command)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._adopt(loop)
        future: asyncio.Future[Any] = loop.create_future()
        self.progress.submitted()
        self._pending.append((command, future))
        if self._inflight is None and not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._dispatch)  # after the requests read in this pass
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve ``loop`` from now on (tests run one ``asyncio.run`` after another): what the
        previous one left in flight is received first."""
        old = self._loop
        if old is not None and not old.is_closed() and old.is_running():
            raise RuntimeError("the pool's process writer serves another running event loop")
        self._finish_blocking()
        self._loop, self._scheduled = loop, False

    def _send_next(self) -> bool:
        """Send the next pending calls (up to ``max_batch``) to the idle child; False when
        the child was gone (their failures are settled, another child started)."""
        batch = self._pending[: self.max_batch]
        del self._pending[: self.max_batch]
        self._inflight, self._began = batch, time.perf_counter()
        try:
            self._conn.send([command for command, _ in batch])
        except (EOFError, OSError) as e:
            self._settle(batch, self._restart(e))
            return False
        return True

    def _dispatch(self) -> None:
        """On the loop: send what is pending to the idle child; its answer wakes the loop."""
        self._scheduled = False
        if self._inflight is not None or not self._pending:
            return
        assert self._loop is not None
        if self._send_next():
            self._loop.add_reader(self._conn.fileno(), self._answered)
        elif self._pending:
            self._scheduled = True
            self._loop.call_soon(self._dispatch)

    def _answered(self) -> None:
        """On the loop: the child answered the batch in flight."""
        assert self._loop is not None
        self._loop.remove_reader(self._conn.fileno())
        self._settle(self._inflight or [], self._receive())
        if self._pending:
            self._dispatch()  # what piled up meanwhile goes at once: the child is idle
        elif self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _receive(self) -> list[Any]:
        """The in-flight batch's results: the child's answer, or every call's failure."""
        batch = self._inflight or []
        try:
            outcome: list[Any]
            outcome, events = self._conn.recv()
        except (EOFError, OSError) as e:
            return self._restart(e)
        self.store.commits_elsewhere()  # the service's views catch up before they answer
        for kind, data in events:
            for listener in self.store.listeners:
                try:
                    listener(kind, data)
                except Exception:
                    log.exception("A store listener failed on %s", kind)
        if self.observe_batch is not None:
            try:
                self.observe_batch(len(batch), time.perf_counter() - self._began)
            except Exception:
                log.exception("The writer's batch observer failed")
        return outcome  # results, refusals (which pickle themselves) and _Failed

    def _restart(self, error: BaseException) -> list[Any]:
        """The child is gone: start another (unless stopping); the batch it had fails."""
        n = len(self._inflight or [])
        if self._stopped:
            return [StoreError("store_unavailable", "the pool service is stopping")] * n
        log.error("The pool store process died (%s); starting it again", error)
        self.restarts += 1
        with contextlib.suppress(Exception):
            self._child.join(timeout=5)
        self._spawn()
        failed = StoreError(
            "store_restarting",
            "the pool's store process restarted; whether this change was made is unknown: "
            "read the lease back or try again",
        )
        return [failed] * n

    def _settle(self, batch: list[_Pending], results: list[Any]) -> None:
        self._inflight = None
        self.progress.answered(len(batch))
        _deliver([(future, result) for (_, future), result in zip(batch, results, strict=True)])

    def _finish_blocking(self) -> None:
        """Receive the batch in flight and run what is pending, blocking (at stop, or when the
        loop that sent them is gone)."""
        while self._inflight is not None or self._pending:
            if self._inflight is None:
                if not self._send_next():
                    continue
            elif self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._conn.fileno())
            inflight = self._inflight
            if inflight is None:  # never: sent just now, or already in flight
                continue
            self._settle(inflight, self._receive())

    async def drain(self) -> None:
        """Wait until nothing is pending or in flight."""
        while self._inflight is not None or self._pending:
            self._drained = asyncio.get_running_loop().create_future()
            if self._inflight is None and not self._scheduled:
                self._dispatch()
            if self._inflight is not None or self._pending:
                await self._drained

    def stop(self) -> None:
        """Finish what is pending, then stop the child. From another thread than the running
        loop's, the loop finishes it; on the loop's own thread (or with no loop running), this
        waits for the child directly."""
        loop = self._loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is not None and loop.is_running() and here is not loop:
            asyncio.run_coroutine_threadsafe(self.drain(), loop).result(timeout=60)
        else:
            self._finish_blocking()
        self._stopped = True
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._child.join(timeout=30)
        if self._child.is_alive():
            self._child.kill()


def store_process(
    conn: Any, db_url: str, options: dict[str, Any], level: int, file_config: Any = None
) -> None:
    """The child: apply batches from ``conn`` until told to stop or the service is gone."""
    from ..dbutil import make_engine
    from ..pool.catalog import default_catalog

    # Ctrl-C reaches the whole process group, and so does SIGTERM from a process manager that
    # signals every process of a service (systemd's default, a test's killpg): the service
    # stops us in order (None) after its last batch, or we see EOF when it is gone
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=level)
    store = Store(make_engine(db_url), default_catalog(), **options, file_config=file_config)
    events: list[tuple[str, dict[str, Any]]] = []
    store.listeners.append(lambda kind, data: events.append((kind, data)))
    with store.locked():  # build the allocator now, then keep it out of full GC passes
        pass
    settle_garbage_collector()
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return  # the service is gone
        if batch is None:
            return
        events.clear()
        outcome = [
            _Failed(RuntimeError(f"{type(r.error).__name__}: {r.error}"))  # may not pickle
            if isinstance(r, _Failed)
            else r
            for r in apply_commands(store, batch, events)
        ]
        try:
            conn.send((outcome, list(events)))
        except (EOFError, OSError):
            return


#: Either writer: what handlers and loops hold (``writer.run``).
Writer = BatchWriter | ProcessBatchWriter
