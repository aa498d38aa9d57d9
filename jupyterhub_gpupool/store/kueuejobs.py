"""Jobs Kubernetes runs: a Kueue Workload admitted through the pool's AdmissionCheck holds a
job lease (issue 35, item 5).

The job row says who runs it (``runner`` = ``kueue``, ``runner_ref`` = the Workload's
namespace, name and uid). Its liveness is the Workload's, which the controller
(``kube.kueue.KueueAdmission``) reads each round: admitted → ``running``; finished, deleted or
evicted → the job ends and its lease is released. The local runner never sees these jobs
(``JobStore.node_jobs``) and the runner timeout does not apply to them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from .. import orm
from .errors import StoreError
from .jobs import ALIVE_STATES, JobStore

KUEUE = "kueue"
#: How a Workload ended, as the controller reports it.
OUTCOMES = ("succeeded", "failed", "deleted", "evicted")


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
    ) -> dict[str, Any]:
        """The live job of the Workload ``uid`` (or the one a user cancelled in the pool: the
        controller rejects the Workload), else a new one asking for ``offer`` (granted or
        queued; refused as ``SubmitJob`` is, e.g. ``unknown_class``): one lease per Workload
        however many rounds see it waiting."""
        with self.locked() as alloc, self.read() as db:
            for job in db.scalars(
                select(orm.JobRow)
                .where(orm.JobRow.runner == KUEUE, orm.JobRow.name == f"{namespace}/{name}")
                .order_by(orm.JobRow.created.desc())
            ):
                if (job.runner_ref or {}).get("uid") != uid:
                    continue
                live = job.state in ("queued", *ALIVE_STATES)
                if live or (job.state == "cancelled" and (job.reason or "").startswith("cancel")):
                    return self._job_json(db, alloc, job)
        ref = {"namespace": namespace, "name": name, "uid": uid}
        return self._new_job(
            user, offer, [], workload, f"{namespace}/{name}", None, (), None, None,
            actor or f"kueue:{namespace}", runner=KUEUE, runner_ref=ref,
        )  # fmt: skip

    def kueue_jobs(self) -> list[dict[str, Any]]:
        """The live jobs of Kueue Workloads (queued to preempting), oldest first."""
        return self.runner_jobs(KUEUE)

    def runner_jobs(self, runner: str) -> list[dict[str, Any]]:
        """The live jobs (queued to preempting) ``runner`` runs, oldest first, with env."""
        with self.locked() as alloc, self.read() as db:
            rows = db.scalars(
                select(orm.JobRow)
                .where(orm.JobRow.runner == runner, orm.JobRow.state.in_(("queued", *ALIVE_STATES)))
                .order_by(orm.JobRow.created, orm.JobRow.id)
            )
            return [self._job_json(db, alloc, j, with_env=True) for j in rows]

    def end_kube_job(
        self, job_id: str, outcome: str, message: str = "", *, actor: str = ""
    ) -> dict[str, Any]:
        """The Workload ``succeeded`` or ``failed`` (Kueue's ``Finished``), was ``deleted``, or
        was ``evicted`` (after the pool's ``Retry`` of a preempting job: ``preempted``; by
        Kueue itself: ``cancelled``, Kueue queues it again and the pool sees a new request).
        The job ends and its lease is released; an ended job stays as it is."""
        if outcome not in OUTCOMES:
            raise StoreError(
                "invalid_field",
                f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}",
                field="outcome",
                allowed=OUTCOMES,
            )
        now = self.clock()
        with self.transaction() as (db, alloc):
            job = self._job_row(db, job_id)
            if job.state in orm.JOB_FINAL:
                return self._job_json(db, alloc, job)
            why = "cancelled" if job.state == "queued" else "stopped"
            if job.state == "cancelling":  # the pool's cancel, carried out by Kueue
                job.state, message = "cancelled", "cancelled in the pool"
            elif outcome == "evicted" and job.state == "preempting":
                job.state, why = "preempted", "preempted"
            elif outcome in ("deleted", "evicted"):
                job.state = "cancelled"
            else:
                job.state = outcome
            job.ended = now
            if job.state != "preempted" and (message or outcome != "succeeded"):
                job.reason = message or f"workload {outcome}"
            self._end_lease(db, alloc, job, why)
            self._job_event(db, "job-ended", actor or "kueue", job, outcome=outcome)
            return self._job_json(db, alloc, job)
