"""Group commit: several store calls in one transaction (``Store.run_batch``), as the service's
writer thread runs them. The leases a batch releases are loaded at once; the audit log is
written in call order; a refusal fails its own call only."""

from __future__ import annotations

import sqlalchemy as sa

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.service.apihandlers.errors import status_of
from jupyterhub_gpupool.store import Store, StoreError
from tests.fakes import lease_events as events
from tests.fakes import make_instances, make_store


def counting(store: Store) -> list[str]:
    """Every SQL statement the store sends from now on."""
    sent: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    return sent


def test_batch_releases_load_their_leases_at_once(db_url, clock):
    upgrade(db_url)
    store = make_store(db_url, clock)
    a = store.allocate("alice", "", "a100-1g")
    b = store.allocate("bob", "", "a100-1g")
    h = store.allocate("dave", "", "h100")
    queued = store.allocate("erin", "", "h100")
    assert queued.state == "queued"
    make_instances(store)  # the MIG slices exist: b may be bound
    sent = counting(store)
    out = store.run_batch(
        [
            commands.Release(a.id, actor="t"),
            commands.Keepalive(b.id, actor="t"),
            commands.Release("no-such-lease"),
            commands.Release(h.id, actor="t"),  # promotes erin
            commands.Release(b.id, actor="t"),  # kept alive above, same batch
        ]
    )
    assert out[0].state == "released" and out[0].slots
    assert out[1].state == "active"
    assert isinstance(out[2], StoreError) and status_of(out[2]) == 404
    assert out[3].state == "released"
    assert out[4].state == "released" and out[4].release_reason == "stopped"
    lease_selects = [s for s in sent if s.lstrip().upper().startswith("SELECT LEASES.")]
    # the prefetch, plus one for the lease that does not exist (and erin's promotion)
    assert len(lease_selects) <= 3, lease_selects
    assert store.lease(queued.id).state == "granted"
    assert events(store, b.id) == ["granted", "mig-created", "activated", "released"]
    assert events(store, queued.id) == ["queued", "granted"]
    with store.read() as db:
        live = db.scalar(
            sa.text("SELECT count(*) FROM lease_slots WHERE live AND lease_id IN (:a, :b, :h)"),
            {"a": a.id, "b": b.id, "h": h.id},
        )
        kinds = [
            k
            for (k,) in db.execute(
                sa.text("SELECT kind FROM events WHERE kind IN ('released', 'granted') ORDER BY id")
            )
        ]
    assert live == 0
    # the audit log is in commit order: erin's grant after dave's release that freed the GPU
    assert kinds[-4:] == ["released", "released", "granted", "released"]


def test_failed_batch_writes_nothing(db_url, clock):
    upgrade(db_url)
    store = make_store(db_url, clock)
    a = store.allocate("alice", "", "h100")

    # a malformed command that fails with an error, not a refusal, after the release wrote
    broken = commands.Allocate("bob", "", "h100", groups=5)  # type: ignore[arg-type]
    try:
        store.run_batch([commands.Release(a.id), broken])
    except TypeError:
        pass
    else:
        raise AssertionError("the batch should have failed")
    assert store.lease(a.id).state == "granted"
    assert events(store, a.id) == ["granted"]


def test_a_malformed_request_fails_alone_in_its_batch(db_url, clock):
    upgrade(db_url)
    store = make_store(db_url, clock)
    out = store.run_batch(
        [
            commands.Allocate("alice", "", "a100-1g"),
            commands.Allocate("bob", "", ""),  # no offer: refused before it writes
            commands.Allocate("", "", "a100-1g"),  # no user
            commands.Allocate("carol", "", "a100-1g"),
        ]
    )
    assert out[0].state == "granted" and out[3].state == "granted"
    for refused, field in ((out[1], "offer"), (out[2], "user")):
        assert isinstance(refused, StoreError)
        assert (status_of(refused), refused.code, refused.field) == (422, "invalid_request", field)
    items, total = store.leases()
    assert total == 2 and {le.user for le in items} == {"alice", "carol"}
