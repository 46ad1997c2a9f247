"""Each rule fires in the scenario it describes and stays quiet where it should (synthetic records)."""
from __future__ import annotations

import dataclasses
import re

import pytest

from gpufeed.analysis import analyze
from tests.synthetic import Scenario, write_run

INPUT_RULES = {"too_few_workers", "cpu_saturated", "storage_latency"}

STORAGE = Scenario(wait_s=0.030, compute_s=0.010, fetch_wall_s=0.080, fetch_cpu_s=0.004, host_cpu_pct=30)
FEW_WORKERS = Scenario(num_workers=0, wait_s=0.020, compute_s=0.010, fetch_wall_s=0.020, fetch_cpu_s=0.019,
                       host_cpu_pct=50)
SATURATED = Scenario(wait_s=0.030, compute_s=0.010, fetch_wall_s=0.040, fetch_cpu_s=0.038, host_cpu_pct=97)
TOO_MANY = Scenario(num_workers=8, wait_s=0.020, compute_s=0.010, fetch_wall_s=0.080, fetch_cpu_s=0.020,
                    host_cpu_pct=99, worker_status="running")
OVERSUBSCRIBED = Scenario(wait_s=0.010, compute_s=0.010, fetch_wall_s=0.010, fetch_cpu_s=0.018,
                          worker_torch_threads=4, worker_os_threads=9, host_cpu_pct=80)
RESTARTS = Scenario(epochs=10, steps_per_epoch=8, startup_s=0.3, warmup_steps=0)
PAGEABLE = Scenario(cuda=True, h2d_host_s=0.004, gpu_idle_s=0.0)
SAWTOOTH = Scenario(cuda=True, wait_s=0.030, compute_s=0.010, fetch_wall_s=0.080, fetch_cpu_s=0.004,
                    host_cpu_pct=30, gpu_util_pattern=[0, 0, 95, 96, 0, 94, 2, 0])
HOST_BOUND = Scenario(cuda=True, gpu_util_pattern=[30, 35, 28, 33])
COMPUTE = Scenario()  # 0.5 ms wait in a 10.5 ms step: under 5%
NO_LOADER = Scenario(with_loader=False)
STALLED = Scenario(stall_s=60.0, end_reason="stalled")


def diagnose(tmp_path, scenario):
    return analyze(write_run(tmp_path / "run", scenario))


def test_storage_latency_fires_when_workers_sleep(tmp_path):
    d = diagnose(tmp_path, STORAGE)
    assert d.bottleneck == "input"
    f = d.finding("storage_latency")
    assert f is not None and f.severity == "high"
    assert f.evidence["worker_asleep_share"] == pytest.approx(0.95, abs=0.01)
    assert f.evidence["data_wait_share"] == pytest.approx(0.75, abs=0.02)
    assert "prefetch_factor=4" in f.recommendation
    suggested = int(f.recommendation.split("num_workers=")[1].split(",")[0])
    assert suggested > 2, "latency-bound loaders need more workers than they have"
    assert INPUT_RULES & set(d.finding_ids) == {"storage_latency"}


# Workers asleep on storage beside a 1 ms step, on a host other programs keep busy: by rate alone the
# loader would need 40 workers (32 at the cap); the what-if model, which predicts this run's own
# settings within 20%, puts the best a few workers up, where the cores bind.
STORAGE_BUSY = dataclasses.replace(STORAGE, compute_s=0.001, fetch_wall_s=0.040, host_cpu_pct=99)


def test_storage_latency_fix_is_the_model_best_where_the_model_describes_the_run(tmp_path):
    d = diagnose(tmp_path, STORAGE_BUSY)
    f, w = d.finding("storage_latency"), d.what_if
    assert abs(w.yours.samples_per_s / w.measured_samples_per_s - 1) < 0.2, "the scenario: a model that fits"
    assert f.evidence["workers_needed"] > w.best.num_workers, "the scenario: the rate alone says more"
    assert f.fix_settings["num_workers"] == w.best.num_workers
    assert f.fix_settings.get("persistent_workers", False) == w.best.persistent_workers
    assert f"num_workers={w.best.num_workers}," in f.recommendation
    # Its predicted gain is the model's best's own, so the fix and the what-if block agree.
    assert f.gain["samples_per_s"] == pytest.approx(w.best.samples_per_s)


def test_storage_latency_without_a_fitting_model_sizes_by_rate(tmp_path):
    """The synthetic STORAGE record is one the model predicts 21% off: the rate heuristic sizes it."""
    d = diagnose(tmp_path, STORAGE)
    w = d.what_if
    assert abs(w.yours.samples_per_s / w.measured_samples_per_s - 1) > 0.2
    assert d.finding("storage_latency").fix_settings == {"num_workers": 8, "prefetch_factor": 4}


def test_too_few_workers_fires_when_cores_idle(tmp_path):
    d = diagnose(tmp_path, FEW_WORKERS)
    f = d.finding("too_few_workers")
    assert f is not None
    # Sized by the model, not by keeping a core for the step: on 2 cores, 19 ms of worker CPU a batch
    # beside a 10 ms step, w1 makes a batch every 19 ms and w2 one every (19 + 10) / 2 = 14.5 ms.
    best = d.what_if.best_one_per_core
    assert best.num_workers == 2 and f"num_workers={best.num_workers}" in f.recommendation
    assert f.gain["low"] > 1.5
    assert INPUT_RULES & set(d.finding_ids) == {"too_few_workers"}


def test_too_few_workers_suggests_more_on_a_big_host(tmp_path):
    d = diagnose(tmp_path, dataclasses.replace(FEW_WORKERS, cpu_count=16, wait_s=0.045,
                                                   fetch_wall_s=0.045, fetch_cpu_s=0.044))
    f = d.finding("too_few_workers")
    assert f is not None
    assert "num_workers=5" in f.recommendation  # ceil(45 ms fetch / 10 ms compute)


def test_cpu_saturated_fires_when_all_cores_busy(tmp_path):
    d = diagnose(tmp_path, SATURATED)
    assert d.finding("cpu_saturated") is not None
    assert INPUT_RULES & set(d.finding_ids) == {"cpu_saturated"}


def test_too_many_workers_fires_on_contention(tmp_path):
    d = diagnose(tmp_path, TOO_MANY)
    f = d.finding("too_many_workers")
    assert f is not None
    assert f.evidence["worker_running_share"] == 1.0
    # Its fix (1 worker, the cores less the step's) is predicted slower than 8 contending workers on this
    # record, whose step needs no core of its own: the self-check does not offer it (issue 31, point 5).
    assert f.gain is not None and f.gain["high"] < 1.0
    assert "No DataLoader change is offered" in f.recommendation and f.fix_settings is None
    assert d.finding("cpu_saturated") is None  # more workers than cores: the cure is fewer, not cheaper
    assert d.finding("storage_latency") is None


def test_thread_oversubscription_fires_on_multithreaded_workers(tmp_path):
    d = diagnose(tmp_path, OVERSUBSCRIBED)
    f = d.finding("thread_oversubscription")
    assert f is not None
    assert f.evidence["worker_torch_threads"] == 4
    assert "torch.set_num_threads(1)" in f.recommendation


def test_worker_restart_fires_on_short_epochs(tmp_path):
    d = diagnose(tmp_path, RESTARTS)
    f = d.finding("worker_restart")
    assert f is not None
    assert f.evidence["iterators"] == 10
    assert f.evidence["worker_startup_s"] == pytest.approx(3.0, rel=0.01)
    assert "persistent_workers=True" in f.recommendation


def test_the_persistent_workers_fix_says_what_it_does_to_a_seeded_shuffle(tmp_path):
    """A persistent loader draws its workers' seed from torch's generator once, not each epoch, and a
    RandomSampler shuffles from the same generator: a seeded run's later epochs come in another order
    (tests/real/test_seeded_shuffle.py). Said where the loader shuffles, not where it reads in order."""
    shuffled = diagnose(tmp_path / "a", RESTARTS).finding("worker_restart")
    assert "shuffles them in another order from its second epoch on" in shuffled.recommendation
    in_order = diagnose(tmp_path / "b", dataclasses.replace(RESTARTS, sampler="SequentialSampler"))
    assert "persistent_workers=True" in in_order.finding("worker_restart").recommendation
    assert "shuffle" not in in_order.finding("worker_restart").recommendation


@pytest.mark.parametrize("change", [{"persistent_workers": True}, {"epochs": 1}, {"num_workers": 0}])
def test_worker_restart_quiet(tmp_path, change):
    assert diagnose(tmp_path, dataclasses.replace(RESTARTS, **change)).finding("worker_restart") is None


# --autotune switched twice in each of 3 epochs: each switch starts a pool while the old one delivers
# its 8 batches in flight (2 workers x prefetch 4): 84 ms from the pool's creation to its first batch.
AUTOTUNED = Scenario(epochs=3, autotune_pools=3, prefetch_factor=4, warmup_steps=0)


def test_autotune_pools_are_one_epoch_not_worker_restarts(tmp_path):
    """The pools --autotune switches between mid-epoch are one epoch of one loader (record/pools.py):
    no worker_restart from them, and the epochs are counted right. The same iterators without the
    switch events that mark them read as restarts; real restarts of a plain run still fire."""
    run = write_run(tmp_path / "run", AUTOTUNED)
    d = analyze(run)
    assert d.finding("worker_restart") is None
    assert d.metrics.iterators == 3  # 9 pools, 3 epochs
    assert d.metrics.worker_startup_s == pytest.approx(3 * AUTOTUNED.startup_s, rel=0.01)  # each epoch's first pool
    assert d.metrics.steps == 3 * AUTOTUNED.steps_per_epoch
    (training,) = [s for s in d.loaders if s.training]
    assert training.iterators == 3 and training.steps == 3 * AUTOTUNED.steps_per_epoch

    events = run / "events" / "1000.jsonl"
    events.write_text("".join(line for line in events.read_text().splitlines(keepends=True) if '"autotune"' not in line))
    unmarked = analyze(run)
    assert unmarked.metrics.iterators == 9
    assert unmarked.finding("worker_restart") is not None  # what the pools would read as, unfiled

    plain = diagnose(tmp_path / "plain", dataclasses.replace(AUTOTUNED, autotune_pools=1, startup_s=0.3))
    f = plain.finding("worker_restart")
    assert f is not None and f.evidence["iterators"] == 3


def test_pageable_transfer_fires_on_blocking_copies(tmp_path):
    d = diagnose(tmp_path, PAGEABLE)
    f = d.finding("pageable_transfer")
    assert f is not None and f.evidence["h2d_pageable_share"] == pytest.approx(0.38, abs=0.02)
    # Copies cost 38%: the loss the headline names, though compute takes more. Never compute_bound beside it.
    assert d.bottleneck == "transfer" and d.costs["transfer"] == pytest.approx(0.38, abs=0.02)
    assert d.finding("compute_bound") is None
    big = diagnose(tmp_path / "big", dataclasses.replace(PAGEABLE, h2d_host_s=0.007))
    assert big.bottleneck == "transfer" and big.finding("pageable_transfer") is not None
    assert "pin_memory=True" in f.recommendation and "non_blocking=True" in f.recommendation


def test_pinned_copies_on_the_steps_stream_stall_the_gpu(tmp_path):
    # Pinned, non_blocking, on the steps' stream: the host does not wait (0.1 ms in .to()), but the 4 ms
    # copy holds up the kernels queued after it. Pinning is done already: a side stream is the fix.
    stalled = dataclasses.replace(PAGEABLE, h2d_host_s=0.0001, h2d_copy_s=0.004, h2d_kind=(True, True, True, 0),
                                  pin_memory=True)
    d = diagnose(tmp_path / "stall", stalled)
    f = d.finding("copy_stalls_gpu")
    assert f is not None and f.evidence["h2d_stall_share"] == pytest.approx(0.004 / 0.0105, rel=0.1)
    assert "pin_memory=True alone would not help" in f.recommendation and "side stream" in f.recommendation
    assert d.finding("pageable_transfer") is None and d.bottleneck == "transfer"
    # The same copies on a prefetcher's side stream overlap with compute: nothing to say.
    side = diagnose(tmp_path / "side", dataclasses.replace(stalled, h2d_kind=(True, True, False, 0)))
    assert side.finding("copy_stalls_gpu") is None and side.metrics.h2d_stall_share == 0.0
    # An older record (no stream column): not measured, not 0.
    old = diagnose(tmp_path / "old", dataclasses.replace(stalled, h2d_kind=(True,)))
    assert old.metrics.h2d_stall_share is None and old.finding("copy_stalls_gpu") is None


@pytest.mark.parametrize("kind, why", [((False, False, True, 2), "torch.as_tensor"),
                                       ((False, False, True, 0), "non_blocking=True")])
def test_pin_memory_alone_would_not_help(tmp_path, kind, why):
    # Pageable copies made by torch.as_tensor(numpy, device=): a loader's pin_memory never pins them;
    # .to() without non_blocking: a pinned copy would still hold the host.
    d = diagnose(tmp_path, dataclasses.replace(PAGEABLE, h2d_kind=kind, pin_memory=True))
    f = d.finding("pageable_transfer")
    assert f is not None and f.evidence["pin_memory_alone_helps"] is False
    assert "pin_memory=True alone would not help" in f.recommendation and why in f.recommendation
    helped = diagnose(tmp_path / "helped", dataclasses.replace(PAGEABLE, h2d_kind=(False, True, True, 0),
                                                               pin_memory=True))
    assert helped.finding("pageable_transfer") is None  # pinned loader, non_blocking asked: not these copies' cause


def test_a_blocking_copy_that_waits_for_queued_compute_is_not_transfer(tmp_path):
    # .to(cuda) held the host 4 ms, but CUDA events around the copy time it at 0.2 ms: the rest was
    # the GPU finishing the work queued before it, which is compute.
    d = diagnose(tmp_path, dataclasses.replace(PAGEABLE, h2d_copy_s=0.0002))
    assert d.metrics.h2d_pageable_share == pytest.approx(0.0002 / 0.0105, rel=0.05)
    assert d.finding("pageable_transfer") is None and d.bottleneck == "compute"
    assert d.finding_ids == ["compute_bound"]


@pytest.mark.parametrize("change", [{"pin_memory": True}, {"h2d_host_s": 0.0001}])
def test_pageable_transfer_quiet(tmp_path, change):
    assert diagnose(tmp_path, dataclasses.replace(PAGEABLE, **change)).finding("pageable_transfer") is None


def test_fluctuating_utilization_names_the_sawtooth(tmp_path):
    d = diagnose(tmp_path, SAWTOOTH)
    f = d.finding("fluctuating_utilization")
    assert f is not None and "sawtooth" in f.message
    assert f.evidence["gpu_util_p5_pct"] < 10 and f.evidence["gpu_util_p95_pct"] > 70
    assert d.finding("storage_latency") is not None


def test_fluctuating_utilization_quiet_when_steady(tmp_path):
    d = diagnose(tmp_path, dataclasses.replace(SAWTOOTH, gpu_util_pattern=[90, 95, 92]))
    assert d.finding("fluctuating_utilization") is None


def test_host_bound_when_gpu_idles_without_data_wait(tmp_path):
    d = diagnose(tmp_path, HOST_BOUND)
    assert d.bottleneck == "host"
    assert d.finding("host_bound") is not None
    assert d.finding("compute_bound") is None


def test_compute_bound_when_the_loader_keeps_up(tmp_path):
    d = diagnose(tmp_path, COMPUTE)
    assert d.bottleneck == "compute"
    assert d.finding_ids == ["compute_bound"]


@pytest.mark.parametrize("scenario", [STORAGE, FEW_WORKERS, SATURATED, TOO_MANY])
def test_compute_bound_quiet_when_input_bound(tmp_path, scenario):
    assert diagnose(tmp_path, scenario).finding("compute_bound") is None


@pytest.mark.parametrize("scenario", [COMPUTE, STORAGE, FEW_WORKERS, SATURATED])
def test_contention_rules_quiet_without_contention(tmp_path, scenario):
    d = diagnose(tmp_path, scenario)
    assert d.finding("too_many_workers") is None
    assert d.finding("thread_oversubscription") is None


def test_no_dataloader(tmp_path):
    d = diagnose(tmp_path, NO_LOADER)
    assert d.finding_ids == ["no_dataloader"]
    assert "40%" in d.finding("no_dataloader").message  # host utilization is still reported
    # No verdict without a measurement: not "COMPUTE" (issue 31, point 1).
    assert d.bottleneck is None and d.input_bound is None
    assert d.not_measured == ("the command never iterated a torch DataLoader, nor stepped an optimizer or ran a "
                              "backward pass, so no training step was timed")
    assert d.to_dict()["bottleneck"] is None and d.to_dict()["not_measured"] == d.not_measured


@pytest.mark.parametrize("end_reason", ["failed", "interrupted"])
def test_a_command_that_ended_before_its_first_batch_gets_no_verdict(tmp_path, end_reason):
    from gpufeed.present.terminal import headline
    d = diagnose(tmp_path, dataclasses.replace(NO_LOADER, end_reason=end_reason))
    assert d.bottleneck is None and d.findings == []
    assert d.not_measured == "the command ended before any DataLoader delivered a batch"
    assert headline(d) == "NOT MEASURED: the command ended before any DataLoader delivered a batch"


def test_loader_stalled_names_what_workers_do(tmp_path):
    d = diagnose(tmp_path, STALLED)
    f = d.finding("loader_stalled")
    assert f is not None and f.severity == "high"
    assert "60 s" in f.message and "hang.py" in f.message
    assert d.findings[0].id == "loader_stalled"


def test_findings_ranked_by_cost(tmp_path):
    d = diagnose(tmp_path, dataclasses.replace(STORAGE, epochs=4, steps_per_epoch=30, startup_s=0.2))
    costs = [f.cost_share or 0.0 for f in d.findings]
    assert costs == sorted(costs, reverse=True)


# Each scenario, and the finding it is written to produce.
SCENARIOS = {"storage_latency": STORAGE, "too_few_workers": FEW_WORKERS, "cpu_saturated": SATURATED,
             "too_many_workers": TOO_MANY, "thread_oversubscription": OVERSUBSCRIBED, "worker_restart": RESTARTS,
             "pageable_transfer": PAGEABLE, "fluctuating_utilization": SAWTOOTH, "host_bound": HOST_BOUND,
             "compute_bound": COMPUTE, "no_dataloader": NO_LOADER, "loader_stalled": STALLED}


def _rendered_text(f) -> str:
    return f"{f.message} {f.recommendation}"


@pytest.mark.parametrize("expected", list(SCENARIOS))
def test_every_finding_has_evidence_and_a_fix(tmp_path, expected):
    d = diagnose(tmp_path, SCENARIOS[expected])
    assert expected in d.finding_ids
    for f in d.findings:
        assert f.severity in ("high", "medium", "low", "info"), f.id
        # The numbers that prove it: measured ones in the evidence, quoted in the message.
        measured = {k: v for k, v in f.evidence.items() if v is not None}
        assert any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in measured.values()), f.evidence
        assert re.search(r"\d", f.message), f.message
        assert all(isinstance(v, (int, float)) for v in f.thresholds.values()), f.thresholds
        # A fix the reader can act on: a sentence, no placeholder left in it.
        assert len(f.recommendation.split()) >= 4 and f.recommendation.rstrip().endswith((".", ")")), f.recommendation
        assert not re.search(r"\b(None|nan|inf)\b", _rendered_text(f)), _rendered_text(f)


@pytest.mark.parametrize("expected", ["storage_latency", "too_few_workers", "thread_oversubscription",
                                      "worker_restart", "no_dataloader"])
def test_rules_survive_missing_readings(tmp_path, expected):
    """No sampler timeline: host numbers are N/A, and every message still renders."""
    run = write_run(tmp_path / "run", SCENARIOS[expected])
    (run / "samples.jsonl").unlink()
    d = analyze(run)
    assert d.metrics.cpu_util_pct is None
    assert expected in d.finding_ids, "the rule needs no host reading to fire"
    for f in d.findings:
        assert not re.search(r"\b(None|nan)\b", _rendered_text(f)), _rendered_text(f)


@pytest.mark.parametrize("quiet", ["cpu_saturated", "too_many_workers"])
def test_rules_that_need_the_host_reading_stay_quiet_without_it(tmp_path, quiet):
    """Busy cores, runnable workers: neither can be claimed unmeasured."""
    run = write_run(tmp_path / "run", SCENARIOS[quiet])
    (run / "samples.jsonl").unlink()
    assert quiet not in analyze(run).finding_ids


def test_storage_latency_on_a_host_busy_with_other_programs(tmp_path):
    """Sleeping workers point at storage even when other programs fill the CPU; those are named."""
    d = diagnose(tmp_path, dataclasses.replace(STORAGE, host_cpu_pct=99))
    f = d.finding("storage_latency")
    assert f is not None and "Other programs used" in f.message
    assert d.finding("cpu_saturated") is None and d.finding("too_many_workers") is None


def test_cpu_saturated_says_how_many_cores_and_the_offload_command(tmp_path):
    """Every core busy: the advice sizes the cores the step needs and shows `gpufeed run --offload`."""
    f = diagnose(tmp_path, SATURATED).finding("cpu_saturated")
    assert f.evidence["cores_needed"] > f.evidence["cpu_count"]
    assert f"--ray-workers {f.evidence['cores_needed']}" in f.recommendation
    assert "gpufeed run --offload ray" in f.recommendation


def test_cpu_saturated_sizes_the_cores_from_the_what_if_model_it_is_given(tmp_path):
    """The rule reads the model's answers from its Context (measured before the rules run): its count
    first, the CPU per sample and step time without it, and nothing where these cores reach the ceiling."""
    from types import SimpleNamespace

    from gpufeed.analysis import ranks, rules
    from gpufeed.analysis.metrics import loader_summaries
    from gpufeed.analysis.rules.loader import cpu_saturated
    from gpufeed.analysis.offload_sizing import FROM_MODEL, FROM_RATES
    from gpufeed.record.reader import load_run
    record = load_run(write_run(tmp_path / "run", SATURATED))
    metrics, training = ranks.job_metrics(record, loader_summaries(record))

    def sized(what_if):
        return cpu_saturated(rules.Context(record=record, metrics=metrics, training=training, what_if=what_if))
    best = SimpleNamespace(samples_per_s=100.0, high=110.0)
    f = sized(SimpleNamespace(cannot_predict=None, cores_for_ceiling=metrics.cpu_count + 7, best=best,
                              ceiling_samples_per_s=400.0))
    assert (f.evidence["cores_needed"], f.evidence["cores_needed_from"]) == (metrics.cpu_count + 7, FROM_MODEL)
    assert f"--ray-workers {metrics.cpu_count + 7}" in f.recommendation
    assert sized(SimpleNamespace(cannot_predict="too few steps")).evidence["cores_needed_from"] == FROM_RATES
    quiet = sized(SimpleNamespace(cannot_predict=None, cores_for_ceiling=None))
    assert "cores_needed" not in quiet.evidence and "--offload" not in quiet.recommendation
    # A ceiling within reach of the best local setting is not worth a cluster (MNIST-like: 10% above).
    close = sized(SimpleNamespace(cannot_predict=None, cores_for_ceiling=metrics.cpu_count + 1, best=best,
                                  ceiling_samples_per_s=110.0))
    assert "cores_needed" not in close.evidence and "--offload" not in close.recommendation


def test_no_offload_advice_where_more_workers_are_the_fix(tmp_path):
    f = diagnose(tmp_path, FEW_WORKERS).finding("too_few_workers")
    assert "--offload" not in f.recommendation and "cores_needed" not in f.evidence


# -- other programs (issue 31, point 9) -------------------------------------------------------------------
# 2 workers at 30% and the step at 100% of a core: the job takes 1.6 cores; the host's 2 cores are 99% busy.
CROWDED = Scenario(host_cpu_pct=99, worker_cpu_pct=30, train_cpu_pct=100, wait_s=0.004, fetch_cpu_s=0.014,
                   others=[[4242, "ffmpeg", 0.35], [4343, "python3", 0.05]])


def test_other_programs_are_named_with_what_they_cost(tmp_path):
    d = diagnose(tmp_path, CROWDED)
    f = d.finding("other_programs")
    assert f is not None, d.finding_ids
    assert f.evidence["other_cores"] == pytest.approx(1.98 - 1.6, abs=0.02)
    assert [p["pid"] for p in f.evidence["programs"]] == [4242]  # 0.05 cores is below the bar
    assert "pid 4242 (ffmpeg) 0.3 cores" in f.message or "pid 4242 (ffmpeg) 0.4 cores" in f.message
    assert "at most" in f.message or "what-if model puts this run at" in f.message


def test_other_programs_stay_quiet_on_a_quiet_machine(tmp_path):
    d = diagnose(tmp_path, dataclasses.replace(CROWDED, host_cpu_pct=80, others=[]))
    assert d.finding("other_programs") is None


def test_launch_bound_when_busy_but_few_sms_work(tmp_path):
    """NVML reads ~97% busy; GPM says 12% of the SMs worked: tiny kernels launched one by one."""
    busy = Scenario(cuda=True, gpu_util_pattern=[96, 98, 97], sm_active_pattern=[10, 14, 12])
    d = diagnose(tmp_path / "tiny", busy)
    f = d.finding("launch_bound")
    assert f is not None and f.evidence["gpu_sm_active_p50_pct"] == pytest.approx(12, abs=1)
    assert "CUDA graphs" in f.recommendation
    fed = diagnose(tmp_path / "fed", dataclasses.replace(busy, sm_active_pattern=[80, 85, 90]))
    assert fed.finding("launch_bound") is None and fed.metrics.gpu_sm_active_p50_pct == pytest.approx(85, abs=1)
    # No GPM (before Hopper): N/A with the reason, and no finding guessed from utilisation alone.
    old = diagnose(tmp_path / "old", dataclasses.replace(busy, sm_active_pattern=None, gpm_na="not permitted"))
    assert old.finding("launch_bound") is None
    assert old.metrics.gpu_sm_active_p50_pct is None and old.metrics.gpu_gpm_na == "not permitted"
    from rich.console import Console
    from gpufeed.present.terminal import render
    out = Console(width=300, record=True)
    render(old, out)
    assert "SM activity N/A: not permitted" in out.export_text()
    out = Console(width=300, record=True)
    render(d, out)
    assert "SM active p50 12%" in out.export_text()


# Other programs hold 0.4 of 2 cores while 2 workers (8 ms of CPU a batch) feed a 10 ms CPU step: the loop
# waits 9% of the time, the model puts the run as it ran at a 19% wait (the step slowed by workers on
# the cores the others took), and on a machine to itself bound by the step alone, waiting 3%.
CROWDED_STEP = dataclasses.replace(CROWDED, fetch_cpu_s=0.008, wait_s=0.001, fetch_wall_s=0.015,
                                   others=[[4242, "ffmpeg", 0.6]])


def test_the_verdict_is_the_jobs_own_where_other_programs_held_cores(tmp_path):
    """Issue 31, point 9: the headline is the job on a machine to itself, the run's kept beside it, and
    other_programs names what the others cost, as a cause of its own."""
    from gpufeed.present.terminal import headline
    d = diagnose(tmp_path, CROWDED_STEP)
    q = d.quiet_machine
    assert q is not None and q["measured"] == {"bottleneck": "input", "input_bound": "moderately",
                                               "costs": q["measured"]["costs"]}
    assert q["measured"]["costs"]["input"] == pytest.approx(0.09, abs=0.01)
    assert q["limit"] == "compute"
    assert q["costs"]["input"] == pytest.approx(1 - q["samples_per_s"] / d.what_if.ceiling_samples_per_s)
    assert d.bottleneck == "compute" and d.input_bound == "not" and d.costs["input"] < 0.05
    assert d.finding("other_programs") is not None
    assert any("the headline is the job's own, COMPUTE" in c for c in d.checks)
    assert headline(d).endswith("; on a machine to itself (measured beside other programs: INPUT, input 9%)")
    assert d.to_dict()["quiet_machine"]["measured"]["bottleneck"] == "input"


@pytest.mark.parametrize("change", [
    {"others": [], "host_cpu_pct": 80},   # no other program held cores: nothing to tell apart
    {"fetch_cpu_s": 0.014},               # the cores bind: the step's part and the loader's cannot be told apart
    {"fetch_cpu_s": 0.004},               # the model beside the others does not reach the run's own band
])
def test_the_measured_verdict_stands_where_the_two_cannot_be_told_apart(tmp_path, change):
    d = diagnose(tmp_path, dataclasses.replace(CROWDED_STEP, **change))
    assert d.quiet_machine is None and d.bottleneck == "input"
    assert d.costs["input"] == pytest.approx(d.metrics.data_wait_share, abs=0.02)
