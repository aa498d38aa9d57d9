"""Nodes: cordon, uncordon and drain flags, and the sharing modes a node's GPUs advertise."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import commands as c
from ..effects import Effect, LeaseGranted, NodeFlagsSet, SharingSet, WaitReason
from ..ending import uncordon_withdrawals
from ..errors import Refusal
from ..facts import Outcome, PoolState, Rule
from ..model import SHARING_MODES
from ..trial import Trial

#: What each node action sets (cordoned: takes nothing new; draining: the same, and says why).
NODE_ACTIONS: Mapping[str, Mapping[str, bool]] = {
    "cordon": {"cordoned": True},
    "uncordon": {"cordoned": False, "draining": False},
    "drain": {"draining": True},
}


def _set_node(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Cordon, uncordon or drain a node (it keeps its leases either way). An uncordon gives
    the queue the node's room at once and withdraws the drain notices of its leases that no
    one is carrying out yet (``state.drained``); answers their ids."""
    flags = NODE_ACTIONS.get(cmd.action)
    if flags is None:
        raise Refusal(
            "not_found",
            f"no node action {cmd.action!r}",
            field="action",
            allowed=list(NODE_ACTIONS),
        )
    if not state.node_known:
        raise Refusal("not_found", f"no node {cmd.name!r}", field="name")
    cordoned, draining = flags.get("cordoned"), flags.get("draining")
    effects: list[Effect] = [NodeFlagsSet(cmd.name, cmd.action, cordoned, draining)]
    if cmd.action != "uncordon":
        return Outcome([], tuple(effects))
    with Trial(state.alloc) as trial:
        trial.set_node_flags(cmd.name, cordoned, draining)
        effects += [LeaseGranted(g) for g in trial.promote(now)]
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    withdrawn = uncordon_withdrawals(cmd.name, state.drained, now)
    return Outcome([e.lease_id for e in withdrawn], (*effects, *withdrawn))


def _set_sharing(state: PoolState, cmd: Any, now: float) -> Outcome:
    """A node's GPUs' sharing modes as its device plugin advertises them (uuid → mode; a MIG
    GPU's and an unnamed one's stay): leases keep what they hold, and the queue is served
    (a GPU now shared may take waiters). Answers what changed."""
    if not state.node_known:
        raise Refusal("not_found", f"no node {cmd.name!r}", field="name")
    changed: dict[str, str] = {}
    for uuid, sharing, mig in state.node_gpus:
        mode = cmd.modes.get(uuid)
        if mode is None or mode == sharing or mig:
            continue
        if mode not in SHARING_MODES:
            raise Refusal("invalid_field", f"unknown sharing mode {mode!r}")
        changed[uuid] = mode
    if not changed:
        return Outcome(changed)
    effects: list[Effect] = [SharingSet(cmd.name, tuple(changed.items()))]
    with Trial(state.alloc) as trial:
        for uuid, mode in changed.items():
            trial.set_gpu_sharing(uuid, mode)
        effects += [LeaseGranted(g) for g in trial.promote(now)]
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    return Outcome(changed, tuple(effects))


RULES: dict[type[c.Command], Rule] = {
    c.SetNode: _set_node,
    c.SetSharing: _set_sharing,
}
