"""The reclaim benchmark (``simulate/reclaim.py``, ``simulate/sessions.py``): session files are
validated with one-line errors naming file, row and column; a small day replays the same way
every time; hand-made sessions show what each rule does to a silent training cell, a CPU phase
and a tab left open."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from jupyterhub_gpupool.cli import main as cli_main
from jupyterhub_gpupool.simulate import reclaim
from jupyterhub_gpupool.simulate.sessions import (
    DAY,
    Segment,
    Session,
    SessionFileError,
    generate,
    load_sessions,
    write_jsonl,
)

OFFERS = [o["name"] for o in reclaim.OFFERS]
H = 3600.0


def _seg(start: float, end: float, **kw) -> dict:
    base = {"start": start, "end": end, "gpu": False, "kernel": "idle", "input": True, "tab": True}
    return {**base, **kw}


def _line(**kw) -> str:
    row = {"id": "s1", "user": "ann", "offer": "h100", "stop": True, "segments": [_seg(0, 60)]}
    row.update(kw)
    return json.dumps(row)


@pytest.mark.parametrize(
    ("line", "where"),
    [
        ("{not json", ":1: -: not JSON"),
        (_line(user=""), ":1: user: missing"),
        (_line(offer="a100-7g"), ":1: offer: unknown offer 'a100-7g' (allowed: h100,"),
        (_line(stop="maybe"), ":1: stop: must be true or false"),
        (_line(segments=[]), ":1: segments: must be a non-empty list"),
        (_line(segments=[_seg(60, 30)]), ":1: segments[0].end: must be after start"),
        (_line(segments=[_seg(0, DAY + 1)]), ":1: segments[0].end: must be within the day"),
        (_line(segments=[_seg(0, 60, kernel="asleep")]), ":1: segments[0].kernel: must be busy"),
        (_line(segments=[_seg(0, 60, gpu="x")]), ":1: segments[0].gpu: must be true or false"),
        (_line(segments=[{"start": 0, "end": 9}]), ":1: segments[0].gpu: missing"),
        (
            _line(segments=[_seg(0, 60), _seg(30, 90)]),
            ":1: segments[1].start: overlaps the segment before",
        ),
    ],
)
def test_jsonl_errors_name_file_row_and_column(tmp_path, line, where):
    path = tmp_path / "day.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(SessionFileError) as err:
        load_sessions(path, OFFERS)
    assert str(err.value).startswith(f"{path}{where}")
    assert "\n" not in str(err.value)


def test_jsonl_duplicate_session_is_named_on_its_row(tmp_path):
    path = tmp_path / "day.jsonl"
    path.write_text(_line() + "\n\n" + _line() + "\n")
    with pytest.raises(SessionFileError, match=r"day.jsonl:3: id: session 's1' appears twice"):
        load_sessions(path, OFFERS)


CSV_HEAD = "session,user,offer,stop,start,end,gpu,kernel,input,tab\n"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("session,user,offer\ns1,ann,h100\n", ":1: stop: missing column"),
        (CSV_HEAD + "s1,ann,h100,yes,0,ten,no,idle,yes,yes\n", ":2: end: must be a number"),
        (
            CSV_HEAD
            + "s1,ann,h100,yes,0,60,no,idle,yes,yes\ns1,bob,h100,yes,60,90,no,idle,no,no\n",
            ":3: user: differs from session 's1'",
        ),
        (CSV_HEAD + ",ann,h100,yes,0,60,no,idle,yes,yes\n", ":2: session: missing"),
    ],
)
def test_csv_errors_name_file_row_and_column(tmp_path, body, where):
    path = tmp_path / "day.csv"
    path.write_text(body)
    with pytest.raises(SessionFileError) as err:
        load_sessions(path, OFFERS)
    assert str(err.value).startswith(f"{path}{where}")


def test_csv_and_jsonl_read_the_same_day(tmp_path):
    csv_path = tmp_path / "day.csv"
    csv_path.write_text(
        CSV_HEAD
        + "s1,ann,l4-half,false,3600,7200,true,busy,true,true\n"
        + "s1,ann,l4-half,false,0,3600,false,idle,true,yes\n"
    )
    [from_csv] = load_sessions(csv_path, OFFERS)
    assert [g.start for g in from_csv.segments] == [0, 3600]  # sorted by start
    assert not from_csv.stop and from_csv.end == DAY
    jsonl = tmp_path / "day.jsonl"
    write_jsonl([from_csv], jsonl)
    assert load_sessions(jsonl, OFFERS) == [from_csv]


def test_the_generator_is_seeded_and_round_trips(tmp_path):
    day = generate(30, seed=5)
    assert day == generate(30, seed=5) and day != generate(30, seed=6)
    assert {s.offer for s in day} <= set(OFFERS)
    for s in day:
        assert all(a.end <= b.start for a, b in zip(s.segments, s.segments[1:], strict=False))
        assert 0 <= s.start < s.end <= DAY
    path = tmp_path / "day.jsonl"
    write_jsonl(day, path)
    assert load_sessions(path, OFFERS) == sorted(day, key=lambda s: (s.start, s.id))


def test_a_small_day_replays_deterministically():
    day = generate(40, seed=4)

    def figures():
        return [
            {k: v for k, v in asdict(f).items() if k != "seconds"} for f in reclaim.run_all(day)
        ]

    first = figures()
    assert first == figures()
    by = {f["policy"]: f for f in first}
    assert by["none"]["reclaims"] == 0
    assert by["ours"]["interrupted_gpu_busy"] == 0
    assert by["ours"]["unsaved_lost"] == 0
    assert by["ours"]["idle_gpu_hours"] < by["none"]["idle_gpu_hours"]


def _session(sid: str, *segments: Segment, stop: bool = True) -> Session:
    start = Segment(8 * H, 8 * H + 120, False, "idle", True, True)
    return Session(sid, "u" + sid, "h100", (start, *segments), stop=stop)


def test_what_each_rule_does_to_three_sessions():
    t = 8 * H + 120
    silent = _session(  # a 3 h training cell, tab closed
        "silent",
        Segment(t, t + 3 * H, True, "busy", False, False),
        Segment(t + 3 * H, t + 3 * H + 600, False, "idle", True, True),
    )
    cpu = _session(  # 90 min of preprocessing on the CPU, then training
        "cpu",
        Segment(t, t + 1.5 * H, False, "busy", False, True),
        Segment(t + 1.5 * H, t + 2.5 * H, True, "busy", False, True),
    )
    left = _session("left", Segment(t, DAY, False, "idle", False, True), stop=False)
    runs = {f.policy: f for f in reclaim.run_all([silent, cpu, left], reclaim.POLICIES)}
    assert runs["culler"].interrupted_gpu_busy == 1  # the silent cell
    assert runs["gpu-only"].interrupted_cpu_busy == 1  # the preprocessing
    assert runs["ours"].interrupted_gpu_busy == runs["ours"].interrupted_cpu_busy == 0
    assert runs["ours"].reclaims == 1  # the tab left open, after 30 min (a notice first)
    assert runs["culler"].reclaims == 1  # it never stops the tab left open
    assert runs["ours"].idle_gpu_hours < 1.5 < runs["culler"].idle_gpu_hours
    assert runs["culler"].unsaved_lost == 1 and runs["ours"].unsaved_lost == 0


def test_an_idle_share_next_to_a_busy_neighbour_is_taken_back():
    """Two half L4s on one GPU: one trains all day, the other's user left with the tab open.
    The L4 gives per-process samples, so the idle share is judged by its own processes and
    reclaimed after its idle timeout; the busy one is never touched."""
    t = 8 * H + 120
    start = Segment(8 * H, t, False, "idle", True, True)
    busy = Session("busy", "ubusy", "l4-half", (start, Segment(t, DAY, True, "busy", False, False)))
    left = Session("left", "uleft", "l4-half", (start, Segment(t, DAY, False, "idle", False, True)))
    ours = reclaim.run_all([busy, left], ["ours"])[0]
    assert ours.reclaims == 1 and ours.interrupted_gpu_busy == 0
    assert ours.idle_gpu_hours < 1.0  # half a GPU for its idle timeout (plus a window or two)
    assert "gpu-busy" not in ours.idle_breakdown
    assert ours.idle_breakdown["counting"] + ours.idle_breakdown["notice"] == pytest.approx(
        ours.idle_gpu_hours
    )


def test_cli_replays_a_file_and_reports_bad_ones_in_one_line(tmp_path, capsys):
    day = tmp_path / "day.jsonl"
    write_jsonl(generate(8, seed=2), day)
    out = tmp_path / "r.json"
    code = cli_main(["simulate", "reclaim", "--sessions", str(day), "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "idle GPU-h" in printed and "ours" in printed
    assert "ours: idle GPU-h still held, by why:" in printed
    body = json.loads(out.read_text())
    assert [r["policy"] for r in body["results"]] == list(reclaim.DEFAULT_POLICIES)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_line(offer="nope") + "\n")
    assert cli_main(["simulate", "reclaim", "--sessions", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("jupyterhub-gpupool: error: ") and f"{bad}:1: offer:" in err
    assert "\n" not in err
