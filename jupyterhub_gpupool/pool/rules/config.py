"""The pool config file's load (``LoadConfig``): which offer, quota and node rows it writes,
which requests and leases end with what it removes, and what it refuses.

Offers and quotas an administrator set by API win over the file until reset; the file's own
rows follow the file. A queued request for an offer no longer in the pool would wait forever:
it ends ``cancelled`` (leases already held keep their slices until released). A declared
node's GPU that vanished from the file, or whose MIG mode switched, loses its leases
(``node-lost``): they hold something that is gone. The allocator has no primitive to replace
an offer table or remove a node, so the rows are written and the last effect
(``AllocatorRebuilt``) has it rebuilt from them; every effect before it is applied to the rows
only, the leases' ends included (``pool.ending.ended_reason``, as ``finish`` without an
allocator).
"""

from __future__ import annotations

from typing import Any

from .. import commands as c
from ..effects import (
    AllocatorRebuilt,
    ConfigLoaded,
    Effect,
    FileQuotaLoaded,
    LeaseNoted,
    LeaseReleased,
    NodeDeclared,
    OfferDropped,
    OfferLoaded,
    PricesLoaded,
)
from ..ending import ended_reason
from ..errors import ConfigError, Refusal
from ..facts import ConfigRows, LeaseFacts, Outcome, PoolState, Rule
from ..model import Node, validate_node
from ..quota import QuotaSpec


def _load_config(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Load ``cmd.config`` (a ``poolconfig.PoolConfig``) over the rows ``state.config_rows``.

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
    effects: list[Effect] = []
    for position, offer in enumerate(config.offers):
        if rows.offers.get(offer.name, "file") == "file":
            effects.append(OfferLoaded(offer, position))
    names = {o.name for o in config.offers}
    dropped = [n for n, source in rows.offers.items() if source == "file" and n not in names]
    effects += [OfferDropped(n) for n in dropped]
    kept = (set(rows.offers) | names) - set(dropped)
    for lease in rows.queued:
        if lease.offer not in kept:
            effects.append(
                LeaseNoted(lease.id, f"the offer {lease.offer!r} was removed from the pool")
            )
            effects.append(_ended(lease, "cancelled"))
    effects += _quotas(rows, config)
    effects.append(PricesLoaded(prices))
    ended = {lease.id for lease in rows.queued if lease.offer not in kept}
    for node in config.nodes:
        effects += _declared(rows, node, ended)
    effects.append(ConfigLoaded(len(config.offers), len(config.nodes)))
    effects.append(AllocatorRebuilt())
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


def _quotas(rows: ConfigRows, config: Any) -> list[Effect]:
    """The file's quotas: written where no administrator's stands, dropped where the file no
    longer has them (in the rows' order)."""
    wanted: dict[tuple[str, str], QuotaSpec] = {}
    for name, spec in (config.users or {}).items():
        wanted[("user", name)] = spec
    for name, spec in (config.groups or {}).items():
        wanted[("group", name)] = spec
    if config.default is not None:
        wanted[("default", "*")] = config.default
    effects: list[Effect] = [
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


def _declared(rows: ConfigRows, node: Node, ended: set[str]) -> list[Effect]:
    """A declared node is written; the leases on its GPUs whose MIG mode switched end
    before (in the file's order), those on its GPUs the file no longer has after (in the
    rows' order): as the node's rows are written. ``ended``: the leases ended already."""
    now = {g.uuid: g for g in rows.gpus.get(node.name, ())}
    switched = [
        now[g.uuid] for g in node.gpus if g.uuid in now and now[g.uuid].mig_enabled != g.mig_enabled
    ]
    declared = {g.uuid for g in node.gpus}
    vanished = [g for g in rows.gpus.get(node.name, ()) if g.uuid not in declared]
    effects: list[Effect] = []
    for gpus in (switched, None, vanished):
        if gpus is None:
            effects.append(NodeDeclared(node))
            continue
        for gpu in gpus:
            for lease in gpu.leases:
                if lease.id not in ended:
                    ended.add(lease.id)
                    effects.append(_ended(lease, "node-lost"))
    return effects


def _ended(lease: LeaseFacts, reason: str) -> LeaseReleased:
    """``lease`` ends with no allocator (``pool.ending.finish``'s rule for the reason)."""
    return LeaseReleased(lease.id, ended_reason(lease, reason), lease.state)


RULES: dict[type[c.Command], Rule] = {c.LoadConfig: _load_config}
