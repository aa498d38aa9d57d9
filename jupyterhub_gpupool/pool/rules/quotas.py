"""Quotas: an API edit or reset of a user's or group's quota, and its preview."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from .. import commands as c
from ..allocator import Allocator
from ..effects import BorrowedChanged, Effect, QuotaReset, QuotaSet
from ..facts import Outcome, PoolState, Rule
from ..quota import QUOTA_FIELDS, QuotaInEffect, QuotaSpec


def _put_quota(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Set a user's or group's quota by API (``cmd.kind``: ``users`` or ``groups``). Lowering
    it below current use is allowed: the leases beyond the new guarantee become borrowed.
    Answers the quota now in effect (``QuotaInEffect``, source ``api``)."""
    raw = cmd.raw
    if isinstance(cmd, c.PatchQuota):  # only the fields named, over the quota in effect
        current = (state.quota.spec if state.quota is not None else QuotaSpec()).to_dict()
        raw = {**{k: current[k] for k in QUOTA_FIELDS}, **raw}
    kind = cmd.kind[:-1]
    spec = QuotaSpec.parse(raw, f"quotas.{cmd.kind}.{cmd.name}")
    flags = borrowed_if(state.alloc, kind, cmd.name, spec.guarantee)
    effects: list[Effect] = [BorrowedChanged(lid, b) for lid, b in flags]
    effects.append(QuotaSet(kind, cmd.name, spec))
    return Outcome(QuotaInEffect(cmd.name, kind, "api", spec), tuple(effects))


def _reset_quota(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Drop a user's or group's API override (``state.quota_override``): the config file's
    quota (``state.file_quota``) applies, or none (a user gets the default). Answers None (the
    store answers the quota in effect after)."""
    if not state.quota_override:
        return Outcome(None)
    kind, spec, book = cmd.kind[:-1], state.file_quota, state.alloc.quotas
    guarantee = spec.guarantee if spec is not None else None
    if kind == "user" and guarantee is None:
        guarantee = book.default_user.guarantee
    flags = borrowed_if(state.alloc, kind, cmd.name, guarantee)
    effects: list[Effect] = [BorrowedChanged(lid, b) for lid, b in flags]
    effects.append(QuotaReset(kind, cmd.name, spec))
    return Outcome(None, tuple(effects))


def borrowed_if(
    alloc: Allocator, kind: str, name: str, guarantee: Fraction | None
) -> list[tuple[str, bool]]:
    """(lease id, borrowed) of each live lease whose flag giving user or group (``kind``)
    ``name`` the guarantee ``guarantee`` (None: a group with no quota) would change:
    ``borrowing.borrowed_flags`` over the leases of the user, or of the group's members, with
    the edited guarantee."""
    users = alloc._owners(name if kind == "user" else None, name if kind == "group" else None)
    flags = alloc._borrowed_now(
        users,
        user_guarantee={name: guarantee} if kind == "user" and guarantee is not None else {},
        group_guarantee={name: guarantee} if kind == "group" else {},
    )
    return [(lease.id, borrowed) for lease, borrowed in flags if borrowed != lease.borrowed]


def quota_preview(
    state: PoolState, kind: str, name: str, raw: Mapping[str, object]
) -> tuple[QuotaSpec, list[str], list[str]]:
    """What editing a quota (the fields of ``raw`` over the one in effect, ``state.quota``)
    would do, changing nothing: ``decide`` of ``PatchQuota`` with its effects read, never
    applied. Returns (the quota it would set, ids that would become borrowed, ids that would
    become within guarantee)."""
    effects = _put_quota(state, c.PatchQuota(kind, name, raw), 0.0).effects
    spec = next(e.spec for e in effects if isinstance(e, QuotaSet))
    changes = [e for e in effects if isinstance(e, BorrowedChanged)]
    become_borrowed = [e.lease_id for e in changes if e.borrowed]
    return spec, become_borrowed, [e.lease_id for e in changes if not e.borrowed]


RULES: dict[type[c.Command], Rule] = {
    c.PutQuota: _put_quota,
    c.PatchQuota: _put_quota,
    c.ResetQuota: _reset_quota,
}
