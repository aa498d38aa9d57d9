"""Whether an offer could ever be placed on the pool's hardware, however long it waited."""

from __future__ import annotations

from collections.abc import Iterable

from .decisions import Rejected
from .model import Node, Offer, Request
from .sharing import no_shared_gpus, only_exclusive


def never_placeable(
    nodes: Iterable[Node], offer: Offer, clusters: frozenset[str] | None = None
) -> Rejected | None:
    """Why no amount of waiting can place ``offer`` (in ``clusters``, when given): no GPU
    that could serve it, or fewer on any one node than it asks for; None when it could fit."""
    if offer.kind == "cpu":
        return None
    best = 0
    modes = []  # the sharing modes of the GPUs a share could otherwise go to
    for node in nodes:
        if clusters is not None and node.cluster not in clusters:
            continue
        n = 0
        for g in node.gpus:
            if not offer.allows_model(g.model.name):
                continue
            if offer.kind == "mig":
                n += g.mig_enabled and offer.profile in g.model.profiles
            elif not g.mig_enabled:
                if offer.kind == "shared":
                    modes.append(g.sharing)
                if offer.kind == "shared" and g.sharing == "exclusive":
                    continue
                if offer.kind == "gpu" and g.sharing == "shared":
                    continue
                if (
                    offer.min_memory_gb
                    and g.model.memory_gb * (offer.milli / 1000) < offer.min_memory_gb
                ):
                    continue
                n += 1
        best = max(best, n)
    if best >= offer.count:
        return None
    if best == 0:
        where = "the pool" if clusters is None else "cluster(s) " + ", ".join(sorted(clusters))
        message = f"no GPU in {where} can serve offer {offer.name!r}"
        if offer.kind == "shared" and only_exclusive(modes):
            message = no_shared_gpus(f"in {where}", offer.name)
        return Rejected(Request("-", "-", offer.name), "no_such_hardware", message, "offer")
    return Rejected(
        Request("-", "-", offer.name),
        "exceeds_node_size",
        f"offer {offer.name!r} asks for {offer.count} GPUs on one node; "
        f"the largest node has {best}",
        "count",
        tuple(range(1, best + 1)),
    )
