"""The server's board of GPU kernel waits and notices (``jupyterhub_gpupool.kernels.board``):
what its listeners (the lab's event stream) are told, and when."""

from __future__ import annotations

from typing import Any

from jupyterhub_gpupool.kernels.board import KernelBoard


def test_listeners_hear_each_change_once_and_a_failing_one_stops_nothing():
    board, heard = KernelBoard(), []

    def broken(_: dict[str, Any]) -> None:
        raise RuntimeError("a lab went away")

    board.listeners += [broken, heard.append]
    cancel = board.wait("k1", offer="h100", position=2, eta_seconds=600)
    assert board.wait("k1", position=2) is cancel  # nothing moved: nobody is told
    board.wait("k1", position=1)
    assert [s["waiting"][0]["position"] for s in heard] == [2, 1]
    (entry,) = board.snapshot()["waiting"]
    assert entry["kernel_id"] == "k1" and entry["offer"] == "h100" and entry["since"]

    assert board.cancel("k2") is None and not cancel.is_set()  # no such start: nothing
    assert board.cancel("k1") == entry and cancel.is_set()
    board.done("k1")
    assert heard[-1] == {"waiting": [], "notices": []} and len(heard) == 3
    board.done("k1")  # already gone: nobody is told again
    assert len(heard) == 3


def test_a_notice_shows_until_it_is_cancelled_or_the_kernel_is_gone():
    board, heard = KernelBoard(), []
    board.listeners.append(heard.append)
    notice = {"message": "… Its variables will be lost …", "deadline": "2026-03-02T10:05:00Z"}
    board.notice("k1", notice, offer="h100")
    board.notice("k1", dict(notice), offer="h100")  # the same notice again: not news
    assert board.snapshot()["notices"] == [{"kernel_id": "k1", "offer": "h100", **notice}]
    board.notice("k1", None)  # a cell ran: the pool cancelled it
    board.notice("k1", notice)
    board.forget("k1")
    assert board.snapshot() == {"waiting": [], "notices": []}
    assert [len(s["notices"]) for s in heard] == [1, 0, 1, 0]
