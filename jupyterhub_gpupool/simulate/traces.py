"""Trace files of the Alibaba GPU cluster trace 2023 ("openb") as arrays, checked row by row.

A bad file fails with one :class:`TraceError` line naming the file, the row (the CSV line
number, the header being line 1) and the column: a missing column, a value that is not a
number, a negative or zero capacity, a GPU node without a model, or a pod whose ``gpu_spec``
names a GPU model no node of the cluster has (:func:`check_models`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "DEFAULT_CPU_REQUEST",
    "GPU_MILLI",
    "NODE_COLUMNS",
    "POD_COLUMNS",
    "NodeTable",
    "PodTable",
    "TraceError",
    "check_models",
    "clean_spec",
    "load_nodes",
    "load_pods",
    "spec_models",
]

GPU_MILLI = 1000
"""Capacity of one GPU in milli-GPU."""
DEFAULT_CPU_REQUEST = 100
"""Kubernetes' "non-zero" cpu request used by scores and fragmentation when a pod asks for 0."""
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
"""Required pod columns; ``gpu_spec`` is optional (the multigpu traces have none)."""


class TraceError(ValueError):
    """A trace file that cannot be used: ``<file>: row <n>, column <c>: <what is wrong>``."""

    def __init__(self, path: str | Path, row: int | None, column: str | None, message: str):
        self.path, self.row, self.column = str(path), row, column
        where = [f"row {row}" if row is not None else "", f"column {column!r}" if column else ""]
        place = ", ".join(w for w in where if w)
        super().__init__(f"{path}: {place + ': ' if place else ''}{message}")


@dataclass(frozen=True)
class NodeTable:
    """The cluster's nodes, sorted by name (the simulator sorts them before drawing priorities)."""

    names: tuple[str, ...]
    cpu: np.ndarray  # milli-cpu, int64
    memory: np.ndarray  # MiB, int64
    gpus: np.ndarray  # GPU count, int64
    model: tuple[str, ...]

    @property
    def total_gpus(self) -> int:
        return int(self.gpus.sum())

    @property
    def capacity_milli(self) -> int:
        return self.total_gpus * GPU_MILLI

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class PodTable:
    """The original trace's pods, sorted by name, as the simulator turns CSV rows into pods.

    ``gpu_milli`` is the per-GPU request clamped to [0, 1000]; pods with ``num_gpu == 0`` get
    milli 0. ``spec`` is the GPU-model list with empty ``|`` parts removed ("" = any model).
    ``source`` and ``spec_rows`` (first CSV row of each spec) let :func:`check_models` point at
    the row that names an unknown model.
    """

    name: str
    names: tuple[str, ...]
    cpu: np.ndarray
    memory: np.ndarray
    num_gpu: np.ndarray
    gpu_milli: np.ndarray
    spec: tuple[str, ...]
    source: str = ""
    spec_rows: dict[str, int] = field(default_factory=dict, compare=False)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def cpu_nonzero(self) -> np.ndarray:
        """Cpu as the scores and the fragmentation measure see it (0 becomes 100)."""
        return np.where(self.cpu == 0, DEFAULT_CPU_REQUEST, self.cpu)

    @property
    def total_milli(self) -> np.ndarray:
        """Total GPU milli per pod: per-GPU milli x GPU count."""
        total: np.ndarray = self.gpu_milli * self.num_gpu
        return total


def clean_spec(spec: str | None) -> str:
    """A ``gpu_spec`` with empty ``|`` parts removed ("" accepts every model)."""
    if not spec:
        return ""
    return "|".join(part.strip() for part in spec.split("|") if part.strip())


def spec_models(spec: str) -> frozenset[str]:
    return frozenset(part for part in spec.split("|") if part)


def _read(
    path: str | Path, required: tuple[str, ...], what: str
) -> list[tuple[int, dict[str, str]]]:
    """(CSV line, row) pairs; a missing column or a short row is a :class:`TraceError`."""
    try:
        f = open(path, newline="")  # noqa: SIM115 (closed by the with block below)
    except OSError as e:
        raise TraceError(path, None, None, f"cannot read the {what} list: {e.strerror}") from None
    with f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(
                path,
                1,
                missing[0],
                f"missing {what} column{'s' if len(missing) > 1 else ''} "
                f"{', '.join(missing)} (the header has {', '.join(header) or 'nothing'})",
            )
        rows: list[tuple[int, dict[str, str]]] = []
        for row in reader:
            line = reader.line_num
            short = [c for c in required if row.get(c) is None]
            if short:
                raise TraceError(path, line, short[0], "the row is shorter than the header")
            rows.append((line, row))
    if not rows:
        raise TraceError(path, None, None, f"no {what}s (only a header)")
    return rows


def _number(
    path: str | Path, line: int, row: dict[str, str], column: str, *, blank: int | None = 0
) -> int:
    """An integer cell (``"12.0"`` allowed); a blank cell is ``blank`` or an error if None."""
    text = (row.get(column) or "").strip()
    if not text:
        if blank is None:
            raise TraceError(path, line, column, "empty; a number is required")
        return blank
    try:
        value = float(text)
    except ValueError:
        raise TraceError(path, line, column, f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise TraceError(path, line, column, f"{text!r} is not a finite number")
    return int(value)


def load_nodes(path: str | Path) -> NodeTable:
    """Read an ``openb_node_list_*.csv`` (columns sn, cpu_milli, memory_mib, gpu, model).

    Every node needs a name, positive cpu and memory, at least one GPU (the experiment's
    cluster is the GPU-node list; a zero-capacity node would only dilute the figures) and,
    having GPUs, a model.
    """
    parsed = []
    seen: dict[str, int] = {}
    for line, r in _read(path, NODE_COLUMNS, "node"):
        name = (r["sn"] or "").strip()
        if not name:
            raise TraceError(path, line, "sn", "empty node name")
        if name in seen:
            raise TraceError(path, line, "sn", f"node {name!r} already on row {seen[name]}")
        seen[name] = line
        cpu = _number(path, line, r, "cpu_milli", blank=None)
        mem = _number(path, line, r, "memory_mib", blank=None)
        gpus = _number(path, line, r, "gpu", blank=None)
        for column, value in (("cpu_milli", cpu), ("memory_mib", mem), ("gpu", gpus)):
            if value <= 0:
                raise TraceError(
                    path, line, column, f"zero-capacity node {name!r}: {column} is {value}"
                )
        model = (r["model"] or "").strip()
        if not model:
            raise TraceError(path, line, "model", f"node {name!r} has {gpus} GPUs but no model")
        parsed.append((name, cpu, mem, gpus, model))
    parsed.sort(key=lambda p: p[0])
    return NodeTable(
        names=tuple(p[0] for p in parsed),
        cpu=np.array([p[1] for p in parsed], dtype=np.int64),
        memory=np.array([p[2] for p in parsed], dtype=np.int64),
        gpus=np.array([p[3] for p in parsed], dtype=np.int64),
        model=tuple(p[4] for p in parsed),
    )


def load_pods(path: str | Path) -> PodTable:
    """Read an ``openb_pod_list_*.csv`` (name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec).

    Applies the simulator's CSV-to-pod rules: GPU fields only when ``num_gpu != 0``, per-GPU milli
    clamped to [0, 1000]. Timestamps are ignored (the published runs write none). Negative
    requests and non-numeric cells are errors naming the row and column.
    """
    parsed = []
    spec_rows: dict[str, int] = {}
    for line, r in _read(path, POD_COLUMNS, "pod"):
        name = (r["name"] or "").strip()
        if not name:
            raise TraceError(path, line, "name", "empty pod name")
        values = {}
        for column in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli"):
            values[column] = v = _number(path, line, r, column)
            if v < 0 and column != "gpu_milli":  # the simulator clamps milli <= 0 to 0
                raise TraceError(path, line, column, f"negative request {v}")
        num_gpu = values["num_gpu"]
        milli = min(max(values["gpu_milli"], 0), GPU_MILLI) if num_gpu else 0
        spec = clean_spec(r.get("gpu_spec")) if num_gpu else ""
        if spec:
            spec_rows.setdefault(spec, line)
        parsed.append((name, values["cpu_milli"], values["memory_mib"], num_gpu, milli, spec))
    parsed.sort(key=lambda p: p[0])
    return PodTable(
        name=Path(path).stem,
        names=tuple(p[0] for p in parsed),
        cpu=np.array([p[1] for p in parsed], dtype=np.int64),
        memory=np.array([p[2] for p in parsed], dtype=np.int64),
        num_gpu=np.array([p[3] for p in parsed], dtype=np.int64),
        gpu_milli=np.array([p[4] for p in parsed], dtype=np.int64),
        spec=tuple(p[5] for p in parsed),
        source=str(path),
        spec_rows=spec_rows,
    )


def check_models(pods: PodTable, nodes: NodeTable) -> None:
    """Every GPU model a pod's ``gpu_spec`` names must be a model of some node.

    A spec naming only unknown models could never be placed; one naming a typo beside a real
    model would silently narrow the pod. Both are :class:`TraceError`s at the spec's first row.
    """
    known = set(nodes.model)
    for spec in sorted(set(pods.spec), key=lambda s: pods.spec_rows.get(s, 0)):
        unknown = sorted(spec_models(spec) - known)
        if unknown:
            raise TraceError(
                pods.source or pods.name,
                pods.spec_rows.get(spec),
                "gpu_spec",
                f"unknown GPU model{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                f"(the nodes have {', '.join(sorted(known))})",
            )
