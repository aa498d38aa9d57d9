"""The idle signal: three sources read over a window, and the table of what each combination means.

A window of a lease is read as a GPU state (utilization on whole GPUs and shares — for a share,
its own processes' utilization where the GPU gives per-process samples, else the whole GPU's —,
GPM activity on Hopper-and-newer MIG, processes and memory on older MIG — NVML has no MIG
utilization), a
kernel state (the user's server's ``/api/kernels``) and the user's presence (input in the lab,
else the hub's ``last_activity``; open connections). :data:`CASES` says, for each of the 27
combinations, whether the window resets the idle count or adds to which one; the docs render
the same rows and the tests check every one. Missing or old inputs are *stale*: nothing counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .catalog import GpuModel
from .model import Offer

#: How a lease's GPU reports activity: utilization (whole GPUs, and shares on a GPU without
#: per-process samples), the share's own processes' utilization (``process``: per-process
#: samples, Maxwell and newer outside MIG), GPM SM activity (MIG on Hopper and newer), or only
#: processes and memory in use (MIG on older GPUs).
SIGNAL_SOURCES = ("utilization", "process", "gpm", "memory")
#: GPU architectures whose driver gives per-process utilization samples outside MIG (nvml.h,
#: ``nvmlDeviceGetProcessUtilization``: "For Maxwell or newer fully supported devices").
PROCESS_UTIL_ARCHITECTURES = frozenset(
    ("maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")
)
GPU_STATES = ("busy", "idle", "unknown")
#: ``unknown``: the kernels API refused the reclaimer's token (or answered nonsense).
KERNEL_STATES = ("busy", "idle", "unknown")
#: ``connected``: a lab tab is open but nobody typed or clicked in the window (a tab left open).
PRESENCE_STATES = ("present", "connected", "absent")
#: ``active`` resets every count; ``idle`` counts towards ``idle_timeout`` (or the pressure
#: timeout); ``idle-cpu`` counts towards the longer ``cpu_busy_timeout`` only.
VERDICTS = ("active", "idle", "idle-cpu")
#: Below this (MiB) with no process count, a MIG instance without activity metrics is unused.
MIG_IDLE_MEMORY_MIB = 64
#: A change of at least this much memory (MiB) within a window counts as GPU activity where
#: nothing better is known (MIG without GPM).
MIG_MEMORY_DELTA_MIB = 256


@dataclass(frozen=True)
class Case:
    """One row of the cases table: the three signals of a window and what the window counts as."""

    gpu: str
    kernel: str
    presence: str
    verdict: str
    why: str


def _cases() -> tuple[Case, ...]:
    rows = []
    for gpu in GPU_STATES:
        for kernel in KERNEL_STATES:
            for presence in PRESENCE_STATES:
                rows.append(Case(gpu, kernel, presence, *_rule(gpu, kernel, presence)))
    return tuple(rows)


def _rule(gpu: str, kernel: str, presence: str) -> tuple[str, str]:
    if gpu == "busy":
        if kernel == "busy":
            return "active", "computing on the GPU: never reclaimed"
        return (
            "active",
            "the GPU is working (a process outside the kernel, or a neighbour on a share read "
            "from the whole GPU)",
        )
    if presence == "present":
        return "active", "the user is at the keyboard"
    if gpu == "unknown":  # MIG without GPM: processes hold memory, activity unknowable
        if kernel == "idle":
            return "idle", "no kernel runs, so nothing drives the GPU"
        if kernel == "busy":
            return "active", "the kernel may be computing on the GPU; the GPU cannot tell"
        return "active", "neither the GPU nor the kernel can be read: never act"
    if kernel == "idle":
        return "idle", "GPU and kernel idle, nobody at the keyboard (an open tab is not presence)"
    if kernel == "busy":
        return "idle-cpu", "the kernel computes on the CPU with the GPU idle: longer timeout"
    return "idle-cpu", "the GPU is idle; the kernel cannot be read, so it counts as busy on CPU"


#: Every combination of the three signals (3 x 3 x 3 rows) and what the reclaimer does with it.
CASES: tuple[Case, ...] = _cases()
_CASE = {(c.gpu, c.kernel, c.presence): c for c in CASES}


def classify(gpu: str, kernel: str, presence: str) -> Case:
    """The row of :data:`CASES` for one window's signals."""
    return _CASE[(gpu, kernel, presence)]


def cases_markdown() -> str:
    """The cases table as Markdown (the explanation page carries this exact text)."""
    lines = ["| GPU | kernel | user | window counts as | why |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {c.gpu} | {c.kernel} | {c.presence} | {c.verdict} | {c.why} |" for c in CASES]
    return "\n".join(lines)


@dataclass(frozen=True)
class GpuSample:
    """One telemetry sample of the lease's device (a GPU, a share's GPU or a MIG instance).

    ``util`` is a percentage or ``None`` where NVML cannot know it (MIG without GPM, a first
    GPM reading); ``None`` is never read as 0 %.
    """

    ts: float
    util: float | None
    memory_used_mib: int | None = None
    processes: int | None = None
    #: A GPU's utilization by lease, from per-process samples: ``(lease id, %)`` pairs for the
    #: leases with processes on it (a lease not listed has none: 0 %). ``None`` where the GPU
    #: gives no per-process samples or an active process could not be tied to a lease.
    lease_util: tuple[tuple[str, float], ...] | None = None


@dataclass(frozen=True)
class KernelView:
    """The kernels of the user's server as last read (``GET /api/kernels``).

    ``state`` is ``busy`` if any kernel's ``execution_state`` is busy, ``idle`` if all are
    idle (or there are none), ``unknown`` when the API refused the token. ``last_activity``
    is the newest kernel ``last_activity``.
    """

    observed_at: float
    state: str
    last_activity: float | None = None


@dataclass(frozen=True)
class PresenceView:
    """The user as last seen: ``last_input`` is the last human interaction (keyboard or
    pointer in a visible lab tab, as the server's jupyterlab-gpupool reports it; without the
    lab package, nothing: the hub's ``last_activity`` is not input, since the proxy stamps it on
    every request, an open tab's polling and the reclaimer's own reads included),
    ``connections`` the open kernel connections."""

    observed_at: float
    last_input: float | None = None
    connections: int = 0
    #: How late an input may reach the pool (the lab reports at most once a minute): an input
    #: this long before a window still counts in it, or typing once a minute would read as
    #: absent in every window that closed before its report arrived.
    lag: float = 0.0


@dataclass(frozen=True)
class Signals:
    """What was seen of one lease over the window ``[start, end]``."""

    start: float
    end: float
    source: str = "utilization"
    gpu: tuple[GpuSample, ...] = ()
    kernel: KernelView | None = None
    presence: PresenceView | None = None


def gpu_signal_source(offer: Offer, model: GpuModel) -> str:
    """Which GPU signal a lease of ``offer`` on ``model`` has (see :data:`SIGNAL_SOURCES`); for
    a share, ``process`` is what the GPU can give (the reader may still fall back to the whole
    GPU, see :func:`share_samples`)."""
    if offer.kind == "shared":
        return "process" if model.architecture in PROCESS_UTIL_ARCHITECTURES else "utilization"
    if offer.kind != "mig":
        return "utilization"
    return "gpm" if model.gpm_supported else "memory"


def share_samples(samples: Sequence[GpuSample], lease: str) -> tuple[GpuSample, ...]:
    """A share's own view of its GPU's samples: where a sample carries per-process figures
    (``lease_util``), its utilization is the lease's own (0 % when the lease has no active
    process), so a busy neighbour on the same GPU does not keep an idle share; a sample without
    them keeps the whole GPU's utilization (the fallback: any activity on the GPU counts)."""
    out = []
    for s in samples:
        if s.lease_util is None:
            out.append(s)
        else:
            own = dict(s.lease_util).get(lease, 0.0)
            out.append(GpuSample(s.ts, own, s.memory_used_mib, s.processes))
    return tuple(out)


def share_signal_source(samples: Sequence[GpuSample]) -> str:
    """``process`` when every sample of a share's window has per-process figures, else
    ``utilization`` (the whole GPU's, for some or all of the window)."""
    if samples and all(s.lease_util is not None for s in samples):
        return "process"
    return "utilization"


def gpu_activity(samples: Sequence[GpuSample], threshold: float) -> str:
    """``busy``, ``idle`` or ``unknown`` for the window's samples.

    Utilization (or GPM activity) above ``threshold`` anywhere is busy. Samples without it fall
    back on processes and memory: a change of :data:`MIG_MEMORY_DELTA_MIB` is busy, no process
    and almost no memory (as far as each is known) is idle, and a process or steady memory held
    is unknown.
    """
    known = [s.util for s in samples if s.util is not None]
    if any(u > threshold for u in known):
        return "busy"
    rest = [s for s in samples if s.util is None]
    if not rest:
        return "idle" if known else "unknown"
    mems = [s.memory_used_mib for s in rest if s.memory_used_mib is not None]
    if len(mems) >= 2 and max(mems) - min(mems) >= MIG_MEMORY_DELTA_MIB:
        return "busy"
    if all(_unused(s) for s in rest):
        return "idle"
    return "unknown"


def _unused(s: GpuSample) -> bool:
    """No process and (almost) no memory: what is known must all say unused, so memory held
    without a process NVML lists (a context the listing missed) is never read as idle."""
    if s.processes is None and s.memory_used_mib is None:
        return False
    no_process = s.processes is None or s.processes == 0
    no_memory = s.memory_used_mib is None or s.memory_used_mib <= MIG_IDLE_MEMORY_MIB
    return no_process and no_memory


def kernel_activity(kernel: KernelView, start: float) -> str:
    """A kernel busy now, or active since ``start`` (it ran something in the window), is busy."""
    if kernel.state not in KERNEL_STATES or kernel.state == "unknown":
        return "unknown"
    if kernel.state == "busy" or (
        kernel.last_activity is not None and kernel.last_activity >= start
    ):
        return "busy"
    return "idle"


def presence_of(presence: PresenceView, start: float) -> str:
    """Input in the window is presence; an open tab without input is only ``connected``."""
    if presence.last_input is not None and presence.last_input + presence.lag >= start:
        return "present"
    return "connected" if presence.connections > 0 else "absent"


#: The lab's longest delay between an input and its report (``GPUPoolLab.presence_interval``
#: is at most this): a reported input counts for this long after it as well.
LAB_REPORT_LAG = 60.0
#: The longest "idle for" a lab's presence report may carry: a lab reports at most once a
#: minute, so an older input is not news (and a larger figure is a client's mistake).
MAX_REPORTED_IDLE = 600.0


def reported_input(previous: float | None, now: float, idle_for: float) -> float:
    """The newest input a lab reported: ``idle_for`` seconds before ``now`` (the pool's clock,
    so a browser's clock never matters); a late report never moves it back."""
    at = now - min(max(idle_for, 0.0), MAX_REPORTED_IDLE)
    return at if previous is None else max(previous, at)


def lab_presence(seen: PresenceView | None, last_input: float | None) -> PresenceView | None:
    """Where the server's lab reports input, presence is that input alone, counted for
    ``LAB_REPORT_LAG`` after it (the report may come that late): of what the reclaimer saw,
    only the time and the open connections are kept (``None``: not seen, which stays stale)."""
    if seen is None:
        return None
    return PresenceView(seen.observed_at, last_input, seen.connections, LAB_REPORT_LAG)


def stale_reason(signals: Signals | None, now: float, stale_after: float) -> str | None:
    """Why these signals must not be acted on (``None``: they are fresh and complete)."""
    if signals is None:
        return "no signals for this lease"
    if now - signals.end > stale_after:
        return f"the window ended {now - signals.end:.0f} s ago"
    if not signals.gpu:
        return "no GPU telemetry in the window"
    newest = max(s.ts for s in signals.gpu)
    if now - newest > stale_after:
        return f"GPU telemetry is {now - newest:.0f} s old"
    if signals.kernel is None:
        return "the user's server was not reached"
    if now - signals.kernel.observed_at > stale_after:
        return f"the kernel state is {now - signals.kernel.observed_at:.0f} s old"
    if signals.presence is None:
        return "the hub was not reached"
    if now - signals.presence.observed_at > stale_after:
        return f"the hub's activity data is {now - signals.presence.observed_at:.0f} s old"
    return None


def read_window(signals: Signals, threshold: float) -> Case:
    """The cases-table row of a fresh window (``threshold``: the GPU-idle utilization, %)."""
    assert signals.kernel is not None and signals.presence is not None
    return classify(
        gpu_activity(signals.gpu, threshold),
        kernel_activity(signals.kernel, signals.start),
        presence_of(signals.presence, signals.start),
    )
