"""Database models (SQLAlchemy 2.0 typed mappings). Only the ``store`` package writes them.

The one invariant the database itself enforces: a whole GPU or a MIG instance is held by at most
one live lease (``uq_lease_slots_live``, a unique partial index), so even a buggy or racing
writer cannot grant a slice twice. Shares of a GPU are guarded by capacity in the store.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    select,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

# lease states (contract) are defined with the lease rules; re-exported for the queries here
from .pool.holders import JOB_FINAL as JOB_FINAL
from .pool.leases import LEASE_STATES as LEASE_STATES
from .pool.leases import LIVE_STATES as LIVE_STATES

#: Why a lease ended (contract).
RELEASE_REASONS = (
    "stopped",
    "reclaimed-idle",
    "reclaimed-borrowed",
    "resized",
    "expired",
    "admin",
    "node-lost",
    "cancelled",
    "rejected",
    "mig-failed",
    "orphaned",
    "denied",
    "withdrawn",
    "lapsed",
    "budget",
    "preempted",
)

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base with stable constraint names (Alembic needs them)."""

    metadata = MetaData(naming_convention=NAMING)


class PoolState(Base):
    """One row: a counter bumped by every allocation change, so replicas know when to resync."""

    __tablename__ = "pool_state"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=0)


class PoolChangeRow(Base):
    """What one batch of decisions changed: the leases whose rows it wrote, under the pool
    version it committed. Another process that last saw the version before reloads just those
    leases instead of rebuilding its allocator (``store/changes.py``). A version without a row
    (any other change: inventory, quotas, MIG, config) makes it rebuild."""

    __tablename__ = "pool_changes"
    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    leases: Mapped[list[str]] = mapped_column(JSON, default=list)


class NodeRow(Base):
    """A GPU node (from the pool config or an agent)."""

    __tablename__ = "nodes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    cluster: Mapped[str] = mapped_column(String(255), default="default")
    cpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    memory_mib: Mapped[int] = mapped_column(Integer, default=0)
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    draining: Mapped[bool] = mapped_column(Boolean, default=False)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    source: Mapped[str] = mapped_column(String(16), default="config")
    last_seen: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    #: Its agent went silent: no new grants until it reports again (leases stay).
    unreachable: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: What pods the pool did not place hold on it (``pool.outside.OutsideHolds.to_json``).
    outside: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    gpus: Mapped[list[GpuRow]] = relationship(
        back_populates="node", cascade="all, delete-orphan", order_by="GpuRow.index"
    )

    @classmethod
    def find(cls, db: Session, name: str) -> NodeRow | None:
        """The node called ``name``, or None."""
        return db.scalar(select(cls).where(cls.name == name))


class GpuRow(Base):
    """A physical GPU on a node."""

    __tablename__ = "gpus"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(64), unique=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(64))
    memory_mib: Mapped[int] = mapped_column(Integer, default=0)
    mig_enabled: Mapped[bool] = mapped_column(Boolean, default=False)
    dynamic_mig: Mapped[bool] = mapped_column(Boolean, default=False)
    sharing: Mapped[str] = mapped_column(String(16), default="auto")
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    #: MIG instances the node last reported (dynamic MIG compares them with ``instances``):
    #: ``[{profile, start, uuid, processes, attempts}]``; None until the node reported.
    observed: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    node: Mapped[NodeRow] = relationship(back_populates="gpus")
    instances: Mapped[list[MigInstanceRow]] = relationship(
        back_populates="gpu", cascade="all, delete-orphan", order_by="MigInstanceRow.start"
    )


class MigInstanceRow(Base):
    """A MIG GPU instance the pool counts on: it exists (static MIG), or the pool wants it
    (dynamic MIG: planned for a grant until the node made it; ``attempts`` and ``error``
    count the node's failed creations)."""

    __tablename__ = "mig_instances"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"))
    profile: Mapped[str] = mapped_column(String(32))
    start: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(String(64), nullable=True)
    gpu: Mapped[GpuRow] = relationship(back_populates="instances")
    __table_args__ = (Index("uq_mig_instances_gpu_start", "gpu_id", "start", unique=True),)


class OfferRow(Base):
    """An offer; ``source`` is ``file`` (pool config) or ``api`` (admin edit, wins over file)."""

    __tablename__ = "offers"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    source: Mapped[str] = mapped_column(String(8), default="file")
    position: Mapped[int] = mapped_column(Integer, default=0)


class QuotaRow(Base):
    """A quota for a user, a group or everybody (``kind`` = user | group | default)."""

    __tablename__ = "quotas"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))
    name: Mapped[str] = mapped_column(String(255))
    guarantee: Mapped[float] = mapped_column(Float, default=0.0)
    limit: Mapped[float | None] = mapped_column(Float, nullable=True)
    budget: Mapped[float | None] = mapped_column(Float, nullable=True)
    period: Mapped[str] = mapped_column(String(8), default="month")
    #: The exception ceiling: the most an approved exception request may take the holder to.
    exception: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: What a spent budget does (``pool.quota.BUDGET_ACTIONS``) and the least budget a grant
    #: starts with.
    budget_action: Mapped[str] = mapped_column(String(8), default="refuse", server_default="refuse")
    budget_minimum: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    source: Mapped[str] = mapped_column(String(8), default="file")
    __table_args__ = (Index("uq_quotas_kind_name", "kind", "name", unique=True),)


class LeaseRow(Base):
    """A lease through its whole life: (awaiting_approval →) queued → granted → active →
    (reclaiming) → released."""

    __tablename__ = "leases"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    server: Mapped[str] = mapped_column(String(255), default="")
    offer: Mapped[str] = mapped_column(String(64))
    group: Mapped[str | None] = mapped_column(String(255), nullable=True)
    groups: Mapped[list[str]] = mapped_column(JSON, default=list)
    #: The clusters the asking hub launches into (None: any): placement stays there.
    clusters: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    #: The hub the lease came from: None for the pool's own hub (its spawner, its users, its
    #: admins), else the name of the other hub's spawner service that asked for it. Reconcile
    #: with the pool's hub touches only its own; a spawner sees only its hub's leases.
    hub: Mapped[str | None] = mapped_column(String(255), nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(24), index=True)
    reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    units: Mapped[str] = mapped_column(String(32), default="0")
    units_f: Mapped[float] = mapped_column(Float, default=0.0)
    borrowed: Mapped[bool] = mapped_column(Boolean, default=False)
    within_guarantee: Mapped[bool] = mapped_column(Boolean, default=True)
    node: Mapped[str | None] = mapped_column(String(255), nullable=True)
    #: A long-waiting request's held node (``pool.headroom``'s sticky hold, ``NodeHeld``):
    #: a restarted or second process holds the same one. None when it holds none.
    held_node: Mapped[str | None] = mapped_column(String(255), nullable=True)
    model: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created: Mapped[datetime] = mapped_column(DateTime)
    queued_since: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    granted: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    activated: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    released: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    release_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    expires: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    keepalive: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    reclaim_deadline: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    reclaim_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: The reclaimer's counts between windows (``pool.reclaim.ReclaimState`` without the
    #: notice, epoch seconds): in the database, so a restarted reclaimer keeps every deadline.
    reclaim_state: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    #: The notice (state ``reclaiming``): what for, what happens, since when, for whom.
    reclaim_kind: Mapped[str | None] = mapped_column(String(16), nullable=True)
    reclaim_action: Mapped[str | None] = mapped_column(String(128), nullable=True)
    reclaim_issued: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    reclaim_pressure: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    reclaim_for: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: Set when a round claimed the action (one of keepalive and act wins); with the release
    #: reason the lease gets whoever releases it, and a shrink's reserved target lease.
    reclaim_acting: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    reclaim_release: Mapped[str | None] = mapped_column(String(32), nullable=True)
    reclaim_target: Mapped[str | None] = mapped_column(String(64), nullable=True)
    resize_of: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: An ask for approval (offer ``approval: required``, or beyond the quota's limit up to
    #: its exception ceiling): the user's reason and duration, then the admin's decision.
    approval: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    #: Approved beyond the limit: held to the exception ceilings (``Request.exception``).
    exception: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: When an approved duration ends: the lease gets a notice before, and ends then.
    lapses: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    busy_hours: Mapped[float] = mapped_column(Float, default=0.0)
    #: The server's own address (``http://10.0.0.7:8888/user/alice/``), set by the spawner:
    #: the reclaimer reads the server there, not through the proxy, which would count its
    #: reads as the user's activity. None: read through the proxy.
    server_url: Mapped[str | None] = mapped_column(String(2048), nullable=True)
    #: ``lab`` once the server's jupyterlab-gpupool reports input: presence is then only what
    #: it reports (``last_input``), never what the hub or the reclaimer see.
    presence_source: Mapped[str | None] = mapped_column(String(16), nullable=True)
    last_input: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    #: Who holds it when not a hub server: ``job`` (``server`` is then ``job:<id>``, the
    #: ``jobs`` row says the rest); None: a server. ``workload``: its class (None: interactive).
    holder: Mapped[str | None] = mapped_column(String(16), nullable=True)
    workload: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: Copies of the offer it holds (an inference job's replicas): its units and devices are
    #: the offer's times this (``Request.replicas``).
    replicas: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    slots: Mapped[list[LeaseSlotRow]] = relationship(
        back_populates="lease", cascade="all, delete-orphan", order_by="LeaseSlotRow.id"
    )
    __table_args__ = (
        # queue wait estimates count an offer's releases of the last hour (Store._release_rate)
        Index("ix_leases_offer_released", "offer", "released"),
    )
    # Every column with a server default has a Python default too, so an INSERT never needs
    # RETURNING to read one back; without this the ORM asks for it, which turns a batch's
    # lease INSERTs into one statement of 40 parameters per row that the driver parses anew
    # each time (on PostgreSQL ~30% of a batch of grants' CPU) instead of a prepared one.
    __mapper_args__ = {"eager_defaults": False}

    @classmethod
    def find(cls, db: Session, lease_id: str) -> LeaseRow | None:
        """The lease with that id, or None."""
        return db.get(cls, lease_id)


class LeaseSlotRow(Base):
    """One piece of one GPU held by a lease; ``live`` while the lease holds it."""

    __tablename__ = "lease_slots"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    lease_id: Mapped[str] = mapped_column(ForeignKey("leases.id", ondelete="CASCADE"), index=True)
    slot_key: Mapped[str] = mapped_column(String(128))
    gpu_uuid: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(8))
    profile: Mapped[str | None] = mapped_column(String(32), nullable=True)
    start: Mapped[int | None] = mapped_column(Integer, nullable=True)
    milli: Mapped[int] = mapped_column(Integer, default=1000)
    create: Mapped[bool] = mapped_column(Boolean, default=False)
    live: Mapped[bool] = mapped_column(Boolean, default=True)
    lease: Mapped[LeaseRow] = relationship(back_populates="slots")
    __table_args__ = (
        # No whole GPU or MIG instance is ever held twice: enforced by the database itself.
        Index(
            "uq_lease_slots_live",
            "slot_key",
            unique=True,
            sqlite_where=text("live AND kind != 'shared'"),
            postgresql_where=text("live AND kind != 'shared'"),
        ),
    )


class EventRow(Base):
    """Audit log: every lease transition and admin action."""

    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[datetime] = mapped_column(DateTime, index=True)
    actor: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(64))
    lease_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    user: Mapped[str | None] = mapped_column(String(255), nullable=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class RefusalRow(Base):
    """Requests refused outright (no lease row is written for them), counted per UTC day, offer
    and code: capacity planning tells refusals by quota from refusals by capacity."""

    __tablename__ = "refusals"
    day: Mapped[datetime] = mapped_column(DateTime, primary_key=True)
    offer: Mapped[str] = mapped_column(String(64), primary_key=True)
    code: Mapped[str] = mapped_column(String(32), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0)


class UtilizationMinuteRow(Base):
    """One minute of one device's utilization: history for reports and charts past the window.

    ``start`` is the MIG instance's start, or -1 for the whole GPU (a NULL would escape the
    unique key). ``util_samples`` counts the samples that had a utilization (MIG devices may
    have none), so late samples for a stored minute merge into an exact mean.
    """

    __tablename__ = "utilization_minutes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(String(64))
    start: Mapped[int] = mapped_column(Integer, default=-1)
    minute: Mapped[datetime] = mapped_column(DateTime, index=True)
    samples: Mapped[int] = mapped_column(Integer, default=0)
    util_samples: Mapped[int] = mapped_column(Integer, default=0)
    util_mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    util_max: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_used_mib_max: Mapped[int] = mapped_column(Integer, default=0)
    __table_args__ = (UniqueConstraint("gpu_uuid", "start", "minute"),)


class UtilizationSampleRow(Base):
    """One raw telemetry sample of one device, kept for ``PoolService.utilization_window``
    seconds: what the reclaim round reads, so every replica decides on the same samples,
    whichever replica an agent posted them to.

    The key is (GPU, MIG start or -1, time): a sample posted twice (a retry, to the same or
    another replica) is stored once. ``lease_util`` holds the per-process utilization by lease
    (``[[lease, %], ...]``, or null where the GPU gave none).
    """

    __tablename__ = "utilization_samples"
    gpu_uuid: Mapped[str] = mapped_column(String(64), primary_key=True)
    start: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    ts: Mapped[float] = mapped_column(Float, primary_key=True, index=True)
    util: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_used_mib: Mapped[int] = mapped_column(Integer, default=0)
    processes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    lease_util: Mapped[list[list[Any]] | None] = mapped_column(JSON, nullable=True)


class LeaseUsageRow(Base):
    """Busy time of one lease in one UTC hour, recorded as it happens (``pool.usage``): seconds
    busy (each device of a multi-device lease counted once: the seconds are divided by the
    lease's devices) and, of those, seconds only estimated (MIG without utilization: judged
    from memory and processes). Held time is the lease's own interval (granted → released)."""

    __tablename__ = "lease_usage"
    lease_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    hour: Mapped[datetime] = mapped_column(DateTime, primary_key=True, index=True)
    busy_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    estimated_seconds: Mapped[float] = mapped_column(Float, default=0.0)


class PriceRow(Base):
    """One price of one GPU model with its effective start (a whole UTC hour): the price table
    over time. Rows before the next whole hour are never changed (``pool.pricing.reconcile``);
    ``held`` NULL: unpriced from then. Prices are exact decimals, kept as text."""

    __tablename__ = "prices"
    model: Mapped[str] = mapped_column(String(64), primary_key=True)
    start: Mapped[datetime] = mapped_column(DateTime, primary_key=True)
    held: Mapped[str | None] = mapped_column(String(32), nullable=True)
    busy: Mapped[str | None] = mapped_column(String(32), nullable=True)
    currency: Mapped[str] = mapped_column(String(8))


class ReclaimLeaderRow(Base):
    """One row: which reclaimer replica may run rounds and act, until when (a lease on
    leadership the holder renews; another takes over once it expires)."""

    __tablename__ = "reclaim_leader"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(255), nullable=True)
    expires: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class ReclaimPolicyRow(Base):
    """One row: the admin's ``reclaim`` section (wins over the pool config file until
    deleted)."""

    __tablename__ = "reclaim_policies"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    actor: Mapped[str] = mapped_column(String(255), default="")
    updated: Mapped[datetime] = mapped_column(DateTime)


#: States of an admin's MIG re-partition: ``waiting`` for the leases in the way to end,
#: ``applying`` (the node's agent or label writer works on it), then ``done``, ``failed`` or
#: ``cancelled``.
REPARTITION_STATES = ("waiting", "applying", "done", "failed", "cancelled")


class MigRepartitionRow(Base):
    """An admin's request to give one GPU a new MIG layout (at most one open per GPU)."""

    __tablename__ = "mig_repartitions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(255), index=True)
    gpu_uuid: Mapped[str] = mapped_column(String(64), index=True)
    layout: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    method: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), default="waiting")
    actor: Mapped[str] = mapped_column(String(255), default="")
    created: Mapped[datetime] = mapped_column(DateTime)
    updated: Mapped[datetime] = mapped_column(DateTime)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: the GPU's cordon before the re-partition (a waiting re-partition cordons it)
    was_cordoned: Mapped[bool] = mapped_column(Boolean, default=False)


#: States of a job (contract): ``cancelling`` and ``preempting`` are transient (its runner is
#: stopping it); the last four are final.
JOB_STATES = (
    "queued",
    "granted",
    "running",
    "cancelling",
    "preempting",
    "succeeded",
    "failed",
    "cancelled",
    "preempted",
)


class JobRow(Base):
    """A job: a command run on a lease the job holds (``LeaseRow.holder`` = ``job``), started
    and stopped by the job runner on the lease's node, not by a hub server."""

    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    group: Mapped[str | None] = mapped_column(String(255), nullable=True)
    name: Mapped[str] = mapped_column(String(255), default="")
    offer: Mapped[str] = mapped_column(String(64))
    workload: Mapped[str] = mapped_column(String(64))
    command: Mapped[list[str]] = mapped_column(JSON)
    env: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)
    #: Where it was submitted from (the runner starts it there when that folder exists on its
    #: machine); null: the runner's choice (the user's home, else the job's own folder).
    cwd: Mapped[str | None] = mapped_column(Text, nullable=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    lease_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    node: Mapped[str | None] = mapped_column(String(255), nullable=True, index=True)
    devices: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    created: Mapped[datetime] = mapped_column(DateTime)
    started: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    ended: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    notice_deadline: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    runner_seen: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    #: The job's output: at most the last ``jobs.LOG_KEEP`` characters, and where they start
    #: in the whole output (offsets are the runner's, over everything it uploaded).
    log: Mapped[str] = mapped_column(Text, default="")
    log_start: Mapped[int] = mapped_column(Integer, default=0)
    #: Who runs it: null, the pool's local job runner on the lease's node; ``kueue``, Kubernetes
    #: (a Kueue Workload admitted through the pool's AdmissionCheck), whose liveness is the
    #: Workload's status, not a runner's heartbeat.
    runner: Mapped[str | None] = mapped_column(String(16), nullable=True)
    #: What runs it for ``runner``: the Workload's ``{"namespace", "name", "uid"}``.
    runner_ref: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)
