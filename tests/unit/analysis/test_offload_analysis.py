"""An offloaded run (``--offload``) as the analysis reads it, on synthetic records: the loader config
names the script's num_workers, but no local worker made a batch. The rules about local workers stay
quiet, the what-if model declines with its reason, and ``offload_input_wait`` sizes the Ray workers."""
from __future__ import annotations

import dataclasses
import io
import json
import re

import pytest

from gpufeed.analysis import analyze
from gpufeed.analysis.offloaded import batches_per_s
from gpufeed.record.reader import load_run
from tests.synthetic import MAIN_PID, Scenario, write_run

LOCAL_WORKER_RULES = {"too_few_workers", "cpu_saturated", "storage_latency", "too_many_workers",
                      "thread_oversubscription", "worker_restart", "loader_rebuilt", "input_wait"}
FLAG = {"backend": "ray", "workers": 2, "nodes": 2, "address": None}


def events(make_ms: float = 50.0, fell_back: str | None = None) -> list[dict]:
    """Totals every 64 batches and at the end, as the hook writes them (steps run from t=1 to t=9)."""
    out = []
    for t, batches in ((3.5, 64), (6.0, 128), (9.0, 200)):
        out.append({"t": t, "batches": batches, "by_node": {"node-a": batches // 2 - 4, "node-b": batches // 2 + 4},
                    "resent": 1, "workers_lost": 1, "fell_back": fell_back if batches == 200 else None,
                    "latency_ms_p50": 61.5, "recent_latency_ms_p50": 60.0 + batches / 64, "make_ms_p50": make_ms,
                    "make_cpu_ms_p50": make_ms * 0.9, "workers": 2})
    return out


# The loop waits 30 ms of each 40 ms step; inside next() the probe reads the CPU of one batch in 8,
# as it does for an iterator without local worker pids (the Ray batch being received, 2 ms).
OFFLOADED = Scenario(num_workers=4, wait_s=0.030, compute_s=0.010, fetch_cpu_s=0.002, host_cpu_pct=40,
                     offload=FLAG, offload_events=events())
# The same run's local-worker situations that each local-worker rule fires on, offloaded.
LOCAL_SITUATIONS = {
    "cores idle": dict(num_workers=0, host_cpu_pct=50),
    "host saturated": dict(num_workers=2, host_cpu_pct=97),
    "many workers": dict(num_workers=8, host_cpu_pct=99, worker_status="running"),
    "threads": dict(worker_torch_threads=4, worker_os_threads=9, host_cpu_pct=80),
    "restarts": dict(epochs=10, steps_per_epoch=20, startup_s=0.3, warmup_steps=0),
}


def diagnose(tmp_path, scenario):
    return analyze(write_run(tmp_path / "run", scenario))


@pytest.mark.parametrize("situation", sorted(LOCAL_SITUATIONS))
def test_rules_about_local_workers_stay_quiet_on_an_offloaded_run(tmp_path, situation):
    d = diagnose(tmp_path, dataclasses.replace(OFFLOADED, **LOCAL_SITUATIONS[situation]))
    assert d.metrics.offload is not None
    assert LOCAL_WORKER_RULES & set(d.finding_ids) == set()
    assert "offload_input_wait" in d.finding_ids  # the wait is still explained, by the Ray side


def test_a_receive_that_sleeps_is_not_read_as_workers_asleep_on_storage(tmp_path):
    """Inside next() an offloaded loop waits for Ray (2 ms of CPU in a 30 ms wait): read as a batch
    made there, that would be a worker 93% asleep, and storage_latency would fire."""
    d = diagnose(tmp_path, OFFLOADED)
    m = d.metrics
    assert m.num_workers == 4  # the script's setting, as its config names it
    assert m.fetch_ms_per_batch_p50 is None and m.worker_fetch_cpu_ratio is None  # no local worker: N/A
    assert m.loader_cpu_bound_samples_per_s is None and m.worker_running_share is None
    assert "storage_latency" not in d.finding_ids


def test_without_the_flag_the_same_steps_are_read_as_local_batches(tmp_path):
    """The control: the same record without the offload flag is judged as a local loader."""
    d = diagnose(tmp_path, dataclasses.replace(OFFLOADED, num_workers=0, offload=None, offload_events=[]))
    assert d.metrics.offload is None and d.metrics.worker_fetch_cpu_ratio is not None
    assert "offload_input_wait" not in d.finding_ids


def test_what_if_declines_an_offloaded_run_with_its_reason(tmp_path):
    d = diagnose(tmp_path, OFFLOADED)
    assert d.what_if is not None and d.what_if.cannot_predict
    assert "Ray workers (--offload)" in d.what_if.cannot_predict
    assert "2 Ray workers" in d.what_if.cannot_predict


def test_offload_finding_sizes_the_ray_workers_from_their_batch_time(tmp_path):
    f = diagnose(tmp_path, OFFLOADED).finding("offload_input_wait")
    # 50 ms a batch in a Ray worker, 10 ms of compute a step: 5 workers keep up; it had 2.
    assert f.evidence["ray_workers_needed"] == 5
    assert "`--ray-workers 5`" in f.recommendation
    assert "2 Ray workers on 2 nodes of a local Ray started for the run" in f.message
    assert f.evidence["offload_batches"] == 200 and f.evidence["offload_latency_ms_p50"] == 61.5
    assert f.cost_share == pytest.approx(0.75, abs=0.02)


def test_offload_finding_blames_the_path_when_the_workers_keep_up(tmp_path):
    f = diagnose(tmp_path, dataclasses.replace(OFFLOADED, offload_events=events(make_ms=15.0))).finding(
        "offload_input_wait")
    assert f.evidence["ray_workers_needed"] == 2
    assert "--ray-workers" not in f.recommendation and "the wait is the path" in f.recommendation


def test_offload_finding_says_when_the_run_fell_back_to_local_workers(tmp_path):
    why = "no Ray worker usable for 30 s"
    f = diagnose(tmp_path, dataclasses.replace(OFFLOADED, offload_events=events(fell_back=why))).finding(
        "offload_input_wait")
    assert f"went on with local workers ({why})" in f.message and f.evidence["offload_fell_back"] == why


def test_an_offloaded_run_that_keeps_up_is_compute_bound(tmp_path):
    d = diagnose(tmp_path, dataclasses.replace(OFFLOADED, wait_s=0.0002))
    assert "offload_input_wait" not in d.finding_ids and "compute_bound" in d.finding_ids


def test_the_record_is_read_with_its_offload_events(tmp_path):
    run = write_run(tmp_path / "run", OFFLOADED)
    with open(run / "events" / f"{MAIN_PID}.jsonl", "a") as f:  # a malformed line is skipped, and said
        f.write(json.dumps({"kind": "offload", "pid": MAIN_PID, "t": 9.5, "batches": "many"}) + "\n")
    record = load_run(run)
    assert [e["batches"] for e in record.offloads] == [64, 128, 200]
    assert any("'batches' is 'many'" in w for w in record.warnings)
    assert record.iterators[0].config.offload == FLAG
    assert batches_per_s(record.offloads) == pytest.approx(72 / 3.0)
    o = analyze(run).metrics.offload
    assert (o.batches, o.by_node, o.resent, o.workers_lost, o.events) == (200, {"node-a": 96, "node-b": 104}, 1, 1, 3)


def test_a_plain_record_has_no_offload(tmp_path):
    d = diagnose(tmp_path, Scenario())
    assert d.metrics.offload is None and d.metrics.to_dict()["offload"] is None


def test_the_terminal_diagnosis_says_who_made_the_batches(tmp_path):
    from rich.console import Console

    from gpufeed.present.terminal import render
    console = Console(record=True, width=400, file=io.StringIO())
    render(diagnose(tmp_path, dataclasses.replace(OFFLOADED, offload_events=events(fell_back="lost"))), console)
    text = console.export_text()
    assert re.search(r"Offload +200 batches made by 2 Ray workers on 2 nodes of a local Ray started for the run "
                     r"\(per node: 96 \+ 104\) · latency p50 61\.5 ms from send to delivery · 50\.0 ms \(45\.0 ms CPU\) "
                     r"a batch in its worker · 1 sent again, 1 workers lost · fell back to local workers: lost", text), text
    assert not re.search(r"│ Loader ", text)  # no local worker to describe
    assert "cannot predict: its batches were made by 2 Ray workers (--offload)" in text
