"""A node put in the allocator in place of the one of its name: an agent's inventory adds a
node, or changes one (GPUs added, removed or switched to another MIG mode, its MIG instances
as the rows now say), without a rebuild.

``put_node`` leaves the allocator as ``store/rebuild.py`` would build it from the rows: the
node's GPUs as given (fresh, in the node's order, in the GPU table with their node), then the
leases it holds placed on them again (``Allocator._occupy``: the node's CPU and memory
tallies, the placement index), then its outside marks (``Allocator.set_outside``). A lease on
a GPU or an instance the node no longer has must have ended first (the rule ends it:
``pool.rules.inventory``). ``put_back`` undoes it, for ``pool.trial.Trial``.
"""

from __future__ import annotations

from dataclasses import replace

from .allocator import Allocator
from .decisions import Lease
from .errors import ConfigError
from .model import RETIRING, Gpu, MigInstance, Node, validate_node
from .outside import OUTSIDE, OutsideHolds


def put_node(alloc: Allocator, node: Node, outside: OutsideHolds) -> Node | None:
    """Make ``node`` (a value: copied, never kept) the allocator's node of its name, with the
    leases on the node it replaces placed on it again and ``outside`` marked. Returns the
    node it replaced (None: a new node, added last)."""
    validate_node(node)
    name = node.name
    for gpu in node.gpus:
        other = alloc.gpus.get(gpu.uuid)
        if other is not None and other.node != name:
            raise ConfigError(f"GPU {gpu.uuid} belongs to node {other.node}", field="uuid")
    old = alloc.nodes.get(name)
    held = _leases_on(alloc, old) if old is not None else []
    new = replace(
        node,
        gpus=[_fresh(g, name) for g in node.gpus],
        labels=dict(node.labels),
        cpu_used=0,
        memory_used=0,
    )
    uuids = {g.uuid for g in new.gpus}
    for lease in held:
        gone = [s.gpu for s in lease.slots if s.gpu not in uuids]
        if gone:
            raise ValueError(f"lease {lease.id} holds GPU {gone[0]}, which {name} no longer has")
    before = [g.uuid for g in old.gpus] if old is not None else []
    alloc.nodes[name] = new
    if old is None:
        alloc._order[name] = len(alloc._order)
        alloc.gpus.update((g.uuid, g) for g in new.gpus)
    elif before == [g.uuid for g in new.gpus]:
        alloc.gpus.update((g.uuid, g) for g in new.gpus)  # each keeps its place
    else:  # the table in node order, each node's GPUs in its order: as a rebuild has it
        table = [(g.uuid, g) for n in alloc.nodes.values() for g in n.gpus]
        alloc.gpus.clear()
        alloc.gpus.update(table)
    alloc._never.clear()  # what is never placeable depends on the inventory
    for lease in held:
        alloc._occupy(lease)
    alloc.set_outside(name, outside)  # re-indexes the node
    return old


def put_back(alloc: Allocator, name: str, old: Node | None, gpus: list[tuple[str, Gpu]]) -> None:
    """Undo ``put_node`` of node ``name``: ``old`` back (None: the node goes) and the GPU table
    as it was (``gpus``, its items before). The leases' devices are the caller's to restore."""
    if old is None:
        del alloc.nodes[name]
        del alloc._order[name]
        alloc._unindex_node(name)
    else:
        alloc.nodes[name] = old
    alloc.gpus.clear()
    alloc.gpus.update(gpus)
    alloc._never.clear()
    if old is not None:
        alloc._reindex(old)


def _fresh(gpu: Gpu, node: str) -> Gpu:
    """A copy of ``gpu`` on ``node`` that nothing holds (its instances copied, unheld)."""
    return replace(
        gpu,
        node=node,
        instances=[
            replace(i, lease=i.lease if i.lease == RETIRING else None) for i in gpu.instances
        ],
        whole_lease=None,
        shares={},
        outside=False,
        outside_by=(),
    )


def _leases_on(alloc: Allocator, node: Node) -> list[Lease]:
    """The leases holding a device of ``node`` (found from its GPUs, not by a scan)."""
    ids: dict[str, None] = {}
    for g in node.gpus:
        if g.whole_lease is not None:
            ids[g.whole_lease] = None
        ids.update(dict.fromkeys(g.shares))
        ids.update(dict.fromkeys(i.lease for i in g.instances if i.lease is not None))
    ids.pop(RETIRING, None)
    ids.pop(OUTSIDE, None)
    return [alloc.leases[lid] for lid in ids if lid in alloc.leases]


def set_gpu(
    alloc: Allocator,
    uuid: str,
    *,
    cordoned: bool | None = None,
    instances: list[MigInstance] | None = None,
) -> None:
    """Cordon a GPU or give it a new MIG layout (what the allocator would be rebuilt with
    from the rows), and re-index its node."""
    gpu = alloc.gpus[uuid]
    if cordoned is not None:
        gpu.cordoned = cordoned
    if instances is not None:
        gpu.instances = instances
    alloc._never.clear()  # what is never placeable may change with a layout
    alloc.set_node_flags(gpu.node)  # re-index it
