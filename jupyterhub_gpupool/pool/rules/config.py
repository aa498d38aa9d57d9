"""The pool config file's load (``LoadConfig``): which offer, quota and node rows it writes,
which requests and leases end with what it removes, what it refuses, and the allocator changed
in place to match, never rebuilt.

Offers and quotas an administrator set by API win over the file until reset; the file's own
rows follow the file. A queued request for an offer no longer in the pool would wait forever:
it ends ``cancelled`` (leases already held keep their slices until released). The allocator's
offer table, quota book and headroom follow (``pool.offertable``). A declared node is put in
place of the allocator's (``pool.nodeput``, as an inventory does): its GPU that vanished from
the file, or whose MIG mode switched, loses its leases first (``node-lost``); its instance rows
follow the file, except those live leases hold; a wanted instance a busy unwanted one blocks
is given up at once, by ``MigResults``' rule (``rules.mig.blocked_creations``). The leases of
the owners whose quota changed get their borrowed flags again, and the queue is served with
what the pool has now.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from .. import commands as c
from ..dramig import made_by_claim
from ..effects import (
    BorrowedChanged,
    ConfigLoaded,
    Effect,
    FileQuotaLoaded,
    HeadroomSet,
    LeaseGranted,
    LeaseNoted,
    NodeDeclared,
    OfferDropped,
    OfferLoaded,
    OffersOrdered,
    PricesLoaded,
    WaitReason,
)
from ..ending import finish_in
from ..errors import ConfigError, Refusal
from ..facts import ConfigRows, NodeRows, Outcome, PoolState, Rule
from ..headroom import headroom_for
from ..model import Gpu, Node, validate_node
from ..offertable import TableTrial
from ..outside import OutsideHolds
from ..quota import QuotaSpec
from ..trial import Trial
from .inventory import _drop_made_for, _instances, _mig_gpu, _row_values, _Rows
from .mig import blocked_creations


def _load_config(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Load ``cmd.config`` (a ``poolconfig.PoolConfig``) over the rows ``state.config_rows``
    (the facts of the queued requests and of the leases on declared nodes: ``state.leases``).

    Refused: a currency change under recorded prices (``invalid_config``, field
    ``prices.currency``), an invalid declared node (``pool.model.validate_node``), a declared
    GPU that belongs to another node (``gpu_elsewhere``)."""
    config, rows = cmd.config, state.config_rows
    prices = config.prices
    currency = prices.currency if prices.schedule else None
    if rows.currencies and currency and rows.currencies != {currency}:
        raise ConfigError(
            f"the recorded prices are in {', '.join(sorted(rows.currencies))}: the currency "
            "cannot change under them",
            field="prices.currency",
        )
    owners = dict(rows.owners)
    for node in config.nodes:
        _check_node(owners, node)
    alloc = state.alloc
    effects: list[Effect] = []
    with TableTrial(alloc) as table, Trial(alloc) as trial:
        trial.serving = False  # the queue is served once the pool is as the file says
        changed = False
        positions = dict(rows.positions)
        for position, offer in enumerate(config.offers):
            if rows.offers.get(offer.name, "file") == "file":
                effects.append(OfferLoaded(offer, position))
                changed |= table.put_offer(offer)
                positions[offer.name] = position
        names = {o.name for o in config.offers}
        dropped = [n for n, source in rows.offers.items() if source == "file" and n not in names]
        for name in dropped:
            effects.append(OfferDropped(name))
            changed |= table.drop_offer(name)
        order = tuple(sorted(alloc.offers, key=lambda n: (positions.get(n, 0), n)))
        if changed or order != tuple(alloc.offers):
            table.order_offers(order)
            effects.append(OffersOrdered(order))
        kept = (set(rows.offers) | names) - set(dropped)
        for lease in rows.queued:
            if lease.offer not in kept:
                note = f"the offer {lease.offer!r} was removed from the pool"
                effects.append(LeaseNoted(lease.id, note))
                finish_in(trial, [(state.leases.get(lease.id, lease), "cancelled")], now, effects)
        quotas = _quotas(rows, config)
        for q in quotas:
            table.set_quota(q.kind, q.name, q.spec)
        effects += quotas
        headroom = headroom_for(config.borrowing, config.classes)
        if headroom != alloc.headroom:
            table.set_headroom(headroom)
            effects.append(HeadroomSet(headroom))
        effects.append(PricesLoaded(prices))
        for node in config.nodes:
            _declared(state, trial, node, now, effects)
        effects += _borrowed(state, quotas)
        trial.serving = True
        effects += [LeaseGranted(g) for g in trial.promote(now)]
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    effects.append(ConfigLoaded(len(config.offers), len(config.nodes)))
    return Outcome(None, tuple(effects))


def _check_node(owners: dict[str, str], node: Node) -> None:
    """Refuse an invalid node, or one declaring a GPU of another node as the nodes before it
    in the file leave them (``owners``, updated: the node's GPUs are its own after it)."""
    validate_node(node)
    for gpu in node.gpus:
        other = owners.get(gpu.uuid)
        if other is not None and other != node.name:
            raise Refusal("gpu_elsewhere", f"GPU {gpu.uuid} belongs to node {other}", field="uuid")
    declared = {g.uuid for g in node.gpus}
    for uuid, owner in list(owners.items()):
        if owner == node.name and uuid not in declared:
            del owners[uuid]
    owners.update(dict.fromkeys(declared, node.name))


def _quotas(rows: ConfigRows, config: Any) -> list[FileQuotaLoaded]:
    """The file's quotas: written where no administrator's stands, dropped where the file no
    longer has them (in the rows' order)."""
    wanted: dict[tuple[str, str], QuotaSpec] = {}
    for name, spec in (config.users or {}).items():
        wanted[("user", name)] = spec
    for name, spec in (config.groups or {}).items():
        wanted[("group", name)] = spec
    if config.default is not None:
        wanted[("default", "*")] = config.default
    effects = [
        FileQuotaLoaded(kind, name, spec)
        for (kind, name), spec in wanted.items()
        if rows.quotas.get((kind, name), "file") == "file"
    ]
    effects += [
        FileQuotaLoaded(kind, name, None)
        for (kind, name), source in rows.quotas.items()
        if source == "file" and (kind, name) not in wanted
    ]
    return effects


def _borrowed(state: PoolState, quotas: Iterable[FileQuotaLoaded]) -> list[Effect]:
    """The borrowed flags the quotas loaded change (``borrowing.borrowed_flags`` over the
    leases of the users, or the groups' members, whose quota was written or dropped; every
    user's for the default), with the quotas as they now are."""
    alloc = state.alloc
    users: set[str] = set()
    for q in quotas:
        if q.kind == "default":
            users |= {le.request.user for le in alloc.leases.values()}
        else:
            users |= alloc._owners(*((q.name, None) if q.kind == "user" else (None, q.name)))
    return [
        BorrowedChanged(lease.id, borrowed)
        for lease, borrowed in alloc._borrowed_now(users)
        if borrowed != lease.borrowed
    ]


def _declared(
    state: PoolState, trial: Trial, node: Node, now: float, effects: list[Effect]
) -> None:
    """A declared node put in place of the allocator's: the leases on its GPUs whose MIG mode
    switched end first (in the file's order), then those on its GPUs the file no longer has
    (in the rows' order); its rows are written and the node put; the creations a busy
    instance blocks are given up after."""
    rows = state.config_rows
    was = rows.nodes.get(node.name)
    before = {g.uuid: g for g in was.gpus} if was is not None else {}
    held = was.leases if was is not None else {}
    declared = {g.uuid for g in node.gpus}
    switched = [
        lid
        for g in node.gpus
        if g.uuid in before and before[g.uuid].mig_enabled != g.mig_enabled
        for lid in held.get(g.uuid, ())
    ]
    vanished = [lid for uuid, ids in held.items() if uuid not in declared for lid in ids]
    lost = [(state.leases[lid], "node-lost") for lid in dict.fromkeys(switched + vanished)]
    finish_in(trial, lost, now, effects)
    ended = set(trial.ended)
    written: list[tuple[Gpu, Any, _Rows]] = []
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        old = before.get(gpu.uuid)
        claim = made_by_claim(node.name, node.cluster, gpu.mig_enabled, state.dra)
        gpu = replace(
            gpu,
            node=node.name,
            dynamic_mig=gpu.dynamic_mig or claim,
            mig_by_claim=claim,
            cordoned=old.cordoned if old is not None else False,
        )
        written.append((gpu, old, _layout(gpu, old, was, ended)))
    holders = {
        k: (lid, st) for k, (lid, st, _) in (was.slots if was else {}).items() if lid not in ended
    }
    on_rows = [
        (_mig_gpu(old, g), synced, None if old.observed is None else list(old.observed))
        for g, old, synced in written
        if old is not None
    ]
    blocked, given_up = blocked_creations(replace(state, mig_holders=holders), node.name, on_rows)
    if was is not None:
        for g, _, synced in written:
            _drop_made_for(synced, g.uuid, was, {f.id for f, _ in given_up})
    put = Node(
        node.name,
        node.cluster,
        node.cpu_milli,
        node.memory_mib,
        [replace(g, instances=_instances(g, synced, _observed(old))) for g, old, synced in written],
        was.cordoned if was is not None else False,
        was.draining if was is not None else False,
        dict(node.labels),
        unreachable=was.unreachable if was is not None else False,
    )
    outside = rows.outside.get(node.name, OutsideHolds())
    effects.append(NodeDeclared(put, tuple(_row_values(s) for _, _, s in written), outside))
    trial.put_node(put, outside)
    effects += blocked
    finish_in(trial, given_up, now, effects)


def _layout(gpu: Gpu, old: Any, was: NodeRows | None, ended: set[str]) -> _Rows:
    """A declared GPU's instance rows by (profile, start): the file's layout (a row of the
    same place kept, its uuid the file's if it names one), and the rows live leases hold that
    the file does not name (it does not know them; the agent will tell). An instance the pool
    made for a lease that ended went with it."""
    rows: _Rows = {}
    held: set[tuple[str, int]] = set()
    if old is not None and was is not None:
        rows = {(p, s): [uuid, n, error] for p, s, uuid, n, error in old.instances}
        _drop_made_for(rows, gpu.uuid, was, ended)
        held = {
            (p, s)
            for (u, p, s), (lid, _, _) in was.slots.items()
            if u == gpu.uuid and lid not in ended
        }
    keep: _Rows = {}
    for inst in gpu.instances:
        key = (inst.profile, inst.start)
        row = rows.pop(key, None) or [None, 0, None]
        row[0] = inst.uuid or row[0]
        keep[key] = row
    keep.update((key, row) for key, row in rows.items() if key in held)
    return keep


def _observed(old: Any) -> list[Any] | None:
    """What the node last reported of a GPU (its row's, unchanged by the file)."""
    return None if old is None or old.observed is None else list(old.observed)


RULES: dict[type[c.Command], Rule] = {c.LoadConfig: _load_config}
