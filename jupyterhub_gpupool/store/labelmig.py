"""The one write the Kubernetes label writer needs beyond the re-partition's own: a failure.

A re-partition ``applying`` through the ``nvidia.com/mig.config`` label (``method: label``)
ends ``done`` when the node's new layout arrives as its inventory (``operate``), or ``failed``
when mig-manager says so: then the reason (the node's own message) is kept on the
re-partition for the admin API, and the GPU gets back the cordon it had before.
"""

from __future__ import annotations

from typing import Any

from .. import orm
from .errors import StoreError
from .operate import OperateStore


class LabelMigStore(OperateStore):
    """Failures of label re-partitions."""

    def fail_repartition(self, rep_id: int, error: str, *, actor: str = "") -> dict[str, Any]:
        """Close an ``applying`` label re-partition as ``failed`` with ``error`` (a closed one
        is answered as it is: the writer may report twice)."""
        with self.transaction() as (db, _):
            rep = db.get(orm.MigRepartitionRow, rep_id)
            if rep is None:
                raise StoreError("not_found", f"no re-partition {rep_id}", field="id")
            try:
                g = self._gpu_row(db, rep.node, rep.gpu_uuid)
            except StoreError:
                g = None
            if rep.state == "applying" and rep.method == "label":
                self._close(db, rep, g, "failed", error[:2000], actor or "system")
                self._allocator = None
            return self._repartition_json(db, rep, g)
