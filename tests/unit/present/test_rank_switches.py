"""--autotune under several ranks, from synthetic per-rank records: each rank's lane (its switches,
its samples/s per period, where it went back to your settings), the check that every rank switched
before the same batches, and what the report, trace, watch and terminal make of it. One rank keeps
its settings chart alone."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from gpufeed.analysis import analyze
from gpufeed.analysis.rank_switches import rank_switches
from gpufeed.present.autotune_view import rank_lanes_chart, rank_lines
from gpufeed.present.report import build_report
from gpufeed.present.terminal import numbers_table
from gpufeed.present.trace import AUTOTUNE_TID, trace
from gpufeed.record.merge import load_runs
from gpufeed.record.reader import load_run
from tests.synthetic import RankAutotune, RankSpec, Scenario, add_rank_autotune, write_ddp_run, write_run

RANK = RankSpec(wait_s=0.004, compute_s=0.006)   # 100 steps of 10 ms from t=1.0: the run ends near 2.0 s
PERIODS = [(1.25, 0.2, 1, {0: 310.0, 1: 290.0}), (1.55, 0.2, 4, {0: 720.0, 1: 700.0})]


def job(tmp_path, ranks: list[RankAutotune]):
    return add_rank_autotune(write_ddp_run(tmp_path / "run", [RANK] * len(ranks)), ranks)


def together(tmp_path):
    """Both ranks switch before batch 30 (to w4 p2) and batch 60 (to w2 p2), rank 0 with the periods."""
    return job(tmp_path, [RankAutotune(switches=[(1.300, 30, 1, 4), (1.600, 60, 4, 2)], periods=PERIODS),
                          RankAutotune(switches=[(1.3004, 30, 1, 4), (1.6003, 60, 4, 2)])])


def test_two_ranks_switching_together_are_two_lanes_with_the_same_marks(tmp_path):
    record = load_run(together(tmp_path))
    rs = rank_switches(record)
    assert [lane.name for lane in rs.lanes] == ["rank 0", "rank 1"]
    assert rs.differ == [] and rs.batches == [30, 60]
    for lane in rs.lanes:
        assert [(s.batch, s.text) for s in lane.switches] == [(30, "w1 p2 → w4 p2"), (60, "w4 p2 → w2 p2")]
        assert lane.in_force() == "w2 p2"
    # each rank's own samples/s in rank 0's periods, on its own lane, where rank 0 measured them
    assert [(p.t_start, p.t_end, p.label, p.samples_per_s) for p in rs.lanes[1].periods] == [
        (pytest.approx(1.05), 1.25, "w1 p2", 290.0), (pytest.approx(1.35), 1.55, "w4 p2", 700.0)]
    assert [p.samples_per_s for p in rs.lanes[0].periods] == [310.0, 720.0]

    chart = rank_lanes_chart(record, t0=1.0, t_end=2.0)
    lanes = chart["lanes"]
    assert [[(s["t"], s["batch"], s["text"]) for s in lane["switches"]] for lane in lanes] == [
        [(0.3, 30, "w1 p2 → w4 p2"), (0.6, 60, "w4 p2 → w2 p2")],
        [(0.3004, 30, "w1 p2 → w4 p2"), (0.6003, 60, "w4 p2 → w2 p2")]]
    # the settings in force as bars from autotune's start to the rank's last batch, one colour per setting
    assert [(s["t0"], s["label"]) for s in lanes[0]["segments"]] == [(0.0, "w1 p2"), (0.3, "w4 p2"), (0.6, "w2 p2")]
    assert lanes[0]["segments"][-1]["t1"] == pytest.approx(max(float(it.steps.t_deliver[-1]) for it in record.iterators
                                                               if it.pid == 1000) - 1.0, abs=1e-4)
    assert [s["color"] for s in lanes[0]["segments"]] == [s["color"] for s in lanes[1]["segments"]]
    assert len({s["color"] for s in lanes[0]["segments"]}) == 3
    assert [r["batch"] for r in chart["rows"]] == [30, 60] and all(r["together"] for r in chart["rows"])
    assert chart["rows"][0]["t"] == [0.3, 0.3004]
    assert chart["sentence"].startswith("every rank (2) switched before the same batches, to the same settings: batch 30, 60")


def test_the_terminal_and_the_json_say_the_batches_once_for_every_rank(tmp_path):
    d = analyze(together(tmp_path))
    assert d.metrics.autotuned["ranks"]["batches"] == [30, 60]
    assert d.metrics.autotuned["ranks"]["ranks"] == {"rank 0": [30, 60], "rank 1": [30, 60]}
    text = _text(numbers_table(d))
    assert "Switches" in text and "every rank (2) switched before the same batches" in text and "30, 60" in text


def test_ranks_that_switch_at_different_batches_are_said_loudly(tmp_path):
    run = job(tmp_path, [RankAutotune(switches=[(1.3, 30, 1, 4), (1.6, 60, 4, 2)]),
                         RankAutotune(switches=[(1.3, 30, 1, 4), (1.61, 61, 4, 2)])])
    rs = rank_switches(load_run(run))
    assert rs.differ == ["switch 2: rank 0 before batch 60 to w2 p2, rank 1 before batch 61 to w2 p2"]
    text = _text(numbers_table(analyze(run)))
    assert "THE RANKS DID NOT SWITCH TOGETHER" in text and "rank 1 before batch 61" in text
    assert rank_lines(load_run(run), 1.0)[-1].startswith("RANKS DIFFER (a bug): switch 2:")


def test_a_rank_that_never_made_a_switch_while_it_ran_is_a_difference(tmp_path):
    run = job(tmp_path, [RankAutotune(switches=[(1.3, 30, 1, 4)]), RankAutotune()])
    assert rank_switches(load_run(run)).differ == [
        "switch 1: rank 1 never switched to w4 p2 (before batch 30 on rank 0)"]


def test_a_rank_that_went_back_to_your_settings_is_drawn(tmp_path):
    # rank 1 died after batch 40 (it wrote nothing more); rank 0 gave up at batch 45 and went back to w1 p2
    run = job(tmp_path, [RankAutotune(switches=[(1.3, 30, 1, 4), (1.5, 45, 4, 1)], declined=(1.49, 45)),
                         RankAutotune(switches=[(1.3, 30, 1, 4)])])
    record = load_run(run)
    rs = rank_switches(record)
    assert rs.differ == []                              # the switch back is rank 0's own, not rank 0's decision
    lane0 = rs.lanes[0]
    assert [s.coordinated for s in lane0.switches] == [True, False]
    assert [(f.t, f.batch, f.lost) for f in lane0.fallbacks] == [(1.49, 45, True)]
    chart = rank_lanes_chart(record, t0=1.0, t_end=2.0)
    assert [(b["t"], b["batch"]) for b in chart["lanes"][0]["back"]] == [(0.49, 45)]
    assert chart["lanes"][0]["segments"][-1]["label"] == "w1 p2"
    assert [(r["batch"], r["together"]) for r in chart["rows"]] == [(30, True), (45, False)]
    assert "rank 0 went back to your settings at batch 45" in chart["sentence"]
    assert "back to your settings at batch 45" in rank_lines(record, 1.0)[0]
    # the trace: an instant where it went back
    events = trace(record)["traceEvents"]
    assert [e["args"]["batch"] for e in events if e.get("cat") == "autotune" and e["name"].startswith("autotune: back")] == [45]


def test_two_nodes_merged_put_every_ranks_switches_on_node_0s_clock(tmp_path):
    # node 1's monotonic clock reads 5000 s more at the same wall time: its switch at t=5001.3 is node 0's 1.3
    node0 = add_rank_autotune(write_ddp_run(tmp_path / "n0", [RANK], world_size=2),
                              [RankAutotune(switches=[(1.3, 30, 1, 4)], periods=PERIODS[:1])])
    node1 = add_rank_autotune(write_ddp_run(tmp_path / "n1", [RANK], world_size=2, rank_base=1, t0=5001.0,
                                            clock_offset_s=1.7e9 - 5000, hostname="node1"),
                              [RankAutotune(switches=[(5001.3, 30, 1, 4)])], t_start=5001.0, rank_base=1)
    rs = rank_switches(load_runs([node0, node1]))
    assert [lane.name for lane in rs.lanes] == ["rank 0", "rank 1"] and rs.differ == []
    assert [s.t for lane in rs.lanes for s in lane.switches] == [pytest.approx(1.3), pytest.approx(1.3)]
    assert [p.samples_per_s for p in rs.lanes[1].periods] == [290.0]


def test_watch_says_each_ranks_settings_and_last_switch(tmp_path):
    lines = rank_lines(load_run(together(tmp_path)), 1.0)
    assert lines == ["rank 0  w2 p2  last switch: batch 60 at 0.6 s (w4 p2 → w2 p2)",
                     "rank 1  w2 p2  last switch: batch 60 at 0.6 s (w4 p2 → w2 p2)"]


def test_trace_has_each_ranks_switches_and_periods_on_its_own_track(tmp_path):
    record = load_run(together(tmp_path))
    events = trace(record)["traceEvents"]
    t0_us = min(e["ts"] for e in events if e.get("cat") == "step")
    step0 = min(float(it.steps.t_request[0]) for it in record.iterators)
    for pid in (1000, 1001):
        switches = [e for e in events if e.get("cat") == "autotune" and e["pid"] == pid and e["ph"] == "i"
                    and "switched" in e["name"]]
        assert [(e["args"]["batch"], e["args"]["to"]) for e in switches] == [(30, "w4 p2"), (60, "w2 p2")]
        # on the steps' clock: the switch at t=1.3 s is 0.3 s after the first step's request (t=1.0)
        assert switches[0]["ts"] - t0_us == pytest.approx((1.3 + (0.0004 if pid == 1001 else 0) - step0) * 1e6, abs=1)
        periods = [e for e in events if e.get("cat") == "autotune" and e["pid"] == pid and e["ph"] == "X"]
        assert [(e["tid"], e["name"], e["args"]["samples_per_s"]) for e in periods] == [
            (AUTOTUNE_TID, "period w1 p2", 310.0 if pid == 1000 else 290.0),
            (AUTOTUNE_TID, "period w4 p2", 720.0 if pid == 1000 else 700.0)]
        assert periods[0]["dur"] == pytest.approx(0.2e6)
        names = [e for e in events if e["ph"] == "M" and e["pid"] == pid and e.get("tid") == AUTOTUNE_TID]
        assert names and names[0]["args"]["name"] == "autotune"


def test_the_report_has_the_rank_lanes(tmp_path):
    html = build_report(together(tmp_path)).html
    assert 'id="run-0-ranks"' in html and 'id="run-0-rank-switches"' in html
    assert html.count('data-together="1"') == 2


def test_one_rank_keeps_its_settings_chart_alone(tmp_path):
    run = write_run(tmp_path / "run", Scenario(epochs=3, autotune_pools=3, prefetch_factor=4, warmup_steps=0))
    record = load_run(run)
    assert rank_switches(record) is None and rank_lanes_chart(record, 0.0, 1.0) is None and rank_lines(record, 0.0) == []
    html = build_report(run).html
    assert 'id="run-0-settings"' in html and 'id="run-0-ranks"' not in html
    assert "Switches" not in _text(numbers_table(analyze(run)))
    assert not [e for e in trace(record)["traceEvents"] if e.get("tid") == AUTOTUNE_TID]


def _text(renderable) -> str:
    console = Console(record=True, width=400, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()
