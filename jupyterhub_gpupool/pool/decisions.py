"""What the allocator decides and holds: ``Grant``, ``Queued``, ``Rejected`` and ``Lease``.

Plain values, so that the store and the simulators can build and read them without the
allocator's machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .model import Request
from .placement import Slot


@dataclass(frozen=True)
class Grant:
    """Grant ``slots`` on ``node`` for ``request`` (the lease id is the request id)."""

    request: Request
    offer: str
    node: str
    slots: tuple[Slot, ...]
    units: Fraction
    group: str | None
    borrowed: bool
    kind: str = "grant"


@dataclass(frozen=True)
class Queued:
    """Wait at ``position`` (1-based) for ``reason``: ``no_capacity``, ``quota``, ``fairness``,
    ``headroom`` (``pool.headroom``)."""

    request: Request
    position: int
    reason: str
    message: str
    units: Fraction
    group: str | None
    within_guarantee: bool
    kind: str = "queued"
    #: The quota's code when ``reason`` is ``quota`` (``over_limit``, ``budget_exhausted``).
    code: str | None = None


@dataclass(frozen=True)
class Rejected:
    """Never grantable as asked: ``code`` is machine-readable, ``field`` names what to fix."""

    request: Request
    code: str
    message: str
    field: str | None = None
    allowed: tuple[object, ...] | None = None
    kind: str = "rejected"


Decision = Grant | Queued | Rejected


@dataclass
class Lease:
    """A grant the allocator holds capacity for."""

    id: str
    request: Request
    offer: str
    node: str
    slots: tuple[Slot, ...]
    units: Fraction
    group: str | None
    borrowed: bool
