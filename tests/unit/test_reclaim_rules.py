"""Idle reclaim as pure rules (``pool/reclaim.py``): every row of the cases table, policy
validation, the notice → keepalive → action machine, cancellation, grace, maximum age, pressure,
borrowed reclaim and stale data. Times are plain numbers passed in; nothing waits."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest

from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.errors import ConfigError
from jupyterhub_gpupool.pool.model import Request, parse_offer
from jupyterhub_gpupool.pool.queue import Waiter
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec
from jupyterhub_gpupool.pool.reclaim import (
    CASES,
    Act,
    Cancel,
    Extend,
    GpuSample,
    KernelView,
    LeaseInfo,
    NoAction,
    Notice,
    PolicySet,
    PresenceView,
    ReclaimPolicy,
    ReclaimState,
    Refuse,
    Signals,
    cases_markdown,
    classify,
    gpu_activity,
    gpu_signal_source,
    keepalive,
    parse_duration,
    parse_policies,
    parse_policy,
    plan_reclaims,
    withdraw,
)

ROOT = Path(__file__).resolve().parents[2]
CATALOG = default_catalog()
OFFERS = {
    o.name: o
    for o in (
        parse_offer(raw, CATALOG)
        for raw in (
            {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
            {"name": "h100x2", "kind": "gpu", "count": 2, "models": ["H100-80GB"]},
            {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
            {"name": "a100-3g", "kind": "mig", "profile": "3g.40gb", "models": ["A100-80GB"]},
            {"name": "quarter", "kind": "shared", "fraction": 0.25},
            {"name": "half", "kind": "shared", "fraction": 0.5},
            {"name": "vip", "kind": "gpu", "models": ["H100-80GB"], "priority_class": "high"},
            {"name": "cpu", "kind": "cpu"},
        )
    )
}
T0 = 1_000_000.0
W = 30.0  # one window
POLICY = ReclaimPolicy(
    idle_timeout=3600,
    pressure_idle_timeout=1200,
    cpu_busy_timeout=4 * 3600,
    warn_before=600,
    busy_grace=900,
    max_extensions=2,
    extension=3600,
    min_runtime=1800,
)
POLICIES = PolicySet(default=POLICY)


def signals(t: float, gpu: str = "idle", kernel: str = "idle", user: str = "absent") -> Signals:
    """One window ending at ``t`` whose inputs read as the given states."""
    start = t - W
    sample = {
        "busy": GpuSample(t, 80.0),
        "idle": GpuSample(t, 0.0),
        "unknown": GpuSample(t, None, memory_used_mib=2000, processes=1),
    }[gpu]
    presence = PresenceView(
        t, last_input=t - 5 if user == "present" else None, connections=int(user != "absent")
    )
    return Signals(start, t, "utilization", (sample,), KernelView(t, kernel), presence)


def lease(lid: str = "L1", user: str = "ann", offer: str = "h100", **kw) -> LeaseInfo:
    units = kw.pop("units", Fraction(1))
    return LeaseInfo(lid, user, offer, units, kw.pop("granted_at", T0), **kw)


def step(le: LeaseInfo, t: float, *, queue=(), quotas=None, policies=POLICIES, **sig):
    """Plan one window for one lease; return the decision and the lease with its new state."""
    [d] = plan_reclaims(
        [le], {le.id: signals(t, **sig)}, policies, list(queue), quotas or QuotaBook(), t,
        offers=OFFERS,
    )  # fmt: skip
    return d, replace(le, state=d.state)


def run(le: LeaseInfo, start: float, end: float, **kw):
    """Windows from ``start`` to ``end``; stop at the first decision other than NoAction."""
    t = start
    d = None
    while t <= end:
        d, le = step(le, t, **kw)
        if not isinstance(d, NoAction):
            return d, le, t
        t += W
    return d, le, t - W


# -- the cases table -----------------------------------------------------------------------

#: What each combination must count as, written out here so that a wrong table fails.
EXPECTED = {
    ("busy", "busy", "present"): "active",
    ("busy", "busy", "connected"): "active",
    ("busy", "busy", "absent"): "active",
    ("busy", "idle", "present"): "active",
    ("busy", "idle", "connected"): "active",
    ("busy", "idle", "absent"): "active",
    ("busy", "unknown", "present"): "active",
    ("busy", "unknown", "connected"): "active",
    ("busy", "unknown", "absent"): "active",
    ("idle", "busy", "present"): "active",
    ("idle", "busy", "connected"): "idle-cpu",
    ("idle", "busy", "absent"): "idle-cpu",
    ("idle", "idle", "present"): "active",
    ("idle", "idle", "connected"): "idle",
    ("idle", "idle", "absent"): "idle",
    ("idle", "unknown", "present"): "active",
    ("idle", "unknown", "connected"): "idle-cpu",
    ("idle", "unknown", "absent"): "idle-cpu",
    ("unknown", "busy", "present"): "active",
    ("unknown", "busy", "connected"): "active",
    ("unknown", "busy", "absent"): "active",
    ("unknown", "idle", "present"): "active",
    ("unknown", "idle", "connected"): "idle",
    ("unknown", "idle", "absent"): "idle",
    ("unknown", "unknown", "present"): "active",
    ("unknown", "unknown", "connected"): "active",
    ("unknown", "unknown", "absent"): "active",
}


def test_the_table_has_every_combination_once():
    assert sorted((c.gpu, c.kernel, c.presence) for c in CASES) == sorted(EXPECTED)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.gpu}-{c.kernel}-{c.presence}")
def test_each_row_of_the_cases_table(case):
    """The row says what the expected table says, the signals read as the row, and a lease
    seeing only such windows gets its notice when (and only when) the row's timeout says."""
    key = (case.gpu, case.kernel, case.presence)
    assert case.verdict == EXPECTED[key]
    assert classify(*key) is case
    kw = dict(gpu=case.gpu, kernel=case.kernel, user=case.presence)
    d, _, t = run(lease(), T0 + W, T0 + 5 * 3600, **kw)
    if case.verdict == "active":
        assert isinstance(d, NoAction) and d.reason.startswith("active")
        assert d.state.idle_since is None and d.state.gpu_idle_since is None
    elif case.verdict == "idle":
        assert isinstance(d, Notice) and d.reclaiming.kind == "idle"
        assert t == pytest.approx(T0 + 3600 - 600, abs=W)
    else:
        assert isinstance(d, Notice) and d.reclaiming.kind == "cpu"
        assert t == pytest.approx(T0 + 4 * 3600 - 600, abs=W)
    assert d.evidence is not None and d.evidence.verdict == case.verdict


def test_the_docs_page_renders_this_very_table():
    page = (ROOT / "docs/source/explanation/reclaim.md").read_text()
    assert cases_markdown() in page


def test_unknown_kernel_state_is_not_idle():
    """A server whose kernels API refused the token is treated as busy on the CPU at worst."""
    d, _, _t = run(lease(), T0 + W, T0 + 2 * 3600, kernel="unknown")
    assert isinstance(d, NoAction) and d.state.idle_since is None
    d, _, _ = run(lease(), T0 + W, T0 + 2 * 3600, gpu="unknown", kernel="unknown")
    assert isinstance(d, NoAction) and d.reason.startswith("active")


def test_a_kernel_active_within_the_window_counts_as_busy():
    le = lease()
    sig = signals(T0)
    sig = replace(sig, kernel=KernelView(T0, "idle", last_activity=T0 - 10))
    [d] = plan_reclaims([le], {"L1": sig}, POLICIES, [], QuotaBook(), T0, offers=OFFERS)
    assert d.evidence.kernel == "busy" and d.state.last_busy == T0


# -- the GPU signal ------------------------------------------------------------------------


def test_gpu_signal_by_family():
    a100, h100, l4 = (CATALOG.model(m) for m in ("A100-80GB", "H100-80GB", "L4"))
    assert gpu_signal_source(OFFERS["a100-1g"], a100) == "memory"
    assert gpu_signal_source(replace(OFFERS["a100-1g"], models=("H100-80GB",)), h100) == "gpm"
    assert gpu_signal_source(OFFERS["quarter"], l4) == "process"  # per-process samples (Ada)
    assert gpu_signal_source(OFFERS["quarter"], CATALOG.model("G2")) == "utilization"  # unknown
    assert gpu_signal_source(OFFERS["h100"], h100) == "utilization"


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        ([GpuSample(0, 3.0), GpuSample(10, 40.0)], "busy"),  # any window sample above threshold
        ([GpuSample(0, 3.0), GpuSample(10, 5.0)], "idle"),  # at the threshold is idle
        ([GpuSample(0, None, 0, processes=0)], "idle"),  # MIG, no process
        ([GpuSample(0, None, None, processes=0)], "idle"),  # MIG, no process, memory unknown
        ([GpuSample(0, None, 4000, 0), GpuSample(10, None, 4000, 0)], "unknown"),  # held memory
        ([GpuSample(0, None, 20, 1), GpuSample(10, None, 20, 1)], "unknown"),  # a process
        ([GpuSample(0, None, 30)], "idle"),  # MIG, almost no memory, processes unknown
        ([GpuSample(0, None, 2000, 1), GpuSample(10, None, 2010, 1)], "unknown"),
        ([GpuSample(0, None, 2000, 1), GpuSample(10, None, 6000, 1)], "busy"),  # memory moved
        ([GpuSample(0, None)], "unknown"),  # nothing known at all
    ],
)
def test_gpu_activity(samples, expected):
    assert gpu_activity(samples, 5.0) == expected


# -- policies ------------------------------------------------------------------------------


def test_durations():
    assert parse_duration("1h30m", "x") == 5400
    assert parse_duration("90s", "x") == 90
    assert parse_duration(2.5, "x") == 2.5
    assert parse_duration("2d", "x") == 172800


@pytest.mark.parametrize(
    ("raw", "field", "text"),
    [
        ({"idle_timout": 60}, "reclaim.default", "unknown field"),
        ({"idle_timeout": -5}, "reclaim.default.idle_timeout", "negative"),
        ({"busy_grace": "-1h"}, "reclaim.default.busy_grace", "duration"),
        ({"warn_before": "soon"}, "reclaim.default.warn_before", "duration"),
        ({"idle_timeout": 0}, "reclaim.default.idle_timeout", "longer than 0"),
        ({"warn_before": "2h", "idle_timeout": "1h"}, "reclaim.default.warn_before", "longer"),
        ({"pressure_idle_timeout": "2h"}, "reclaim.default.pressure_idle_timeout", "exceed"),
        ({"cpu_busy_timeout": "20m"}, "reclaim.default.cpu_busy_timeout", "at least"),
        ({"max_age": "5m"}, "reclaim.default.max_age", "warn_before"),
        ({"max_extensions": -1}, "reclaim.default.max_extensions", "whole number"),
        ({"max_extensions": True}, "reclaim.default.max_extensions", "whole number"),
        ({"gpu_idle_threshold": 100}, "reclaim.default.gpu_idle_threshold", "percentage"),
        ({"action": "kill"}, "reclaim.default.action", "unknown action"),
        ({"action": "shrink:nope"}, "reclaim.default.action", "unknown shrink target"),
        ({"action": "shrink:cpu"}, "reclaim.default.action", "release-gpu"),
        ({"exempt_users": "ann"}, "reclaim.default.exempt_users", "list"),
        ({"enabled": "yes"}, "reclaim.default.enabled", "true or false"),
    ],
)
def test_policy_errors_name_the_field(raw, field, text):
    with pytest.raises(ConfigError) as err:
        parse_policy(raw, OFFERS)
    assert err.value.field == field
    assert text in str(err.value)
    assert str(err.value).startswith(field)


@pytest.mark.parametrize(
    ("offer", "target", "text"),
    [
        ("a100-1g", "a100-3g", "not fewer"),  # a bigger slice
        ("quarter", "half", "not fewer"),  # a bigger share
        ("h100", "h100x2", "not fewer"),  # more GPUs
        ("a100-1g", "h100", "cannot shrink into a gpu offer"),  # another kind
        ("a100-3g", "quarter", "cannot shrink into a shared offer"),
        ("h100", "a100-1g", "no GPU model serves both"),  # a slice of another model
    ],
)
def test_shrink_targets_must_be_smaller_and_compatible(offer, target, text):
    raw = {"offers": {offer: {"action": f"shrink:{target}"}}}
    with pytest.raises(ConfigError) as err:
        parse_policies(raw, OFFERS)
    assert err.value.field == f"reclaim.offers.{offer}.action"
    assert text in str(err.value)


def test_a_legal_shrink_and_the_resolution_order():
    raw = {
        "default": {"idle_timeout": "2h", "warn_before": "5m"},
        "priority_classes": {"high": {"idle_timeout": "3h", "exempt_groups": ["staff"]}},
        "offers": {
            "a100-3g": {"action": "shrink:a100-1g", "idle_timeout": "90m"},
            "h100x2": {"action": "shrink:h100"},
            "vip": {"warn_before": "15m"},
        },
    }
    ps = parse_policies(raw, OFFERS)
    assert ps.for_offer(OFFERS["a100-3g"]).shrink_to == "a100-1g"
    assert ps.for_offer(OFFERS["a100-3g"]).idle_timeout == 5400  # the offer's own
    assert ps.for_offer(OFFERS["a100-3g"]).warn_before == 300  # from the default
    assert ps.for_offer(OFFERS["h100"]).idle_timeout == 7200  # only the default applies
    vip = ps.for_offer(OFFERS["vip"])
    assert (vip.idle_timeout, vip.warn_before) == (10800, 900)  # class, then offer
    assert vip.exempts("bob", ["staff"]) == "group staff is exempt"
    assert ps.for_offer(None) is ps.default


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"offers": {"nope": {}}}, "reclaim.offers"),
        ({"priority_classes": {"urgent": {}}}, "reclaim.priority_classes"),
        ({"defaults": {}}, "reclaim"),
        ({"default": {"action": "shrink:quarter"}}, "reclaim.default.action"),  # quarter → itself
    ],
)
def test_policy_set_errors_name_the_field(raw, field):
    with pytest.raises(ConfigError) as err:
        parse_policies(raw, OFFERS)
    assert err.value.field == field


# -- the notice machine --------------------------------------------------------------------


def test_notice_extend_limit_then_action():
    d, le, t = run(lease(), T0 + W, T0 + 2 * 3600)
    assert isinstance(d, Notice)
    assert t == T0 + 3600 - 600  # warn_before ahead of the timeout
    assert d.reclaiming.deadline == T0 + 3600  # the idle run started at T0 (the first window)
    assert (d.reclaiming.action, d.reclaiming.kind) == ("stop", "idle")
    assert d.state.reclaiming == d.reclaiming  # the service persists this
    for used in (1, 2):
        ext = keepalive(le, POLICY, t + 60)
        assert isinstance(ext, Extend)
        assert (ext.extensions, ext.limit, ext.until) == (used, 2, t + 60 + 3600)
        le = replace(le, state=ext.state)
        assert le.state.reclaiming is None
        d, le, t = run(le, t + 60 + W, t + 4 * 3600)
        assert isinstance(d, Notice), d
        assert t >= ext.until  # no notice while the keepalive holds
    refused = keepalive(le, POLICY, t + 60)
    assert isinstance(refused, Refuse)
    assert (refused.code, refused.limit) == ("extension_limit", 2)
    assert "2 extensions" in refused.message
    deadline = d.reclaiming.deadline
    d, le = step(le, deadline - W)
    assert isinstance(d, NoAction) and d.kind == "noticed"
    d, _ = step(le, deadline)
    assert isinstance(d, Act)
    assert (d.action, d.release_reason, d.save_first) == ("stop", "reclaimed-idle", True)


def test_a_keepalive_holds_off_the_next_notice_for_the_documented_time():
    """The docs' table: ``extension`` is "how long a keepalive holds off the next notice";
    at the default policy the next notice comes that long after the keepalive, not
    ``warn_before`` earlier (it once came after 50 minutes of the documented hour)."""
    text = (ROOT / "docs/source/explanation/reclaim.md").read_text()
    [row] = [line for line in text.splitlines() if line.startswith("| `extension` |")]
    assert "holds off the next notice" in row
    documented = parse_duration(row.split("|")[2].strip().strip("`"), "extension")
    assert documented == 3600.0
    policy = ReclaimPolicy()  # the defaults
    assert policy.extension == documented
    policies = PolicySet(default=policy)
    d, le, t = run(lease(), T0 + W, T0 + 2 * 3600, policies=policies)
    assert isinstance(d, Notice)
    ext = keepalive(le, policy, t)
    assert isinstance(ext, Extend) and ext.until == t + documented
    d, le, t2 = run(replace(le, state=ext.state), t + W, t + 3 * 3600, policies=policies)
    assert isinstance(d, Notice) and d.reclaiming.kind == "idle"
    assert t2 == t + documented  # the first window at or after the hour
    assert d.reclaiming.deadline == t2 + policy.warn_before


def test_an_admin_withdrawal_holds_off_idle_and_max_age_notices():
    policy = replace(POLICY, max_age=8 * 3600)
    policies = PolicySet(default=policy)
    le = lease(granted_at=T0 - 8 * 3600)  # past its maximum age
    d, le = step(le, T0, policies=policies)
    assert isinstance(d, Notice) and d.reclaiming.kind == "max_age"
    le = replace(le, state=withdraw(le.state, T0, policy.extension))
    assert le.state.reclaiming is None and le.state.idle_since is None
    d, le, t = run(le, T0 + W, T0 + 3 * 3600, policies=policies)
    assert isinstance(d, Notice) and t == T0 + policy.extension


def test_a_keepalive_never_moves_the_maximum_age():
    policy = replace(POLICY, max_age=3 * 3600, idle_timeout=1800, pressure_idle_timeout=1200)
    policies = PolicySet(default=policy)
    granted = T0 - 2 * 3600  # its maximum age comes 10 min after the idle notice's deadline
    d, le, t = run(lease(granted_at=granted), T0 + W, T0 + 3600, policies=policies)
    assert isinstance(d, Notice) and d.reclaiming.kind == "idle" and t == T0 + 1200
    le = replace(le, state=keepalive(le, policy, t).state)  # holds idle notices off an hour
    d, le, t = run(le, t + W, T0 + 4 * 3600, policies=policies)
    assert isinstance(d, Notice) and d.reclaiming.kind == "max_age"
    assert t == granted + 3 * 3600 - policy.warn_before  # on time, keepalive or not


def test_a_late_notice_still_gives_warn_before():
    le = lease(state=ReclaimState(idle_since=T0 - 5 * 3600))  # e.g. policy just switched on
    d, _ = step(le, T0)
    assert isinstance(d, Notice) and d.reclaiming.deadline == T0 + 600


@pytest.mark.parametrize(
    ("sig", "reason"),
    [
        ({"gpu": "busy"}, "the GPU got busy again"),
        ({"user": "present"}, "the user is back"),
        ({"kernel": "busy"}, "the kernel is running"),
    ],
)
def test_the_notice_is_cancelled_when_the_lease_works_again(sig, reason):
    d, le, t = run(lease(), T0 + W, T0 + 2 * 3600)
    assert isinstance(d, Notice)
    d, le = step(le, t + W, **sig)
    assert isinstance(d, Cancel) and d.reason == reason
    assert le.state.reclaiming is None and le.state.idle_since is None


def test_gpu_work_resets_the_extensions():
    _d, le, t = run(lease(), T0 + W, T0 + 2 * 3600)
    le = replace(le, state=keepalive(le, POLICY, t).state)
    assert le.state.extensions == 1
    _, le = step(le, t + W, gpu="busy")
    assert le.state.extensions == 0


def test_busy_grace_after_work():
    policies = PolicySet(default=replace(POLICY, idle_timeout=1200, busy_grace=2400))
    _, le = step(lease(), T0, gpu="busy", kernel="busy", policies=policies)
    d, _, t = run(le, T0 + W, T0 + 3600, policies=policies)
    assert isinstance(d, Notice)
    assert t == T0 + 2400 - 600  # not T0 + 1200 - 600: the grace after the busy window


def test_max_age_notice_waits_for_a_busy_gpu_and_cannot_be_extended():
    policies = PolicySet(default=replace(POLICY, max_age=8 * 3600))
    le = lease()
    d, le = step(le, T0 + 8 * 3600 - 600, gpu="busy", kernel="busy", policies=policies)
    assert isinstance(d, Notice) and d.reclaiming.kind == "max_age"
    assert d.reclaiming.deadline == T0 + 8 * 3600
    refused = keepalive(le, policies.default, T0 + 8 * 3600 - 300)
    assert isinstance(refused, Refuse) and refused.code == "not_extendable"
    d, le = step(le, T0 + 8 * 3600, gpu="busy", kernel="busy", policies=policies)
    assert isinstance(d, NoAction) and d.kind == "deferred"
    d, le = step(le, T0 + 8 * 3600 + W, policies=policies)
    assert isinstance(d, Act) and d.release_reason == "expired"


def _waiter(rid: str, offer: str, user: str = "zoe", **kw) -> Waiter:
    units = kw.pop("units", Fraction(1))
    return Waiter(
        Request(rid, user, offer), units, kw.pop("group", None),
        kw.pop("within", True), kw.pop("reason", "no_capacity"), T0,
    )  # fmt: skip


def test_pressure_shortens_the_timeout_for_the_hardware_waited_for():
    queue = [_waiter("w1", "h100")]
    d, le, t = run(lease(), T0 + W, T0 + 2 * 3600, queue=queue)
    assert isinstance(d, Notice) and d.reclaiming.pressure
    assert t == T0 + 1200 - 600
    assert "others wait" in d.reclaiming.reason
    # a wait for quota, or for other hardware, is no pressure on this lease
    for other in (_waiter("w2", "h100", reason="quota"), _waiter("w3", "a100-1g")):
        d, _, t = run(lease(), T0 + W, T0 + 2 * 3600, queue=[other])
        assert t == T0 + 3600 - 600 and not d.reclaiming.pressure
    # the waiter is gone before the deadline: the pressure notice is withdrawn
    d, le = step(le, T0 + 1200 - 600 + W, queue=[])
    assert isinstance(d, Cancel) and d.reason == "nobody waits for this hardware any more"


def test_a_gpu_busy_kernel_is_never_reclaimed():
    """Not under pressure, not when borrowed, not after hours."""
    policies = PolicySet(default=replace(POLICY, max_age=3600))
    queue = [_waiter("w1", "h100")]
    quotas = QuotaBook(
        users={"zoe": QuotaSpec(guarantee=Fraction(1))}, held_user={"ann": Fraction(3)}
    )
    le = lease(borrowed=True, granted_at=T0 - 10 * 3600)
    t = T0
    while t < T0 + 6 * 3600:
        d, le = step(
            le, t, gpu="busy", kernel="busy", queue=queue, quotas=quotas, policies=policies
        )
        assert not isinstance(d, Act)
        assert not (isinstance(d, Notice) and d.reclaiming.kind != "max_age")
        t += 300


def test_exempt_users_are_left_alone():
    policies = PolicySet(default=replace(POLICY, exempt_users=frozenset({"ann"})))
    d, _, _ = run(lease(), T0 + W, T0 + 3 * 3600, policies=policies)
    assert isinstance(d, NoAction) and d.reason == "user ann is exempt"


# -- stale data ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: replace(s, gpu=(GpuSample(s.end - 600, 0.0),)), "GPU telemetry is 600 s old"),
        (lambda s: replace(s, gpu=()), "no GPU telemetry"),
        (lambda s: replace(s, kernel=None), "server was not reached"),
        (lambda s: replace(s, presence=PresenceView(s.end - 900)), "activity data is 900 s old"),
    ],
)
def test_stale_data_never_acts(change, reason):
    d, le, _t = run(lease(), T0 + W, T0 + 2 * 3600)
    assert isinstance(d, Notice)
    late = d.reclaiming.deadline + 600
    [d] = plan_reclaims(
        [le], {"L1": change(signals(late))}, POLICIES, [], QuotaBook(), late, offers=OFFERS
    )
    assert isinstance(d, NoAction) and d.kind == "stale" and reason in d.reason
    assert d.state.reclaiming is not None  # the notice stands; only fresh data may act on it
    assert d.state.idle_since is None  # an idle run spans seen windows only
    [d] = plan_reclaims(
        [le], {"L1": signals(late)}, POLICIES, [], QuotaBook(), late, offers=OFFERS,
        pool_at=late - 300,
    )  # fmt: skip
    assert isinstance(d, NoAction) and "pool's data is 300 s old" in d.reason
    d, _ = step(le, late)
    assert isinstance(d, Act)


# -- borrowed reclaim ----------------------------------------------------------------------


def _borrowed_setup():
    """Group ml (guarantee 1) waits; ann, bob and cy of group cv (guarantee 1) borrow."""
    quotas = QuotaBook(
        groups={"ml": QuotaSpec(guarantee=Fraction(1)), "cv": QuotaSpec(guarantee=Fraction(1))},
        held_user={"ann": Fraction(3), "bob": Fraction(2), "cy": Fraction(1)},
        held_group={"cv": Fraction(6)},
    )
    queue = [_waiter("w1", "h100", user="zoe", group="ml")]
    return quotas, queue


def _plan(leases, quotas, queue, t, sigs=None, policies=POLICIES):
    sigs = sigs or {}
    return plan_reclaims(
        leases, {le.id: sigs.get(le.id) or signals(t, user="present") for le in leases},
        policies, queue, quotas, t, offers=OFFERS,
    )  # fmt: skip


def test_borrowed_reclaim_takes_from_the_most_over_guarantee_first():
    quotas, queue = _borrowed_setup()
    t = T0 + 7200
    kw = dict(group="cv", borrowed=True)
    leases = [lease("b", "bob", **kw), lease("a", "ann", **kw), lease("c", "cy", **kw)]
    ds = {d.lease: d for d in _plan(leases, quotas, queue, t)}
    assert isinstance(ds["a"], Notice)  # ann holds 3, guarantee 0: 3 over
    rec = ds["a"].reclaiming
    assert (rec.kind, rec.for_request, rec.deadline) == ("borrowed", "w1", t + 600)
    assert isinstance(ds["b"], NoAction) and isinstance(ds["c"], NoAction)  # one is enough


def test_borrowed_reclaim_then_idlest_then_youngest():
    quotas = QuotaBook(
        users={"zoe": QuotaSpec(guarantee=Fraction(1))},
        held_user={"ann": Fraction(2), "bob": Fraction(2)},
    )
    queue = [_waiter("w1", "h100")]
    t = T0 + 7200
    idle_bob = ReclaimState(gpu_idle_since=t - 1800)
    idle_ann = ReclaimState(gpu_idle_since=t - 600)
    leases = [
        lease("a", "ann", borrowed=True, state=idle_ann),
        lease("b", "bob", borrowed=True, state=idle_bob),
    ]
    sigs = {le.id: signals(t) for le in leases}
    ds = {d.lease: d for d in _plan(leases, quotas, queue, t, sigs)}
    assert isinstance(ds["b"], Notice) and ds["b"].reclaiming.kind == "borrowed"
    # equally over and equally idle: the youngest lease goes
    leases = [
        lease("old", "ann", borrowed=True, granted_at=T0),
        lease("new", "bob", borrowed=True, granted_at=T0 + 3600),
    ]
    ds = {d.lease: d for d in _plan(leases, quotas, queue, t)}
    assert isinstance(ds["new"], Notice) and isinstance(ds["old"], NoAction)


def test_borrowed_reclaim_never_below_guarantee():
    # ann's guarantee is 1.5 and she holds 2: taking a whole GPU would leave her at 1
    quotas = QuotaBook(
        users={"ann": QuotaSpec(guarantee=Fraction(3, 2)), "zoe": QuotaSpec(guarantee=Fraction(1))},
        held_user={"ann": Fraction(2)},
    )
    ds = _plan([lease("a", "ann", borrowed=True)], quotas, [_waiter("w1", "h100")], T0 + 7200)
    assert isinstance(ds[0], NoAction)
    # with a guarantee of 1 she stays at it: then the lease may go
    quotas.users["ann"] = QuotaSpec(guarantee=Fraction(1))
    ds = _plan([lease("a", "ann", borrowed=True)], quotas, [_waiter("w1", "h100")], T0 + 7200)
    assert isinstance(ds[0], Notice) and ds[0].reclaiming.kind == "borrowed"


def test_borrowed_reclaim_respects_min_runtime_and_the_waiter():
    quotas, queue = _borrowed_setup()
    young = lease("a", "ann", group="cv", borrowed=True, granted_at=T0)
    [d] = _plan([young], quotas, queue, T0 + 1800 - W)
    assert isinstance(d, NoAction)
    [d] = _plan([young], quotas, queue, T0 + 1800)
    assert isinstance(d, Notice)
    # a borrowing waiter is owed nothing
    borrower = [_waiter("w2", "h100", user="ann", group="cv")]
    [d] = _plan([young], quotas, borrower, T0 + 7200)
    assert isinstance(d, NoAction)
    # a waiter for other hardware is not served by it
    [d] = _plan([young], quotas, [_waiter("w3", "a100-1g", group="ml")], T0 + 7200)
    assert isinstance(d, NoAction)


def test_borrowed_reclaim_never_more_than_needed():
    quotas, queue = _borrowed_setup()
    t = T0 + 7200
    leaving = lease("a", "ann", group="cv", borrowed=True, state=ReclaimState(idle_since=T0))
    other = lease("b", "bob", group="cv", borrowed=True)
    sigs = {"a": signals(t), "b": signals(t, user="present")}
    ds = {d.lease: d for d in _plan([leaving, other], quotas, queue, t, sigs)}
    assert isinstance(ds["a"], Notice) and ds["a"].reclaiming.kind == "idle"
    assert isinstance(ds["b"], NoAction)  # the idle lease leaving already makes the room
    # a second round with the borrowed notice pending issues none more
    quotas, queue = _borrowed_setup()
    first = _plan([other], quotas, queue, t)[0]
    assert isinstance(first, Notice)
    again = _plan([replace(other, state=first.state), lease("c", "cy", group="cv", borrowed=True)],
                  quotas, queue, t + W)  # fmt: skip
    assert [type(d) for d in again] == [NoAction, NoAction]


def test_borrowed_notice_acts_at_the_deadline_or_cancels():
    quotas, queue = _borrowed_setup()
    le = lease("a", "ann", group="cv", borrowed=True)
    [d] = _plan([le], quotas, queue, T0 + 7200)
    le = replace(le, state=d.state)
    assert isinstance(keepalive(le, POLICY, T0 + 7300), Refuse)
    [d] = _plan([le], quotas, queue, T0 + 7200 + 600)
    assert isinstance(d, Act) and d.release_reason == "reclaimed-borrowed"
    [d] = _plan([le], quotas, [], T0 + 7300)
    assert isinstance(d, Cancel) and "served or withdrawn" in d.reason
    busy = {"a": signals(T0 + 7300, gpu="busy", kernel="busy")}
    [d] = _plan([le], quotas, queue, T0 + 7300, busy)
    assert isinstance(d, Cancel) and d.reason == "the GPU got busy again"


def test_cpu_leases_are_not_reclaimed():
    [d] = plan_reclaims(
        [lease(offer="cpu", units=Fraction(0))], {}, POLICIES, [], QuotaBook(), T0, offers=OFFERS
    )
    assert isinstance(d, NoAction) and d.reason == "no GPU to reclaim"
