"""Leases a batch only releases are read as snapshots on PostgreSQL (``store/snapshots.py``):
the answers and the rows must be what the ORM's rows give (SQLite keeps those), and any lease
something else in the batch could read as a row is still loaded through the ORM."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from typing import Any

import sqlalchemy as sa

from jupyterhub_gpupool import orm
from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.store import Store, snapshots
from tests.fakes import APPROVAL_POOL, StoreClock, make_store


@contextmanager
def orm_loads() -> Iterator[list[str]]:
    """The ids of the lease rows the ORM loads from the database meanwhile."""
    loaded: list[str] = []

    def on_load(target: orm.LeaseRow, _context: Any) -> None:
        loaded.append(target.id)

    sa.event.listen(orm.LeaseRow, "load", on_load)
    try:
        yield loaded
    finally:
        sa.event.remove(orm.LeaseRow, "load", on_load)


def _named(value: Any, names: dict[str, str]) -> Any:
    """``value`` with lease ids replaced by their users' names (ids are random); a view (a
    ``LeaseView``, its slots) as a dict of its every field."""
    if is_dataclass(value) and not isinstance(value, type):
        return _named(asdict(value), names)
    if isinstance(value, dict):
        return {k: _named(v, names) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_named(v, names) for v in value]
    return names.get(value, value) if isinstance(value, str) else value


def _story(store: Store, clock: StoreClock) -> tuple[list[Any], list[str], dict[str, str]]:
    """Three grants (one bound), then one batch releasing two and granting another: its
    answers, the leases the ORM loaded in that batch, and lease id → user."""
    made = store.run_batch(
        [commands.Allocate(u, "", "h100", actor=u) for u in ("alice", "bob", "carol")]
    )
    store.keepalive(made[0].id, actor="alice")  # active; bob's and carol's only granted
    clock.advance(seconds=30)
    with orm_loads() as loaded:
        out = store.run_batch(
            [
                commands.Release(made[0].id, actor="alice"),
                commands.Allocate("dave", "", "h100", actor="dave"),
                commands.Release(made[1].id, reason="cancelled", actor="bob"),
            ]
        )
    names = {r.id: r.user for r in (*made, *out)}
    return out, loaded, names


def _rows(store: Store, names: dict[str, str]) -> dict[str, Any]:
    lease, slot, event = (t.__table__ for t in (orm.LeaseRow, orm.LeaseSlotRow, orm.EventRow))
    with store.read() as db:
        leases = db.execute(sa.select(lease)).all()
        slots = db.execute(sa.select(*(c for c in slot.c if c.name != "id"))).all()
        events = db.execute(
            sa.select(
                event.c.ts, event.c.actor, event.c.kind, event.c.lease_id, event.c.data
            ).order_by(event.c.id)
        ).all()
    return {
        "leases": sorted(_named([*r], names) for r in leases),
        "slots": sorted((_named([*r], names) for r in slots), key=repr),
        "events": [_named([*e], names) for e in events],
    }


def test_a_release_read_as_a_snapshot_answers_and_writes_what_the_orm_row_does(pg_url, sqlite_url):
    found = {}
    for url in (sqlite_url, pg_url):
        upgrade(url)
        clock = StoreClock()
        store = make_store(url, clock, APPROVAL_POOL)  # four H100s
        out, loaded, names = _story(store, clock)
        found[url] = (_named(out, names), len(loaded), _rows(store, names))
        store.engine.dispose()
    (sqlite_out, sqlite_loads, sqlite_rows), (pg_out, pg_loads, pg_rows) = found.values()
    assert [r["state"] for r in pg_out] == ["released", "granted", "released"]
    assert pg_out[0]["release_reason"] == "stopped" and pg_out[2]["release_reason"] == "cancelled"
    assert pg_out == sqlite_out  # every field of every answer, slots included
    assert pg_rows == sqlite_rows  # every column of every lease, slot and audit event
    # SQLite loaded the two released rows through the ORM; PostgreSQL read them as snapshots
    assert (sqlite_loads, pg_loads) == (2, 0)


def test_leases_something_else_could_read_are_loaded_as_rows(pg_url):
    """The ORM loads a lease released twice in one batch, every lease of a batch with a
    keepalive, and a lease under a reclaim notice."""
    upgrade(pg_url)
    clock = StoreClock()
    store = make_store(pg_url, clock, APPROVAL_POOL)
    a, b, c, d = store.run_batch(
        [commands.Allocate(u, "", "h100", actor=u) for u in ("a", "b", "c", "d")]
    )
    with orm_loads() as loaded:
        twice = store.run_batch(
            [commands.Release(a.id), commands.Release(a.id, reason="cancelled")]
        )
    assert loaded == [a.id]
    assert [r.state for r in twice] == ["released", "released"]
    assert twice[1].release_reason == "stopped"  # the second found it released already
    with orm_loads() as loaded:
        bound, released = store.run_batch([commands.Keepalive(b.id), commands.Release(c.id)])
    assert sorted(loaded) == sorted([b.id, c.id])
    assert (bound.state, released.state) == ("active", "released")
    store.admin_reclaim(d.id, grace=600, actor="root")  # a notice with a deadline
    with orm_loads() as loaded:
        (out,) = store.run_batch([commands.Release(d.id)])
    assert loaded == [d.id] and out.state == "released"
    with store.read() as db:
        kinds = db.scalars(
            sa.select(orm.EventRow.kind).where(
                orm.EventRow.lease_id == a.id, orm.EventRow.kind == "released"
            )
        ).all()
    assert kinds == ["released"]  # released once, however often asked


def test_the_query_probes_the_slots_by_index_on_statistics_that_lag(pg_url):
    """A new pool's tables grow faster than autovacuum analyses them: the query must still
    look up each lease's slots through the index, not hash the whole slots table (which a
    plain join did here, in time growing with every lease ever made)."""
    upgrade(pg_url)
    engine = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        for table in ("leases", "lease_slots"):  # no ANALYZE during the test
            conn.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        conn.exec_driver_sql(
            'INSERT INTO leases (id, "user", server, offer, groups, priority, state, units, '
            "units_f, borrowed, within_guarantee, created, busy_hours, exception, "
            "reclaim_pressure) SELECT 'l' || i, 'u', '', 'h100', '[]', 0, 'released', '1', 1, "
            "false, true, now(), 0, false, false FROM generate_series(1, 5000) AS i"
        )
        conn.exec_driver_sql(
            'INSERT INTO lease_slots (lease_id, slot_key, gpu_uuid, kind, milli, "create", '
            "live) SELECT 'l' || i, 'k' || i, 'g', 'gpu', 1000, false, false "
            "FROM generate_series(1, 5000) AS i"
        )
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        plan = [
            r[0]
            for r in raw.execute(
                "EXPLAIN " + snapshots.SELECT, {"ids": [f"l{i}" for i in range(1, 9)]}
            )
        ]
        rows = raw.execute(snapshots.SELECT, {"ids": ["l1", "l2"]}).fetchall()
    engine.dispose()
    assert not any("Seq Scan on lease_slots" in line for line in plan), plan
    assert any("ix_lease_slots_lease_id" in line for line in plan), plan
    assert sorted(r[0] for r in rows) == ["l1", "l2"]
