"""The effects of reclaim and notices (``pool.effects``): a round's counts and notices,
claims and ends, the policy, a spent budget's warnings (their rows: ``store/reclaimapply.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .reclaim import ReclaimState


@dataclass(frozen=True)
class ReclaimCounted:
    """A reclaim round counted a window of a lease (its reclaim state after; no notice
    changes, nothing is audited)."""

    lease_id: str
    state: ReclaimState


@dataclass(frozen=True)
class ReclaimNoticed:
    """A reclaim round gives a lease a notice (``state`` has it), with the ``evidence``
    (``pool.reclaim.Evidence`` as a dict) the audit event carries."""

    lease_id: str
    state: ReclaimState
    evidence: Mapping[str, Any] | None


@dataclass(frozen=True)
class ReclaimCancelled:
    """A reclaim round withdraws a lease's notice (the GPU works again, nobody waits):
    ``state`` is its reclaim state after."""

    lease_id: str
    state: ReclaimState
    reason: str
    evidence: Mapping[str, Any] | None


@dataclass(frozen=True)
class ReclaimClaimed:
    """A lease's reclaim action is claimed now (a round's, again once a claim went stale, or
    the service's own for an overdue notice): released with ``release`` when its server
    stops, restarted into ``target`` (a shrink); ``state``: its reclaim state after (None: as
    it is); ``data``: the ``reclaim-acting`` audit event's."""

    lease_id: str
    release: str | None
    target: str | None
    data: Mapping[str, Any]
    state: ReclaimState | None = None


@dataclass(frozen=True)
class ReclaimEnded:
    """A claimed reclaim's outcome (``kind``: ``reclaimed`` or ``reclaim-failed``, the audit
    event with ``data``). ``unclaimed``: the claim ends; ``forgotten``: its release reason and
    shrink target too; ``state``: the user keeps the GPU with this reclaim state (active)."""

    lease_id: str
    kind: str
    data: Mapping[str, Any]
    unclaimed: bool = True
    forgotten: bool = False
    state: ReclaimState | None = None


@dataclass(frozen=True)
class NoticeMoved:
    """An administrator pushes a notice's deadline ``seconds`` later (``state`` has it)."""

    lease_id: str
    state: ReclaimState
    seconds: float


@dataclass(frozen=True)
class ReclaimPolicySet:
    """The administrator's ``reclaim`` section (checked) replaces the config file's."""

    section: Mapping[str, Any]


@dataclass(frozen=True)
class ReclaimPolicyReset:
    """The administrator's ``reclaim`` section is dropped: the config file's applies."""


@dataclass(frozen=True)
class BudgetWarned:
    """A user's or group's budget use crossed a level this period (the audit event's data,
    which the service passes to its notify hook)."""

    warning: Mapping[str, Any]
