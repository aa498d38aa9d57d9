"""Workload classes as pure rules (``pool/workloads.py``): the ``classes:`` section, who may use
a class, a request's priority, what a job may carry, and the preemption order the allocator
follows when a within-guarantee request of a non-preemptible class cannot be placed."""

from __future__ import annotations

from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.errors import ConfigError, PoolError
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec
from jupyterhub_gpupool.pool.workloads import (
    DEFAULT_CLASSES,
    Holder,
    check_job,
    class_for,
    idle_reclaimable,
    lease_class,
    parse_classes,
    preemption_rank,
    request_priority,
)
from jupyterhub_gpupool.poolconfig import parse_pool_config
from tests.allocrig import granted, pool, queued, req

INTERACTIVE, TRAINING, INFERENCE = (DEFAULT_CLASSES[k] for k in DEFAULT_CLASSES)


def test_defaults_are_the_contracts():
    classes = parse_classes(None)
    assert (classes["interactive"].priority, classes["training"].priority) == (100, 50)
    assert classes["inference"].priority == 125
    assert [c.preemptible for c in classes.values()] == [False, True, False]
    assert [c.idle_reclaim for c in classes.values()] == [True, False, False]
    assert classes["training"].grace == 300
    assert parse_pool_config({}, default_catalog()).classes == classes


def test_a_section_overrides_field_by_field_and_adds_classes():
    classes = parse_classes(
        {"training": {"grace": 600, "allowed_groups": ["ml"]}, "batch": {"priority": 10}}
    )
    assert classes["training"].grace == 600 and classes["training"].preemptible
    assert classes["training"].allowed_groups == ("ml",)
    assert classes["batch"].priority == 10 and not classes["batch"].preemptible
    assert classes["inference"] == DEFAULT_CLASSES["inference"]


@pytest.mark.parametrize(
    ("section", "field", "words"),
    [
        ({"training": {"gracee": 5}}, "classes.'training'", "unknown field(s) gracee"),
        ({"training": {"grace": -1}}, "classes.'training'.grace", "whole seconds"),
        ({"training": {"preemptible": "yes"}}, "classes.'training'.preemptible", "true or false"),
        ({"inference": {"priority": 1.5}}, "classes.'inference'.priority", "whole number"),
        ({"training": {"allowed_groups": "ml"}}, "classes.'training'.allowed_groups", "list"),
        ({"interactive": {"preemptible": True}}, "classes.interactive.preemptible", "servers"),
        (["training"], "classes", "mapping"),
    ],
)
def test_bad_sections_are_config_errors_naming_the_field(section, field, words):
    with pytest.raises(ConfigError) as err:
        parse_classes(section)
    assert err.value.field == field and words in err.value.message


def test_the_pool_config_refuses_an_unknown_class_key_with_its_path():
    with pytest.raises(ConfigError, match="unknown field") as err:
        parse_pool_config({"classes": {"training": {"prio": 1}}}, default_catalog())
    assert err.value.field == "classes.'training'"


def test_who_may_use_a_class():
    classes = parse_classes({"inference": {"allowed_groups": ["serving"]}})
    assert class_for(classes, "training", ()).name == "training"
    assert class_for(classes, "inference", ("serving", "x")).name == "inference"
    with pytest.raises(PoolError) as err:
        class_for(classes, "inference", ("ml",))
    assert err.value.code == "class_not_allowed"
    with pytest.raises(PoolError) as err:
        class_for(classes, "batch", ())
    assert err.value.code == "unknown_class" and "training" in (err.value.allowed or [])


def test_priority_is_the_offers_shifted_by_the_class_distance_from_interactive():
    classes = parse_classes(None)
    assert request_priority(classes, INTERACTIVE, 0) == 0  # a server's is what it was
    assert request_priority(classes, TRAINING, 0) == -50
    assert request_priority(classes, INFERENCE, 10) == 35  # an offer's "high" still counts


def test_a_lease_without_a_class_is_interactive_and_idle_reclaim_follows_the_class():
    classes = parse_classes(None)
    assert lease_class(classes, None).name == "interactive"
    assert lease_class(classes, "gone-from-config").name == "interactive"
    assert idle_reclaimable(classes, None)
    assert not idle_reclaimable(classes, "training")
    assert not idle_reclaimable(classes, "inference")


@pytest.mark.parametrize(
    ("command", "env", "code"),
    [
        (None, None, "invalid_command"),
        ([], None, "invalid_command"),
        (["", "x"], None, "invalid_command"),
        (["python", 3], None, "invalid_command"),
        ("python train.py", None, "invalid_command"),
        (["python"], {"1BAD": "x"}, "invalid_env"),
        (["python"], {"CUDA_VISIBLE_DEVICES": "0"}, "invalid_env"),
        (["python"], {"SEED": 1}, "invalid_env"),
        (["python"], ["SEED=1"], "invalid_env"),
    ],
)
def test_bad_commands_and_environments_are_refused_with_their_code(command, env, code):
    with pytest.raises(PoolError) as err:
        check_job(command, env)
    assert err.value.code == code


def test_a_good_job_passes_as_lists_and_dicts():
    assert check_job(["python", "t.py"], {"SEED": "1"}) == (["python", "t.py"], {"SEED": "1"})
    assert check_job(["x"], None) == (["x"], None)


def holder(lid: str, cls=TRAINING, borrowed=False, granted_at=0.0, **kw) -> Holder:
    return Holder(lid, cls, borrowed, granted_at, **kw)


def test_preemption_order_training_first_then_borrowed_and_never_inference():
    ranks = {
        h.id: preemption_rank(h, INTERACTIVE, 100.0)
        for h in (
            holder("train-old", granted_at=1),
            holder("train-young", granted_at=9),
            holder("train-leaving", granted_at=1, leaving=True),
            holder("nb-borrowed", INTERACTIVE, borrowed=True, surplus=Fraction(1)),
            holder("nb-within", INTERACTIVE),
            holder("serve", INFERENCE),
            holder("serve-borrowed", INFERENCE, borrowed=True),
        )
    }
    assert ranks["nb-within"] is None and ranks["serve"] is None
    assert ranks["serve-borrowed"] is None  # a higher class is never taken
    order = sorted((r, k) for k, r in ranks.items() if r is not None)
    assert [k for _, k in order] == ["train-leaving", "train-young", "train-old", "nb-borrowed"]


def test_a_preemptible_request_takes_nothing_and_inference_takes_borrowed_servers():
    assert preemption_rank(holder("t"), TRAINING, 0) is None
    borrowed_nb = holder("nb", INTERACTIVE, borrowed=True)
    assert preemption_rank(borrowed_nb, INFERENCE, 0) is not None


def _jobs_pool():
    """Four H100s: two training jobs and two servers, each pair within its user's guarantee
    (nothing is borrowed); vip's guarantee is 1."""
    two = QuotaSpec(guarantee=Fraction(2))
    quotas = QuotaBook(users={"vip": QuotaSpec(guarantee=Fraction(1)), "nb": two, "trainer": two})
    alloc = pool(quotas)
    classes = parse_classes(None)
    kinds = {}
    for rid, user, cls in (
        ("t1", "trainer", "training"),
        ("nb1", "nb", None),
        ("t2", "trainer", "training"),
        ("nb2", "nb", None),
    ):
        granted(alloc.submit(req(rid, "h100", user, arrival=len(kinds)), len(kinds)))
        kinds[rid] = cls
    return alloc, classes, kinds


def test_the_allocator_frees_the_youngest_training_job_for_an_interactive_request():
    alloc, classes, kinds = _jobs_pool()
    ask = req("v", "h100", "vip")
    assert queued(alloc.decide(ask, 5)).within_guarantee

    def rank(lease):
        h = holder(lease.id, lease_class(classes, kinds[lease.id]), lease.borrowed)
        h = Holder(h.id, h.cls, h.borrowed, lease.request.arrival)
        return preemption_rank(h, INTERACTIVE, 5)

    assert not any(le.borrowed for le in alloc.leases.values())
    assert alloc.reclaimable_for(ask, 5, rank) == ["t2"]  # though within its guarantee
    # without the classes, nothing is borrowed here: nothing could be taken
    assert alloc.reclaimable_for(ask, 5) == []


def test_the_allocator_never_frees_inference_or_servers_within_guarantee():
    alloc, classes, kinds = _jobs_pool()
    kinds.update(t1="inference", t2="inference")
    ask = req("v", "h100", "vip")

    def rank(lease):
        h = Holder(lease.id, lease_class(classes, kinds[lease.id]), lease.borrowed, 0.0)
        return preemption_rank(h, INTERACTIVE, 5)

    assert alloc.reclaimable_for(ask, 5, rank) == []
