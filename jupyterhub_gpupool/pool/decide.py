"""The pool decides: ``decide(state, command, now) -> Outcome(answer, effects)``.

In the spirit of dask's ``handle_stimulus``, which returns instructions rather than doing
them: ``decide`` reads the pool state (``PoolState``: the allocator, plus the few facts of the
rows the rules need, which the store gathers first), changes nothing and does no I/O, and says
what is to happen as effects (``pool.effects``). The store's one applier makes them true in
one transaction (``store/apply.py``); the service serializes the answer. A refusal is raised
as a ``Refusal`` (its code, message, field and allowed values are the API's error body).

The commands decided here are the keys of ``DECIDED``; their rules live in ``pool.rules``, one
module per area, over the view in ``pool.facts``: leases; approvals; nodes (cordon, drain,
reachability, sharing); quotas; jobs and kernels; reclaim (a reclaimer's round, an action's
outcome, the reclaim policy); notices (an administrator's reclaim, extension and cancel, the
service's claim of an overdue notice, a spent budget's notices); inventory (a node's
inventory: the node put in place of its own, ``pool.nodeput``; outside marks, rebinding);
mig (a node's MIG results, re-partitions); config (a pool config's load: the offer, quota and
node rows it writes, the requests and leases its removals end, the allocator changed in place,
``pool.offertable`` and ``pool.nodeput``, and the queue served). A job's or a kernel's request
is the lease rule's ``allocate`` with its holder's effect after it; a job that ends takes its lease
along (``JobEnded``), and a preemption round plays the ends as it goes (``ending.finish_in``).
``pool.ending``'s ``finish`` and ``serve_queue`` are the same rules for the store's other
callers that end a lease or serve the queue; its ``admin_notice`` gives an enforced notice (an
admin's, a drain's, a budget's, a lapse's) for every caller that gives one, and
``uncordon_withdrawals`` is the notices an uncordon withdraws. The quota-edit preview is the
``PatchQuota`` rule with its effects read and discarded (``rules.quotas.quota_preview``). What
differs by a lease's holder (a server, a job, a kernel) is a rule of ``pool.holders`` these
rules ask, never a store method of its own.
"""

from __future__ import annotations

from . import commands as c
from .facts import Outcome, PoolState, Rule
from .rules import (
    approvals,
    config,
    inventory,
    jobs,
    kernels,
    leases,
    mig,
    nodes,
    notices,
    quotas,
    reclaim,
)


def decide(state: PoolState, command: c.Command, now: float) -> Outcome:
    """Decide ``command`` on ``state`` at ``now`` (epoch seconds); changes nothing."""
    rule = _RULES.get(type(command))
    if rule is None:
        raise ValueError(f"{type(command).__name__} is not decided by pool.decide yet")
    return rule(state, command, now)


_RULES: dict[type[c.Command], Rule] = {
    **leases.RULES,
    **approvals.RULES,
    **nodes.RULES,
    **quotas.RULES,
    **jobs.RULES,
    **kernels.RULES,
    **reclaim.RULES,
    **notices.RULES,
    **inventory.RULES,
    **mig.RULES,
    **config.RULES,
}

#: Commands ``decide`` decides.
DECIDED = frozenset(_RULES)
#: Commands that take no decision: what the pool is told or keeps, written as it comes (a
#: utilization sample's minutes and their pruning, a lab's presence, a server's URL, a job's
#: output, a refusal counted for planning, the alerts' states, the reclaimer's leader lock).
#: Later decisions read some of them as facts (presence, samples); none changes a lease, a
#: device, a quota or the queue when it arrives.
RECORDS = frozenset(
    {
        c.WriteMinutes,
        c.PruneMinutes,
        c.PruneSamples,
        c.ReportPresence,
        c.SetServerUrl,
        c.AppendJobLog,
        c.RecordRefusal,
        c.RecordAlerts,
        c.TakeLeader,
        c.GiveUpLeader,
    }
)
#: Commands that change the pool by writing rows the allocator is then rebuilt from, deciding
#: inside the store as they write them: none any more (a node's inventory is decided by
#: ``rules.inventory``); kept so that a command that would be one must say so.
REBUILDS: frozenset[type[c.Command]] = frozenset()
