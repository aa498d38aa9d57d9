"""Devices a grant may fall back to (pure): with DRA, an offer with ``fallback: true`` lets the
server's claim name alternatives after the granted device (Kubernetes' ``firstAvailable``), so
a pod whose granted GPU or MIG slice was taken first (a training job's claim between the grant
and the pod) gets another free one of the same offer on the same node instead of staying
``Pending``. The spawner then rebinds the lease to what it got (``pool.outside.rebind``, which
refuses a device another lease was granted meanwhile).

The alternatives are read from the allocator's books when the lease is shown to its spawner:
devices of the granted node the offer may use, free (no lease, not held outside, not being
destroyed, on a schedulable GPU), lowest index first like the pool's own grants.
"""

from __future__ import annotations

from collections.abc import Sequence

from .model import Gpu, Node, Offer
from .placement import Slot

#: At most this many alternatives per lease (``firstAvailable`` allows 8 subrequests in all).
MAX_FALLBACK = 3


def _model_ok(gpu: Gpu, offer: Offer) -> bool:
    return offer.allows_model(gpu.model.name) and (
        offer.min_memory_gb is None or gpu.model.memory_gb >= offer.min_memory_gb
    )


def fallback_devices(
    node: Node, offer: Offer, slots: Sequence[Slot], limit: int = MAX_FALLBACK
) -> tuple[Slot, ...]:
    """Up to ``limit`` free devices of ``node`` that could serve ``offer`` besides the lease's
    own ``slots`` (none where the offer does not allow falling back, or for shares)."""
    if not offer.fallback or limit <= 0 or offer.kind not in ("gpu", "mig"):
        return ()
    mine = {s.key for s in slots}
    out: list[Slot] = []
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        if not gpu.schedulable or not _model_ok(gpu, offer):
            continue
        if offer.kind == "gpu":
            free = (
                not gpu.mig_enabled
                and gpu.whole_lease is None
                and not gpu.shares
                and gpu.sharing != "shared"
            )
            if free and gpu.uuid not in mine:
                out.append(Slot(gpu.uuid, "gpu"))
        elif gpu.mig_enabled and not gpu.dynamic_mig and not gpu.mig_by_claim:
            for inst in sorted(gpu.instances, key=lambda i: i.start):
                slot = Slot(gpu.uuid, "mig", 0, inst.profile, inst.start)
                if inst.profile == offer.profile and inst.lease is None and slot.key not in mine:
                    out.append(slot)
    return tuple(out[:limit])
