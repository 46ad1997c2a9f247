"""The verdict: a loss that reaches 5% of the time is the bottleneck even while compute takes more
(TensorFlow's bands: 5-20% moderately, 20% and more highly input-bound), compute only below that; the
headline quantifies every share, and every loss worth naming is explained by a finding with a fix
(issue 11, point 12; issue 31, point 2)."""
from __future__ import annotations

import dataclasses

import pytest
from rich.console import Console

from gpufeed.analysis import analyze
from gpufeed.analysis.rules import EXPLAINED_BY
from gpufeed.present.terminal import headline, render
from tests.synthetic import Scenario, write_run

# A 3.2 s step of which 0.17 s waits for data (5%): 2 workers on 2 cores, CPU busy 60%.
SLOW_STEP = Scenario(compute_s=3.03, wait_s=0.17, fetch_wall_s=0.3, fetch_cpu_s=0.25, host_cpu_pct=60,
                     steps_per_epoch=30, warmup_steps=2)
# 8-35% data wait with 1-2 workers on 2 cores, workers on the CPU, the host not saturated: no
# specific rule fires (the workers already fill the cores beside the step).
MODERATE_WAITS = [Scenario(num_workers=w, wait_s=wait, compute_s=0.010 - wait / 2, fetch_wall_s=0.020,
                           fetch_cpu_s=0.018, host_cpu_pct=70)
                  for w in (1, 2) for wait in (0.001, 0.002, 0.004)]


def diagnose(tmp_path, scenario):
    return analyze(write_run(tmp_path / "run", scenario))


def test_a_long_step_with_five_percent_wait_is_moderately_input_bound_and_says_what_compute_takes(tmp_path):
    d = diagnose(tmp_path, SLOW_STEP)
    assert d.bottleneck == "input" and d.input_bound == "moderately"
    assert d.costs["input"] == pytest.approx(0.17 / 3.2, abs=0.005)
    assert d.costs["compute"] == pytest.approx(1 - 0.17 / 3.2, abs=0.005)
    assert headline(d) == "INPUT (5% of the time: moderately input-bound); compute takes 95%"
    assert d.to_dict()["costs"]["input"] == pytest.approx(0.053, abs=0.005)
    assert d.to_dict()["input_bound"] == "moderately"
    # The 5% is still explained, and compute_bound ("the loader is not the problem") stays quiet.
    assert set(d.finding_ids) & (EXPLAINED_BY["input"] | {"input_wait"})
    assert d.finding("compute_bound") is None


@pytest.mark.parametrize("scenario", MODERATE_WAITS, ids=lambda s: f"{s.num_workers}w-{s.wait_s * 1000:.0f}ms")
def test_moderate_waits_with_few_workers_are_always_explained(tmp_path, scenario):
    d = diagnose(tmp_path, scenario)
    share = d.costs["input"]
    assert 0.08 <= share <= 0.45
    assert d.bottleneck == "input"
    assert d.input_bound == ("highly" if share >= 0.20 else "moderately")
    f = d.finding("input_wait")
    assert f is not None and f.cost_share == pytest.approx(share)
    assert f"num_workers={scenario.num_workers} on 2 cores" in f.message
    assert "already has at least as many workers as the job has cores for them (1 of 2 cores, one left" in f.message
    assert "`gpufeed tune -- python train.py`" in f.recommendation
    assert f.evidence["data_wait_share"] == pytest.approx(share)
    out = Console(width=200, record=True)
    render(d, out)
    text = out.export_text()
    assert (f"Bottleneck: INPUT ({share:.0%} of the time: {d.input_bound} input-bound); "
            f"compute takes {1 - share:.0%}") in text
    assert "input_wait" in text and "fix:" in text


def test_a_specific_finding_leaves_no_general_one(tmp_path):
    d = diagnose(tmp_path, Scenario(num_workers=0, wait_s=0.030, fetch_cpu_s=0.030, host_cpu_pct=50, cpu_count=4))
    assert d.bottleneck == "input" and d.finding("too_few_workers") is not None
    assert d.finding("input_wait") is None


def test_input_dominates_when_it_is_the_largest_share(tmp_path):
    d = diagnose(tmp_path, dataclasses.replace(MODERATE_WAITS[0], wait_s=0.030, compute_s=0.010))
    assert d.bottleneck == "input" and d.costs["input"] == pytest.approx(0.75, abs=0.01)
    assert headline(d) == "INPUT (75% of the time: highly input-bound); compute takes 25%"


def test_below_five_percent_the_run_is_compute_bound_and_not_input_bound(tmp_path):
    d = diagnose(tmp_path, dataclasses.replace(SLOW_STEP, wait_s=0.06, compute_s=3.14))
    assert d.costs["input"] == pytest.approx(0.06 / 3.2, abs=0.005)
    assert d.bottleneck == "compute" and d.input_bound == "not"
    assert headline(d) == "COMPUTE (98% of the time: not input-bound); input costs 2%"
    assert d.finding("compute_bound") is not None


def test_transfer_and_host_losses_are_explained_when_their_rules_stay_quiet(tmp_path):
    pinned_loader = Scenario(cuda=True, h2d_host_s=0.004, gpu_idle_s=0.0, pin_memory=True)
    d = diagnose(tmp_path / "a", pinned_loader)
    assert d.finding("pageable_transfer") is None
    f = d.finding("blocking_transfer")
    assert f is not None and f.cost_share == pytest.approx(0.38, abs=0.02) and "non_blocking=True" in f.recommendation
    busy_gpu = Scenario(cuda=True, gpu_util_pattern=[62, 60, 58])  # busy 60%, waits 5% of that
    d = diagnose(tmp_path / "b", busy_gpu)
    assert d.finding("host_bound") is None  # p50 >= 50%: the Profiler's bar
    f = d.finding("host_idle")
    assert f is not None and f.cost_share == pytest.approx(1 - 0.60 - 0.0005 / 0.0105, abs=0.01)
    # The GPU idles 35% of the time for host reasons: that is the loss the headline names.
    assert d.bottleneck == "host" and d.finding("compute_bound") is None


def test_on_cuda_host_wait_while_the_gpu_is_busy_is_not_input(tmp_path):
    # The loop waits 3 ms for data each 13 ms step, but the GPU still runs queued work: CUDA events
    # say it idled 0.1 ms. The GPU did not wait: no input finding, the run is compute-bound.
    d = diagnose(tmp_path, Scenario(cuda=True, wait_s=0.003, gpu_idle_s=0.0001, fetch_wall_s=0.04,
                                    fetch_cpu_s=0.001, gpu_util_pattern=[97, 98, 99]))
    assert d.metrics.data_wait_share > 0.2 and d.costs["input"] == pytest.approx(0.0001 / 0.013, rel=0.05)
    assert d.bottleneck == "compute" and d.finding_ids == ["compute_bound"]
    idle = diagnose(tmp_path / "idle", Scenario(cuda=True, wait_s=0.003, fetch_wall_s=0.04, fetch_cpu_s=0.001,
                                                gpu_util_pattern=[70, 75, 72]))
    assert idle.finding("storage_latency") is not None


def test_in_process_loading_waiting_for_a_core_is_not_asleep(tmp_path):
    # num_workers=0 on a host busy with other programs: inside next() the training process got the CPU
    # 7% of the time but the sampler saw it runnable: it waited for a core, not for storage.
    busy = Scenario(num_workers=0, wait_s=0.030, fetch_cpu_s=0.002, host_cpu_pct=97)
    d = diagnose(tmp_path / "busy", busy)
    assert d.metrics.worker_fetch_cpu_ratio < 0.1 and d.metrics.worker_running_share == 1.0
    assert d.finding("storage_latency") is None and d.finding("cpu_saturated") is not None
    asleep = write_run(tmp_path / "asleep", dataclasses.replace(busy, host_cpu_pct=20))
    lines = (asleep / "samples.jsonl").read_text().replace('"running"', '"sleeping"')
    (asleep / "samples.jsonl").write_text(lines)
    d = analyze(asleep)
    assert d.metrics.worker_running_share == 0.0 and d.finding("storage_latency") is not None
