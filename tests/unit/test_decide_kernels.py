"""The kernel commands decided by ``pool.decide`` (``pool/rules/kernels.py``): a kernel's
request and release, its provisioner's reports and the kernel reaper's round, each checked on
its effects or refusal with the allocator left as it was (the rows are
``test_kernels_api.py``'s part)."""

from __future__ import annotations

from jupyterhub_gpupool.pool import commands as c
from jupyterhub_gpupool.pool.allocator import Allocator
from jupyterhub_gpupool.pool.effects import (
    KeptAlive,
    KernelBusy,
    KernelNoticeCancelled,
    KernelNoticed,
    KernelRequested,
    LeaseActivated,
    LeaseGranted,
    LeaseQueued,
    LeaseReleased,
    NewLease,
)
from jupyterhub_gpupool.pool.facts import KernelFacts
from jupyterhub_gpupool.pool.kernels import KernelRules, idle_notice
from jupyterhub_gpupool.pool.workloads import DEFAULT_CLASSES
from tests.allocrig import decided, granted, lease, pool, queued, refusal, req

CLASSES = DEFAULT_CLASSES


def kernel(lid: str = "k", state: str = "active", **kw) -> KernelFacts:
    facts = lease(lid, state, server=f"kernel:{lid}", holder="kernel", offer="h100")
    return KernelFacts(facts, **kw)


def holding(lid: str = "k") -> Allocator:
    alloc = pool()
    granted(alloc.submit(req(lid, "h100", server=f"kernel:{lid}"), 0))
    return alloc


def test_a_kernel_asks_for_its_lease_like_a_server_then_holds_it_as_a_kernel():
    out = decided(pool(), c.RequestKernel("u", "h100", "K1"), classes=CLASSES, new_id="L")
    grant, made = out.effects
    assert isinstance(grant, LeaseGranted) and grant.new == NewLease()
    assert (grant.grant.request.server, grant.grant.request.priority) == ("kernel:K1", 0)
    assert made == KernelRequested("L", "interactive") and out.answer == "L"
    alloc = pool()
    for i in range(4):
        granted(alloc.submit(req(f"h{i}", "h100", server=f"s{i}"), 0))
    waits, made = decided(
        alloc, c.RequestKernel("u", "h100", "K1"), classes=CLASSES, new_id="L"
    ).effects
    assert isinstance(waits, LeaseQueued) and made == KernelRequested("L", "interactive")


def test_a_kernel_asking_again_keeps_its_lease_for_the_same_offer_only():
    alloc = holding()
    again = decided(alloc, c.RequestKernel("u", "h100", "k"), classes=CLASSES, kernel=kernel())
    assert (again.answer, again.effects) == ("k", ())
    other = refusal(alloc, c.RequestKernel("u", "a100-1g", "k"), classes=CLASSES, kernel=kernel())
    assert (other.code, other.field) == ("kernel_exists", "kernel_id")
    theirs = refusal(alloc, c.RequestKernel("v", "h100", "k"), classes=CLASSES, kernel=kernel())
    assert theirs.code == "kernel_exists"
    bad = refusal(alloc, c.RequestKernel("u", "h100", "no spaces"), classes=CLASSES)
    assert (bad.code, bad.field) == ("invalid_field", "kernel_id")


def test_a_release_ends_the_kernels_lease_and_an_ended_one_stays():
    alloc = holding()
    held = kernel()
    out = decided(alloc, c.ReleaseKernel("k"), kernel=held)
    assert out.effects == (LeaseReleased("k", "stopped", "active"),)
    alloc = pool()
    for i in range(4):
        granted(alloc.submit(req(f"h{i}", "h100", server=f"s{i}"), 0))
    queued(alloc.submit(req("k", "h100", server="kernel:k"), 1))
    waiting = decided(alloc, c.ReleaseKernel("k"), kernel=kernel(state="queued"))
    assert waiting.effects == (LeaseReleased("k", "cancelled", "queued"),)
    assert decided(pool(), c.ReleaseKernel("k"), kernel=kernel(state="released")).effects == ()
    missing = refusal(pool(), c.ReleaseKernel("k"))
    assert (missing.code, missing.message) == ("not_found", "id: no GPU kernel 'k'")


def test_a_report_keeps_the_kernel_binds_a_grant_and_an_execution_ends_its_notice():
    alloc = holding()
    first = decided(alloc, c.KernelActivity("k", "busy"), kernel=kernel(state="granted"))
    assert first.effects == (KeptAlive("k"), LeaseActivated("k"), KernelBusy("k"))
    idle = decided(alloc, c.KernelActivity("k", "idle"), kernel=kernel(notice_deadline=50.0))
    assert idle.effects == (KeptAlive("k"),)  # idle: the notice stands
    busy = decided(alloc, c.KernelActivity("k", "busy"), kernel=kernel(notice_deadline=50.0))
    assert busy.effects == (KeptAlive("k"), KernelBusy("k"), KernelNoticeCancelled("k"))
    waiting = decided(alloc, c.KernelActivity("k", "busy"), kernel=kernel(state="queued"))
    assert waiting.effects == (KeptAlive("k"),)  # nothing runs yet
    gone = decided(alloc, c.KernelActivity("k", "busy"), kernel=kernel(state="released"))
    assert gone.effects == ()  # answered as it is: the provisioner shuts the kernel down


def test_a_report_is_refused_for_a_bad_state_before_the_kernel_is_looked_for():
    bad = refusal(pool(), c.KernelActivity("k", "dead"))
    assert (bad.code, bad.field) == ("invalid_field", "state")
    assert refusal(pool(), c.KernelActivity("k", "idle")).code == "not_found"


def test_the_reaper_releases_lost_and_expired_kernels_and_notices_idle_ones():
    alloc = pool()
    for lid in ("lost", "idle", "expired", "fine"):
        granted(alloc.submit(req(lid, "h100", server=f"kernel:{lid}"), 0))
    rules = KernelRules(idle_timeout=3600, notice=300, report_timeout=120)
    now = 10_000.0
    kernels = (
        kernel("lost", last_report=now - 121, last_busy=now - 121),
        kernel("idle", last_report=now - 5, last_busy=now - 3600),
        kernel("expired", notice_deadline=now, last_report=now - 5, last_busy=now - 4000),
        kernel("fine", last_report=now - 5, last_busy=now - 60),
    )
    leases = {k.lease.id: k.lease for k in kernels}
    out = decided(alloc, c.ReapKernels(), now, kernels=kernels, kernel_rules=rules, leases=leases)
    assert out.answer == ["lost", "idle", "expired"]
    assert out.effects == (
        KernelNoticed("idle", now + 300, idle_notice(3600, 300)),
        LeaseReleased("lost", "orphaned", "active"),
        LeaseReleased("expired", "idle", "active"),
    )
    never = KernelRules(idle_timeout=0)  # never idle-reclaimed
    quiet = decided(alloc, c.ReapKernels(), now, kernels=kernels[1:2], kernel_rules=never)
    assert quiet.effects == () and quiet.answer == []
