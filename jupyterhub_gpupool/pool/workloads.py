"""Workload classes: interactive servers, training jobs and inference services, each with its
own rules, drawn from one pool (the pool config's ``classes:``).

Why three: a notebook within its guarantee must never lose its GPU to a batch job, a training
job can stop at a checkpoint and start again (so it may borrow idle capacity and be preempted
with a notice), and an inference service answers other people's requests (so it is never
preempted and never reclaimed for being idle). The rules here are pure; the store applies them.

* priority: a request's queue priority is its offer's (``Offer.priority``) plus its class's
  distance from ``interactive`` (training 50 − 100 = −50 on a default offer, inference +25),
  so an offer's own priority class still orders requests within a class and a server's
  priority is what it always was;
* preemption order (:func:`preemption_rank`): for a within-guarantee request of a
  non-preemptible class that cannot be placed, leases of a preemptible class go first (those
  already being preempted, then the youngest: the least work lost), then borrowed leases of a
  class no higher than the requester's (``borrowing.reclaim_order``); nothing else is taken;
* preemption for a long waiter (:func:`waiter_preemption_rank`): a request of a preemptible
  class with ``preempt_for_waiters`` that has waited past the allocator's ``reserve_after``
  (so it holds one node, ``pool.reservation``) may take, on that node only, borrowed leases of
  a preemptible class no higher than its own that are smaller than it asks (an 8-GPU training
  takes 1- and 4-GPU ones): the node is held, nothing new lands there, but the trainings that
  backfilled it before it was held would keep it for hours;
* idle reclaim: a class with ``idle_reclaim: false`` is never reclaimed for being idle.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction

from .borrowing import reclaim_order
from .errors import ConfigError, PoolError
from .limits import MAX_INT, check_name, shown
from .model import Offer

INTERACTIVE = "interactive"
TRAINING = "training"
INFERENCE = "inference"
#: The lease holder of a job (``LeaseRow.holder``); a server's lease has none.
JOB_HOLDER = "job"
#: The most seconds a preemption notice may give (a day).
MAX_GRACE = 86400
_FIELDS = {
    "priority",
    "preemptible",
    "idle_reclaim",
    "grace",
    "allowed_groups",
    "preempt_for_waiters",
}


@dataclass(frozen=True)
class WorkloadClass:
    """One class's rules (``allowed_groups`` empty: every user may use it)."""

    name: str
    priority: int
    preemptible: bool = False
    idle_reclaim: bool = True
    grace: int = 0
    allowed_groups: tuple[str, ...] = ()
    #: A long waiter of this (preemptible) class may preempt smaller borrowed leases of a
    #: preemptible class no higher than it on the node held for it (:func:`waiter_preemption_rank`).
    preempt_for_waiters: bool = False

    def allows(self, groups: Iterable[str]) -> bool:
        """Whether a user in ``groups`` may use this class."""
        return not self.allowed_groups or bool(set(self.allowed_groups) & set(groups))


DEFAULT_CLASSES: Mapping[str, WorkloadClass] = {
    INTERACTIVE: WorkloadClass(INTERACTIVE, 100, preemptible=False, idle_reclaim=True),
    TRAINING: WorkloadClass(
        TRAINING, 50, preemptible=True, idle_reclaim=False, grace=300, preempt_for_waiters=True
    ),
    INFERENCE: WorkloadClass(INFERENCE, 125, preemptible=False, idle_reclaim=False),
}


def parse_classes(raw: object, path: str = "classes") -> dict[str, WorkloadClass]:
    """The ``classes:`` section: every default class, each overridden field by field by what
    the section says; a new name is a new class (fields not given: not preemptible, idle
    reclaim on, priority 0)."""
    out = dict(DEFAULT_CLASSES)
    if raw is None:
        return out
    if not isinstance(raw, Mapping):
        raise ConfigError(f"must be a mapping of class → rules, got {shown(raw)}", field=path)
    for name, spec in raw.items():
        where = f"{path}.{shown(name)}"
        name = check_name(str(name), where, "a workload class's name")
        if spec is None:
            spec = {}
        if not isinstance(spec, Mapping):
            raise ConfigError(f"must be a mapping, got {shown(spec)}", field=where)
        unknown = set(spec) - _FIELDS
        if unknown:
            raise ConfigError(
                f"unknown field(s) {', '.join(sorted(map(str, unknown)))}",
                field=where,
                allowed=sorted(_FIELDS),
            )
        base = out.get(name, WorkloadClass(name, 0))
        priority = spec.get("priority", base.priority)
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > MAX_INT:
            raise ConfigError(
                f"must be a whole number, got {shown(priority)}", field=f"{where}.priority"
            )
        flags = {}
        for key in ("preemptible", "idle_reclaim", "preempt_for_waiters"):
            value = spec.get(key, getattr(base, key))
            if not isinstance(value, bool):
                raise ConfigError(
                    f"must be true or false, got {shown(value)}", field=f"{where}.{key}"
                )
            flags[key] = value
        grace = spec.get("grace", base.grace)
        if isinstance(grace, bool) or not isinstance(grace, int) or not 0 <= grace <= MAX_GRACE:
            raise ConfigError(
                f"must be whole seconds from 0 to {MAX_GRACE}, got {shown(grace)}",
                field=f"{where}.grace",
            )
        groups = spec.get("allowed_groups", list(base.allowed_groups)) or []
        if not isinstance(groups, list):
            raise ConfigError("must be a list of group names", field=f"{where}.allowed_groups")
        allowed = tuple(
            check_name(str(g), f"{where}.allowed_groups[{i}]", "a group's name")
            for i, g in enumerate(groups)
        )
        out[name] = WorkloadClass(
            name,
            priority,
            flags["preemptible"],
            flags["idle_reclaim"],
            grace,
            allowed,
            flags["preempt_for_waiters"],
        )
    if out[INTERACTIVE].preemptible:
        raise ConfigError(
            "servers cannot be preempted (they have no checkpoint notice)",
            field=f"{path}.{INTERACTIVE}.preemptible",
        )
    return out


def class_for(
    classes: Mapping[str, WorkloadClass], name: str, groups: Iterable[str]
) -> WorkloadClass:
    """The class ``name`` for a user in ``groups``: ``unknown_class`` or ``class_not_allowed``
    (refusals with a code, as the REST API answers them)."""
    cls = classes.get(name)
    if cls is None:
        raise PoolError(
            f"there is no workload class {name!r}",
            field="class",
            allowed=sorted(classes),
            code="unknown_class",
        )
    if not cls.allows(groups):
        raise PoolError(
            f"the class {name!r} is for the groups {', '.join(cls.allowed_groups)} only",
            field="class",
            code="class_not_allowed",
        )
    return cls


def lease_class(classes: Mapping[str, WorkloadClass], workload: str | None) -> WorkloadClass:
    """The class of a lease: its own (a job's), else ``interactive`` (a server's, or a class
    removed from the config since: treated as the safest, never preempted)."""
    return classes.get(workload or INTERACTIVE) or classes[INTERACTIVE]


def request_priority(
    classes: Mapping[str, WorkloadClass], cls: WorkloadClass, offer_priority: int
) -> int:
    """Queue priority of a request of ``cls`` for an offer of ``offer_priority``."""
    return offer_priority + cls.priority - classes[INTERACTIVE].priority


#: The most replicas one job may ask for.
MAX_REPLICAS = 64


def check_replicas(replicas: object, cls: WorkloadClass, offer: Offer | None) -> int:
    """A job's replicas: a whole number from 1 to ``MAX_REPLICAS``; more than one only for
    class ``inference`` (a service's copies; a training spreads with a larger offer) and a
    whole-GPU offer (its grant is the offer's GPUs times the replicas, on one node: MIG slices
    and shares are one device a grant). Refusals are ``invalid_replicas``."""
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise PoolError(
            f"replicas must be a whole number, got {shown(replicas)}",
            field="replicas",
            code="invalid_replicas",
        )
    if not 1 <= replicas <= MAX_REPLICAS:
        raise PoolError(
            f"replicas must be from 1 to {MAX_REPLICAS}, got {replicas}",
            field="replicas",
            code="invalid_replicas",
        )
    if replicas > 1 and cls.name != INFERENCE:
        raise PoolError(
            f"only class {INFERENCE!r} has replicas; class {cls.name!r} asks for a larger offer",
            field="replicas",
            code="invalid_replicas",
        )
    if replicas > 1 and offer is not None and offer.kind != "gpu":
        raise PoolError(
            f"offer {offer.name!r} is a {offer.kind} offer: replicas need whole GPUs",
            field="replicas",
            code="invalid_replicas",
        )
    return replicas


def replicas_of(offer: Offer, replicas: int) -> Offer:
    """What one grant of ``replicas`` copies of ``offer`` holds, so the quota charges it and
    placement finds room for it: ``replicas`` times the GPUs, CPU and memory, on one node
    (named apart from the offer, so the allocator's per-offer caches never mix them)."""
    if replicas == 1:
        return offer
    return replace(
        offer,
        name=f"{offer.name}*{replicas}",
        count=offer.count * replicas,
        cpu_milli=offer.cpu_milli * replicas,
        memory_mib=offer.memory_mib * replicas,
    )


def idle_reclaimable(classes: Mapping[str, WorkloadClass], workload: str | None) -> bool:
    """Whether the idle reclaimer may give a lease of this class a notice."""
    return lease_class(classes, workload).idle_reclaim


#: What a job may carry: its command's words and their total, its environment's variables.
MAX_ARGS = 1024
MAX_COMMAND_CHARS = 64 * 1024
MAX_ENV = 256
MAX_ENV_CHARS = 64 * 1024
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
#: Variables the runner sets itself (a job may not set them).
RUNNER_ENV = ("CUDA_VISIBLE_DEVICES", "GPUPOOL_JOB_ID", "GPUPOOL_PREEMPT_NOTICE")


def check_job(command: object, env: object) -> tuple[list[str], dict[str, str] | None]:
    """A job's command (a non-empty list of strings, the first not empty) and environment
    (names → strings; not the runner's own variables), or the refusal: ``invalid_command``,
    ``invalid_env``."""
    if not isinstance(command, list) or not command:
        raise PoolError(
            "command must be a non-empty list of strings (the program, then its arguments)",
            field="command",
            code="invalid_command",
        )
    if not all(isinstance(w, str) for w in command) or not command[0]:
        raise PoolError(
            "command must be a list of strings, the program first",
            field="command",
            code="invalid_command",
        )
    if len(command) > MAX_ARGS or sum(len(w) for w in command) > MAX_COMMAND_CHARS:
        raise PoolError(
            f"command is too long (at most {MAX_ARGS} words, {MAX_COMMAND_CHARS} characters)",
            field="command",
            code="invalid_command",
        )
    if any("\0" in w for w in command):
        raise PoolError("command contains NUL", field="command", code="invalid_command")
    if env is None:
        return list(command), None
    if not isinstance(env, Mapping) or len(env) > MAX_ENV:
        raise PoolError(
            f"env must be an object of at most {MAX_ENV} names → strings",
            field="env",
            code="invalid_env",
        )
    total = 0
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise PoolError(
                f"{shown(key)} is not an environment variable name", field="env", code="invalid_env"
            )
        if key in RUNNER_ENV:
            raise PoolError(
                f"{key} is set by the job runner", field=f"env.{key}", code="invalid_env"
            )
        if not isinstance(value, str) or "\0" in value:
            raise PoolError(
                f"must be a string without NUL, got {shown(value)}",
                field=f"env.{key}",
                code="invalid_env",
            )
        total += len(key) + len(value)
    if total > MAX_ENV_CHARS:
        raise PoolError(f"env is over {MAX_ENV_CHARS} characters", field="env", code="invalid_env")
    return list(command), dict(env)


#: The longest working directory a job may name (Linux's PATH_MAX).
MAX_CWD_CHARS = 4096


def check_cwd(cwd: object) -> str | None:
    """A job's working directory: an absolute path (where it was submitted from), or None."""
    if cwd is None:
        return None
    if (
        not isinstance(cwd, str)
        or not cwd.startswith("/")
        or "\0" in cwd
        or len(cwd) > MAX_CWD_CHARS
    ):
        raise PoolError(
            f"cwd must be an absolute path of at most {MAX_CWD_CHARS} characters",
            field="cwd",
            code="invalid_field",
        )
    return cwd


@dataclass(frozen=True)
class Holder:
    """A live lease as preemption sees it."""

    id: str
    cls: WorkloadClass
    borrowed: bool
    granted_at: float
    #: Units its owner holds beyond guarantee (``borrowing.owner_surplus``).
    surplus: Fraction = Fraction(0)
    #: Already under a preemption notice (leaving anyway).
    leaving: bool = False
    #: Units it holds (:func:`waiter_preemption_rank` takes only smaller leases).
    units: Fraction = Fraction(0)


Rank = tuple[int, tuple[Fraction, float, float, str]]


def preemption_rank(holder: Holder, requester: WorkloadClass, now: float) -> Rank | None:
    """Sort key of ``holder`` among the leases a within-guarantee request of ``requester``
    may take (smallest first), or None: never taken for it.

    A preemptible requester takes nothing; a preemptible lease goes first (one already
    leaving before any other, then the youngest); then a borrowed lease of a class no higher
    than the requester's, in ``borrowing.reclaim_order``. Inference (highest) is never taken.
    """
    if requester.preemptible:
        return None
    if holder.cls.preemptible:
        return (0 if holder.leaving else 1, (Fraction(0), 0.0, -holder.granted_at, holder.id))
    if holder.borrowed and holder.cls.priority <= requester.priority:
        return (2, reclaim_order(holder.surplus, None, holder.granted_at, holder.id, now))
    return None


def waiter_preemption_rank(
    holder: Holder, requester: WorkloadClass, units: Fraction, now: float
) -> Rank | None:
    """Sort key of ``holder`` among the leases a long waiter of ``requester`` for ``units`` may
    take on the node held for it (smallest first), or None: never taken for it.

    Only when ``requester`` is preemptible with ``preempt_for_waiters``; only a borrowed lease
    (never one within its owner's guarantee) of a preemptible class no higher than the
    requester's, holding fewer units than it asks: so a lease is never taken by one it
    could take back (no preemption cycle), and interactive and inference leases (never
    preemptible) are never taken. One already leaving goes first, then the youngest (the
    least work lost); the allocator keeps only as many as the node needs
    (``Allocator.reclaimable_for`` with ``node``).
    """
    if not (requester.preemptible and requester.preempt_for_waiters):
        return None
    if not (holder.cls.preemptible and holder.borrowed):
        return None
    if holder.cls.priority > requester.priority or holder.units >= units:
        return None
    return (0 if holder.leaving else 1, (Fraction(0), 0.0, -holder.granted_at, holder.id))


def preempting_reason(requester_user: str, offer: str, long_waiter: bool = False) -> str:
    """What a preemption notice says (the job's ``reason``, the notice file's);
    ``long_waiter``: for a long waiter on the node held for it."""
    if long_waiter:
        return f"preempted: {requester_user}'s larger job has waited long for {offer} on this node"
    return f"preempted: {requester_user} (within guarantee) waits for {offer}"


__all__ = [
    "DEFAULT_CLASSES",
    "INFERENCE",
    "INTERACTIVE",
    "JOB_HOLDER",
    "TRAINING",
    "Holder",
    "WorkloadClass",
    "check_job",
    "class_for",
    "idle_reclaimable",
    "lease_class",
    "parse_classes",
    "preempting_reason",
    "preemption_rank",
    "request_priority",
    "waiter_preemption_rank",
]
