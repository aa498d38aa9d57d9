"""Jobs Kubernetes runs: a Kueue Workload admitted through the pool's AdmissionCheck holds a
job lease (issue 35, item 5).

The job row says who runs it (``runner`` = ``kueue``, ``runner_ref`` = the Workload's
namespace, name and uid). Its liveness is the Workload's, which the controller
(``kube.kueue.KueueAdmission``) reads each round: admitted → ``running``; finished, deleted or
evicted → the job ends and its lease is released. The local runner never sees these jobs
(``JobStore.node_jobs``) and the runner timeout does not apply to them.
"""

from __future__ import annotations

from sqlalchemy import select

from .. import orm
from ..pool import commands as c
from ..pool.rules.jobs import KUBE_OUTCOMES as OUTCOMES
from ..pool.rules.jobs import KUEUE, kueue_job_of
from .jobs import ALIVE_STATES, JobStore
from .read.jobs import JobView

__all__ = ["KUEUE", "OUTCOMES", "KueueJobStore"]


class KueueJobStore(JobStore):
    """Submit and end the jobs of Kueue Workloads."""

    def kueue_job(
        self,
        user: str,
        offer: str,
        workload: str,
        namespace: str,
        name: str,
        uid: str,
        *,
        actor: str = "",
    ) -> JobView:
        """The live job of the Workload ``uid`` (or the one a user cancelled in the pool: the
        controller rejects the Workload), else a new one asking for ``offer`` (granted or
        queued; refused as ``SubmitJob`` is, e.g. ``unknown_class``): one lease per Workload
        however many rounds see it waiting."""
        command = c.KueueJob(user, offer, workload, namespace, name, uid, actor=actor)
        with self.locked() as alloc, self.read() as db:  # most rounds: it has its job
            found = kueue_job_of(self._kueue_jobs(db, command), uid)
            if found is not None:
                return self._job_view(db, alloc, self._job_row(db, found))
        return self._new_job(command, actor or f"kueue:{namespace}")

    def kueue_jobs(self) -> list[JobView]:
        """The live jobs of Kueue Workloads (queued to preempting), oldest first."""
        return self.runner_jobs(KUEUE)

    def runner_jobs(self, runner: str) -> list[JobView]:
        """The live jobs (queued to preempting) ``runner`` runs, oldest first, with env."""
        with self.locked() as alloc, self.read() as db:
            rows = db.scalars(
                select(orm.JobRow)
                .where(orm.JobRow.runner == runner, orm.JobRow.state.in_(("queued", *ALIVE_STATES)))
                .order_by(orm.JobRow.created, orm.JobRow.id)
            )
            return [self._job_view(db, alloc, j, with_env=True) for j in rows]

    def end_kube_job(
        self, job_id: str, outcome: str, message: str = "", *, actor: str = ""
    ) -> JobView:
        """The Workload ``succeeded`` or ``failed`` (Kueue's ``Finished``), was ``deleted``, or
        was ``evicted`` (after the pool's ``Retry`` of a preempting job: ``preempted``; by
        Kueue itself: ``cancelled``, Kueue queues it again and the pool sees a new request).
        The job ends and its lease is released; an ended job stays as it is. ``pool.decide``
        decides (``rules.jobs``)."""
        return self._job_command(
            c.EndKubeJob(job_id, outcome, message, actor=actor), actor or "kueue"
        )
