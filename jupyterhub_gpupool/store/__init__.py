"""The only code that turns the allocator's decisions into rows.

Modules by responsibility, imports pointing one way (each only to those above it):

* ``errors`` — ``StoreError``: refusals with a code, no HTTP status;
* ``rows`` — conversions between rows and values;
* ``read`` — the read models of leases, GPU kernels, jobs, nodes, reclaim policies,
  re-partitions, quotas, presence reports, the pool's inventory and map and the admin
  panel's tables (``read.leases.LeaseView``, ``read.poolmap.PoolMapView``, ...): typed, frozen
  views built by plain functions, which the store answers with and the service serializes
  (``service/serialize/``);
* ``rebuild`` — the allocator built from the rows;
* ``core`` — transactions, the pool lock, the allocator kept in step, the audit log;
* ``apply`` — the one applier of the allocator's decisions;
* ``views`` — read-only views (leases, offers, users, inventory, audit, usage), the leases as
  read models;
* ``leases`` — the lease lifecycle; ``mig`` — dynamic MIG; ``admin`` — config, nodes,
  quotas; ``utilization`` — minute aggregates;
* ``reclaim`` — idle-GPU reclamation: the reclaimer's leader lock, rounds, outcomes, "keep my
  GPU", the policy override and the user's recent reclaims;
* ``chargeback`` — usage with costs (``pool.pricing``'s one rounding rule), the top idle
  holders; ``planning`` — capacity figures per offer and day from the recorded leases;
* ``operate`` — the admin panel's actions: reclaim now, extend a notice, drain by a deadline,
  MIG re-partitions, and the map's reads; ``labelmig`` — the failure of a re-partition
  applied through the Kubernetes ``nvidia.com/mig.config`` label; ``approvals`` — an
  administrator's decision on a request awaiting approval, and the lapse of approved time;
  ``alerting`` — what the service's alert loop reads, and the audit of its alerts;
  ``outside`` — devices pods the pool did not place hold, and the device a pod really got;
  ``jobs`` — job leases: a command run on a lease by the job runner, not a hub server.

``Store`` puts them together. Every change of state is a command (``pool/commands.py``) that the
service runs only through its writer (``service/writer.py``), off the event loop; ``dispatch``
names the store method that applies each command type.
"""

from __future__ import annotations

from ..poolconfig import PoolConfig
from .alerting import AlertStore
from .approvals import ApprovalStore
from .budgets import BudgetStore
from .errors import StoreError, lease_not_found
from .kernels import KernelStore
from .kueuejobs import KueueJobStore
from .outside import OutsideStore
from .planning import PlanningStore
from .rows import utcnow
from .views import EVERY_HUB


class Store(
    KernelStore,
    KueueJobStore,
    OutsideStore,
    ApprovalStore,
    BudgetStore,
    PlanningStore,
    AlertStore,
):
    """Leases, inventory, offers, quotas and utilization history in the database, decided by
    an ``Allocator``."""


__all__ = [
    "EVERY_HUB",
    "PoolConfig",
    "Store",
    "StoreError",
    "lease_not_found",
    "utcnow",
]
