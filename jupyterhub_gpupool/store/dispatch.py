"""Which store method applies each command: the writer's one dispatch table, by type.

The table is written against the finished ``Store`` class (``appliers(Store)``), so a method
that a later mixin overrides is the one that runs. A command's fields are its method's
parameters, passed by name; ``actor`` goes only to the methods that audit as someone
(``takes_actor``). ``tests/unit/test_commands.py`` checks that every command has a line, and
that the fields and the parameters agree.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

from ..pool import commands as c


class Applier(NamedTuple):
    """How one command type is applied."""

    method: Callable[..., Any]
    takes_actor: bool


def table(store: type) -> dict[type[c.Command], Callable[..., Any]]:
    """Command type → the store method (unbound) that applies it."""
    s: Any = store
    return {
        c.Allocate: s.allocate,
        c.Release: s.release,
        c.Keepalive: s.keepalive,
        c.SetServerUrl: s.set_server_url,
        c.ReportPresence: s.report_presence,
        c.Resize: s.resize,
        c.MarkRestarting: s.mark_restarting,
        c.ExpireGrants: s.expire_grants,
        c.Promote: s.promote,
        c.Reconcile: s.reconcile,
        c.Approve: s.approve,
        c.Deny: s.deny,
        c.LapseApprovals: s.lapse_approvals,
        c.BudgetRound: s.budget_round,
        c.RecordRefusal: s.record_refusal,
        c.LoadConfig: s.load_config,
        c.SetNode: s.set_node,
        c.DrainNode: s.drain_node,
        c.PutQuota: s.put_quota,
        c.PatchQuota: s.patch_quota,
        c.ResetQuota: s.reset_quota,
        c.PutInventory: s.put_inventory,
        c.Rebind: s.rebind,
        c.SetOutside: s.set_outside,
        c.SetSharing: s.set_sharing,
        c.AddBusy: s.add_busy,
        c.MarkUnreachable: s.mark_unreachable,
        c.MigResults: s.mig_results,
        c.WriteMinutes: s.write_minutes,
        c.PruneMinutes: s.prune_minutes,
        c.PruneSamples: s.prune_samples,
        c.TakeLeader: s.take_leader,
        c.GiveUpLeader: s.give_up_leader,
        c.ReclaimRound: s.reclaim_round,
        c.ReclaimOutcome: s.reclaim_outcome,
        c.PutReclaimPolicy: s.put_reclaim_policy,
        c.ResetReclaimPolicy: s.reset_reclaim_policy,
        c.AdminReclaim: s.admin_reclaim,
        c.ExtendNotice: s.extend_notice,
        c.CancelNotice: s.cancel_notice,
        c.EnforceNotices: s.enforce_notices,
        c.NoticeEnforced: s.notice_enforced,
        c.RecordAlerts: s.record_alerts,
        c.RequestRepartition: s.request_repartition,
        c.CancelRepartition: s.cancel_repartition,
        c.AdvanceRepartitions: s.advance_repartitions,
        c.FailRepartition: s.fail_repartition,
        c.SubmitJob: s.submit_job,
        c.CancelJob: s.cancel_job,
        c.JobStatus: s.job_status,
        c.AppendJobLog: s.append_job_log,
        c.PreemptJobs: s.preempt_jobs,
        c.KueueJob: s.kueue_job,
        c.EndKubeJob: s.end_kube_job,
        c.RequestKernel: s.request_kernel,
        c.ReleaseKernel: s.release_kernel,
        c.KernelActivity: s.kernel_activity,
        c.ReapKernels: s.reap_kernels,
    }


@functools.cache
def appliers(store: type) -> dict[type[c.Command], Applier]:
    """The table for ``store``'s class, with what each method takes (computed once)."""
    out = {}
    for kind, method in table(store).items():
        out[kind] = Applier(method, "actor" in inspect.signature(method).parameters)
    return out


def apply(store: Any, command: c.Command) -> Any:
    """Run ``command`` on ``store`` (in the caller's transaction, if any)."""
    cls: type = type(store)
    try:
        how = appliers(cls)[type(command)]
    except KeyError:
        raise ValueError(f"not a pool command: {command!r}") from None
    kwargs = vars(command).copy()  # its fields (a plain frozen dataclass), ``actor`` too
    if not how.takes_actor:
        del kwargs["actor"]
    return how.method(store, **kwargs)
