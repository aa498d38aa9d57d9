"""Quotas in GPU units: exact units, guarantee/limit/borrowing
per user and per group, the group a request is charged to, and config validation."""

from __future__ import annotations

from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.errors import ConfigError
from jupyterhub_gpupool.pool.model import offer_units, parse_offer
from jupyterhub_gpupool.pool.quota import QUOTA_CODES, QUOTA_FIELDS, QuotaBook, QuotaSpec, Verdict

CATALOG = default_catalog()
A100 = CATALOG.model("A100-80GB")
H100 = CATALOG.model("H100-80GB")


def spec(guarantee=0, limit=None, budget=None, period="month") -> QuotaSpec:
    raw: dict[str, object] = {"guarantee": guarantee, "period": period}
    if limit is not None:
        raw["limit"] = limit
    if budget is not None:
        raw["budget"] = budget
    return QuotaSpec.parse(raw)


# -- units ------------------------------------------------------------------------------------


def offer(**raw):
    return parse_offer({"name": "o", **raw}, CATALOG)


def test_one_g_ten_gb_on_a100_80gb_is_exactly_one_seventh():
    units = offer_units(offer(kind="mig", profile="1g.10gb", models=["A100-80GB"]), A100)
    assert units == Fraction(1, 7)
    assert isinstance(units, Fraction)


def test_seven_one_g_slices_add_up_to_exactly_one_unit():
    book = QuotaBook()
    units = offer_units(offer(kind="mig", profile="1g.10gb", models=["A100-80GB"]), A100)
    for _ in range(7):
        book.add("alice", "ml", units)
    assert book.held("alice") == 1
    assert book.group_held("ml") == 1
    # exactly, not approximately: a float sum of 7 × (1/7) would not be 1 in general
    assert book.held("alice") == Fraction(1)
    for _ in range(7):
        book.remove("alice", "ml", units)
    assert book.held("alice") == 0
    assert book.group_held("ml") == 0


@pytest.mark.parametrize(
    ("raw", "model", "expected"),
    [
        ({"kind": "mig", "profile": "3g.40gb", "models": ["A100-80GB"]}, A100, Fraction(1, 2)),
        ({"kind": "mig", "profile": "2g.20gb", "models": ["A100-80GB"]}, A100, Fraction(2, 7)),
        ({"kind": "mig", "profile": "4g.40gb", "models": ["A100-80GB"]}, A100, Fraction(4, 7)),
        ({"kind": "mig", "profile": "7g.80gb", "models": ["A100-80GB"]}, A100, Fraction(1)),
        ({"kind": "gpu", "count": 1, "models": ["H100-80GB"]}, H100, Fraction(1)),
        ({"kind": "gpu", "count": 2, "models": ["H100-80GB"]}, H100, Fraction(2)),
        ({"kind": "shared", "fraction": 0.25}, H100, Fraction(1, 4)),
        ({"kind": "cpu"}, H100, Fraction(0)),
    ],
)
def test_units_are_the_dominant_share_or_the_fraction(raw, model, expected):
    assert offer_units(offer(**raw), model) == expected


def test_remove_never_goes_below_zero():
    book = QuotaBook()
    book.add("alice", "ml", Fraction(1, 7))
    book.remove("alice", "ml", Fraction(1))
    assert book.held("alice") == 0
    assert book.group_held("ml") == 0


# -- guarantee, limit and borrowing per user ---------------------------------------------------


def test_user_within_guarantee_does_not_borrow_and_beyond_it_does():
    book = QuotaBook(users={"alice": spec(guarantee=1, limit=2)})
    first = book.check("alice", [], Fraction(1))
    assert first == Verdict(True, group=None, borrowed=False)
    book.add("alice", None, Fraction(1))
    second = book.check("alice", [], Fraction(1, 2))
    assert second.ok and second.borrowed
    # a request that straddles the guarantee borrows (part of it is beyond)
    book2 = QuotaBook(users={"alice": spec(guarantee=1, limit=2)})
    book2.add("alice", None, Fraction(1, 2))
    assert book2.check("alice", [], Fraction(1)).borrowed
    assert not book2.check("alice", [], Fraction(1, 2)).borrowed


def test_user_over_limit_can_wait_but_exceeds_limit_never_can():
    book = QuotaBook(users={"alice": spec(guarantee=1, limit=2)})
    book.add("alice", None, Fraction(2))
    over = book.check("alice", [], Fraction(1, 7))
    assert not over.ok
    assert over.code == "over_limit"
    assert over.can_wait
    exceeds = book.check("alice", [], Fraction(3))
    assert not exceeds.ok
    assert exceeds.code == "exceeds_limit"
    assert not exceeds.can_wait
    # exceeds_limit does not depend on what is held: it is about the request alone
    assert QuotaBook(users={"alice": spec(limit=2)}).check("alice", [], Fraction(3)).code == (
        "exceeds_limit"
    )


def test_exactly_up_to_the_limit_is_allowed():
    book = QuotaBook(users={"alice": spec(limit=1)})
    for _ in range(7):
        verdict = book.check("alice", [], Fraction(1, 7))
        assert verdict.ok
        book.add("alice", None, Fraction(1, 7))
    assert book.held("alice") == 1
    assert book.check("alice", [], Fraction(1, 7)).code == "over_limit"


def test_limit_zero_is_no_quota():
    book = QuotaBook(users={"bob": spec(limit=0)})
    verdict = book.check("bob", [], Fraction(1, 7))
    assert verdict.code == "no_quota"
    assert not verdict.can_wait


def test_default_user_quota_applies_to_users_without_their_own():
    book = QuotaBook(users={"vip": spec(limit=4)}, default_user=spec(limit=1))
    assert book.check("anyone", [], Fraction(2)).code == "exceeds_limit"
    assert book.check("vip", [], Fraction(2)).ok


def test_no_guarantee_means_everything_is_borrowed():
    book = QuotaBook()
    verdict = book.check("carol", [], Fraction(1, 7))
    assert verdict.ok and verdict.borrowed


def test_budget_exhausted_when_used_hours_reach_the_budget():
    book = QuotaBook(users={"alice": spec(limit=2, budget=10, period="week")})
    book.used_hours["alice"] = 9.99
    assert book.check("alice", [], Fraction(1)).ok
    book.used_hours["alice"] = 10.0
    verdict = book.check("alice", [], Fraction(1))
    assert verdict.code == "budget_exhausted"
    assert not verdict.can_wait
    assert "week" in verdict.message
    book.used_hours["alice"] = 12.5
    assert book.check("alice", [], Fraction(1, 7)).code == "budget_exhausted"


def test_group_budget_exhausted():
    book = QuotaBook(groups={"ml": spec(limit=4, budget=100)})
    book.used_hours["group:ml"] = 100.0
    verdict = book.check("alice", ["ml"], Fraction(1), "ml")
    assert verdict.code == "budget_exhausted"


# -- groups ---------------------------------------------------------------------------------


def test_group_guarantee_keeps_a_member_within_guarantee():
    book = QuotaBook(groups={"ml": spec(guarantee=2, limit=3)})
    v1 = book.check("alice", ["ml"], Fraction(1))
    assert v1.ok and v1.group == "ml" and not v1.borrowed
    book.add("alice", "ml", Fraction(1))
    book.add("bob", "ml", Fraction(1))
    # the group's guarantee (2) is used up by alice and bob together: the next unit borrows
    v2 = book.check("carol", ["ml"], Fraction(1))
    assert v2.ok and v2.group == "ml" and v2.borrowed
    book.add("carol", "ml", Fraction(1))
    v3 = book.check("dave", ["ml"], Fraction(1, 7))
    assert v3.code == "over_limit"
    assert v3.group == "ml"
    assert v3.can_wait
    assert book.check("dave", ["ml"], Fraction(4)).code == "exceeds_limit"


def test_borrowed_only_when_beyond_both_user_and_group_guarantee():
    book = QuotaBook(users={"alice": spec(guarantee=1)}, groups={"ml": spec(guarantee=1)})
    book.add("bob", "ml", Fraction(1))  # the group's guarantee is spent by bob
    assert not book.borrows("alice", "ml", Fraction(1))  # alice's own guarantee covers it
    book.add("alice", "ml", Fraction(1))
    assert book.borrows("alice", "ml", Fraction(1, 7))  # beyond both now
    assert book.borrows("alice", None, Fraction(1, 7))


def test_group_limit_zero_is_no_quota_and_group_usage_counts_for_everybody():
    book = QuotaBook(groups={"guests": spec(limit=0), "ml": spec(limit=1)})
    assert book.check("alice", ["guests"], Fraction(1, 7), "guests").code == "no_quota"
    book.add("bob", "ml", Fraction(1))
    assert book.check("alice", ["ml"], Fraction(1, 7)).code == "over_limit"


def test_named_group_is_charged():
    book = QuotaBook(groups={"a": spec(limit=4), "b": spec(limit=4)})
    verdict = book.check("alice", ["a", "b"], Fraction(1), "b")
    assert verdict.ok and verdict.group == "b"


def test_named_group_without_a_quota_is_charged_without_limits():
    book = QuotaBook(groups={"a": spec(limit=1)})
    verdict = book.check("alice", ["a", "plain"], Fraction(3), "plain")
    assert verdict.ok and verdict.group == "plain"


def test_named_group_at_its_limit_waits_even_if_another_group_has_room():
    book = QuotaBook(groups={"a": spec(limit=1), "b": spec(limit=4)})
    book.add("bob", "a", Fraction(1))
    verdict = book.check("alice", ["a", "b"], Fraction(1), "a")
    assert verdict.code == "over_limit"
    assert verdict.group == "a"


def test_first_group_with_room_is_charged():
    book = QuotaBook(groups={"a": spec(limit=1), "b": spec(limit=4), "c": spec(limit=4)})
    assert book.check("alice", ["a", "b", "c"], Fraction(1)).group == "a"
    book.add("bob", "a", Fraction(1))
    # a is full: b, the next one in the user's order, is charged (not c)
    assert book.check("alice", ["a", "b", "c"], Fraction(1)).group == "b"
    # the user's own order counts, not the order the groups were declared in
    assert book.check("alice", ["c", "a", "b"], Fraction(1)).group == "c"


def test_groups_without_a_quota_are_not_charged_when_none_is_named():
    book = QuotaBook(groups={"ml": spec(limit=4)})
    assert book.check("alice", ["plain", "ml"], Fraction(1)).group == "ml"
    assert book.check("alice", ["plain"], Fraction(1)).group is None


def test_not_a_member_of_the_named_group():
    book = QuotaBook(groups={"ml": spec(limit=4)})
    verdict = book.check("alice", ["physics"], Fraction(1), "ml")
    assert verdict.code == "not_in_group"
    assert not verdict.ok and not verdict.can_wait
    assert "ml" in verdict.message


def test_user_limit_applies_after_the_group_is_chosen():
    book = QuotaBook(users={"alice": spec(limit=1)}, groups={"ml": spec(limit=8)})
    book.add("alice", "ml", Fraction(1))
    verdict = book.check("alice", ["ml"], Fraction(1, 7))
    assert verdict.code == "over_limit"
    assert verdict.group == "ml"


@pytest.mark.parametrize("first", [spec(limit=Fraction(1, 2)), spec(limit=0)])
def test_a_full_later_group_makes_the_request_wait_not_fail(first):
    # the rule: "charged to the group the request names, else the first group with room".
    # "small" can never hold a whole GPU, "big" can once its members release something, so the
    # request must be able to wait (over_limit, charged to big), not be refused for ever.
    book = QuotaBook(groups={"small": first, "big": spec(limit=2)})
    book.add("bob", "big", Fraction(2))
    verdict = book.check("alice", ["small", "big"], Fraction(1))
    assert verdict.can_wait
    assert verdict.code == "over_limit"
    assert verdict.group == "big"


def test_a_full_first_group_is_kept_over_a_later_group_that_never_fits():
    book = QuotaBook(groups={"big": spec(limit=2), "small": spec(limit=Fraction(1, 2))})
    book.add("bob", "big", Fraction(2))
    verdict = book.check("alice", ["big", "small"], Fraction(1))
    assert (verdict.code, verdict.group) == ("over_limit", "big")
    assert verdict.can_wait


def test_a_later_group_with_room_is_charged_after_a_never_fitting_one():
    book = QuotaBook(
        groups={"none": spec(limit=0), "small": spec(limit=Fraction(1, 2)), "big": spec(limit=2)}
    )
    verdict = book.check("alice", ["none", "small", "big"], Fraction(1))
    assert verdict.ok and verdict.group == "big"


# -- share (fair ordering) -------------------------------------------------------------------


def test_share_is_held_over_guarantee_of_the_group_else_the_user():
    book = QuotaBook(users={"alice": spec(guarantee=2)}, groups={"ml": spec(guarantee=4)})
    book.add("alice", "ml", Fraction(1))
    assert book.share("ml", "alice") == pytest.approx(0.25)
    assert book.share(None, "alice") == pytest.approx(0.5)
    assert book.share("nogroupquota", "alice") == pytest.approx(0.5)
    assert book.share(None, "nobody") == 0.0
    book.add("bob", None, Fraction(1, 7))
    # no guarantee: any holding sorts after every holder with a guarantee
    assert book.share(None, "bob") > book.share(None, "alice")


# -- QuotaSpec.parse ------------------------------------------------------------------------


def test_parse_valid_quota_with_exact_units():
    parsed = QuotaSpec.parse({"guarantee": 0.1, "limit": "1/7", "budget": 5, "period": "day"})
    assert parsed.guarantee == Fraction(1, 10)
    assert parsed.limit == Fraction(1, 7)
    assert parsed.budget == Fraction(5)
    assert parsed.period == "day"
    assert QuotaSpec.parse({}) == QuotaSpec()
    assert QuotaSpec.parse({}).limit is None
    assert QuotaSpec.parse({"limit": 2}).to_dict() == {
        "guarantee": 0.0,
        "limit": 2.0,
        "budget": None,
        "period": "month",
        "exception": None,
        "budget_action": "refuse",
        "budget_minimum": 0.0,
    }


@pytest.mark.parametrize("key", ["guarantee", "limit", "budget"])
@pytest.mark.parametrize("value", [-1, -0.5, "-1", "lots", True, False, [1], {"a": 1}])
def test_parse_rejects_bad_numbers_naming_the_field(key, value):
    with pytest.raises(ConfigError) as info:
        QuotaSpec.parse({key: value}, "quota")
    assert info.value.field == f"quota.{key}"
    assert str(info.value).startswith(f"quota.{key}")


def test_parse_none_means_unset_for_limit_and_budget_but_not_for_guarantee():
    assert QuotaSpec.parse({"limit": None, "budget": None}) == QuotaSpec()
    with pytest.raises(ConfigError) as info:
        QuotaSpec.parse({"guarantee": None})
    assert info.value.field == "quota.guarantee"


def test_parse_error_names_the_field_under_the_given_prefix():
    with pytest.raises(ConfigError) as info:
        QuotaSpec.parse({"limit": -2}, "quotas.users.alice")
    assert info.value.field == "quotas.users.alice.limit"
    assert info.value.to_dict()["error"]["field"] == "quotas.users.alice.limit"


def test_parse_rejects_guarantee_above_limit():
    with pytest.raises(ConfigError) as info:
        QuotaSpec.parse({"guarantee": 3, "limit": 2})
    assert info.value.field == "quota.guarantee"
    # equal is fine
    assert QuotaSpec.parse({"guarantee": 2, "limit": 2}).guarantee == 2


@pytest.mark.parametrize("period", ["year", "Month", "", 30, None])
def test_parse_rejects_unknown_period(period):
    with pytest.raises(ConfigError) as info:
        QuotaSpec.parse({"period": period})
    assert info.value.field == "quota.period"
    assert info.value.allowed == ["day", "week", "month"]


def test_parse_rejects_unknown_fields_naming_them():
    with pytest.raises(ConfigError) as info:
        QuotaSpec.parse({"limt": 1, "guarantee": 0})
    assert info.value.field == "quota"
    assert "limt" in str(info.value)
    assert info.value.allowed == sorted(QUOTA_FIELDS)
    assert {"budget_action", "budget_minimum", "limit"} <= set(info.value.allowed)


def test_parse_rejects_a_non_mapping():
    with pytest.raises(ConfigError) as info:
        QuotaSpec.parse([("limit", 1)], "quotas.groups.ml")  # type: ignore[arg-type]
    assert info.value.field == "quotas.groups.ml"


def test_parse_rejects_nan():
    with pytest.raises(ConfigError) as info:
        QuotaSpec.parse({"limit": float("nan")})
    assert info.value.field == "quota.limit"


def test_parse_rejects_infinity_as_a_config_error():
    with pytest.raises(ConfigError) as info:
        QuotaSpec.parse({"limit": float("inf")})
    assert info.value.field == "quota.limit"


def test_quota_codes_are_the_documented_set():
    assert set(QUOTA_CODES) == {
        "no_quota",
        "exceeds_limit",
        "over_limit",
        "budget_exhausted",
        "not_in_group",
    }


# -- budgets that mean something (issue 32) ------------------------------------------------------


def test_a_grant_never_starts_with_less_budget_left_than_the_minimum():
    # 9.98 of 10 unit-hours used: with a minimum of 0.5 left, no new grant (the second
    # lease granted at 9.98 of 10); without one, 0.02 left is still room
    spec = {"guarantee": 0, "limit": 4, "budget": 10, "budget_minimum": 0.5}
    book = QuotaBook(users={"alice": QuotaSpec.parse(spec)})
    book.used_hours["alice"] = 9.98
    verdict = book.check("alice", [], Fraction(1))
    assert (verdict.ok, verdict.code) == (False, "budget_exhausted")
    book.used_hours["alice"] = 9.4
    assert book.check("alice", [], Fraction(1)).ok
    lax = QuotaBook(users={"alice": QuotaSpec.parse({**spec, "budget_minimum": 0})})
    lax.used_hours["alice"] = 9.98
    assert lax.check("alice", [], Fraction(1)).ok
    lax.used_hours["alice"] = 10.0
    assert lax.check("alice", [], Fraction(1)).code == "budget_exhausted"


@pytest.mark.parametrize(
    ("action", "refused"), [("refuse", True), ("stop", True), ("notify", False)]
)
def test_budget_actions_refuse_stop_or_only_notify(action, refused):
    spec = QuotaSpec.parse({"limit": 4, "budget": 10, "budget_action": action})
    assert spec.budget_action == action
    book = QuotaBook(users={"alice": spec}, groups={"ml": spec})
    book.used_hours.update({"alice": 12.0})
    assert (book.check("alice", [], Fraction(1)).code == "budget_exhausted") is refused
    book.used_hours = {"group:ml": 12.0}
    verdict = book.check("bob", ["ml"], Fraction(1), "ml")
    assert (verdict.code == "budget_exhausted") is refused
    assert QuotaSpec.parse({}).budget_action == "refuse"  # the documented default


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"budget": 10, "budget_action": "warn"}, "quota.budget_action"),
        ({"budget": 1, "budget_minimum": 2}, "quota.budget_minimum"),
        ({"budget": 1, "budget_minimum": -1}, "quota.budget_minimum"),
    ],
)
def test_bad_budget_fields_are_refused_naming_the_field(raw, field):
    with pytest.raises(ConfigError) as info:
        QuotaSpec.parse(raw)
    assert info.value.field == field
