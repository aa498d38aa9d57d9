"""A day of notebook sessions: a seeded generator with stated distributions, and a file format.

A *session* is one user's server for one offer, described by *segments* of activity in seconds
since midnight: whether the GPU computes, whether the kernel is busy, whether the user interacts
(``input``) and whether a lab tab is open (``tab``). Gaps between segments are the user away
with the tab closed. ``stop``: the user stops the server when the last segment ends; otherwise
it stays up, idle with the tab closed, until the end of the day. ``kernel_visible: false``
means the server's kernels API refuses the reclaimer's token (it reads as ``unknown``).

Files (``--sessions FILE``):

* **JSONL** (``.jsonl``/``.json``): one session per line,
  ``{"id", "user", "offer", "stop", "kernel_visible"?, "segments": [{"start", "end", "gpu",
  "kernel", "input", "tab"}, ...]}``;
* **CSV** (``.csv``): one segment per row, columns ``session,user,offer,stop,start,end,gpu,
  kernel,input,tab`` and optionally ``kernel_visible``; the session columns must agree on every
  row of a session. Booleans are ``true/false``, ``1/0`` or ``yes/no``; ``kernel`` is ``busy`` or
  ``idle``.

Every error is one line naming the file, the row (line) and the column.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DAY = 86400.0


@dataclass(frozen=True)
class Segment:
    """One stretch of a session's activity, ``[start, end)`` in seconds since midnight."""

    start: float
    end: float
    gpu: bool
    kernel: str
    input: bool
    tab: bool


@dataclass(frozen=True)
class Session:
    """One server: who, which offer, what it does when, and how it ends."""

    id: str
    user: str
    offer: str
    segments: tuple[Segment, ...]
    stop: bool = True
    kernel_visible: bool = True

    @property
    def start(self) -> float:
        return self.segments[0].start

    @property
    def end(self) -> float:
        """When the user stops it (the end of the day if they never do)."""
        return self.segments[-1].end if self.stop else DAY


# -- the generator -------------------------------------------------------------------------

#: The offers users pick, by share of sessions (see ``simulate.reclaim.OFFERS``).
OFFER_MIX = {
    "h100": 0.30,
    "a100-1g": 0.15,
    "a100-3g": 0.10,
    "h100-1g": 0.12,
    "h100-3g": 0.08,
    "l4-quarter": 0.15,
    "l4-half": 0.10,
}
#: Sessions per user per day: 0, 1, 2 or 3 with these probabilities (mean 1.35).
SESSIONS_PER_USER = (0.15, 0.45, 0.30, 0.10)
#: Block kinds a session is made of, with their probabilities.
BLOCKS = {"interactive": 0.45, "cpu": 0.15, "silent": 0.15, "away": 0.25}
#: How a session ends: the user stops it, leaves a tab open, or walks away with it closed.
ENDINGS = {"stop": 0.40, "tab-open": 0.35, "tab-closed": 0.25}


def _pick(rng: random.Random, table: Mapping[str, float]) -> str:
    return rng.choices(list(table), weights=list(table.values()))[0]


def tidal_arrival(rng: random.Random) -> float:
    """Arrivals rise in the morning and after lunch: 45 % around 10:00, 40 % around 14:00 (both
    normal, sigma 75 min), 15 % uniform over the day; clipped to 00:00-22:00."""
    u = rng.random()
    if u < 0.45:
        t = rng.gauss(10 * 3600, 4500)
    elif u < 0.85:
        t = rng.gauss(14 * 3600, 4500)
    else:
        t = rng.uniform(0, DAY)
    return min(max(t, 0.0), 22 * 3600.0)


def _exp(rng: random.Random, mean_min: float, low_min: float = 0.5) -> float:
    return max(low_min, rng.expovariate(1 / mean_min)) * 60


def _block(rng: random.Random, kind: str, t: float) -> list[Segment]:
    """One block of activity starting at ``t`` (durations in the docstring of ``generate``)."""
    out: list[Segment] = []
    if kind == "interactive":
        end = t + rng.uniform(20, 90) * 60
        while t < end:
            burst = _exp(rng, 4)
            out.append(Segment(t, t + burst, True, "busy", True, True))
            t += burst
            think = _exp(rng, 6)
            out.append(Segment(t, t + think, False, "idle", True, True))
            t += think
        return out
    if kind == "away":
        dur = rng.uniform(15, 120) * 60
        return [Segment(t, t + dur, False, "idle", False, rng.random() < 0.7)]
    start = Segment(t, t + 120, False, "idle", True, True)  # the user starts the long cell
    t += 120
    if kind == "cpu":
        dur = min(6 * 3600, 50 * 60 * math.exp(rng.gauss(0, 0.6)))
        out = [start, Segment(t, t + dur, False, "busy", False, rng.random() < 0.6)]
        if rng.random() < 0.6:  # preprocessing, then the GPU phase
            out += _block(rng, "silent", t + dur)
        return out
    dur = rng.uniform(1, 4) * 3600
    return [start, Segment(t, t + dur, True, "busy", False, rng.random() < 0.4)]


def generate(users: int = 200, seed: int = 1) -> list[Session]:
    """A seeded day of sessions for ``users`` users (``u000`` …).

    Per user: 0-3 sessions (:data:`SESSIONS_PER_USER`), each at a :func:`tidal_arrival`, for an
    offer drawn from :data:`OFFER_MIX`. A session is blocks until its working time (lognormal,
    median 3 h, sigma 0.6, 30 min to 9 h) is used up: *interactive* (20-90 min of GPU bursts,
    exponential mean 4 min, between thinking, mean 6 min, typing in an open tab), *cpu* (a
    kernel busy on the CPU with the GPU idle, lognormal median 50 min, sigma 0.6; the user away,
    tab open 60 %; followed by a silent GPU phase 60 % of the time), *silent* (a training cell
    of 1-4 h, uniform, with no output and no input; tab open 40 %) and *away* (15-120 min,
    uniform; tab open 70 %). Blocks follow :data:`BLOCKS`. It ends per :data:`ENDINGS`: stopped,
    left with a tab open until midnight, or left with the tab closed. 5 % of servers refuse the
    reclaimer's token for the kernels API.
    """
    rng = random.Random(seed)
    sessions: list[Session] = []
    for u in range(users):
        user = f"u{u:03d}"
        n = rng.choices(range(len(SESSIONS_PER_USER)), weights=SESSIONS_PER_USER)[0]
        for k in range(n):
            t = start = tidal_arrival(rng)
            work = min(9 * 3600, max(1800, 3 * 3600 * math.exp(rng.gauss(0, 0.6))))
            segments = [Segment(t, t + 120, False, "idle", True, True)]  # spawn and open
            t += 120
            while t - start < work and t < DAY:
                blk = _block(rng, _pick(rng, BLOCKS), t)
                segments += blk
                t = blk[-1].end
            ending = _pick(rng, ENDINGS)
            if ending == "tab-open" and t < DAY:
                segments.append(Segment(t, DAY, False, "idle", False, True))
            segments = [
                Segment(s.start, min(s.end, DAY), s.gpu, s.kernel, s.input, s.tab)
                for s in segments
                if s.start < DAY
            ]
            sessions.append(
                Session(
                    f"{user}-s{k}",
                    user,
                    _pick(rng, OFFER_MIX),
                    tuple(segments),
                    stop=ending == "stop",
                    kernel_visible=rng.random() >= 0.05,
                )
            )
    return sorted(sessions, key=lambda s: (s.start, s.id))


# -- files ---------------------------------------------------------------------------------

_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}
SEGMENT_FIELDS = ("start", "end", "gpu", "kernel", "input", "tab")
CSV_COLUMNS = ("session", "user", "offer", "stop", *SEGMENT_FIELDS)


class SessionFileError(ValueError):
    """A bad session file: one line naming the file, the row and the column."""

    def __init__(self, path: Path | str, row: int, column: str, message: str) -> None:
        super().__init__(f"{path}:{row}: {column}: {message}")


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError("must be true or false")


def _time(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("must be a number of seconds")
    try:
        t = float(value)  # type: ignore[arg-type]  # any cell: float() refusing it is the check
    except (TypeError, ValueError):
        raise ValueError(f"must be a number of seconds, got {value!r}") from None
    if not math.isfinite(t) or not 0 <= t <= DAY:
        raise ValueError(f"must be within the day (0 to {DAY:.0f} s), got {value!r}")
    return t


def _segment(raw: Mapping[str, object], path: Path, row: int, prefix: str) -> Segment:
    values: dict[str, object] = {}
    for name in SEGMENT_FIELDS:
        col = f"{prefix}{name}"
        if name not in raw or raw[name] in (None, ""):
            raise SessionFileError(path, row, col, "missing")
        try:
            if name in ("start", "end"):
                values[name] = _time(raw[name])
            elif name == "kernel":
                if raw[name] not in ("busy", "idle"):
                    raise ValueError(f"must be busy or idle, got {raw[name]!r}")
                values[name] = raw[name]
            else:
                values[name] = _bool(raw[name])
        except ValueError as e:
            raise SessionFileError(path, row, col, str(e)) from None
    seg = Segment(**values)  # type: ignore[arg-type]  # each value checked by its field above
    if seg.end <= seg.start:
        raise SessionFileError(path, row, f"{prefix}end", "must be after start")
    return seg


def _session(
    sid: str, head: Mapping[str, object], segs: Sequence[tuple[int, str, Segment]], path: Path
) -> Session:
    ordered = sorted(segs, key=lambda x: x[2].start)
    for (_, _, a), (row, prefix, b) in itertools.pairwise(ordered):
        if b.start < a.end:
            raise SessionFileError(path, row, f"{prefix}start", "overlaps the segment before")
    return Session(
        sid,
        str(head["user"]),
        str(head["offer"]),
        tuple(s for _, _, s in ordered),
        stop=bool(head["stop"]),
        kernel_visible=bool(head.get("kernel_visible", True)),
    )


def _head(
    raw: Mapping[str, object], path: Path, row: int, offers: Iterable[str]
) -> dict[str, object]:
    head: dict[str, object] = {}
    for name in ("user", "offer"):
        value = raw.get(name)
        if not isinstance(value, str) or not value.strip():
            raise SessionFileError(path, row, name, "missing")
        head[name] = value.strip()
    offers = list(offers)
    if head["offer"] not in offers:
        raise SessionFileError(
            path, row, "offer", f"unknown offer {head['offer']!r} (allowed: {', '.join(offers)})"
        )
    for name, default in (("stop", None), ("kernel_visible", True)):
        value = raw.get(name, default)
        if value in (None, ""):
            if default is None:
                raise SessionFileError(path, row, name, "missing")
            value = default
        try:
            head[name] = _bool(value)
        except ValueError as e:
            raise SessionFileError(path, row, name, str(e)) from None
    return head


def load_sessions(path: str | Path, offers: Iterable[str]) -> list[Session]:
    """Read a JSONL or CSV session file (see the module docstring); errors name file, row and
    column."""
    path = Path(path)
    offers = list(offers)
    with open(path, newline="", encoding="utf-8") as f:
        if path.suffix.lower() == ".csv":
            sessions = _load_csv(f, path, offers)
        elif path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
            sessions = _load_jsonl(f, path, offers)
        else:
            raise SessionFileError(path, 0, "-", "use a .csv or .jsonl file")
    if not sessions:
        raise SessionFileError(path, 1, "-", "no sessions")
    return sorted(sessions, key=lambda s: (s.start, s.id))


def _load_jsonl(lines: Iterable[str], path: Path, offers: list[str]) -> list[Session]:
    out: list[Session] = []
    seen: set[str] = set()
    for row, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            raise SessionFileError(path, row, "-", f"not JSON ({e.msg})") from None
        if not isinstance(raw, dict):
            raise SessionFileError(path, row, "-", "must be a JSON object")
        sid = raw.get("id")
        if not isinstance(sid, str) or not sid:
            raise SessionFileError(path, row, "id", "missing")
        if sid in seen:
            raise SessionFileError(path, row, "id", f"session {sid!r} appears twice")
        seen.add(sid)
        head = _head(raw, path, row, offers)
        segs = raw.get("segments")
        if not isinstance(segs, list) or not segs:
            raise SessionFileError(path, row, "segments", "must be a non-empty list")
        parsed = []
        for i, seg in enumerate(segs):
            if not isinstance(seg, dict):
                raise SessionFileError(path, row, f"segments[{i}]", "must be an object")
            prefix = f"segments[{i}]."
            parsed.append((row, prefix, _segment(seg, path, row, prefix)))
        out.append(_session(sid, head, parsed, path))
    return out


def _load_csv(f: Iterable[str], path: Path, offers: list[str]) -> list[Session]:
    reader = csv.DictReader(f)
    missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise SessionFileError(path, 1, missing[0], "missing column")
    heads: dict[str, dict[str, object]] = {}
    segs: dict[str, list[tuple[int, str, Segment]]] = {}
    for row, raw in enumerate(reader, 2):
        sid = (raw.get("session") or "").strip()
        if not sid:
            raise SessionFileError(path, row, "session", "missing")
        head = _head(raw, path, row, offers)
        if sid in heads:
            for col, value in head.items():
                if heads[sid][col] != value:
                    raise SessionFileError(path, row, col, f"differs from session {sid!r}'s")
        heads.setdefault(sid, head)
        segs.setdefault(sid, []).append((row, "", _segment(raw, path, row, "")))
    return [_session(sid, heads[sid], segs[sid], path) for sid in heads]


def write_jsonl(sessions: Iterable[Session], path: str | Path) -> None:
    """Write sessions in the JSONL format (a generated day can be edited and replayed)."""
    with open(path, "w", encoding="utf-8") as f:
        for s in sessions:
            row = {
                "id": s.id,
                "user": s.user,
                "offer": s.offer,
                "stop": s.stop,
                "kernel_visible": s.kernel_visible,
                "segments": [{k: getattr(g, k) for k in SEGMENT_FIELDS} for g in s.segments],
            }
            f.write(json.dumps(row) + "\n")
