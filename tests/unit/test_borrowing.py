"""The borrowed-capacity rules in one place (``pool/borrowing.py``): which leases are
borrowed, in what order borrowed leases go back, and the quota preview running the very rule
the allocator applies after a quota change."""

from __future__ import annotations

from fractions import Fraction

from jupyterhub_gpupool.pool.borrowing import borrowed_flags, owner_surplus, reclaim_order
from jupyterhub_gpupool.pool.decisions import Lease
from jupyterhub_gpupool.pool.model import Request
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec
from jupyterhub_gpupool.pool.rules.quotas import borrowed_if
from tests.allocrig import granted, pool, req

F = Fraction


def lease(lid: str, user: str = "u", arrival: float = 0.0, **kw) -> Lease:
    group, exception = kw.get("group"), kw.get("exception", False)
    request = Request(lid, user, "h100", arrival=arrival, exception=exception)
    return Lease(lid, request, "h100", "n", (), F(1), group, False)


def no_group(_group: str) -> F | None:
    return None


def test_a_users_oldest_leases_are_within_guarantee_the_rest_borrowed():
    leases = [lease("new", arrival=3), lease("old", arrival=1), lease("mid", arrival=2)]
    flags = borrowed_flags(leases, F(2), no_group, lambda g: F(0))
    assert flags == {"old": False, "mid": False, "new": True}
    assert borrowed_flags(leases, F(0), no_group, lambda g: F(0)) == dict.fromkeys(flags, True)


def test_a_group_within_its_guarantee_keeps_its_members_leases_within():
    leases = [lease("a", group="ml"), lease("b", arrival=1, group="ml")]
    held = {"ml": F(2)}
    flags = borrowed_flags(leases, F(0), {"ml": F(2)}.get, held.__getitem__)
    assert flags == {"a": False, "b": False}
    flags = borrowed_flags(leases, F(0), {"ml": F(1)}.get, held.__getitem__)
    assert flags == {"a": True, "b": True}


def test_an_approved_exception_is_never_borrowed():
    leases = [lease("x", exception=True), lease("y", arrival=1)]
    assert borrowed_flags(leases, F(0), no_group, lambda g: F(0)) == {"x": False, "y": True}


def test_reclaim_order_most_over_guarantee_then_idlest_then_youngest():
    now = 100.0
    keys = {
        "less-over": reclaim_order(F(1), 10.0, 5.0, "less-over", now),
        "most-over-busy": reclaim_order(F(3), None, 5.0, "most-over-busy", now),
        "most-over-idle": reclaim_order(F(3), 50.0, 5.0, "most-over-idle", now),
        "most-over-idle-young": reclaim_order(F(3), 50.0, 9.0, "most-over-idle-young", now),
        "most-over-idler": reclaim_order(F(3), 20.0, 5.0, "most-over-idler", now),
    }
    assert sorted(keys, key=keys.__getitem__) == [
        "most-over-idler",  # idle since 20
        "most-over-idle-young",  # idle since 50, granted later
        "most-over-idle",
        "most-over-busy",  # not idle: counts as idle from now
        "less-over",
    ]


def test_owner_surplus_is_the_least_of_the_users_and_the_groups():
    book = QuotaBook(
        users={"u": QuotaSpec(guarantee=F(1))}, groups={"ml": QuotaSpec(guarantee=F(3))}
    )
    held_user, held_group = {"u": F(4)}, {"ml": F(5)}
    assert owner_surplus("u", None, held_user, held_group, book) == F(3)
    assert owner_surplus("u", "ml", held_user, held_group, book) == F(2)
    assert owner_surplus("u", "other", held_user, held_group, book) == F(3)  # no such quota


def preview(alloc, kind: str, name: str, guarantee: F) -> tuple[list[str], list[str]]:
    """The quota preview's flags (``pool.rules.quotas.borrowed_if``, what ``decide`` of a quota edit
    says): (ids that become borrowed, ids that become within guarantee)."""
    flags = borrowed_if(alloc, kind, name, guarantee)
    return [lid for lid, b in flags if b], [lid for lid, b in flags if not b]


def _three_leases():
    alloc = pool(QuotaBook(users={"u": QuotaSpec(guarantee=F(3))}))
    for i in range(3):
        granted(alloc.submit(req(f"u{i}", "h100", "u", arrival=float(i)), 0))
    return alloc


def test_the_preview_is_what_the_change_then_does_and_changes_nothing():
    alloc = _three_leases()
    assert not any(le.borrowed for le in alloc.leases.values())
    assert preview(alloc, "user", "u", F(1)) == (["u1", "u2"], [])
    assert not any(le.borrowed for le in alloc.leases.values())  # a preview changes nothing
    alloc.quotas.users["u"] = QuotaSpec(guarantee=F(1))
    changed = alloc.rederive_borrowed("u")
    assert sorted(le.id for le in changed) == ["u1", "u2"]
    assert preview(alloc, "user", "u", F(2)) == ([], ["u1"])
    assert preview(alloc, "user", "nobody", F(0)) == ([], [])


def test_a_group_preview_covers_the_groups_members():
    book = QuotaBook(groups={"ml": QuotaSpec(guarantee=F(2), limit=F(4))})
    alloc = pool(book)
    for i, user in enumerate(("a", "b")):
        granted(alloc.submit(req(f"{user}0", "h100", user, group="ml", groups=("ml",)), i))
    assert not any(le.borrowed for le in alloc.leases.values())
    assert preview(alloc, "group", "ml", F(1)) == (["a0", "b0"], [])
    alloc.quotas.groups["ml"] = QuotaSpec(guarantee=F(1), limit=F(4))
    assert sorted(le.id for le in alloc.rederive_borrowed(group="ml")) == ["a0", "b0"]


def test_the_preview_leaves_an_approved_exception_within_guarantee():
    """The panel's preview once had its own copy of the rule, without exceptions: it said an
    exception's lease would become borrowed, which saving the quota never did."""
    alloc = pool(QuotaBook(users={"u": QuotaSpec(guarantee=F(2), exception=F(4))}))
    granted(alloc.submit(req("x", "h100", "u", exception=True), 0))
    granted(alloc.submit(req("y", "h100", "u", arrival=1.0), 0))
    assert preview(alloc, "user", "u", F(0)) == (["y"], [])
