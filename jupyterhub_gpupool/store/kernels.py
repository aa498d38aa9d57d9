"""Kernel leases: a GPU held by one notebook kernel of a (CPU-only) server (issue 36).

The lease row is the whole record (``pool/kernels.py`` says why): ``server`` =
``kernel:<id>``, ``holder`` = ``kernel``, class ``interactive``, no ``expires`` (nothing on the
hub binds it). The provisioner's reports keep it: ``keepalive`` is the last report,
``last_input`` the last report of an execution (``presence_source`` = ``kernel``). The kernel's
idle notice is ``reclaim_deadline`` + ``reclaim_reason`` with no ``reclaim_kind``: the
reclaimer, which never watches kernel leases, has no notice of its own on them. The hub's
reconcile leaves kernel leases alone (``pool.holders.orphans``): no hub server is theirs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from .. import orm
from ..pool import commands as c
from ..pool.allocator import Allocator
from ..pool.facts import KernelFacts, LeaseFacts, PoolState
from ..pool.kernels import KERNEL_HOLDER, KernelRules, kernel_server
from ..pool.rules.kernels import kernel_not_found as refused_kernel
from .apply import LazyFacts, decided, lease_facts
from .errors import StoreError
from .jobs import JobStore
from .read.kernels import KernelView, kernel_view
from .rows import epoch


def kernel_not_found(kernel_id: str) -> StoreError:
    """The refusal for a kernel lease that does not exist (or is not the caller's)."""
    e = refused_kernel(kernel_id)
    return StoreError(e.code, e.message, field=e.field)


class KernelStore(JobStore):
    """Kernel leases: request, release, the provisioner's reports and the kernel reaper."""

    def __init__(self, *args: Any, kernel_rules: KernelRules | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        #: ``PoolService.kernel_idle_timeout`` / ``kernel_notice`` / ``kernel_report_timeout``.
        self.kernel_rules = kernel_rules or KernelRules()

    def request_kernel(
        self,
        user: str,
        offer: str,
        kernel_id: str,
        group: str | None = None,
        groups: tuple[str, ...] | list[str] = (),
        *,
        actor: str = "",
    ) -> KernelView:
        """Ask for ``offer`` for the kernel ``kernel_id``: granted or queued like a server's
        lease (the same quota). Asking again for a kernel that holds or waits for the same
        offer answers that lease (a restart keeps its GPU); another offer is refused
        (``kernel_exists``): the provisioner releases first."""
        command = c.RequestKernel(user, offer, kernel_id, group, tuple(groups), actor=actor)
        with self.transaction() as (db, alloc):
            live = None
            if isinstance(kernel_id, str):  # else refused
                live = self._live_kernel_row(db, kernel_id)
            state = self._ask_state(
                db, alloc, user, kernel_server(kernel_id), classes=self.classes,
                kernel=kernel_facts(live) if live is not None else None,
            )  # fmt: skip
            outcome = decided(state, command, self._now_s())
            made = self._apply_effects(db, alloc, outcome.effects, actor)
            row = made.get(outcome.answer) or self.lease_row(db, outcome.answer)
            return self._kernel_view(db, alloc, row)

    def kernels(self, user: str | None = None) -> list[KernelView]:
        """Kernel leases not released yet, oldest first (``user`` None: everybody's)."""
        with self.locked() as alloc, self.read() as db:
            q = select(orm.LeaseRow).where(
                orm.LeaseRow.holder == KERNEL_HOLDER,
                orm.LeaseRow.state.in_(("queued", *orm.LIVE_STATES)),
            )
            if user is not None:
                q = q.where(orm.LeaseRow.user == user)
            rows = db.scalars(q.order_by(orm.LeaseRow.created, orm.LeaseRow.id).limit(1000))
            return [self._kernel_view(db, alloc, r) for r in rows]

    def kernel(self, kernel_id: str) -> KernelView:
        """The kernel's newest lease (a released one says why it ended)."""
        with self.locked() as alloc, self.read() as db:
            return self._kernel_view(db, alloc, self._kernel_row(db, kernel_id))

    def kernel_owner(self, kernel_id: str) -> str:
        """Whose kernel it is (``not_found`` if none)."""
        with self.read() as db:
            return self._kernel_row(db, kernel_id).user

    def release_kernel(self, kernel_id: str, *, actor: str = "") -> KernelView:
        """End the kernel's lease (shut down, restarted with another offer, cancelled while
        queued); an ended one stays as it is. ``pool.decide`` decides (``rules.kernels``)."""
        return self._kernel_command(c.ReleaseKernel(kernel_id, actor=actor), actor)

    def kernel_activity(self, kernel_id: str, state: str, *, actor: str = "") -> KernelView:
        """The provisioner's report (its heartbeat): the kernel is alive and ``busy``
        (executing: its idle notice, if any, is cancelled), ``idle`` or ``starting``. The
        first report of a granted kernel activates its lease. Answers the lease: a released
        one tells the provisioner to shut the kernel down. ``pool.decide`` decides."""
        return self._kernel_command(c.KernelActivity(kernel_id, state, actor=actor), actor)

    def _kernel_command(
        self, command: c.ReleaseKernel | c.KernelActivity, actor: str
    ) -> KernelView:
        """Decide a command on the kernel's newest lease and apply it; answers its view."""
        with self.transaction() as (db, alloc):
            row = self._newest_kernel_row(db, command.kernel_id)
            facts, rows = self._lease_facts(db, alloc, [row]) if row is not None else ({}, {})
            kernel = kernel_facts(row, facts.get(row.id)) if row is not None else None
            state = PoolState(alloc, facts, kernel=kernel)
            outcome = decided(state, command, self._now_s())
            assert row is not None  # else refused
            if isinstance(command, c.ReleaseKernel):
                actor = actor or row.user
            self._apply_effects(db, alloc, outcome.effects, actor, rows)
            return self._kernel_view(db, alloc, row)

    def reap_kernels(self, *, actor: str = "") -> list[str]:
        """The kernel reaper's round (``pool.kernels.kernel_verdict``): release the leases of
        kernels nobody reports any more (``orphaned``), give idle ones their notice, release
        those whose notice ran out (``idle``). Returns the lease ids acted on. ``pool.decide``
        decides (``rules.kernels``)."""
        with self.read() as db:
            any_live = db.scalar(select(orm.LeaseRow.id).where(*_live_kernels()).limit(1))
        if any_live is None:
            return []  # no write: most rounds of most pools
        with self.transaction() as (db, alloc):
            rows = db.scalars(
                select(orm.LeaseRow)
                .where(*_live_kernels())
                .order_by(orm.LeaseRow.created, orm.LeaseRow.id)
            ).all()
            facts = LazyFacts(self, db, alloc, rows)
            kernels = tuple(kernel_facts(row) for row in rows)
            state = PoolState(alloc, facts, kernels=kernels, kernel_rules=self.kernel_rules)
            outcome = decided(state, c.ReapKernels(actor=actor), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor or "system", facts.read)
            return list(outcome.answer)

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _live_kernel_row(db: Session, kernel_id: str) -> orm.LeaseRow | None:
        return db.scalars(
            select(orm.LeaseRow).where(
                orm.LeaseRow.server == kernel_server(kernel_id),
                orm.LeaseRow.holder == KERNEL_HOLDER,
                orm.LeaseRow.state.in_(("queued", *orm.LIVE_STATES)),
            )
        ).first()

    @classmethod
    def _newest_kernel_row(cls, db: Session, kernel_id: str) -> orm.LeaseRow | None:
        """The kernel's live lease, else its newest one (None: it has none)."""
        return (
            cls._live_kernel_row(db, kernel_id)
            or db.scalars(
                select(orm.LeaseRow)
                .where(
                    orm.LeaseRow.server == kernel_server(kernel_id),
                    orm.LeaseRow.holder == KERNEL_HOLDER,
                )
                .order_by(orm.LeaseRow.created.desc(), orm.LeaseRow.id.desc())
            ).first()
        )

    def _kernel_row(self, db: Session, kernel_id: str) -> orm.LeaseRow:
        row = self._newest_kernel_row(db, kernel_id)
        if row is None:
            raise kernel_not_found(kernel_id)
        return row

    def _kernel_view(self, db: Session, alloc: Allocator | None, row: orm.LeaseRow) -> KernelView:
        return kernel_view(self._lease_view(db, alloc, row), alloc, row)


def _live_kernels() -> tuple[ColumnElement[bool], ...]:
    return (orm.LeaseRow.holder == KERNEL_HOLDER, orm.LeaseRow.state.in_(orm.LIVE_STATES))


def kernel_facts(row: orm.LeaseRow, facts: LeaseFacts | None = None) -> KernelFacts:
    """What the pool's rules read of a kernel's lease row (``facts``: its lease facts read
    already, with its pending targets)."""
    start = row.granted or row.created
    own = row.reclaim_deadline if row.reclaim_kind is None else None  # the kernel's notice
    return KernelFacts(
        facts or lease_facts(row),
        epoch(own) if own is not None else None,
        epoch(_latest(row.keepalive, start)),
        epoch(_latest(row.last_input, start)),
    )


def _latest(a: datetime | None, b: datetime) -> datetime:
    return b if a is None else max(a, b)
