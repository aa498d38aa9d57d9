"""Every notice says what it is for and whether it can be kept (issue 31, must-show 3, the
pool and hook side): a heading per kind, the keep control only where keeping is allowed and
otherwise the reason why not, the same reason the keepalive's refusal gives, and the webhook
example never tells a user to press a Keep button that will not keep."""

from __future__ import annotations

import pytest

from jupyterhub_gpupool.pool.reclaim import (
    NOTICE_KINDS,
    LeaseInfo,
    Reclaiming,
    ReclaimPolicy,
    ReclaimState,
    Refuse,
    keepalive,
    notice_words,
)
from jupyterhub_gpupool.reclaim.hooks import message

EXPECTED = {
    "idle": ("Idle GPU: it will be reclaimed", True, None),
    "cpu": ("Idle GPU (the kernel works on the CPU): it will be reclaimed", True, None),
    "max_age": (
        "Maximum age reached: this GPU will be reclaimed",
        False,
        "It cannot be kept: the lease has reached its maximum age",
    ),
    "borrowed": (
        "Borrowed GPU: someone within their guarantee needs it",
        False,
        "It cannot be kept: it is borrowed beyond your guarantee and someone within theirs "
        "waits for it",
    ),
    "admin": (
        "An administrator reclaims this GPU",
        False,
        "It cannot be kept: an administrator reclaims it (they can extend or cancel the notice)",
    ),
    "drain": (
        "Node maintenance: this GPU's node is being drained",
        False,
        "It cannot be kept: its node is drained for maintenance (an administrator can extend "
        "or cancel the notice)",
    ),
    "exception": (
        "Your approved extra time ends",
        False,
        "It cannot be kept: the time of your approved exception is over (ask for more to keep it)",
    ),
    "budget": (
        "Budget spent: this GPU will be reclaimed",
        False,
        "It cannot be kept: the GPU-hour budget it is charged to is spent (ask an administrator "
        "for more)",
    ),
}


@pytest.mark.parametrize("kind", NOTICE_KINDS)
def test_each_kind_has_its_heading_and_keep_rule(kind):
    heading, keep, why = EXPECTED[kind]
    assert notice_words(kind, 0, 2, False) == {
        "heading": heading,
        "keep": keep,
        "why_not_kept": why,
    }
    # the user's keepalive agrees: kept where the notice says so, refused with the same reason
    rec = Reclaiming(kind, 2000.0, "why", "stop", 1000.0)
    le = LeaseInfo("L1", "ann", "h100", 1, 0.0, state=ReclaimState(reclaiming=rec))
    answer = keepalive(le, ReclaimPolicy(), 1500.0)
    assert isinstance(answer, Refuse) != keep
    if not keep:
        assert answer.message == "this GPU cannot be kept: " + why.removeprefix(
            "It cannot be kept: "
        )


def test_an_idle_notice_used_up_or_under_way_says_why():
    assert notice_words("idle", 2, 2, False)["why_not_kept"] == (
        "It cannot be kept: kept 2 times already, the most allowed; use the GPU to keep it"
    )
    assert notice_words("idle", 0, 0, False)["why_not_kept"] == (
        "It cannot be kept: the policy allows no extensions; use the GPU to keep it"
    )
    words = notice_words("idle", 0, 2, True)
    assert (
        not words["keep"] and words["why_not_kept"] == "It cannot be kept: the reclaim has started"
    )


def test_the_webhook_words_a_notice_by_its_kind():
    lease = {"user": "ann", "offer": "h100"}
    idle = {"deadline": "14:00", "reason": "idle for 30 min", **notice_words("idle", 0, 2, False)}
    assert message("notice", lease, idle) == (
        "Idle GPU: it will be reclaimed. ann: your GPU (h100) will be reclaimed at 14:00: idle "
        "for 30 min. Press 'Keep my GPU' to keep it."
    )
    borrowed = {"deadline": "14:00", "reason": "owed", **notice_words("borrowed", 0, 2, False)}
    text = message("notice", lease, borrowed)
    assert text.startswith("Borrowed GPU: someone within their guarantee needs it. ann:")
    assert "Keep my GPU" not in text and text.endswith("someone within theirs waits for it.")


def test_the_webhook_names_the_offer_by_its_display_name():
    lease = {"user": "ann", "offer": "a100-1g"}
    done = {"offer": "a100-1g", "offer_name": "A100 · 1g.10gb slice", "action": "stop"}
    text = message("done", lease, done)
    assert "A100 · 1g.10gb slice" in text and "a100-1g" not in text
