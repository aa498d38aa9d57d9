"""The only code that turns the allocator's decisions into rows.

Every change runs in one transaction that first takes the pool lock (``BEGIN IMMEDIATE`` on
SQLite, an advisory lock on PostgreSQL), then checks the pool version: when another replica
changed the pool since this process last looked, the in-memory allocator is rebuilt from the
rows. So several service replicas on one PostgreSQL database never double-grant, and a restart
(or ``kill -9``) loses nothing that was acknowledged: a grant is answered only after its commit.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from typing import Any

from sqlalchemy import Engine, func, insert, or_, select, update
from sqlalchemy.orm import Session, joinedload, selectinload, sessionmaker

from . import orm
from .dbutil import lock_pool
from .migstore import MigStore
from .pool.allocator import Allocator, Decision, Grant, Lease, Queued, Rejected
from .pool.catalog import Catalog
from .pool.errors import ConfigError, PoolError
from .pool.migplan import MAX_ATTEMPTS
from .pool.model import Gpu, Node, Offer, Request, parse_offer, validate_node
from .pool.placement import Slot
from .pool.queue import Waiter, estimate_wait
from .pool.quota import QuotaBook, QuotaSpec
from .storeviews import StoreViews, _held_hours, _ts

log = logging.getLogger("jupyterhub_gpupool.store")


def utcnow() -> datetime:
    """Naive UTC now (the database stores naive UTC)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


class StoreError(PoolError):
    """A request the store refuses; ``status`` is the HTTP status the API answers with."""

    def __init__(self, status: int, code: str, message: str, **kw: Any) -> None:
        super().__init__(message, code=code, **kw)
        self.status = status

    def __reduce__(self) -> tuple:
        """Pickle by state (the store process sends refusals back): ``message`` already holds
        the field and allowed values that ``__init__`` would add again."""
        return _restore_store_error, (
            self.status,
            self.code,
            self.message,
            self.field,
            self.allowed,
        )


def _restore_store_error(
    status: int, code: str, message: str, field: str | None, allowed: list | None
) -> StoreError:
    error = StoreError(status, code, message)
    error.field, error.allowed, error.message, error.args = field, allowed, message, (message,)
    return error


_REJECT_STATUS = {
    "unknown_offer": 422,
    "offer_not_allowed": 403,
    "duplicate_request": 409,
    "no_such_hardware": 422,
    "exceeds_node_size": 422,
    "exceeds_limit": 422,
    "no_quota": 403,
    "budget_exhausted": 403,
    "not_in_group": 403,
}


@dataclass(frozen=True)
class PoolConfig:
    """What the pool config file declares (validated)."""

    nodes: tuple[Node, ...] = ()
    offers: tuple[Offer, ...] = ()
    users: Mapping[str, QuotaSpec] = field(default_factory=dict)
    groups: Mapping[str, QuotaSpec] = field(default_factory=dict)
    default: QuotaSpec | None = None


class Store(StoreViews, MigStore):
    """Leases, inventory, offers and quotas in the database, decided by an ``Allocator``.

    ``mig_attempts``: failed creations of a planned MIG instance before its grant is released.
    """

    def __init__(
        self,
        engine: Engine,
        catalog: Catalog,
        *,
        clock: Callable[[], datetime] = utcnow,
        grant_timeout: float = 600.0,
        aging_interval: float = 600.0,
        reserve_after: float = 1800.0,
        mig_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        self.engine = engine
        self.catalog = catalog
        self.clock = clock
        self.grant_timeout = grant_timeout
        self.aging_interval = aging_interval
        self.reserve_after = reserve_after
        self.mig_attempts = mig_attempts
        self.session_factory = sessionmaker(engine, expire_on_commit=False)
        self.read_factory = sessionmaker(
            engine.execution_options(gpupool_readonly=True), expire_on_commit=False
        )
        self._local = threading.local()
        self._allocator: Allocator | None = None
        self._version: int | None = None
        self._thread_lock = threading.RLock()
        #: Seconds a view may lag the commits of another process deciding on the same pool.
        self.view_lag = 1.0
        self._checked = 0.0
        self._elsewhere = self._elsewhere_seen = 0
        #: Seconds between recounts of the budget hours used (see ``_used_hours``).
        self.budget_refresh = 60.0
        self._budgets_at = 0.0
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []
        self.file_config = PoolConfig()

    # -- transactions ----------------------------------------------------------------------

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only session (no pool lock; on SQLite a deferred, non-blocking BEGIN)."""
        with self.read_factory() as db:
            yield db

    @contextmanager
    def locked(self, *, fresh: bool = True) -> Iterator[Allocator]:
        """The allocator, held still (no decision runs meanwhile) for a read-only view.

        Views take no pool lock. When another process decides too, a view first catches up with
        its commits: at once with those it was told of (``commits_elsewhere``: the service's
        store process, so an answer never shows less than the decisions already answered), and
        within ``view_lag`` seconds with the rest (another replica's). ``fresh=False`` is for
        bulk readers (sample ingestion, metrics), which may be ``view_lag`` behind rather than
        rebuild the allocator for every batch of decisions.
        """
        with self._thread_lock:
            if self._allocator is None or self._check_due(fresh):
                with self.transaction(write=False):  # reads the version; rebuilds if it moved
                    pass
            assert self._allocator is not None
            yield self._allocator

    def commits_elsewhere(self) -> None:
        """Note that another process committed decisions on this pool (cheap; any thread)."""
        self._elsewhere += 1

    def _check_due(self, fresh: bool) -> bool:
        """Whether a view must look at the pool version first: told of other commits (and
        ``fresh``), or ``view_lag`` seconds since the last look."""
        now, told = time.monotonic(), self._elsewhere
        if not (fresh and told != self._elsewhere_seen) and now - self._checked < self.view_lag:
            return False
        self._checked, self._elsewhere_seen = now, told
        return True

    def run_batch(self, calls: list[tuple[Callable[..., Any], tuple, dict]]) -> list[Any]:
        """Run several store calls in ONE transaction (one lock, one commit): group commit.

        Each call's result, or its ``StoreError`` (a refusal, raised before it wrote anything),
        comes back in order. Any other error rolls the whole batch back and is raised: the
        caller fails every call of the batch, and nothing of it was committed.
        """
        results: list[Any] = []
        # no autoflush: the batch's rows go out together at commit (multi-row INSERTs)
        with self.transaction() as (db, _), db.no_autoflush:
            held = self._prefetch(
                db, [a[0] for fn, a, _ in calls if _name(fn) in _BY_LEASE_ID and a]
            )
            for fn, args, kwargs in calls:
                try:
                    results.append(fn(*args, **kwargs))
                except StoreError as e:
                    results.append(e)
        del held
        return results

    @staticmethod
    def _prefetch(db: Session, lease_ids: list[str]) -> list[orm.LeaseRow]:
        """Load the leases (and their slots) a batch's calls address, in one query for the
        whole batch instead of one per call: ``_get`` then finds them in the session's
        identity map (which holds rows weakly: keep the returned list while the batch runs)."""
        if len(lease_ids) < 2:
            return []
        return list(
            db.scalars(
                select(orm.LeaseRow)
                .where(orm.LeaseRow.id.in_(set(lease_ids)))
                .options(joinedload(orm.LeaseRow.slots))
            ).unique()
        )

    @contextmanager
    def transaction(self, write: bool = True) -> Iterator[tuple[Session, Allocator]]:
        """Lock the pool, bring the allocator up to date, yield both; commit and bump on success.

        On any error the transaction rolls back and the in-memory allocator is thrown away (it
        may hold half-applied changes); the next transaction rebuilds it from the rows.
        """
        active = getattr(self._local, "active", None)
        if active is not None:  # inside a batch: the calls share its transaction
            yield active
            return
        with self._thread_lock, self.session_factory() as db:
            try:
                with db.begin():
                    version = self._lock_version(db, write)
                    if self._allocator is None or self._version != version - write:
                        self._allocator = self._rebuild(db)
                    elif write and self._now_s() - self._budgets_at >= self.budget_refresh:
                        self._allocator.quotas.used_hours = self._used_hours(
                            db, self._allocator.quotas
                        )
                    self._local.active = (db, self._allocator)
                    self._local.events = events = []
                    try:
                        yield db, self._allocator
                        if events:  # the audit log, in order: one multi-row INSERT
                            # on the session's connection: Core, no ORM execution path
                            db.connection().execute(insert(orm.EventRow.__table__), events)
                    finally:
                        self._local.active = None
                        self._local.events = None
                self._version = version
            except BaseException:
                self._allocator = None
                self._version = None
                raise

    @staticmethod
    def _lock_version(db: Session, write: bool) -> int:
        """Serialise with every other writer and return the pool version after this transaction.

        One statement does both: a writer bumps the version row, whose row lock (held to
        commit) orders writers across replicas on PostgreSQL; a reader takes a share lock on
        it, so it never sees half of a writer's changes. (SQLite's ``BEGIN IMMEDIATE`` already
        serialised the transaction.)
        """
        table = orm.PoolState.__table__
        if write:
            stmt = (
                update(table)
                .where(table.c.id == 1)
                .values(version=table.c.version + 1)
                .returning(table.c.version)
            )
        else:
            stmt = select(table.c.version).where(table.c.id == 1)
            if db.get_bind().dialect.name == "postgresql":
                stmt = stmt.with_for_update(read=True)
        conn = db.connection()  # Core statements: no need for the ORM's execution path
        version = conn.execute(stmt).scalar()
        if version is None:  # a new database: make the row once, then lock it as above
            lock_pool(db)
            if conn.execute(select(table.c.version).where(table.c.id == 1)).scalar() is None:
                conn.execute(insert(table).values(id=1, version=0))
            version = conn.execute(stmt).scalar()
        return version

    def _now_s(self) -> float:
        return self.clock().replace(tzinfo=timezone.utc).timestamp()

    # -- rebuilding the allocator from rows -----------------------------------------------

    def _rebuild(self, db: Session) -> Allocator:
        nodes = []
        for row in db.scalars(
            select(orm.NodeRow)
            .options(selectinload(orm.NodeRow.gpus).selectinload(orm.GpuRow.instances))
            .order_by(orm.NodeRow.id)
        ):
            gpus = []
            for g in row.gpus:
                model = self.catalog.model_for_nvml(g.model, g.memory_mib)
                gpus.append(
                    Gpu(
                        g.uuid,
                        g.index,
                        model,
                        row.name,
                        g.mig_enabled,
                        g.dynamic_mig,
                        g.sharing,
                        g.healthy,
                        g.cordoned,
                        self._instances_of(g),
                    )
                )
            nodes.append(
                Node(
                    row.name,
                    row.cluster,
                    row.cpu_milli,
                    row.memory_mib,
                    gpus,
                    row.cordoned,
                    row.draining,
                    dict(row.labels or {}),
                )
            )
        offers = [
            parse_offer(r.spec, self.catalog)
            for r in db.scalars(select(orm.OfferRow).order_by(orm.OfferRow.position))
        ]
        allocator = Allocator(
            nodes,
            offers,
            self._quota_book(db),
            aging_interval=self.aging_interval,
            reserve_after=self.reserve_after,
        )
        live = db.scalars(
            select(orm.LeaseRow)
            .where(orm.LeaseRow.state.in_(orm.LIVE_STATES))
            .options(selectinload(orm.LeaseRow.slots))
        )
        for row in live:
            slots = tuple(
                Slot(s.gpu_uuid, s.kind, s.milli, s.profile, s.start, s.create)
                for s in row.slots
                if s.live
            )
            allocator.restore(
                Lease(
                    row.id,
                    self._request(row),
                    row.offer,
                    row.node or "",
                    slots,
                    Fraction(row.units),
                    row.group,
                    row.borrowed,
                )
            )
        for row in db.scalars(select(orm.LeaseRow).where(orm.LeaseRow.state == "queued")):
            since = (row.queued_since or row.created).replace(tzinfo=timezone.utc).timestamp()
            allocator.restore_waiter(
                Waiter(
                    self._request(row),
                    Fraction(row.units),
                    row.group,
                    row.within_guarantee,
                    row.reason or "no_capacity",
                    since,
                )
            )
        return allocator

    def _request(self, row: orm.LeaseRow) -> Request:
        return Request(
            row.id,
            row.user,
            row.offer,
            row.server,
            row.group,
            tuple(row.groups or ()),
            row.priority,
            row.created.replace(tzinfo=timezone.utc).timestamp(),
        )

    def _quota_book(self, db: Session) -> QuotaBook:
        book = QuotaBook()
        for q in db.scalars(select(orm.QuotaRow)):
            spec = QuotaSpec.parse(
                {
                    "guarantee": q.guarantee,
                    "limit": q.limit,
                    "budget": q.budget,
                    "period": q.period,
                },
                f"quotas.{q.kind}s.{q.name}",
            )
            if q.kind == "user":
                book.users[q.name] = spec
            elif q.kind == "group":
                book.groups[q.name] = spec
            else:
                book.default_user = spec
        book.used_hours = self._used_hours(db, book)
        return book

    def _used_hours(self, db: Session, book: QuotaBook) -> dict[str, float]:
        """Unit-hours used this period by users and groups that have a budget.

        Computed when the allocator is built and again every ``budget_refresh`` seconds of the
        store's clock (by the next deciding transaction): held leases keep using their budget.
        """
        self._budgets_at = self._now_s()
        budgets = {u: s for u, s in book.users.items() if s.budget is not None}
        gbudgets = {g: s for g, s in book.groups.items() if s.budget is not None}
        if book.default_user.budget is None and not budgets and not gbudgets:
            return {}
        now = self.clock()
        specs = [*budgets.values(), *gbudgets.values(), book.default_user]
        earliest = min(period_start(now, spec.period) for spec in specs)
        used: dict[str, float] = {}
        rows = db.scalars(
            select(orm.LeaseRow).where(
                orm.LeaseRow.granted.is_not(None),
                or_(orm.LeaseRow.released.is_(None), orm.LeaseRow.released >= earliest),
            )
        )
        for row in rows:
            spec = book.users.get(row.user, book.default_user)
            if spec.budget is not None:
                used[row.user] = used.get(row.user, 0.0) + _held_hours(
                    row, period_start(now, spec.period), now
                )
            if row.group in gbudgets:
                key = f"group:{row.group}"
                used[key] = used.get(key, 0.0) + _held_hours(
                    row, period_start(now, gbudgets[row.group].period), now
                )
        return used

    # -- configuration ---------------------------------------------------------------------

    def load_config(self, config: PoolConfig) -> None:
        """Make the database match the pool config file, except what admins changed by API.

        Nodes from the file are added or updated; offers and quotas with ``source='api'`` win
        over the file until an admin resets them.
        """
        self.file_config = config
        with self.transaction() as (db, _):
            for position, offer in enumerate(config.offers):
                row = db.get(orm.OfferRow, offer.name)
                spec = _offer_spec(offer)
                if row is None:
                    db.add(
                        orm.OfferRow(name=offer.name, spec=spec, source="file", position=position)
                    )
                elif row.source == "file":
                    row.spec, row.position = spec, position
            names = {o.name for o in config.offers}
            for row in db.scalars(select(orm.OfferRow).where(orm.OfferRow.source == "file")):
                if row.name not in names:
                    db.delete(row)
            db.flush()
            # requests waiting for an offer that no longer exists would wait forever: end them
            # (leases already held keep their slices until released)
            kept = set(db.scalars(select(orm.OfferRow.name)))
            for row in db.scalars(
                select(orm.LeaseRow).where(
                    orm.LeaseRow.state == "queued", orm.LeaseRow.offer.not_in(kept)
                )
            ).all():
                row.message = f"the offer {row.offer!r} was removed from the pool"
                self._finish(db, None, row, "cancelled", "system")
            self._load_quotas(db, config)
            for node in config.nodes:
                self._upsert_node(db, node, source="config")
            self._event(
                db,
                "config-loaded",
                "system",
                data={"offers": len(config.offers), "nodes": len(config.nodes)},
            )
            db.flush()
            self._allocator = None  # offers, quotas and nodes changed: rebuild from the rows

    def _load_quotas(self, db: Session, config: PoolConfig) -> None:
        wanted: dict[tuple[str, str], QuotaSpec] = {}
        for name, spec in (config.users or {}).items():
            wanted[("user", name)] = spec
        for name, spec in (config.groups or {}).items():
            wanted[("group", name)] = spec
        if config.default is not None:
            wanted[("default", "*")] = config.default
        existing = {(q.kind, q.name): q for q in db.scalars(select(orm.QuotaRow))}
        for key, spec in wanted.items():
            row = existing.get(key)
            if row is None:
                row = orm.QuotaRow(kind=key[0], name=key[1], source="file")
                db.add(row)
            if row.source == "file":
                _set_quota(row, spec)
        for key, row in existing.items():
            if row.source == "file" and key not in wanted:
                db.delete(row)

    def _upsert_node(self, db: Session, node: Node, source: str) -> orm.NodeRow:
        """Add or update a node (validated first: nothing invalid ever reaches the rows)."""
        validate_node(node)
        row = orm.NodeRow.find(db, node.name)
        elsewhere = db.scalars(
            select(orm.GpuRow)
            .join(orm.NodeRow)
            .where(orm.GpuRow.uuid.in_([g.uuid for g in node.gpus]), orm.NodeRow.name != node.name)
        ).first()
        if elsewhere is not None:
            raise StoreError(
                409,
                "gpu_elsewhere",
                f"GPU {elsewhere.uuid} belongs to node {elsewhere.node.name}",
                field="uuid",
            )
        if row is None:
            row = orm.NodeRow(name=node.name, labels={})
            db.add(row)
        row.cluster, row.cpu_milli, row.memory_mib = node.cluster, node.cpu_milli, node.memory_mib
        row.labels, row.source, row.last_seen = dict(node.labels), source, self.clock()
        by_uuid = {g.uuid: g for g in row.gpus}
        keep = []
        for gpu in node.gpus:
            g = by_uuid.pop(gpu.uuid, None)
            if g is not None and g.mig_enabled != gpu.mig_enabled:
                # the GPU changed mode under its leases: they hold something that is gone
                self._release_gpu_leases(db, g.uuid, "node-lost", "system")
            g = g or orm.GpuRow(uuid=gpu.uuid)
            g.index, g.model = gpu.index, gpu.model.name
            g.memory_mib = round(gpu.model.memory_gb * 1024)
            g.mig_enabled, g.dynamic_mig, g.sharing = gpu.mig_enabled, gpu.dynamic_mig, gpu.sharing
            g.healthy = gpu.healthy
            self._sync_instances(db, g, gpu, source)
            keep.append(g)
        row.gpus = keep
        for gone in by_uuid.values():
            self._release_gpu_leases(db, gone.uuid, "node-lost", "system")
        return row

    def _release_gpu_leases(self, db: Session, gpu_uuid: str, reason: str, actor: str) -> None:
        rows = db.scalars(
            select(orm.LeaseRow)
            .join(orm.LeaseSlotRow)
            .where(orm.LeaseSlotRow.gpu_uuid == gpu_uuid, orm.LeaseSlotRow.live)
        ).unique()
        for row in rows:
            self._finish(db, None, row, reason, actor)

    # -- leases ----------------------------------------------------------------------------

    def allocate(
        self,
        user: str,
        server: str,
        offer: str,
        *,
        group: str | None = None,
        groups: Iterable[str] = (),
        priority: int | None = None,
        actor: str = "",
        resize_of: str | None = None,
    ) -> dict[str, Any]:
        """Ask for ``offer`` for ``user``'s ``server``: a granted or queued lease, or StoreError."""
        now = self.clock()
        with self.transaction() as (db, alloc):
            if resize_of is None:
                # one lease (live or queued) per server; the allocator knows them all, and so
                # sees the ones made earlier in the same batch too
                existing = alloc.lease_for_server(user, server)
                if existing is not None:
                    lease_id, state = existing
                    raise StoreError(
                        409,
                        "already_allocated",
                        f"server {user}/{server} already has lease {lease_id} ({state})",
                        field="server",
                    )
            offer_obj = alloc.offers.get(offer)
            prio = priority if priority is not None else _priority(offer_obj)
            try:
                request = Request(
                    uuid.uuid4().hex,
                    user,
                    offer,
                    server,
                    group,
                    tuple(groups),
                    prio,
                    now.replace(tzinfo=timezone.utc).timestamp(),
                )
            except PoolError as e:  # a refusal of this call alone, even inside a batch
                raise StoreError(422, e.code, e.message, field=e.field) from None
            decision = alloc.decide(request, self._now_s())
            if isinstance(decision, Rejected):
                raise StoreError(
                    _REJECT_STATUS.get(decision.code, 409),
                    decision.code,
                    decision.message,
                    field=decision.field,
                    allowed=decision.allowed,
                )
            row = orm.LeaseRow(
                id=request.id,
                user=user,
                server=server,
                offer=offer,
                group=decision.group,
                groups=list(groups),
                priority=prio,
                created=now,
                units=str(decision.units),
                units_f=float(decision.units),
                resize_of=resize_of,
                borrowed=False,  # set here, not by column defaults: the JSON is built pre-flush
                within_guarantee=True,
                busy_hours=0.0,
            )
            db.add(row)
            alloc.apply(decision, self._now_s())
            if isinstance(decision, Grant):
                self._granted(db, row, decision, now)
            else:
                assert isinstance(decision, Queued)
                row.state, row.reason, row.message = "queued", decision.reason, decision.message
                row.queued_since, row.within_guarantee = now, decision.within_guarantee
                self._event(
                    db,
                    "queued",
                    actor or user,
                    row,
                    {"reason": decision.reason, "position": decision.position},
                )
            return self._lease_json(db, alloc, row)

    def _granted(self, db: Session, row: orm.LeaseRow, grant: Grant, now: datetime) -> None:
        row.state, row.reason, row.message = "granted", None, None
        row.granted, row.node, row.group = now, grant.node, grant.group
        row.units, row.units_f, row.borrowed = str(grant.units), float(grant.units), grant.borrowed
        row.expires = now + timedelta(seconds=self.grant_timeout)
        for slot in grant.slots:
            gpu = self._allocator.gpus.get(slot.gpu) if self._allocator else None
            row.model = gpu.model.name if gpu is not None else row.model
            if slot.create:  # the pool plans a new MIG instance: record it with the GPU
                gpu_row = db.scalar(select(orm.GpuRow).where(orm.GpuRow.uuid == slot.gpu))
                if gpu_row is not None:
                    gpu_row.instances.append(
                        orm.MigInstanceRow(profile=slot.profile, start=slot.start)
                    )
            row.slots.append(
                orm.LeaseSlotRow(
                    slot_key=slot.key,
                    gpu_uuid=slot.gpu,
                    kind=slot.kind,
                    profile=slot.profile,
                    start=slot.start,
                    milli=slot.milli,
                    create=slot.create,
                    live=True,
                )
            )
        self._event(
            db,
            "granted",
            "system",
            row,
            {
                "node": grant.node,
                "offer": row.offer,
                "waited": (now - row.queued_since).total_seconds() if row.queued_since else None,
                "slots": [s.key for s in grant.slots],
            },
        )

    def _finish(
        self, db: Session, alloc: Allocator | None, row: orm.LeaseRow, reason: str, actor: str
    ) -> list[Grant]:
        """Release ``row`` for ``reason``; returns grants made to waiters (when ``alloc``)."""
        now = self.clock()
        was = row.state
        row.state, row.released, row.release_reason = "released", now, reason
        row.reclaim_deadline = None
        for s in row.slots:
            s.live = False
            if s.create:  # a MIG instance the pool made for this lease goes with it
                gpu = db.scalar(select(orm.GpuRow).where(orm.GpuRow.uuid == s.gpu_uuid))
                if gpu is not None:
                    gpu.instances = [i for i in gpu.instances if i.start != s.start]
                    # delete now: a grant later in the same batch may plan an instance here
                    db.flush()
        self._event(db, "released", actor, row, {"reason": reason, "from": was})
        if alloc is None:
            return []
        related = alloc.leases_of(row.user, row.group)
        borrowed_before = {lid: lease.borrowed for lid, lease in related.items()}
        grants = (
            alloc.release(row.id, self._now_s())
            if row.id in alloc.leases or row.id in alloc.waiters
            else alloc.promote(self._now_s())
        )
        for grant in grants:
            waiter = db.get(orm.LeaseRow, grant.request.id)
            if waiter is not None:
                self._granted(db, waiter, grant, now)
        # what the owner still holds may now be within guarantee (the allocator re-derived it)
        for lease_id, was in borrowed_before.items():
            lease = alloc.leases.get(lease_id)
            if lease is not None and lease.borrowed != was:
                other = db.get(orm.LeaseRow, lease.id)
                if other is not None and other.borrowed != lease.borrowed:
                    other.borrowed = lease.borrowed
                    kind = "borrowed" if lease.borrowed else "within-guarantee"
                    self._event(db, kind, "system", other)
        return grants

    def release(self, lease_id: str, *, reason: str = "stopped", actor: str = "") -> dict[str, Any]:
        """End a lease (or leave the queue) and serve the queue with what it frees."""
        if reason not in orm.RELEASE_REASONS:
            raise StoreError(
                422,
                "invalid_reason",
                f"unknown release reason {reason!r}",
                field="reason",
                allowed=orm.RELEASE_REASONS,
            )
        with self.transaction() as (db, alloc):
            row = self._get(db, lease_id)
            if row.state == "released":
                return self._lease_json(db, alloc, row)
            if row.state == "queued" and reason == "stopped":
                reason = "cancelled"
            self._finish(db, alloc, row, reason, actor)
            return self._lease_json(db, alloc, row)

    def keepalive(self, lease_id: str, *, actor: str = "") -> dict[str, Any]:
        """The server is running on its lease: bind a grant (granted → active), note liveness.

        Binding the new lease of a resize releases the old one (make-before-break).
        """
        now = self.clock()
        with self.transaction() as (db, alloc):
            row = self._get(db, lease_id)
            if row.state in ("queued", "released"):
                raise StoreError(409, "not_live", f"lease {lease_id} is {row.state}", field="id")
            if row.state == "granted" and not self._lease_json(db, alloc, row)["ready"]:
                # dynamic MIG: nothing to run on yet (the lease says ready once there is)
                raise StoreError(
                    409,
                    "not_ready",
                    f"lease {lease_id} waits for its MIG instance to be made; bind it once "
                    "the lease is ready",
                    field="id",
                )
            row.keepalive = now
            if row.state == "granted":
                row.state, row.activated, row.expires = "active", now, None
                self._event(db, "activated", actor, row)
                if row.resize_of:
                    old = db.get(orm.LeaseRow, row.resize_of)
                    if old is not None and old.state != "released":
                        self._finish(db, alloc, old, "resized", actor)
            return self._lease_json(db, alloc, row)

    def resize(self, lease_id: str, offer: str, *, actor: str = "") -> dict[str, Any]:
        """Reserve ``offer`` for the lease's server; the old lease stays until the new one binds."""
        with self.read() as db:
            row = db.get(orm.LeaseRow, lease_id)
            if row is None:
                raise StoreError(404, "not_found", f"no lease {lease_id!r}", field="id")
            if row.state not in orm.LIVE_STATES:
                raise StoreError(409, "not_live", f"lease {lease_id} is {row.state}", field="id")
            if offer == row.offer:
                raise StoreError(
                    422, "same_offer", f"lease {lease_id} already has {offer!r}", field="offer"
                )
            pending = db.scalar(
                select(orm.LeaseRow).where(
                    orm.LeaseRow.resize_of == lease_id,
                    orm.LeaseRow.state.in_(("queued", *orm.LIVE_STATES)),
                )
            )
            if pending is not None:
                raise StoreError(
                    409,
                    "resize_pending",
                    f"lease {lease_id} already has resize {pending.id} pending",
                    field="id",
                )
            user, server, group, groups = row.user, row.server, row.group, row.groups
        return self.allocate(
            user, server, offer, group=group, groups=groups, actor=actor, resize_of=lease_id
        )

    def expire_grants(self) -> int:
        """Release grants no server bound in time; returns how many."""
        now = self.clock()
        with self.transaction() as (db, alloc):
            rows = db.scalars(
                select(orm.LeaseRow).where(
                    orm.LeaseRow.state == "granted", orm.LeaseRow.expires < now
                )
            ).all()
            for row in rows:
                self._finish(db, alloc, row, "expired", "system")
            return len(rows)

    def reconcile(self, running: set[tuple[str, str]], *, actor: str = "system") -> int:
        """Release leases (and queue entries) of servers the hub no longer runs or spawns."""
        with self.transaction() as (db, alloc):
            rows = db.scalars(
                select(orm.LeaseRow).where(orm.LeaseRow.state.in_(("queued", *orm.LIVE_STATES)))
            ).all()
            gone = [r for r in rows if (r.user, r.server) not in running]
            for row in gone:
                self._finish(
                    db, alloc, row, "stopped" if row.state != "queued" else "cancelled", actor
                )
            self._event(db, "reconciled", actor, data={"released": len(gone)})
            return len(gone)

    def promote(self) -> int:
        """Serve the queue (after aging, say); returns how many were granted."""
        now = self.clock()
        with self.transaction() as (db, alloc):
            grants = alloc.promote(self._now_s())
            for grant in grants:
                row = db.get(orm.LeaseRow, grant.request.id)
                if row is not None:
                    self._granted(db, row, grant, now)
            return len(grants)

    # -- nodes and quotas (admin) ------------------------------------------------------------

    def set_node(self, name: str, action: str, *, actor: str = "") -> dict[str, Any]:
        """cordon / uncordon / drain a node."""
        flags = {
            "cordon": {"cordoned": True},
            "uncordon": {"cordoned": False, "draining": False},
            "drain": {"draining": True},
        }
        if action not in flags:
            raise StoreError(
                404, "not_found", f"no node action {action!r}", field="action", allowed=list(flags)
            )
        with self.transaction() as (db, alloc):
            row = orm.NodeRow.find(db, name)
            if row is None:
                raise StoreError(404, "not_found", f"no node {name!r}", field="name")
            for k, v in flags[action].items():
                setattr(row, k, v)
            alloc.set_node_flags(name, **flags[action])
            self._event(db, f"node-{action}", actor, data={"node": name})
            if action == "uncordon":
                for grant in alloc.promote(self._now_s()):
                    waiter = db.get(orm.LeaseRow, grant.request.id)
                    if waiter is not None:
                        self._granted(db, waiter, grant, self.clock())
            return _node_json(row)

    def put_quota(
        self, kind: str, name: str, raw: Mapping[str, object], *, actor: str = ""
    ) -> dict:
        """Set a user's or group's quota by API (wins over the file). Lowering it below current
        use is allowed: the leases beyond the new guarantee become borrowed."""
        _check_quota_kind(kind)
        spec = QuotaSpec.parse(raw, f"quotas.{kind}.{name}")
        with self.transaction() as (db, alloc):
            k = kind[:-1]
            row = db.scalar(
                select(orm.QuotaRow).where(orm.QuotaRow.kind == k, orm.QuotaRow.name == name)
            )
            if row is None:
                row = orm.QuotaRow(kind=k, name=name)
                db.add(row)
            _set_quota(row, spec)
            row.source = "api"
            (alloc.quotas.users if k == "user" else alloc.quotas.groups)[name] = spec
            self._remark_borrowed(db, alloc, k, name)
            self._event(db, "quota-set", actor, data={"kind": k, "name": name, **spec.to_dict()})
            return {"name": name, "kind": k, "source": "api", **spec.to_dict()}

    def reset_quota(self, kind: str, name: str, *, actor: str = "") -> dict[str, Any]:
        """Drop an admin's API override: the pool config file's quota (or the default) applies."""
        _check_quota_kind(kind)
        k = kind[:-1]
        from_file = (self.file_config.users if k == "user" else self.file_config.groups) or {}
        with self.transaction() as (db, alloc):
            row = db.scalar(
                select(orm.QuotaRow).where(orm.QuotaRow.kind == k, orm.QuotaRow.name == name)
            )
            book = alloc.quotas.users if k == "user" else alloc.quotas.groups
            if row is not None and row.source == "api":
                if name in from_file:
                    _set_quota(row, from_file[name])
                    row.source = "file"
                    book[name] = from_file[name]
                else:
                    db.delete(row)
                    book.pop(name, None)
                self._remark_borrowed(db, alloc, k, name)
                self._event(db, "quota-reset", actor, data={"kind": k, "name": name})
        return self.get_quota(kind, name)

    def _remark_borrowed(self, db: Session, alloc: Allocator, kind: str, name: str) -> None:
        """Persist the allocator's re-derived ``borrowed`` flags for a user or group."""
        changed = alloc.rederive_borrowed(
            user=name if kind == "user" else None, group=name if kind == "group" else None
        )
        for lease in changed:
            row = db.get(orm.LeaseRow, lease.id)
            if row is not None:
                row.borrowed = lease.borrowed
                self._event(db, "borrowed" if row.borrowed else "within-guarantee", "system", row)

    def get_quota(self, kind: str, name: str) -> dict[str, Any]:
        """A user's or group's effective quota and where it comes from."""
        _check_quota_kind(kind)
        with self.read() as db:
            row = db.scalar(
                select(orm.QuotaRow).where(
                    orm.QuotaRow.kind == kind[:-1], orm.QuotaRow.name == name
                )
            )
            if row is None and kind == "users":
                row = db.scalar(select(orm.QuotaRow).where(orm.QuotaRow.kind == "default"))
                src = "default" if row is not None else "none"
            else:
                src = row.source if row else "none"
            spec = {"guarantee": 0.0, "limit": None, "budget": None, "period": "month"}
            if row is not None:
                spec = {
                    "guarantee": row.guarantee,
                    "limit": row.limit,
                    "budget": row.budget,
                    "period": row.period,
                }
            return {"name": name, "kind": kind[:-1], "source": src, **spec}

    # -- inventory (agents) --------------------------------------------------------------

    def put_inventory(self, node: Node, *, actor: str = "") -> dict[str, Any]:
        """An agent's report of a node: add or update it, release leases on vanished GPUs."""
        with self.transaction() as (db, _):
            row = self._upsert_node(db, node, source="agent")
            self._event(db, "inventory", actor, data={"node": node.name, "gpus": len(node.gpus)})
            db.flush()
            self._allocator = None  # inventory changed shape: rebuild on the next decision
            return _node_json(row)

    def add_busy(self, hours: Mapping[str, float]) -> None:
        """Add busy GPU hours to live leases (from utilization samples); no pool lock needed."""
        if not hours:
            return
        with self.session_factory() as db, db.begin():
            for row in db.scalars(select(orm.LeaseRow).where(orm.LeaseRow.id.in_(list(hours)))):
                row.busy_hours += hours[row.id]

    # -- reads ---------------------------------------------------------------------------

    def _get(self, db: Session, lease_id: str) -> orm.LeaseRow:
        row = db.get(orm.LeaseRow, lease_id, options=[joinedload(orm.LeaseRow.slots)])
        if row is None:
            raise StoreError(404, "not_found", f"no lease {lease_id!r}", field="id")
        return row

    def lease(self, lease_id: str) -> dict[str, Any]:
        """One lease as JSON."""
        with self.locked() as alloc, self.read() as db:
            return self._lease_json(db, alloc, self._get(db, lease_id))

    def lease_owner(self, lease_id: str) -> str:
        """The user a lease belongs to (for scope checks)."""
        with self.read() as db:
            return self._get(db, lease_id).user

    def leases(
        self,
        *,
        user: str | None = None,
        state: str | None = None,
        offset: int = 0,
        limit: int = 200,
    ) -> tuple[list[dict[str, Any]], int]:
        """Leases, newest first, filtered; returns (page, total)."""
        if state is not None and state not in orm.LEASE_STATES:
            raise StoreError(
                400,
                "invalid_state",
                f"unknown state {state!r}",
                field="state",
                allowed=orm.LEASE_STATES,
            )
        with self.locked() as alloc, self.read() as db:
            q = select(orm.LeaseRow)
            if user is not None:
                q = q.where(orm.LeaseRow.user == user)
            if state is not None:
                q = q.where(orm.LeaseRow.state == state)
            total = db.scalar(select(func.count()).select_from(q.subquery())) or 0
            rows = db.scalars(
                q.order_by(orm.LeaseRow.created.desc(), orm.LeaseRow.id)
                .offset(offset)
                .limit(limit)
                .options(selectinload(orm.LeaseRow.slots))
            )
            rows = list(rows)
            # queue positions and release rates once per page, not once per queued lease
            positions = rates = None
            if any(r.state == "queued" for r in rows):
                now = self._now_s()
                positions = {w.request.id: i for i, w in enumerate(alloc.queue(now), 1)}
                rates = {}
            return [self._lease_json(db, alloc, r, positions, rates) for r in rows], total

    def _lease_json(
        self,
        db: Session,
        alloc: Allocator | None,
        row: orm.LeaseRow,
        positions: Mapping[str, int] | None = None,
        rates: dict[str, float] | None = None,
    ) -> dict:
        out: dict[str, Any] = {
            "id": row.id,
            "user": row.user,
            "server": row.server,
            "offer": row.offer,
            "group": row.group,
            "state": row.state,
            "reason": row.reason,
            "message": row.message,
            "units": row.units_f,
            "borrowed": row.borrowed,
            "node": row.node,
            "model": row.model,
            "created": _ts(row.created),
            "granted": _ts(row.granted),
            "activated": _ts(row.activated),
            "released": _ts(row.released),
            "release_reason": row.release_reason,
            "expires": _ts(row.expires),
            "resize_of": row.resize_of,
            "position": None,
            "eta_seconds": None,
            "reclaim": None,
            "slots": [
                {
                    "gpu": s.gpu_uuid,
                    "kind": s.kind,
                    "profile": s.profile,
                    "start": s.start,
                    "milli": s.milli,
                    "mig_uuid": None,
                }
                for s in row.slots
            ],
        }
        if row.reclaim_deadline is not None:
            out["reclaim"] = {"deadline": _ts(row.reclaim_deadline), "reason": row.reclaim_reason}
        if row.state == "queued" and alloc is not None:
            if positions is None:
                pos = alloc.position(row.id, self._now_s())
            else:
                pos = positions.get(row.id)
            out["position"] = pos
            if pos is not None:
                if rates is None:
                    rate = self._release_rate(db, row.offer)
                else:
                    if row.offer not in rates:
                        rates[row.offer] = self._release_rate(db, row.offer)
                    rate = rates[row.offer]
                out["eta_seconds"] = estimate_wait(pos, rate)
        # ready: live, and every MIG instance exists (dynamic MIG: once the node made it)
        out["ready"] = row.state in orm.LIVE_STATES
        for s in out["slots"]:
            if s["kind"] == "mig" and row.state in orm.LIVE_STATES:
                s["mig_uuid"], exists = (
                    (None, False)
                    if alloc is None
                    else self._slot_device(alloc, row.id, s["gpu"], s["start"])
                )
                out["ready"] = out["ready"] and exists
        return out

    def _release_rate(self, db: Session, offer: str) -> float:
        """Releases of ``offer`` in the last hour: the basis of queue wait estimates."""
        since = self.clock() - timedelta(hours=1)
        return float(
            db.scalar(
                select(func.count())
                .select_from(orm.LeaseRow)
                .where(
                    orm.LeaseRow.offer == offer,
                    orm.LeaseRow.released >= since,
                    orm.LeaseRow.granted.is_not(None),
                )
            )
            or 0
        )

    def offers_for(self, user: str | None, groups: Iterable[str]) -> list[dict[str, Any]]:
        """Offers visible to ``user`` with live availability, queue length, units and quota fit."""
        groups = list(groups)
        with self.locked() as alloc, self.read() as db:
            out = []
            for offer in alloc.offers.values():
                if user is not None and not offer.visible_to(groups):
                    continue
                units = alloc.units_for(offer, None)
                queue = sum(1 for w in alloc.waiters.values() if w.request.offer == offer.name)
                verdict = alloc.quotas.check(user, groups, units) if user else None
                available = alloc.available(offer)
                eta = (
                    0.0
                    if available and not queue
                    else estimate_wait(queue + 1, self._release_rate(db, offer.name))
                )
                out.append(
                    {
                        **_offer_spec(offer),
                        "units": float(units),
                        "available": available,
                        "queue_length": queue,
                        "quota_ok": None if verdict is None else verdict.ok,
                        "quota_reason": None if verdict is None or verdict.ok else verdict.code,
                        "eta_seconds": eta,
                    }
                )
            return out

    def user(self, name: str, groups: Iterable[str] = ()) -> dict[str, Any]:
        """A user's quota, use, leases and notices."""
        with self.locked() as alloc:
            leases, _ = self.leases(user=name, limit=100)
            live = [le for le in leases if le["state"] != "released"]
            spec = alloc.quotas.user_spec(name)
            notices = [
                {
                    "lease": le["id"],
                    "kind": "reclaim",
                    "message": le["reclaim"]["reason"],
                    "deadline": le["reclaim"]["deadline"],
                }
                for le in live
                if le["reclaim"]
            ]
            return {
                "name": name,
                "groups": list(groups),
                "quota": spec.to_dict(),
                "held_units": float(alloc.quotas.held(name)),
                "used_unit_hours": alloc.quotas.used_hours.get(name),
                "leases": live,
                "notices": notices,
            }

    def _event(
        self,
        db: Session,
        kind: str,
        actor: str,
        row: orm.LeaseRow | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        event = {
            "ts": self.clock(),
            "actor": actor or "system",
            "kind": kind,
            "lease_id": row.id if row else None,
            "user": row.user if row else None,
            "data": data or {},
        }
        pending = getattr(self._local, "events", None)
        if pending is not None:  # written with the transaction's other events, before commit
            pending.append(event)
        else:
            db.add(orm.EventRow(**event))
        for listener in self.listeners:
            listener(kind, {"lease": row.id if row else None, **(data or {})})


#: Store calls whose first argument is a lease id: a batch loads those leases at once.
_BY_LEASE_ID = frozenset({"release", "keepalive"})


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", "")


def _priority(offer: Offer | None) -> int:
    if offer is None:
        return 0
    try:
        return int(offer.priority_class)
    except ValueError:
        return {"low": -10, "default": 0, "high": 10}.get(offer.priority_class, 0)


def _check_quota_kind(kind: str) -> None:
    """Quotas exist for ``users`` and ``groups`` (the URL's kind)."""
    if kind not in ("users", "groups"):
        raise StoreError(
            404, "not_found", f"no quota kind {kind!r}", field="kind", allowed=["users", "groups"]
        )


def _set_quota(row: orm.QuotaRow, spec: QuotaSpec) -> None:
    row.guarantee = float(spec.guarantee)
    row.limit = None if spec.limit is None else float(spec.limit)
    row.budget = None if spec.budget is None else float(spec.budget)
    row.period = spec.period


def period_start(now: datetime, period: str) -> datetime:
    """Start of the budget period containing ``now`` (UTC days, ISO weeks, calendar months)."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


def _offer_spec(offer: Offer) -> dict[str, Any]:
    spec = {
        "name": offer.name,
        "kind": offer.kind,
        "display_name": offer.display_name,
        "description": offer.description,
        "count": offer.count,
        "profile": offer.profile,
        "models": list(offer.models),
        "fraction": offer.fraction,
        "min_memory_gb": offer.min_memory_gb,
        "cpu_milli": offer.cpu_milli,
        "memory_mib": offer.memory_mib,
        "groups": list(offer.groups),
        "priority_class": offer.priority_class,
        "reclaim_policy": offer.reclaim_policy,
        "idle_timeout": offer.idle_timeout,
    }
    return {k: v for k, v in spec.items() if v is not None}


def _node_json(row: orm.NodeRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "cluster": row.cluster,
        "cordoned": row.cordoned,
        "draining": row.draining,
        "gpus": len(row.gpus),
        "source": row.source,
    }


__all__ = ["ConfigError", "Decision", "PoolConfig", "Store", "StoreError", "utcnow"]
