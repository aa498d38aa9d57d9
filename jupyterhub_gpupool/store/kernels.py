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

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from .. import orm
from ..pool.allocator import Allocator
from ..pool.errors import PoolError
from ..pool.kernels import (
    KERNEL_HOLDER,
    KERNEL_PREFIX,
    KernelRules,
    check_kernel_id,
    check_kernel_state,
    idle_notice,
    kernel_server,
    kernel_verdict,
)
from ..pool.model import offer_priority
from ..pool.workloads import INTERACTIVE, request_priority
from .errors import StoreError
from .jobs import JobStore
from .rows import epoch, ts


def kernel_not_found(kernel_id: str) -> StoreError:
    """The refusal for a kernel lease that does not exist (or is not the caller's)."""
    return StoreError("not_found", f"no GPU kernel {kernel_id!r}", field="id")


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
    ) -> dict[str, Any]:
        """Ask for ``offer`` for the kernel ``kernel_id``: granted or queued like a server's
        lease (the same quota). Asking again for a kernel that holds or waits for the same
        offer answers that lease (a restart keeps its GPU); another offer is refused
        (``kernel_exists``): the provisioner releases first."""
        try:
            check_kernel_id(kernel_id)
        except PoolError as e:
            raise StoreError(e.code, e.message, field=e.field) from None
        now = self.clock()
        with self.transaction() as (db, alloc):
            row = self._live_kernel_row(db, kernel_id)
            if row is not None:
                if row.user != user or row.offer != offer:
                    raise StoreError(
                        "kernel_exists",
                        f"kernel {kernel_id} already holds a lease for {row.offer!r}",
                        field="kernel_id",
                    )
                return self._kernel_json(db, alloc, row)
            cls = self.classes[INTERACTIVE]
            prio = request_priority(self.classes, cls, offer_priority(alloc.offers.get(offer)))
            lease = self.allocate(
                user, kernel_server(kernel_id), offer, group=group, groups=groups,
                priority=prio, actor=actor,
            )  # fmt: skip
            row = self.lease_row(db, lease["id"])
            row.holder, row.workload, row.expires = KERNEL_HOLDER, cls.name, None
            row.keepalive, row.last_input, row.presence_source = now, now, "kernel"
            return self._kernel_json(db, alloc, row)

    def kernels(self, user: str | None = None) -> list[dict[str, Any]]:
        """Kernel leases not released yet, oldest first (``user`` None: everybody's)."""
        with self.locked() as alloc, self.read() as db:
            q = select(orm.LeaseRow).where(
                orm.LeaseRow.holder == KERNEL_HOLDER,
                orm.LeaseRow.state.in_(("queued", *orm.LIVE_STATES)),
            )
            if user is not None:
                q = q.where(orm.LeaseRow.user == user)
            rows = db.scalars(q.order_by(orm.LeaseRow.created, orm.LeaseRow.id).limit(1000))
            return [self._kernel_json(db, alloc, r) for r in rows]

    def kernel(self, kernel_id: str) -> dict[str, Any]:
        """The kernel's newest lease (a released one says why it ended)."""
        with self.locked() as alloc, self.read() as db:
            return self._kernel_json(db, alloc, self._kernel_row(db, kernel_id))

    def kernel_owner(self, kernel_id: str) -> str:
        """Whose kernel it is (``not_found`` if none)."""
        with self.read() as db:
            return self._kernel_row(db, kernel_id).user

    def release_kernel(self, kernel_id: str, *, actor: str = "") -> dict[str, Any]:
        """End the kernel's lease (shut down, restarted with another offer, cancelled while
        queued); an ended one stays as it is."""
        with self.transaction() as (db, alloc):
            row = self._kernel_row(db, kernel_id)
            if row.state != "released":
                self._finish(db, alloc, row, "cancelled" if row.state == "queued" else "stopped",
                             actor or row.user)  # fmt: skip
            return self._kernel_json(db, alloc, row)

    def kernel_activity(self, kernel_id: str, state: str, *, actor: str = "") -> dict[str, Any]:
        """The provisioner's report (its heartbeat): the kernel is alive and ``busy``
        (executing: its idle notice, if any, is cancelled), ``idle`` or ``starting``. The
        first report of a granted kernel activates its lease. Answers the lease: a released
        one tells the provisioner to shut the kernel down."""
        try:
            check_kernel_state(state)
        except PoolError as e:
            raise StoreError(e.code, e.message, field=e.field, allowed=e.allowed) from None
        now = self.clock()
        with self.transaction() as (db, alloc):
            row = self._kernel_row(db, kernel_id)
            if row.state == "released":
                return self._kernel_json(db, alloc, row)
            row.keepalive = now
            if row.state == "granted":
                row.state, row.activated = "active", now
                self._event(db, "activated", actor, row)
            if state == "busy" and row.state in orm.LIVE_STATES:
                row.last_input = now
                if row.reclaim_deadline is not None and row.reclaim_kind is None:
                    row.reclaim_deadline, row.reclaim_reason = None, None
                    self._event(db, "kernel-notice-cancelled", actor, row)
            return self._kernel_json(db, alloc, row)

    def reap_kernels(self, *, actor: str = "") -> list[str]:
        """The kernel reaper's round (``pool.kernels.kernel_verdict``): release the leases of
        kernels nobody reports any more (``orphaned``), give idle ones their notice, release
        those whose notice ran out (``idle``). Returns the lease ids acted on."""
        rules, now, actor = self.kernel_rules, self.clock(), actor or "system"
        acted: list[str] = []
        with self.read() as db:
            any_live = db.scalar(
                select(orm.LeaseRow.id)
                .where(
                    orm.LeaseRow.holder == KERNEL_HOLDER, orm.LeaseRow.state.in_(orm.LIVE_STATES)
                )
                .limit(1)
            )
        if any_live is None:
            return acted  # no write: most rounds of most pools
        with self.transaction() as (db, alloc):
            rows = db.scalars(
                select(orm.LeaseRow)
                .where(
                    orm.LeaseRow.holder == KERNEL_HOLDER, orm.LeaseRow.state.in_(orm.LIVE_STATES)
                )
                .order_by(orm.LeaseRow.created, orm.LeaseRow.id)
            ).all()
            for row in rows:
                start = row.granted or row.created
                last_report = _latest(row.keepalive, start)
                last_busy = _latest(row.last_input, start)
                deadline = row.reclaim_deadline if row.reclaim_kind is None else None
                verdict = kernel_verdict(
                    epoch(now), epoch(last_report), epoch(last_busy),
                    epoch(deadline) if deadline is not None else None, rules,
                )  # fmt: skip
                if verdict == "lost":
                    self._finish(db, alloc, row, "orphaned", actor)
                elif verdict == "reclaim":
                    self._finish(db, alloc, row, "idle", actor)
                elif verdict == "notice":
                    row.reclaim_deadline = now + timedelta(seconds=rules.notice)
                    row.reclaim_reason = idle_notice(
                        (now - last_busy).total_seconds(), rules.notice
                    )
                    self._event(db, "kernel-notice", actor, row,
                                {"deadline": ts(row.reclaim_deadline)})  # fmt: skip
                else:
                    continue
                acted.append(row.id)
        return acted

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

    def _kernel_row(self, db: Session, kernel_id: str) -> orm.LeaseRow:
        row = (
            self._live_kernel_row(db, kernel_id)
            or db.scalars(
                select(orm.LeaseRow)
                .where(
                    orm.LeaseRow.server == kernel_server(kernel_id),
                    orm.LeaseRow.holder == KERNEL_HOLDER,
                )
                .order_by(orm.LeaseRow.created.desc(), orm.LeaseRow.id.desc())
            ).first()
        )
        if row is None:
            raise kernel_not_found(kernel_id)
        return row

    def _kernel_json(
        self, db: Session, alloc: Allocator | None, row: orm.LeaseRow
    ) -> dict[str, Any]:
        out = self._lease_json(db, alloc, row)
        notice = None
        if row.reclaim_deadline is not None and row.reclaim_kind is None:
            notice = {"deadline": ts(row.reclaim_deadline), "message": row.reclaim_reason}
        return {
            **out,
            "kernel_id": row.server[len(KERNEL_PREFIX) :],
            "lease_id": row.id,
            "devices": self._job_devices(alloc, row),
            "last_report": ts(row.keepalive),
            "last_busy": ts(row.last_input),
            "notice": notice,
        }


def _live_kernels() -> tuple[ColumnElement[bool], ...]:
    return (orm.LeaseRow.holder == KERNEL_HOLDER, orm.LeaseRow.state.in_(orm.LIVE_STATES))


def _latest(a: datetime | None, b: datetime) -> datetime:
    return b if a is None else max(a, b)
