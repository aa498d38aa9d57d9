"""PostgreSQL's bulk writes (``store/bulk.py``): a batch's audit events in one INSERT, its
releases in one UPDATE of the leases and one of their slots, sent as binary arrays.

The same story is told on SQLite (the ORM's writes, row by row) and on PostgreSQL (the bulk
writes), and the rows must come out the same; on PostgreSQL the batch must send one statement
of each kind; and text the driver would have to quote survives the trip as it was."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from psycopg import _queries, pq

from jupyterhub_gpupool import orm
from jupyterhub_gpupool.dbutil import analyse_if_never, make_engine, upgrade
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.store import Store, bulk
from jupyterhub_gpupool.store.rows import new_row
from tests.fakes import APPROVAL_POOL, StoreClock, make_instances, make_store

#: An actor name with what a text array would have to quote or escape.
AWKWARD = 'o\'neil "the" \\admin\\, {x} NULL é'


def story(store: Store, clock: StoreClock) -> dict[str, str]:
    """Grants, a queue, releases in batches (one frees the GPU a waiter gets in the same
    batch, one a MIG instance the pool made), an admin's reclaim with a notice, grants that
    expire together, and a reconcile. Returns (user → lease id) of the leases made."""
    ids: dict[str, str] = {}

    def grant(user: str, offer: str) -> None:
        ids[user] = store.allocate(user, "", offer, actor=AWKWARD).id

    out = store.run_batch(
        [
            commands.Allocate(u, "", o, actor=AWKWARD)
            for u, o in (
                ("alice", "a100-1g"),
                ("bob", "a100-3g"),
                ("carol", "h100"),
                ("dave", "h100"),
            )
        ]
    )
    ids.update({r.user: r.id for r in out})
    assert [r.state for r in out] == ["granted", "granted", "granted", "queued"]
    make_instances(store)  # the MIG instances exist: their leases can be bound
    store.run_batch([commands.Keepalive(ids[u], actor=u) for u in ("alice", "bob")])
    clock.advance(seconds=30)
    out = store.run_batch(
        [
            # made before the flush that retires alice's instance: on PostgreSQL the session
            # takes the staged lease over for that flush
            commands.Allocate("erin", "", "a100-1g", actor="erin"),
            commands.Release(ids["carol"], actor="carol"),  # dave gets the H100
            commands.Release(ids["alice"], actor="alice"),  # its instance goes too
            commands.Allocate("ivy", "", "a100-7g", actor="ivy", groups=["ml"]),
        ]
    )
    ids["erin"], ids["ivy"] = out[0].id, out[3].id
    assert [r.state for r in out] == ["granted", "released", "released", "queued"]
    clock.advance(seconds=30)
    store.admin_reclaim(ids["bob"], grace=600, actor="root")  # a notice with a deadline
    store.admin_reclaim(ids["bob"], immediately=True, actor="root")  # the deadline goes
    grant("frank", "a100-1g")
    grant("gina", "a100-1g")
    clock.advance(seconds=store.grant_timeout + 1)
    assert store.expire_grants() == 4  # dave, erin, frank and gina never bound: all at once
    grant("hank", "h100")
    store.keepalive(ids["hank"])
    store.reconcile(set())  # the hub runs no server: hank's lease goes
    return ids


def rows(store: Store, ids: dict[str, str]) -> dict[str, Any]:
    """Every lease, slot and audit event, by user instead of lease id (ids are random)."""
    user_of = {lease: user for user, lease in ids.items()}
    lease, slot, event = (t.__table__ for t in (orm.LeaseRow, orm.LeaseSlotRow, orm.EventRow))
    with store.read() as db:  # typed columns: SQLite's times come back as datetimes too
        # every column (the staged leases of a batch are written by bulk.py, not the ORM)
        leases = db.execute(sa.select(lease)).all()
        slots = db.execute(
            sa.select(*(c for c in slot.c if c.name != "id")).order_by(slot.c.id)
        ).all()
        events = db.execute(
            sa.select(
                event.c.ts,
                event.c.actor,
                event.c.kind,
                event.c.lease_id,
                event.c.user,
                event.c.data,
            ).order_by(event.c.id)
        ).all()
    return {
        "leases": sorted(
            (user_of[r.id], *(v for k, v in r._mapping.items() if k != "id")) for r in leases
        ),
        "lease_rows": {user_of[r.id]: r for r in leases},
        # the order they were written in is not theirs (a batch writes its new leases last)
        "slots": sorted(((user_of[r[0]], *r[1:]) for r in slots), key=repr),
        "events": [(*e[:3], user_of.get(e[3]), e[4], e[5]) for e in events],
    }


def test_postgresql_writes_the_rows_sqlite_writes(pg_url, sqlite_url):
    found = {}
    for url in (sqlite_url, pg_url):
        upgrade(url)
        clock = StoreClock()
        store = make_store(url, clock)
        found[url] = rows(store, story(store, clock))
        store.engine.dispose()
    sqlite, pg = found[sqlite_url], found[pg_url]
    assert pg["leases"] == sqlite["leases"]
    assert pg["slots"] == sqlite["slots"]
    assert pg["events"] == sqlite["events"]
    released = [r for r in pg["lease_rows"].values() if r.state == "released"]
    assert len(released) == 9 and all(
        r.released is not None and r.reclaim_deadline is None for r in released
    )
    ivy = pg["lease_rows"]["ivy"]  # queued when bulk.py wrote it: defaults and JSON
    assert (ivy.release_reason, ivy.groups, ivy.clusters, ivy.busy_hours) == (
        "cancelled",
        ["ml"],
        None,
        0.0,
    )
    assert pg["slots"] and not any(live for *_, live in pg["slots"])
    assert any(e[1] == AWKWARD for e in pg["events"])


@contextmanager
def protocol_trace(store: Store, path: Path) -> Iterator[None]:
    """libpq's trace of every message the store's connections send and receive meanwhile."""
    traced = []

    def on_checkout(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        dbapi_conn.pgconn.trace(out.fileno())
        dbapi_conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        traced.append(dbapi_conn)

    with path.open("w") as out:
        sa.event.listen(store.engine, "checkout", on_checkout)
        try:
            yield
        finally:
            sa.event.remove(store.engine, "checkout", on_checkout)
            for conn in traced:
                conn.pgconn.untrace()


def round_trips(path: Path) -> list[list[str]]:
    """The traced conversation as round trips: what the client sent before each answer (the
    frontend's messages up to the backend's next reply)."""
    trips: list[list[str]] = []
    sending = False
    for line in path.read_text().splitlines():
        side, _length, kind, *rest = [*line.split("\t"), ""]
        if side == "F":
            if not sending:
                trips.append([])
                sending = True
            trips[-1].append(f"{kind} {' '.join(rest)}".strip())
        elif side == "B":
            sending = False
    return trips


def test_a_batch_takes_two_round_trips_whatever_its_size(pg_url, clock, tmp_path):
    """Begin, version lock and the leases the releases address; then the releases (leases and
    slots), the new leases, their slots, the audit log, the change record and the commit:
    none of them once per row, and the releases before the grants of the slots they free."""
    upgrade(pg_url)
    store = make_store(pg_url, clock, APPROVAL_POOL)  # four H100s
    out = store.run_batch([commands.Allocate(f"u{i}", "", "h100") for i in range(4)])
    trace = tmp_path / "trace"
    returned: list[bool] = []  # each connection's autocommit as it went back to the pool
    sa.event.listen(store.engine, "checkin", lambda c, _r: returned.append(c.autocommit))
    with protocol_trace(store, trace):
        out = store.run_batch(
            [commands.Release(r.id) for r in out]
            + [commands.Allocate(f"v{i}", "", "h100") for i in range(4)]  # the freed GPUs
        )
    assert [r.state for r in out] == ["released"] * 4 + ["granted"] * 4
    trips = round_trips(trace)
    assert len(trips) == 2, trips
    start, end = (" ".join(" ".join(t).split()).upper() for t in trips)
    assert start.index('"BEGIN"') < start.index("UPDATE POOL_STATE") < start.index("SELECT L.ID")
    assert end.index("UPDATE LEASES SET") < end.index("INSERT INTO POOL_CHANGES")
    assert "UPDATE LEASE_SLOTS SET" in end and end.endswith("SYNC FLUSH")
    for table in ("LEASES", "LEASE_SLOTS", "EVENTS"):
        assert f"INSERT INTO {table} " in end
    assert '"COMMIT"' in end
    # one statement of each kind, however many rows: five executions and the commit
    assert sum(m.startswith("Execute") for t in trips for m in t) == 3 + 2 + 1
    with store.read() as db:
        live = db.scalar(sa.text("SELECT count(*) FROM lease_slots WHERE live"))
        states = dict(
            db.execute(sa.text("SELECT state, count(*) FROM leases GROUP BY state")).all()
        )
    assert live == 4 and states == {"released": 4, "granted": 4}
    # the batch sent its own BEGIN in autocommit mode; its connection went back to the pool
    # in psycopg's usual mode (a BEGIN before each transaction's first statement)
    assert returned and not any(returned)


def test_a_batch_whose_pipelined_commit_fails_is_rolled_back_whole(pg_url, clock):
    """The end of a batch goes out with its COMMIT in one round trip: a statement refused
    there (a slot the database says is held, behind the allocator's back) fails the batch,
    writes nothing of it, and leaves the connection and the store usable."""
    upgrade(pg_url)
    store = make_store(pg_url, clock)  # one H100
    kept = store.allocate("alice", "", "a100-1g")
    with store.locked() as alloc:
        h100 = next(g.uuid for g in alloc.gpus.values() if g.model.name == "H100-80GB")
    with sa.create_engine(store.engine.url).begin() as conn:  # not through the store
        conn.execute(
            sa.insert(orm.LeaseRow).values(
                id="forged",
                user="mallory",
                offer="h100",
                state="granted",
                node="h100",
                units="1",
                units_f=1.0,
                created=clock(),
            )
        )
        conn.execute(
            sa.insert(orm.LeaseSlotRow).values(
                lease_id="forged", slot_key=h100, gpu_uuid=h100, kind="gpu", live=True
            )
        )
    with store.read() as db:
        before = db.execute(sa.text("SELECT count(*) FROM events")).scalar()
    try:
        store.run_batch(
            [
                commands.Release(kept.id),
                commands.Allocate("bob", "", "h100"),  # the slot mallory holds
            ]
        )
    except sa.exc.IntegrityError as e:
        assert "uq_lease_slots_live" in str(e)
    else:
        raise AssertionError("a grant of a slot the database says is held was committed")
    with store.read() as db:
        assert db.execute(sa.text("SELECT count(*) FROM events")).scalar() == before
        states = dict(db.execute(sa.text("SELECT id, state FROM leases")).all())
    assert states == {kept.id: "granted", "forged": "granted"}  # nothing of the batch
    # the store goes on: its allocator is rebuilt from the rows, mallory's slot included
    assert store.allocate("bob", "", "h100").state == "queued"
    assert store.release(kept.id).state == "released"


def test_a_batch_whose_connection_is_lost_fails_as_sqlalchemy_says_and_the_next_reconnects(
    pg_url, clock
):
    """The batch's pipelines run on the driver, outside SQLAlchemy: a connection lost under
    them still raises SQLAlchemy's OperationalError (the service answers 503
    store_unavailable to it) and is not handed out again; nothing of the batch was written."""
    upgrade(pg_url)
    store = make_store(pg_url, clock, APPROVAL_POOL)
    a, b = store.run_batch([commands.Allocate(u, "", "h100") for u in ("a", "b")])
    database = store.engine.url.database
    with sa.create_engine(store.engine.url).connect() as admin:  # the store's own go away
        ended = admin.execute(
            sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = :db AND pid <> pg_backend_pid()"
            ),
            {"db": database},
        ).scalar()
    assert ended >= 1
    try:
        store.run_batch([commands.Release(a.id), commands.Release(b.id)])
    except sa.exc.OperationalError:
        pass
    else:
        raise AssertionError("a batch on a lost connection did not fail")
    assert store.lease(a.id).state == "granted"  # nothing of it was written
    out = store.run_batch([commands.Release(a.id), commands.Release(b.id)])
    assert [r.state for r in out] == ["released", "released"]


def test_a_new_lease_is_inserted_without_its_null_columns():
    """The columns a new lease leaves NULL (reclaim, release, approval) stay out of its INSERT,
    so the batch's statement is short enough for psycopg to cache its parsing; a column whose
    database default is not NULL is sent even as None (leaving it out would not write NULL)."""

    def lease(i: int, **values: Any) -> orm.LeaseRow:
        return orm.LeaseRow(id=f"l{i}", user="u", server="", offer="h100", **values)

    sql, params = bulk._LEASES.statement([lease(1), lease(2)])
    assert "reclaim_deadline" not in sql and "l_reclaim_deadline" not in params
    assert '"user"' in sql and params["l_user"] == ["u", "u"]
    assert len(sql) < _queries.MAX_CACHED_STATEMENT_LENGTH / 2
    assert len(params) < _queries.MAX_CACHED_STATEMENT_PARAMS / 2
    # one lease with a value keeps the column, for every row
    sql2, params2 = bulk._LEASES.statement([lease(1), lease(2, resize_of="l0")])
    assert "resize_of" in sql2 and params2["l_resize_of"] == [None, "l0"]
    # the same columns, the same statement text (prepared once per connection)
    assert bulk._LEASES.statement([lease(3)])[0] is sql
    # a server default that is not NULL: None must be sent to be written
    sql3, params3 = bulk._LEASES.statement([lease(1, reclaim_pressure=None)])
    assert "reclaim_pressure" in sql3 and params3["l_reclaim_pressure"] == [None]


def test_rows_made_without_attribute_events_are_written_as_the_orm_writes_them(db_url):
    """``rows.new_row`` (a grant's lease and slot): through the unit of work, also as a slot
    added to a row already stored, they come back as rows the constructor made do; an unknown
    name fails as the constructor's does."""
    upgrade(db_url)
    engine = make_engine(db_url)
    now = datetime(2026, 1, 2, 3, 4, 5)
    fields = {"user": "u", "server": "", "offer": "h100", "created": now, "units": "1"}
    fields |= {"state": "granted", "units_f": 1.0}
    with sa.orm.Session(engine) as db, db.begin():
        fast = new_row(orm.LeaseRow, id="fast", groups=["g"], **fields)
        fast.slots.append(new_row(orm.LeaseSlotRow, slot_key="k1", gpu_uuid="G1", kind="gpu"))
        db.add_all([fast, orm.LeaseRow(id="slow", groups=["g"], **fields)])
    with sa.orm.Session(engine) as db, db.begin():  # a slot added to a stored row
        stored = db.get(orm.LeaseRow, "slow")
        stored.slots.append(new_row(orm.LeaseSlotRow, slot_key="k2", gpu_uuid="G2", kind="gpu"))
    with sa.orm.Session(engine) as db:
        rows = {r.id: r for r in db.scalars(sa.select(orm.LeaseRow))}
        columns = [c.key for c in orm.LeaseRow.__table__.columns if c.key != "id"]
        assert {c: getattr(rows["fast"], c) for c in columns} == {
            c: getattr(rows["slow"], c) for c in columns
        }
        assert rows["fast"].borrowed is False and rows["fast"].groups == ["g"]  # a default
        assert [(s.slot_key, s.live) for s in rows["fast"].slots] == [("k1", True)]
        assert [(s.slot_key, s.live) for s in rows["slow"].slots] == [("k2", True)]
    with pytest.raises(TypeError, match="'colour' is an invalid keyword argument for LeaseRow"):
        new_row(orm.LeaseRow, id="x", colour="red")


def test_a_new_pools_tables_are_analysed_once_after_its_first_grants(db_url, clock):
    """After ``analyse_after`` grants the store analyses the tables its batches address when
    nothing ever did (PostgreSQL; on SQLite nothing happens), once: their prepared statements'
    generic plans, made while the tables were empty, are made again from real statistics."""
    upgrade(db_url)
    store = make_store(db_url, clock, APPROVAL_POOL)  # four H100s
    store.analyse_after = 3

    def never_analysed() -> set[str]:
        if store.engine.dialect.name != "postgresql":
            return set()
        with store.engine.connect() as conn:
            return set(
                conn.exec_driver_sql(
                    "SELECT relname FROM pg_stat_user_tables WHERE last_analyze IS NULL "
                    "AND last_autoanalyze IS NULL"
                ).scalars()
            )

    addressed = {"leases", "lease_slots", "pool_changes"}
    expected = addressed if store.engine.dialect.name == "postgresql" else set()
    assert never_analysed() >= expected
    out = store.run_batch([commands.Allocate(f"u{i}", "", "h100") for i in range(2)])
    assert never_analysed() >= expected and store.analyse_after == 3  # 2 grants of 3
    out += store.run_batch([commands.Allocate("u2", "", "h100")])
    assert store.analyse_after is None  # once per process
    assert not never_analysed() & addressed
    assert [r.state for r in out] == ["granted"] * 3
    assert analyse_if_never(store.engine, tuple(addressed)) == []  # nothing left to do
