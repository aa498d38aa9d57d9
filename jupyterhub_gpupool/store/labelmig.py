"""The one write the Kubernetes label writer needs beyond the re-partition's own: a failure.

A re-partition ``applying`` through the ``nvidia.com/mig.config`` label (``method: label``)
ends ``done`` when the node's new layout arrives as its inventory (``operate``), or ``failed``
when mig-manager says so: then the reason (the node's own message) is kept on the
re-partition for the admin API, and the GPU gets back the cordon it had before.
"""

from __future__ import annotations

from .. import orm
from ..pool import commands as c
from ..pool.facts import PoolState
from .apply import decided
from .operate import OperateStore
from .read.repartitions import RepartitionView


class LabelMigStore(OperateStore):
    """Failures of label re-partitions."""

    def fail_repartition(self, rep_id: int, error: str, *, actor: str = "") -> RepartitionView:
        """Close an ``applying`` label re-partition as ``failed`` with ``error`` (a closed one
        is answered as it is: the writer may report twice; ``pool.decide``)."""
        with self.transaction() as (db, alloc):
            rep = db.get(orm.MigRepartitionRow, rep_id)
            reps = () if rep is None else self._repartitions(db, alloc, [rep])
            state = PoolState(alloc, repartitions=reps)
            outcome = decided(state, c.FailRepartition(rep_id, error), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor or "system")
            assert rep is not None  # else refused
            return self._repartition_view(db, rep, self._find_gpu(db, rep.node, rep.gpu_uuid))
