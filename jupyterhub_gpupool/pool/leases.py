"""The lease lifecycle's rules that more than one part needs: states, and when a grant is ready.

A lease moves ``(awaiting_approval →) queued → granted → active → (reclaiming) → released``;
``awaiting_approval`` holds nothing until an admin approves (→ queued or granted) or denies
(→ released). A grant is *ready* once
everything it holds exists: a whole GPU or a share always does; a MIG slice on a static GPU
does (its layout was declared), on a dynamic GPU only once the node made the instance (it then
has a ``MIG-…`` uuid). The store refuses to bind a grant that is not ready, the lease JSON says
``ready``, and the spawner waits for it: all three ask this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .model import Gpu

#: Lease states (contract).
LEASE_STATES = ("awaiting_approval", "queued", "granted", "active", "reclaiming", "released")
#: States that hold capacity.
LIVE_STATES = ("granted", "active", "reclaiming")


def mig_device(gpu: Gpu | None, lease_id: str, start: int | None) -> tuple[str | None, bool]:
    """The ``MIG-…`` uuid of the lease's instance at ``start`` on ``gpu``, and whether that
    instance exists (static GPUs: always, declared layouts may not know their uuids; GPUs whose
    instances the DRA driver makes per claim: as good as, the server's claim makes it)."""
    if gpu is None:
        return None, False
    for inst in gpu.instances:
        if inst.start == start and inst.lease == lease_id:
            made = inst.uuid is not None or not gpu.dynamic_mig or gpu.mig_by_claim
            return inst.uuid, made
    return None, False


def is_ready(state: str, mig_instances_exist: Iterable[bool]) -> bool:
    """Whether a lease can be run on: live, and each of its MIG instances exists."""
    return state in LIVE_STATES and all(mig_instances_exist)


def still_waiting(lease: Mapping[str, Any]) -> bool:
    """For clients of the lease JSON: awaiting approval, queued, or granted but not ready."""
    return lease["state"] in ("awaiting_approval", "queued") or (
        lease["state"] == "granted" and not lease.get("ready", True)
    )
