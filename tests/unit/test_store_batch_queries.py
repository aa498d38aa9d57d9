"""What a batch asks the database (issue 16's round trips), on SQLite and PostgreSQL: the
requests awaiting approval are looked up once per batch, not once per ``allocate``, with the
same answers as the calls one by one; an allocator rebuilt from the rows (the inventory read
with Core queries) decides like the one kept in step with them."""

from __future__ import annotations

import sqlalchemy as sa

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.store import Store, StoreError
from tests.fakes import APPROVAL_POOL, make_instances, make_store


def state_selects(store: Store) -> list[str]:
    """Every ``SELECT`` from ``leases`` by state the store sends from now on."""
    sent: list[str] = []

    def note(_conn, _cursor, statement, *_a) -> None:
        text = " ".join(statement.split()).upper()
        if text.startswith("SELECT") and "FROM LEASES" in text and "LEASES.STATE =" in text:
            sent.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", note)
    return sent


def test_a_batch_looks_up_requests_awaiting_approval_once(db_url, clock):
    upgrade(db_url)
    store = make_store(db_url, clock, APPROVAL_POOL)
    ask = store.allocate("admin", "", "big", reason="the paper deadline")
    assert ask.state == "awaiting_approval"
    sent = state_selects(store)
    out = store.run_batch(
        [
            commands.Allocate("admin", "", "h100"),  # the server's request still waits
            commands.Allocate("admin", "other", "h100"),
            commands.Allocate("dana", "a", "h100"),
            commands.Allocate("dana", "b", "h100"),
        ]
    )
    assert isinstance(out[0], StoreError) and out[0].code == "already_allocated"
    assert ask.id in out[0].message
    assert [r.state for r in out[1:]] == ["granted"] * 3
    assert len(sent) == 1, sent  # one query for the four allocates (was one each)
    # outside a batch, an allocate asks the database itself: the same refusal
    try:
        store.allocate("admin", "", "h100")
    except StoreError as e:
        assert e.code == "already_allocated" and ask.id in e.message
    else:
        raise AssertionError("a second request for a server awaiting approval was accepted")


def test_a_request_withdrawn_earlier_in_the_batch_no_longer_blocks_its_server(db_url, clock):
    upgrade(db_url)
    store = make_store(db_url, clock, APPROVAL_POOL)
    ask = store.allocate("admin", "", "big", reason="the paper deadline")
    out = store.run_batch(
        [
            commands.Release(ask.id),
            commands.Allocate("admin", "", "h100"),
        ]
    )
    assert out[0].state == "released" and out[0].release_reason == "withdrawn"
    assert out[1].state == "granted"  # as when the two calls run one after the other


def test_an_allocator_rebuilt_from_the_rows_matches_the_one_kept_in_step(db_url, clock):
    upgrade(db_url)
    store = make_store(db_url, clock)
    store.allocate("alice", "", "a100-3g")
    store.allocate("bob", "", "a100-1g")
    make_instances(store)  # the dynamic-MIG GPU's instances exist and are observed
    store.allocate("carol", "", "h100")
    before = store.pool(detail=True)
    store._allocator = None  # the next look rebuilds it from the rows
    assert store.pool(detail=True) == before
    grant = store.allocate("dave", "", "a100-1g")  # placed beside the existing instances
    assert grant.state == "granted" and grant.slots[0].start is not None


def test_a_request_asked_earlier_in_the_batch_blocks_its_server_after_a_flush(db_url, clock):
    upgrade(db_url)
    store = make_store(db_url, clock, APPROVAL_POOL)

    def flush(kind: str, _data: dict) -> None:
        # what releasing a planned MIG instance does in the middle of a batch: a flush, here
        # right after the first request was asked (the store's listeners run in its transaction)
        if kind == "approval-requested":
            store._local.active[0].flush()

    store.listeners.append(flush)
    out = store.run_batch(
        [
            commands.Allocate("admin", "", "big", reason="the paper deadline"),
            commands.Allocate("admin", "", "big", reason="asked twice"),
        ]
    )
    out.insert(1, None)  # where the flush was
    assert out[0].state == "awaiting_approval"
    assert isinstance(out[2], StoreError) and out[2].code == "already_allocated"
    assert out[0].id in out[2].message
    assert [a.id for a in store.awaiting_approval()] == [out[0].id]


def test_whose_a_lease_is_comes_from_memory_once_known(db_url, clock):
    """Every DELETE checks whose the lease is; the service notes it from the grant's answer,
    so the check does not read the database (on the event loop) again, and a lease it never
    saw is read once. A missing lease is still the store's 404."""
    upgrade(db_url)
    store = make_store(db_url, clock, APPROVAL_POOL)
    noted = store.allocate("dana", "a", "h100")
    unseen = store.allocate("dana", "b", "h100")
    sent: list[str] = []

    def note(_conn, _cursor, statement, *_a) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            sent.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", note)
    store.note_holder(noted.id, noted.user, noted.hub)
    assert store.lease_holder(noted.id) == ("dana", None) and sent == []
    assert store.lease_holder(unseen.id) == ("dana", None) and len(sent) == 1
    assert store.lease_holder(unseen.id) == ("dana", None) and len(sent) == 1
    try:
        store.lease_holder("no-such-lease")
    except StoreError as e:
        assert e.code == "not_found"
    else:
        raise AssertionError("a missing lease had a holder")


def test_a_batch_counts_requests_against_the_cap_without_a_query_per_allocate(db_url, clock):
    """``max_requests_per_user`` counts the requests awaiting approval too: in a batch from the
    one prefetch (it was a query per ``allocate``), as the calls one by one would count them —
    those asked and withdrawn earlier in the same batch included."""
    upgrade(db_url)
    store = make_store(db_url, clock, APPROVAL_POOL, max_requests_per_user=3)
    ask = store.allocate("admin", "", "big", reason="the paper deadline")
    sent = state_selects(store)
    out = store.run_batch(
        [
            commands.Allocate("admin", "a", "h100"),  # 1 awaiting + 0 held: granted
            commands.Allocate("admin", "b", "big", reason="a second paper"),  # 2 of 3
            commands.Allocate("admin", "c", "h100"),  # 2 awaiting + 1 held: at the cap
            commands.Release(ask.id),  # withdrawn: one fewer
            commands.Allocate("admin", "d", "h100"),
            commands.Allocate("admin", "e", "h100"),  # at the cap again
        ]
    )
    assert out[0].state == "granted"
    assert out[1].state == "awaiting_approval"
    assert isinstance(out[2], StoreError) and out[2].code == "too_many_requests"
    assert out[3].state == "released"
    assert out[4].state == "granted"
    assert isinstance(out[5], StoreError) and out[5].code == "too_many_requests"
    assert len(sent) == 1, sent  # the prefetch; no count per allocate
    # outside a batch the count asks the database: the same answer
    try:
        store.allocate("admin", "f", "h100")
    except StoreError as e:
        assert e.code == "too_many_requests"
    else:
        raise AssertionError("a request over the cap was accepted")


def test_a_pool_with_no_request_awaiting_approval_skips_the_lookup(db_url, clock):
    """Most of the time nothing awaits approval: a batch then asks nothing about it. The
    store knows from the rows it rebuilt from, and from its own asks; a request another
    replica asks for moves the pool version, so the next batch rebuilds and looks again."""
    upgrade(db_url)
    store = make_store(db_url, clock, APPROVAL_POOL, max_requests_per_user=5)
    replica = make_store(db_url, clock, APPROVAL_POOL, max_requests_per_user=5)
    store.pool(detail=False)  # caught up with the replica's config load: rebuilt, and looked once
    sent = state_selects(store)
    out = store.run_batch([commands.Allocate("dana", f"s{i}", "h100") for i in range(3)])
    assert [r.state for r in out] == ["granted"] * 3
    assert sent == []  # no lookup of requests awaiting approval, no count per allocate
    ask = replica.allocate("admin", "", "big", reason="the paper deadline")
    assert ask.state == "awaiting_approval"
    out = store.run_batch([commands.Allocate("admin", "", "h100")])
    assert isinstance(out[0], StoreError) and out[0].code == "already_allocated"
    assert ask.id in out[0].message
    # the rebuild (its live leases, then the check), then the batch's lookup
    assert len(sent) == 3 and "IN (" in sent[-1].upper(), sent
    # its own ask: the next batch looks them up again (in the same batch, the ask's note)
    out = store.run_batch(
        [
            commands.Allocate("dana", "big", "big", reason="a second paper"),
            commands.Allocate("dana", "big", "h100"),
        ]
    )
    assert out[0].state == "awaiting_approval"
    assert isinstance(out[1], StoreError) and out[1].code == "already_allocated"
    out = store.run_batch([commands.Allocate("dana", "big", "h100")])
    assert isinstance(out[0], StoreError) and out[0].code == "already_allocated"
