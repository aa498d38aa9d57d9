"""NVIDIA's MIG layout rules on one GPU: which instances may exist side by side, and where.

Valid starts only, no overlapping memory slices, per-profile instance caps, one media-extension
instance, compute slices within the GPU. The inventory (``model``) checks reported layouts with
these and placement plans new instances with them, so they sit below both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .catalog import GpuModel
from .errors import MigLayoutError


def memory_mask(start: int, size: int) -> int:
    """Bit mask of the memory slices ``start .. start + size - 1``."""
    return ((1 << size) - 1) << start


def validate_mig_layout(model: GpuModel, instances: Iterable[tuple[str, int]]) -> None:
    """Raise ``MigLayoutError`` unless ``(profile, start)`` pairs form a layout NVIDIA allows."""
    if not model.mig_capable:
        raise MigLayoutError(f"{model.name} does not support MIG", field="model")
    used = 0
    counts: dict[str, int] = {}
    compute = media = 0
    for name, start in instances:
        p = model.profile(name)
        if start not in p.starts:
            raise MigLayoutError(
                f"{name} cannot start at memory slice {start} on {model.name}",
                field="start",
                allowed=p.starts,
            )
        span = memory_mask(start, p.memory_slices)
        if used & span:
            raise MigLayoutError(
                f"{name} at {start} overlaps memory slices already in use on {model.name}",
                field="start",
            )
        used |= span
        counts[name] = counts.get(name, 0) + 1
        if counts[name] > p.max_count:
            raise MigLayoutError(
                f"at most {p.max_count} instance(s) of {name} fit on {model.name}",
                field="profile",
            )
        compute += p.compute_slices
        media += p.media_extensions
    if compute > model.compute_slices:
        raise MigLayoutError(
            f"layout needs {compute} compute slices, {model.name} has {model.compute_slices}",
            field="profile",
        )
    if media > 1:
        raise MigLayoutError(
            "only one instance per GPU can own the media extensions (+me)", field="profile"
        )


def mig_new_starts(
    model: GpuModel, instances: Sequence[tuple[str, int]], profile: str
) -> tuple[int, ...]:
    """Starts where a new ``profile`` instance could be created next to ``instances``."""
    p = model.profile(profile)
    used = 0
    compute = media = same = 0
    for name, start in instances:
        q = model.profiles[name]
        used |= memory_mask(start, q.memory_slices)
        compute += q.compute_slices
        media += q.media_extensions
        same += name == profile
    if same >= p.max_count or compute + p.compute_slices > model.compute_slices:
        return ()
    if p.media_extensions and media:
        return ()
    return tuple(s for s in p.starts if not used & memory_mask(s, p.memory_slices))
