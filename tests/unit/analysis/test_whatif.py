"""The what-if model on synthetic records: its formulas, and the runs it must refuse to predict from."""
from __future__ import annotations

import dataclasses
import json

import pytest

from gpufeed import thresholds as th
from gpufeed.analysis import analyze
from gpufeed.analysis.whatif import LIMIT_CORES, LIMIT_LOOP, LIMIT_WORKERS, answer_run, samples_per_s
from tests.synthetic import Scenario, write_run

# Workers asleep 95% of a 100 ms fetch (5 ms CPU), a 10 ms step, the training process busy 100%.
STORAGE = Scenario(num_workers=2, persistent_workers=True, wait_s=0.040, compute_s=0.010, fetch_wall_s=0.100,
                   fetch_cpu_s=0.005, host_cpu_pct=30, worker_cpu_pct=5.5)
# num_workers=0: 30 ms of CPU per batch inside next(), a 1 ms step.
CPU_BOUND = Scenario(num_workers=0, wait_s=0.030, compute_s=0.001, fetch_cpu_s=0.030, host_cpu_pct=50)


def run(tmp_path, scenario, **asked):
    return answer_run(write_run(tmp_path / "run", scenario), **asked)


def test_sleeping_workers_scale_with_their_number(tmp_path):
    two = run(tmp_path, STORAGE)
    assert two.cannot_predict is None
    c = two.costs
    assert c.cpu_s == pytest.approx(0.005) and c.sleep_s == pytest.approx(0.095, rel=0.01)
    assert c.handoff_s == pytest.approx(0.0005, abs=0.0003)  # the sampler saw 5.5% CPU: 0.5 ms beyond the fetch
    yours = two.predictions[0]
    # 2 workers, one 100 ms batch each at a time: 20 batches/s of 32 samples.
    assert yours.limit == LIMIT_WORKERS
    assert yours.samples_per_s == pytest.approx(640, rel=0.05)
    eight = answer_run(tmp_path / "run", workers=8).predictions[0]
    assert eight.samples_per_s == pytest.approx(4 * yours.samples_per_s, rel=0.05)
    assert eight.low <= eight.samples_per_s <= eight.high


def test_enough_workers_reach_the_ceiling_of_the_step(tmp_path):
    w = run(tmp_path, STORAGE, workers=16)
    p = w.predictions[0]
    # 16 workers make 160 batches/s; the loop takes a batch every 10 ms + the receive: the step binds.
    assert p.limit == LIMIT_LOOP
    assert p.samples_per_s == pytest.approx(w.ceiling_samples_per_s, rel=0.05)
    assert w.workers_for_ceiling == pytest.approx(10, abs=1)  # 100 ms per batch / ~10 ms per step


def test_cpu_bound_batches_are_capped_by_the_cores(tmp_path):
    w = run(tmp_path, CPU_BOUND, workers=16, persistent=True)
    p = w.predictions[0]
    assert w.costs.cpu_s == pytest.approx(0.030)
    assert p.limit == LIMIT_CORES
    # 2 cores / (30 ms of the workers + the training process's ~1 ms) per batch of 32 samples.
    assert p.samples_per_s == pytest.approx(2 / 0.031 * 32, rel=0.08)
    four = answer_run(tmp_path / "run", workers=16, cores=4, persistent=True).predictions[0]
    assert four.samples_per_s == pytest.approx(2 * p.samples_per_s, rel=0.02)
    # 1 ms steps need 31 ms of CPU each: about 31 cores to keep the loop fed.
    assert w.cores_for_ceiling == pytest.approx(31, abs=3)


def test_workers_started_each_epoch_cost_their_start_and_stop(tmp_path):
    """Started again each epoch, every worker is forked and, at the epoch's end, shut down: from a
    run without workers that cost is the documented typical one; a run whose epochs ended with
    workers measures its own (the ``epoch_end`` events)."""
    steady = run(tmp_path, CPU_BOUND, workers=16, persistent=True).predictions[0].samples_per_s
    costs = answer_run(tmp_path / "run", workers=16).costs
    assert (costs.spawn_s, costs.stop_s) == (th.WHATIF_WORKER_SPAWN_S, th.WHATIF_WORKER_STOP_S)
    restarted = answer_run(tmp_path / "run", workers=16, persistent=False).predictions[0].samples_per_s
    epoch_samples = CPU_BOUND.steps_per_epoch * CPU_BOUND.batch_size
    extra_s = epoch_samples / restarted - epoch_samples / steady
    restart_s = 16 * th.WHATIF_WORKER_SPAWN_S + (16 + th.WHATIF_STOP_FIXED_WORKERS) * th.WHATIF_WORKER_STOP_S
    assert extra_s == pytest.approx(restart_s, rel=0.25)

    # Workers stop together: 0.2 s for the run's 2 workers is a part per worker and as much as
    # WHATIF_STOP_FIXED_WORKERS more, and 16 workers take 18 parts, not 8 times the run's 2.
    slow_stop = dataclasses.replace(STORAGE, persistent_workers=False, epochs=3, stop_s=0.2)
    record = write_run(tmp_path / "stops", slow_stop)
    measured = answer_run(record, workers=2).costs
    assert measured.stop_s == pytest.approx(0.2 / (2 + th.WHATIF_STOP_FIXED_WORKERS))

    def restart_s(workers: int) -> float:  # an epoch started again, less the same epoch with persistent workers
        epoch_s = {persistent: STORAGE.steps_per_epoch * STORAGE.batch_size / answer_run(
            record, workers=workers, persistent=persistent).predictions[0].samples_per_s for persistent in (False, True)}
        return epoch_s[False] - epoch_s[True]
    assert restart_s(16) - restart_s(2) == pytest.approx(14 * (measured.spawn_s + measured.stop_s), rel=1e-6)


def test_no_workers_is_the_batch_plus_the_step(tmp_path):
    w = run(tmp_path, CPU_BOUND)
    yours = w.predictions[0]
    assert yours.num_workers == 0
    assert yours.samples_per_s == pytest.approx(32 / 0.031, rel=0.05)
    assert yours.samples_per_s == pytest.approx(w.measured_samples_per_s, rel=0.05)


def test_a_faster_gpu_raises_the_ceiling_not_the_loader(tmp_path):
    base = run(tmp_path, STORAGE, workers=16)
    fast = answer_run(tmp_path / "run", workers=16, gpu_speedup=2.0)
    assert fast.ceiling_samples_per_s > 1.5 * base.ceiling_samples_per_s
    # With the step twice as fast, 16 workers asleep 95 ms a batch become the limit.
    assert fast.predictions[0].limit == LIMIT_WORKERS


def test_a_faster_cpu_shrinks_cpu_seconds_not_storage_waits(tmp_path):
    cpu = run(tmp_path / "cpu", CPU_BOUND, workers=16, persistent=True).predictions[0]
    fast = answer_run(tmp_path / "cpu" / "run", workers=16, persistent=True, cpu_speedup=2.0).predictions[0]
    assert fast.limit == LIMIT_CORES and fast.samples_per_s == pytest.approx(2 * cpu.samples_per_s, rel=0.02)
    assert fast.label.endswith("CPU 2x")
    # Workers asleep 95 ms of a 100 ms batch: half their 5 ms of CPU saves 2.5%.
    storage = run(tmp_path / "storage", STORAGE).predictions[0]
    quicker = answer_run(tmp_path / "storage" / "run", cpu_speedup=2.0).predictions[0]
    assert storage.limit == LIMIT_WORKERS
    assert quicker.samples_per_s == pytest.approx(storage.samples_per_s * 1.025, rel=0.01)


def test_a_stretch_where_other_programs_held_the_cores_is_left_out_of_the_costs(tmp_path):
    """On a shared machine another program can slow every step for a while; the costs are the job's
    own, from the rest of the run, where that leaves enough steps."""
    from gpufeed.analysis import ranks
    from gpufeed.analysis.metrics import loader_summaries
    from gpufeed.analysis.whatif import measure_costs
    from gpufeed.record.reader import load_run

    record = load_run(write_run(tmp_path / "run", dataclasses.replace(STORAGE, wait_s=0.020)))
    m, training = ranks.job_metrics(record, loader_summaries(record))
    assert measure_costs(record, training, m).p50.compute_s == pytest.approx(0.010, rel=0.05)
    half = (m.window_start_t + m.window_end_t) / 2
    for it in record.iterators:  # the first half's steps 19 ms slower: 1 ms in next(), 29 ms after it
        slow = it.steps.t_request < half
        it.steps.t_deliver[slow] = it.steps.t_request[slow] + 0.001
    assert measure_costs(record, training, m).p50.compute_s == pytest.approx(0.0195, rel=0.1)
    samples = record.samples
    samples.cpu_pct[samples.t <= half] = 100.0   # ... while every core was busy, mostly not with the job
    assert measure_costs(record, training, m).p50.compute_s == pytest.approx(0.010, rel=0.05)


def test_batches_per_epoch_come_from_the_epochs_that_ended(tmp_path):
    """A run usually stops inside an epoch: that epoch's few batches are not an epoch's worth."""
    from gpufeed.analysis import ranks
    from gpufeed.analysis.metrics import loader_summaries
    from gpufeed.analysis.whatif import measure_costs
    from gpufeed.record.reader import load_run

    epochs = dataclasses.replace(STORAGE, persistent_workers=False, epochs=4, steps_per_epoch=60, stop_s=0.05)
    record = load_run(write_run(tmp_path / "run", epochs))
    m, training = ranks.job_metrics(record, loader_summaries(record))
    assert measure_costs(record, training, m).p50.batches_per_epoch == 60
    last = record.iterators[-1]
    last.steps, last.epoch_ends = last.steps[:6], []   # stopped 6 batches into its fourth epoch
    assert measure_costs(record, training, m).p50.batches_per_epoch == 60


def test_worker_restart_each_epoch_is_amortised(tmp_path):
    short = Scenario(num_workers=2, epochs=10, steps_per_epoch=30, startup_s=0.3, warmup_steps=0, wait_s=0.0005,
                     compute_s=0.010, fetch_wall_s=0.015, fetch_cpu_s=0.002)
    w = run(tmp_path, short)
    restart = w.predictions[0]
    keep = answer_run(tmp_path / "run", persistent=True).predictions[0]
    assert not restart.persistent_workers and keep.persistent_workers
    # 30 batches of ~15 ms steady work against ~0.3 s of start-up every epoch.
    assert keep.samples_per_s > 1.5 * restart.samples_per_s
    assert restart.samples_per_s == pytest.approx(w.measured_samples_per_s, rel=0.05)


def test_persistent_workers_on_a_loader_rebuilt_each_epoch_start_again_all_the_same(tmp_path):
    """persistent_workers=True keeps nothing on a loader built anew each epoch: the model's "your
    settings" restart their workers each epoch (as the loader_rebuilt finding counts them), and the
    fix, built once with persistent workers, is predicted a gain, not the 1.00x of reading the
    flag (issue 36: the finding charged 25% of the time to start-up, the model tied the fix)."""
    restarting = dict(num_workers=2, epochs=10, steps_per_epoch=30, startup_s=0.3, warmup_steps=0, wait_s=0.0005,
                      compute_s=0.010, fetch_wall_s=0.015, fetch_cpu_s=0.002)
    rebuilt = run(tmp_path, Scenario(persistent_workers=True, rebuilt=True, **restarting))
    assert rebuilt.cannot_predict is None and not rebuilt.costs.persistent
    yours = rebuilt.predictions[0]
    assert not yours.persistent_workers
    assert yours.samples_per_s == pytest.approx(rebuilt.measured_samples_per_s, rel=0.05)
    built_once = answer_run(tmp_path / "run", persistent=True).predictions[0]
    assert built_once.samples_per_s > 1.5 * yours.samples_per_s
    # Built once, the same flag is read as it is: its workers are kept.
    kept = answer_run(write_run(tmp_path / "once", Scenario(persistent_workers=True, **restarting)))
    assert kept.costs.persistent and kept.predictions[0].persistent_workers

    diag = analyze(tmp_path / "run")
    found = next(f for f in diag.findings if f.id == "loader_rebuilt")
    assert found.gain is not None and found.gain["speedup"] > 1.5, found.recommendation


def test_diagnosis_carries_the_block_and_json(tmp_path):
    d = analyze(write_run(tmp_path / "run", STORAGE))
    data = json.loads(json.dumps(d.to_dict()))["what_if"]
    assert data["cannot_predict"] is None
    assert data["best"]["num_workers"] > 2
    assert data["ceiling_samples_per_s"] > data["best"]["samples_per_s"] * 0.9
    # The storage finding's fix is among the predictions.
    assert any(p["why"] == "the fix of storage_latency" for p in data["predictions"])


@pytest.mark.parametrize("scenario, reason", [
    (Scenario(steps_per_epoch=25), "too few steps"),
    (Scenario(with_loader=False), "never iterated a DataLoader"),
    (dataclasses.replace(CPU_BOUND, fetch_cpu_s=None), "CPU readings"),
    (dataclasses.replace(STORAGE, fetch_cpu_s=None), "no CPU readings of the workers"),
])
def test_cannot_predict_says_why(tmp_path, scenario, reason):
    w = run(tmp_path, scenario)
    assert w.cannot_predict is not None and reason in w.cannot_predict
    assert w.predictions == [] and w.best is None
    assert analyze(tmp_path / "run").to_dict()["what_if"] == {"cannot_predict": w.cannot_predict}


def test_time_waited_before_each_reading_is_the_sum_over_steps():
    """The prefix-sum form of the wait before a time, against the sum over every step it replaced."""
    import numpy as np

    from gpufeed.analysis.intervals import waited_before
    from gpufeed.record.rows import StepRows

    rng = np.random.default_rng(0)
    request = 44374.0 + np.cumsum(rng.uniform(0.001, 0.02, 500))
    deliver = request + rng.uniform(0.0, 0.03, 500)          # some waits overlap the next request
    steps = StepRows.of([(k, float(r), float(d), 8, None) for k, (r, d) in enumerate(zip(request, deliver))])
    x = np.concatenate(([request[0] - 1.0], rng.uniform(request[0], deliver[-1], 200), [deliver[-1] + 1.0]))
    brute = np.array([np.clip(np.minimum(deliver, t) - request, 0, None).sum() for t in x])
    got = waited_before(steps.t_request, steps.t_deliver, x)
    assert np.allclose(got, brute, atol=1e-9)
    assert got[0] == 0 and got[-1] == pytest.approx((deliver - request).sum())


def _costs(**changed):
    from gpufeed.analysis.whatif import Costs
    base = dict(cpu_s=0.054, sleep_s=0.002, handoff_s=0.0007, compute_s=0.0036, receive_s=0.0, main_cpu_s=0.003,
                startup_s=0.85, spawn_s=0.0126, stop_s=0.0059, batches_per_epoch=30.0, samples_per_batch=16.0,
                cores=2.0, other_cores=0.0, workers=16, persistent=False, cuda=False)
    return Costs(**{**base, **changed})


def test_an_epochs_start_up_comes_from_its_period_where_the_run_has_several():
    """16 workers on 2 cores wait 0.85 s for an epoch's first batch, most of the epoch's production:
    read as start-up, the run's own setting came out 17% below its measured epochs. From the epoch's
    period, the run's own setting is its epochs, and each worker more or fewer costs its fork and stop."""
    from gpufeed.analysis.whatif import samples_per_s
    period = 1.3  # above what the formula counts without any other start-up (1.19 s): not clamped at 0
    c = _costs(epoch_period_s=period)
    own, _ = samples_per_s(c, 16, persistent=False)
    assert own == pytest.approx(30 * 16 / period, rel=1e-6)
    from_wait, _ = samples_per_s(_costs(), 16, persistent=False)
    assert from_wait < own  # the old reading (the first batch's wait as start-up) counted production twice
    eight, _ = samples_per_s(c, 8, persistent=False)
    rate_gain = 30 * 16 / eight - 30 * 16 / own  # seconds per epoch: fewer forks and stops, same cores
    assert rate_gain == pytest.approx(-8 * (c.spawn_s + c.stop_s), abs=0.02)


def test_cpu_of_processes_that_exit_between_readings_is_not_another_programs():
    """A worker that exits between two readings takes its last CPU with it: the host's busy cores then
    exceed the job's, which is not another program. Only intervals whose processes are the same at
    both ends count, where there are enough of them."""
    from types import SimpleNamespace

    from gpufeed.record.rows import ProcRow

    import numpy as np

    from gpufeed.analysis.whatif.sampled import other_cores
    t = np.arange(10) * 0.1
    procs, busy = [], []
    for i in range(10):
        exiting = i in (3, 6)  # a worker gone at this reading: its last CPU was on the host, not in the tree
        procs.append([ProcRow.of([1, 0, 100.0, 1, "R", 0])] + ([] if exiting else [ProcRow.of([2, 1, 80.0, 1, "R", 0])]))
        busy.append([100.0, 80.0 + 5.0])  # the same either way: core 1 also ran another program's 5%
    record = SimpleNamespace(samples=SimpleNamespace(t=t, cpu_pct=np.array(busy), procs=procs))
    m = SimpleNamespace(cpu_cores=[0, 1], window_start_t=0.0, window_end_t=1.0, cpu_cores_busy=1.85,
                        cpu_cores_command=1.66)
    assert other_cores(record, m) == pytest.approx(0.05)  # the 5% another program took on core 1
    few = SimpleNamespace(samples=SimpleNamespace(t=t[:3], cpu_pct=np.array(busy[:3]), procs=[procs[0], procs[3], procs[0]]))
    assert other_cores(few, m) == pytest.approx(1.85 - 1.66)  # too few steady intervals: the run's metrics


def _compute_bound(**changed):
    """bench/what_if.py's compute-bound record, alone: a 10.7 ms step on two threads (21 ms of CPU),
    a batch 1.65 ms of worker CPU, 2 cores."""
    record = dict(cpu_s=0.00165, sleep_s=0.0, handoff_s=0.0, compute_s=0.0107, main_cpu_s=0.0214, startup_s=0.2,
                  spawn_s=0.01, stop_s=0.005, batches_per_epoch=200.0, samples_per_batch=256.0, workers=0,
                  persistent=True)
    return _costs(**{**record, **changed})


def test_workers_beside_a_cpu_step_that_fills_the_cores_slow_it_down():
    """Measured: the step took 13.1-14.4 ms beside 1-16 workers (10.7 ms alone). Each worker's CPU
    preempts one of the step's two threads, and the other waits: the loop's bound falls by about
    twice the worker CPU made beside the step, and no worker count brings the ceiling back."""
    from gpufeed.analysis.whatif import LIMIT_LOOP, batches_per_s
    from gpufeed.analysis.whatif.formulas import preempted_step
    c = _compute_bound()
    stall, spin = preempted_step(c, 1, 2.0, c.compute_s)
    assert stall == pytest.approx(2 * 0.00165) and spin == pytest.approx(0.00165)
    rate, limit = batches_per_s(c, 4)
    # The worker CPU made while the step runs: the share of the period the step takes (10.7 of 11.5 ms,
    # the cores' bound), twice: 13.8 ms a batch, within the 13.1-14.4 ms measured.
    assert limit == LIMIT_LOOP and 1 / rate == pytest.approx(0.0107 + 2 * 0.00165 * 0.0107 / (0.02305 / 2), rel=1e-6)
    assert 0.0131 <= 1 / rate <= 0.0144
    ceiling = 1 / c.compute_s
    assert batches_per_s(c, 0)[0] < ceiling and rate < ceiling


def test_a_step_that_leaves_cores_idle_or_runs_on_the_gpu_is_not_preempted():
    from gpufeed.analysis.whatif import batches_per_s
    from gpufeed.analysis.whatif.formulas import preempted_step, worker_bounds
    one_thread = _compute_bound(main_cpu_s=0.0107)  # k = 1: the other core absorbs the workers' 1.65 ms
    assert preempted_step(one_thread, 4, 2.0, one_thread.compute_s) == (0.0, 0.0)
    gpu = _compute_bound(cuda=True)
    assert preempted_step(gpu, 4, 2.0, gpu.compute_s) == (0.0, 0.0)
    assert batches_per_s(gpu, 4)[0] == min(worker_bounds(gpu, 4, 2.0).values())


def test_a_baseline_with_workers_is_taken_back_to_its_step_alone():
    """A run with workers measured its step preempted (14 ms, 28 ms of the training process's CPU a
    batch, as measured beside 2 workers): the model's costs are the step alone, so the run's own
    setting is predicted about as measured, and no workers faster."""
    from gpufeed.analysis.whatif import batches_per_s
    from gpufeed.analysis.whatif.costs import _alone
    measured = _compute_bound(compute_s=0.014, main_cpu_s=0.028, workers=2)
    alone = _alone(measured)
    assert alone.compute_s < measured.compute_s and alone.main_cpu_s < measured.main_cpu_s
    assert 1 / batches_per_s(alone, 2)[0] == pytest.approx(measured.compute_s, rel=0.15)
    assert batches_per_s(alone, 0)[0] > batches_per_s(alone, 2)[0]
    assert _alone(_compute_bound()) == _compute_bound()  # no workers measured: nothing to take back


# A CPU-only run's training process with two torch threads: while it made each batch inside next()
# (26 ms of its thread's CPU), its other thread spun for 4 ms (the process's CPU in next(), 30 ms,
# less the thread's own).
SPINNING = dataclasses.replace(CPU_BOUND, wait_s=0.026, fetch_cpu_s=0.026, spin_in_next_s=0.004, train_torch_threads=2)


def test_the_steps_idle_threads_spin_and_take_the_cores_of_few_workers(tmp_path):
    """Beside a few busy workers the spin of the step's threads (k = 2: twice the 4 ms next() shows)
    takes cores the workers needed; beside many, the kernel's fair share leaves it little."""
    w = run(tmp_path, SPINNING, workers=2, persistent=True)
    c = w.costs
    assert (c.step_threads, c.spin_s) == (2, pytest.approx(0.008))
    assert c.cpu_s == pytest.approx(0.030)   # the batch's CPU as the probe read it, spin included
    assert c.worker_cpu_s == pytest.approx(0.026)   # in a worker: the thread's own (4 ms: spin only)
    cpu = c.worker_cpu_s + c.handoff_s + c.main_cpu_s
    two = w.predictions[0]
    assert two.limit == LIMIT_CORES
    # 2 workers and 2 spinning threads share 2 cores: the spin has a core, and lasts its 8 ms.
    assert two.samples_per_s == pytest.approx(2 / (cpu + 0.008) * 32, rel=0.01)
    sixteen = answer_run(tmp_path / "run", workers=16, persistent=True).predictions[0]
    share = 2 * 2 / 18  # 16 workers and 2 threads on 2 cores: the spin gets 0.22 cores for the wait
    period = (cpu - share * (c.compute_s + c.receive_s)) / (2 - share)
    assert sixteen.samples_per_s == pytest.approx(32 / period, rel=0.01)
    assert sixteen.samples_per_s > 1.1 * two.samples_per_s


def test_the_loop_without_workers_waits_for_the_training_thread_not_its_spinning_ones(tmp_path):
    """The batch made inside next() takes the training thread's 26 ms, not the process's 30 ms: the
    other thread's spin ran beside it (the model's own setting must give the run's own rate)."""
    w = run(tmp_path, SPINNING)
    assert w.costs.cpu_beside_s == pytest.approx(0.004)
    yours = w.predictions[0]
    assert yours.limit == LIMIT_LOOP
    assert yours.samples_per_s == pytest.approx(w.measured_samples_per_s, rel=0.03)
    assert yours.samples_per_s == pytest.approx(32 / (0.026 + 0.001), rel=0.03)


def test_no_spin_without_the_threads_or_on_a_gpu(tmp_path):
    """A record without the training process's threads (older) or with one thread predicts as before:
    every worker setting on the cores alike; nor does a step on the GPU spin (its ops are not OpenMP's)."""
    for name, scenario in (("older", dataclasses.replace(SPINNING, train_torch_threads=None)),
                           ("one", dataclasses.replace(SPINNING, train_torch_threads=1)),
                           ("gpu", dataclasses.replace(SPINNING, cuda=True))):
        w = run(tmp_path / name, scenario, workers=2, persistent=True)
        assert w.costs.spin_s == 0.0, name
        sixteen = answer_run(tmp_path / name / "run", workers=16, persistent=True).predictions[0]
        assert sixteen.samples_per_s == pytest.approx(w.predictions[0].samples_per_s, rel=0.01), name


def test_an_epoch_without_workers_is_its_batches_each_made_and_stepped(tmp_path):
    """No start-up to amortise: an epoch of 4 batches takes 4 periods (the model once took 3, and
    predicted short epochs a third too fast)."""
    short = dataclasses.replace(CPU_BOUND, steps_per_epoch=4, epochs=12, startup_s=CPU_BOUND.wait_s, warmup_steps=4)
    w = run(tmp_path, short)
    assert w.costs.batches_per_epoch == pytest.approx(4)
    assert w.predictions[0].samples_per_s == pytest.approx(32 / (0.030 + 0.001), rel=0.03)
    assert w.predictions[0].samples_per_s == pytest.approx(w.measured_samples_per_s, rel=0.05)


def block_text(path, scenario) -> str:
    """The What-if block of diagnose for this scenario, as the terminal shows it."""
    from rich.console import Console

    from gpufeed.present.whatif_view import what_if_block
    console = Console(width=250, record=True)
    console.print(what_if_block(run(path, scenario)))
    return console.export_text()


def test_the_block_names_the_spin_only_where_there_is_one(tmp_path):
    assert "its 2 threads spin 8.0 ms a step while it waits" in block_text(tmp_path / "spin", SPINNING)
    assert "spin" not in block_text(tmp_path / "none", dataclasses.replace(SPINNING, train_torch_threads=1))


# A compute-bound run without workers (a 10 ms step, a 1 ms batch) whose probe forked in the warm-up:
# the fork took 12 ms, and the two steps while its child shared the pages 90 ms and 10 ms beyond the step.
FORKED = Scenario(num_workers=0, wait_s=0.001, compute_s=0.010, fetch_cpu_s=0.001, host_cpu_pct=50,
                  steps_per_epoch=100, epochs=3, fork_probe=(0.012, 0.090, 0.010))


def test_workers_started_each_epoch_pay_the_copy_on_write_of_their_fork(tmp_path):
    """Each epoch's fork of non-persistent workers makes the step copy the pages it writes: the probe's
    fork measured 100 ms of it (and 12 ms to fork this process), and only workers started again each
    epoch pay it, once an epoch whatever their number."""
    w = run(tmp_path / "forked", FORKED, workers=4, persistent=False)
    assert w.costs.cow_s == pytest.approx(0.100, abs=0.002)
    assert w.costs.spawn_s == pytest.approx(0.012)
    unforked = run(tmp_path / "none", dataclasses.replace(FORKED, fork_probe=None), workers=4, persistent=False)
    assert unforked.costs.cow_s == 0.0
    epoch_samples = FORKED.steps_per_epoch * FORKED.batch_size
    for workers in (1, 4):
        paid = answer_run(tmp_path / "forked" / "run", workers=workers, persistent=False).predictions[0]
        not_paid = answer_run(tmp_path / "none" / "run", workers=workers, persistent=False).predictions[0]
        extra_s = epoch_samples / paid.samples_per_s - epoch_samples / not_paid.samples_per_s
        assert extra_s == pytest.approx(0.100 + workers * (0.012 - th.WHATIF_WORKER_SPAWN_S), abs=0.004), workers
        kept = [answer_run(tmp_path / d / "run", workers=workers, persistent=True).predictions[0].samples_per_s
                for d in ("forked", "none")]
        assert kept[0] == pytest.approx(kept[1], rel=0.001), workers


def test_a_step_preempted_during_the_probe_counts_only_what_its_faults_can_cost(tmp_path):
    """Workers that took the cores while the probe's child lived made its two steps 200 ms slower, but
    9,000 page faults cost at most 9,000 x WHATIF_MAX_FAULT_S of that."""
    preempted = dataclasses.replace(FORKED, fork_probe=(0.012, 0.190, 0.010))
    w = run(tmp_path, preempted, workers=4, persistent=False)
    assert w.costs.cow_s == pytest.approx(9000 * th.WHATIF_MAX_FAULT_S)


def test_no_copy_on_write_for_workers_that_are_spawned(tmp_path):
    """A spawned (or forkserver) worker shares no pages with the training process: nothing to copy."""
    for name, scenario in (("spawn", dataclasses.replace(FORKED, multiprocessing_context="spawn")),
                           ("forkserver", dataclasses.replace(FORKED, default_start_method="forkserver"))):
        w = run(tmp_path / name, scenario, workers=4, persistent=False)
        assert w.costs.cow_s == 0.0, name
        assert w.costs.spawn_s == pytest.approx(0.012), name


def test_the_block_names_the_copy_on_write_where_there_is_one(tmp_path):
    assert "each fork of workers costs its step 100 ms (copy-on-write)" in block_text(tmp_path / "cow", FORKED)
    none = block_text(tmp_path / "none", dataclasses.replace(FORKED, fork_probe=None))
    assert "(copy-on-write)" not in none and "copy-on-write 0 ms/fork" in none  # not measured: named assumed


def test_settings_keep_the_workers_threads_and_the_block_says_so(tmp_path):
    """Workers that ran 4 torch threads each: every setting is predicted with 4, and the block says a
    thread cap is not predicted; workers at torch's default of one thread say nothing of it."""
    four = dataclasses.replace(STORAGE, worker_torch_threads=4)
    assert run(tmp_path / "four", four).costs.worker_threads == 4
    assert "every setting with 4 torch threads in each worker" in block_text(tmp_path / "four-block", four)
    assert "torch threads in each worker" not in block_text(tmp_path / "one", STORAGE)


@pytest.mark.parametrize("persistent", [True, False])
def test_evaluation_passes_are_not_the_training_steps(tmp_path, persistent):
    """A Trainer evaluating every 10 steps: each pass (0.1 s, then 80 ms shutting its workers down in the
    next() that ends it) pauses training. The run's rate leaves the passes out, and so does every cost
    of the model: the step, and the epoch period of workers started again each epoch."""
    epochs = 1 if persistent else 4  # (the generator gives each epoch new workers)
    scenario = dataclasses.replace(STORAGE, persistent_workers=persistent, epochs=epochs, steps_per_epoch=240 // epochs,
                                   stop_s=0.02, eval_every=10, eval_s=0.1, eval_stop_s=0.08)
    w = run(tmp_path, scenario)
    d = analyze(tmp_path / "run")
    assert d.metrics.compute_per_batch_ms == pytest.approx(10.1, rel=0.02)  # the step and 1 ms after each pass
    assert w.costs.compute_s == pytest.approx(0.010, rel=0.02)
    yours = w.predictions[0]
    assert yours.samples_per_s == pytest.approx(w.measured_samples_per_s, rel=0.05)
    if not persistent:  # 60 steps of 50 ms and the 50 ms start-up: the six passes in it are not the epoch's
        assert w.costs.epoch_period_s == pytest.approx(60 * 0.050 + 0.05 + 0.02, rel=0.02)


def test_what_the_other_threads_burn_beyond_their_spin_is_the_batchs_parallel_work(tmp_path):
    """A batch whose torch ops run in parallel regions: 20 ms on the training thread and 25 ms on the
    other, of which one idle thread's spin (``WHATIF_OMP_SPIN_S``) is not the batch's; the rest is, up
    to as much as the training thread's own (a region splits its work evenly)."""
    parallel = dataclasses.replace(CPU_BOUND, wait_s=0.030, fetch_cpu_s=0.020, spin_in_next_s=0.025,
                                   train_torch_threads=2)
    c = run(tmp_path, parallel, workers=4, persistent=True).costs
    assert c.worker_cpu_s == pytest.approx(0.020 + 0.025 - th.WHATIF_OMP_SPIN_S)
    many = dataclasses.replace(parallel, spin_in_next_s=0.045)
    assert run(tmp_path / "many", many, workers=4, persistent=True).costs.worker_cpu_s == pytest.approx(0.040)


# num_workers=0, a batch that sleeps 49 ms (storage) on 1 ms of the training thread's CPU, while the step's
# other torch thread spins 9 ms (the process's CPU in next(): 10 ms). The Hugging Face Trainer script of
# tests/real read so: 1.4 ms on the thread, 9.3 ms beside it, and its workers then spent 1.0-1.6 ms a batch.
ASLEEP_SPINNING = dataclasses.replace(CPU_BOUND, wait_s=0.050, fetch_cpu_s=0.001, spin_in_next_s=0.009,
                                      train_torch_threads=2, train_cpu_pct=25, host_cpu_pct=15)


def test_a_batch_made_in_a_worker_costs_its_own_cpu_not_the_spin_beside_it(tmp_path):
    """The other thread's 9 ms is no more than an idle OpenMP thread spins after the step's last
    parallel region (``WHATIF_OMP_SPIN_S``): none of it is the batch's work, which the spin term
    counts for settings with workers, not each worker's batch."""
    w = run(tmp_path, ASLEEP_SPINNING, workers=16, persistent=True)
    c = w.costs
    assert c.cpu_s == pytest.approx(0.010) and c.worker_cpu_s == pytest.approx(0.001)
    sixteen = w.predictions[0]
    # 16 workers, each 1 ms of CPU + 0.7 ms handing off + 49 ms asleep a batch: about 315 batches/s, and
    # 2 cores hold most of it (the 1 ms step, preempted, a little less); at 10 ms of CPU a batch, not half.
    workers_bound = 16 / (0.001 + th.WHATIF_HANDOFF_S + 0.049) * 32
    assert 0.85 * workers_bound < sixteen.samples_per_s <= 1.01 * workers_bound
    spin_as_the_batchs, limit = samples_per_s(dataclasses.replace(c, worker_cpu_s=None), 16, True)
    assert limit == LIMIT_CORES and spin_as_the_batchs < 0.5 * sixteen.samples_per_s
    # The run's own setting still makes its batch on the training thread, the spin beside it.
    assert w.measured_samples_per_s == pytest.approx(answer_run(tmp_path / "run").predictions[0].samples_per_s,
                                                     rel=0.03)


def test_ranks_on_one_node_share_its_cores_and_the_job_is_every_ranks(tmp_path):
    """torchrun, 2 ranks on 2 cores, each making its 30 ms batches inside next() and stepping 1 ms: the
    costs are the rank's, its share of the cores is one, and the samples/s are the job's. However many
    ranks share them, the cores make the same job rate once the workers fill them."""
    from tests.synthetic import RankSpec, write_ddp_run

    rank = RankSpec(wait_s=0.030, compute_s=0.001, batch_cpu_s=0.030, cpu_pct=100.0)
    w = answer_run(write_ddp_run(tmp_path / "ddp", [rank, rank], steps=200), workers=16, persistent=True)
    assert w.cannot_predict is None and w.costs.ranks == 2
    # Your settings: the two ranks step together, each a batch every 31 ms.
    assert w.yours.samples_per_s == pytest.approx(2 * 32 / 0.031, rel=0.05)
    assert w.yours.samples_per_s == pytest.approx(w.measured_samples_per_s, rel=0.05)
    c = w.costs
    sixteen = w.predictions[0]
    assert sixteen.limit == LIMIT_CORES
    assert sixteen.samples_per_s == pytest.approx(
        32 * (2 - c.other_cores) / (c.cpu_s + c.handoff_s + c.main_cpu_s), rel=0.03)
    assert w.ceiling_samples_per_s == pytest.approx(2 * 32 / (c.compute_s + c.receive_s))
    from rich.console import Console

    from gpufeed.present.whatif_view import what_if_block
    console = Console(width=250, record=True)
    console.print(what_if_block(w))
    assert "2 ranks share these 2 cores" in console.export_text()
    assert "ranks share" not in block_text(tmp_path / "one", CPU_BOUND)


def test_ranks_on_several_nodes_cannot_be_predicted_together(tmp_path):
    """Two nodes' run directories analysed together: each node's ranks share its own cores, not the
    others', so the model asks for one node's record."""
    from gpufeed.analysis import analyze_record
    from gpufeed.record.merge import load_runs
    from tests.synthetic import RankSpec, write_ddp_run

    rank = RankSpec(wait_s=0.030, compute_s=0.001, batch_cpu_s=0.030)
    nodes = [write_ddp_run(tmp_path / f"node{n}", [rank, rank], steps=200, hostname=f"node{n}", rank_base=2 * n,
                           world_size=4, pid_base=1000 + 10 * n) for n in range(2)]
    merged = analyze_record(load_runs(nodes)).to_dict()["what_if"]
    assert merged["cannot_predict"].startswith("ranks on several nodes")
    assert answer_run(nodes[0]).cannot_predict is None


def test_a_loop_that_never_waits_takes_the_step_of_a_ready_batch(tmp_path):
    """Every other step waited 40 ms for its batch and then took 6 ms, the others found it ready and took
    2 ms (the storage bench record: 1.07 ms a step after short waits, 5.44 ms after waits over 20 ms). The
    ceiling, data always ready, is the ready step's; what the run's own wait made of the rest stays the
    mean's. Not without workers (no batch is ever ready) nor on a GPU (its host runs ahead)."""
    cold = dataclasses.replace(STORAGE, wait_s=0.0005, compute_s=0.002, cold=(0.040, 0.006), fetch_wall_s=0.030,
                               fetch_cpu_s=0.001, train_cpu_pct=10)
    w = run(tmp_path, cold, workers=16, persistent=True)
    c = w.costs
    assert c.compute_s == pytest.approx(0.004, rel=0.03) and c.ready_compute_s == pytest.approx(0.002, rel=0.03)
    assert w.ceiling_samples_per_s == pytest.approx(32 / (0.002 + c.receive_s), rel=0.01)
    sixteen = w.predictions[0]
    assert sixteen.limit == LIMIT_LOOP
    # ... less each epoch's first batch (30 ms in an epoch of 200 steps of 2.5 ms)
    assert sixteen.samples_per_s == pytest.approx(w.ceiling_samples_per_s * 0.5 / 0.53, rel=0.02)
    assert "step 4.0 ms (2.0 ms after a batch that was ready)" in block_text(tmp_path / "block", cold)
    assert "after a batch that was ready" not in block_text(tmp_path / "even", STORAGE)
    for name, scenario in (("w0", dataclasses.replace(CPU_BOUND, cold=(0.040, 0.006))),
                           ("gpu", dataclasses.replace(cold, cuda=True))):
        assert run(tmp_path / name, scenario).costs.ready_compute_s is None, name


def test_a_burst_of_batches_under_way_at_the_window_edge_is_not_handoff_cpu():
    """Many workers on few cores finish their batches together, in bursts: the burst under way when the
    window ends is CPU without its batches. Counted by their share inside, the workers' CPU beyond the
    fetches stays the pickling's, not a third of each burst (2026-12-03: 21.9 ms read for 1.9 ms)."""
    from types import SimpleNamespace

    from gpufeed.record.rows import ProcRow

    import numpy as np

    from gpufeed.analysis.whatif.sampled import handoff_per_batch
    from gpufeed.record.rows import FetchRows

    # 4 workers on 2 cores, each batch 125 ms of CPU over 250 ms, all four in step: a burst every 250 ms.
    # Each worker's process also spends 1 ms per batch beyond the fetch.
    workers, fetch_cpu, period, handoff = (11, 12, 13, 14), 0.125, 0.250, 0.001
    rows = FetchRows.of([(k * period, (k + 1) * period, fetch_cpu, 16) for k in range(8) for _ in workers])
    cpu_pct = 100.0 * (fetch_cpu + handoff) / period
    t = np.arange(0.0, 2.0001, 0.1)
    samples = SimpleNamespace(t=t, procs=[[ProcRow.of([pid, 0, cpu_pct]) for pid in workers] for _ in t])
    spans = np.array([[0.0, 0.9]])  # ends with the 4th burst (0.75-1.0 s) 60% made
    got = handoff_per_batch(SimpleNamespace(samples=samples), set(workers), rows, spans)
    assert got == pytest.approx(handoff, rel=0.05)
    # Counting whole fetches by their end instead leaves the burst's CPU so far over: 26x the truth.
    ended = rows[rows.t_end <= 0.9]
    whole = (cpu_pct / 100 * 0.9 * len(workers) - float(ended.cpu_s.sum())) / len(ended)
    assert whole > 20 * handoff


# Short epochs of workers started again each time: 8 steps of 2 ms (15 ms waits), then 0.3 s of start-up
# and 30 ms of stopping them, during which the training process forks, copies pages and joins (60% of
# a core); while it steps and waits, 20%.
RESTARTING = dataclasses.replace(STORAGE, persistent_workers=False, epochs=12, steps_per_epoch=8, compute_s=0.002,
                                 wait_s=0.015, startup_s=0.3, stop_s=0.03, train_cpu_pct=20.0, restart_cpu_pct=60.0)


def test_the_training_processs_cpu_per_step_leaves_out_starting_and_stopping_workers(tmp_path):
    """Forking and stopping the workers is each epoch's start-up, which the model counts apart: per step
    it would be 25 ms of CPU beside a 2 ms step (the short-epochs bench record read 6.8 ms a step where
    its persistent runs read 0.5-0.9 ms), and persistent workers would come out cores-bound."""
    c = run(tmp_path, RESTARTING, workers=2, persistent=True).costs
    assert c.main_cpu_s == pytest.approx(0.2 * 0.002, rel=0.15)  # 20% of a core while it steps
    steady = dataclasses.replace(RESTARTING, restart_cpu_pct=None)  # 20% throughout: no start-up CPU to leave out
    whole = run(tmp_path / "steady", steady, workers=2, persistent=True).costs
    assert whole.main_cpu_s == pytest.approx(c.main_cpu_s, rel=0.15)


def test_a_few_runnable_readings_in_short_fetches_are_not_a_core_waited_for():
    """The runnable share of a worker's fetches is taken as low as its readings allow: 9 of 26 is at
    least 19%, 900 of 2,600 at least 33%; no readings leave it unknown."""
    from gpufeed.analysis.whatif.costs import _surely_running
    assert _surely_running(9 / 26, 26) == pytest.approx(0.19, abs=0.01)
    assert _surely_running(0.346, 2600) == pytest.approx(0.328, abs=0.005)
    assert _surely_running(0.0, 30) == 0.0 and _surely_running(None, 0) is None


def test_a_worker_read_runnable_while_cores_were_idle_is_asleep_not_waiting_for_a_core(tmp_path):
    """Every reading inside a fetch says "running": with the cores 30% busy no worker waits for one (2
    workers sleeping 1 ms at a time read so in 18 of 29 readings on idle cores), and the fetch's
    95 ms beyond its CPU is asleep, which more workers overlap; with the cores full, it is a wait for
    a core, which they do not."""
    idle = run(tmp_path, dataclasses.replace(STORAGE, worker_status="running")).costs
    assert idle.sleep_s == pytest.approx(0.095, rel=0.01)
    full = run(tmp_path / "full", dataclasses.replace(STORAGE, worker_status="running", host_cpu_pct=99)).costs
    assert full.sleep_s < 0.2 * 0.095


def test_workers_beyond_an_epochs_batches_never_get_one():
    """DataLoader hands an epoch's batches out from worker 0 again each epoch: with 8 batches an epoch,
    16 workers make them as 8 do (and, started each epoch, pay for forking all 16)."""
    short = _costs(cpu_s=0.002, sleep_s=0.050, batches_per_epoch=8.0, whole_epochs=True, persistent=True)
    eight, sixteen = (samples_per_s(short, w, True)[0] for w in (8, 16))
    assert sixteen == pytest.approx(eight)
    assert samples_per_s(short, 4, True)[0] < 0.9 * eight
    assert samples_per_s(short, 16, False)[0] < samples_per_s(short, 8, False)[0]  # the forks of 16
    # Counted over a run that ended inside its first epoch, 8 is a lower bound: more workers still help.
    reached = dataclasses.replace(short, whole_epochs=False)
    assert samples_per_s(reached, 16, True)[0] > 1.2 * samples_per_s(reached, 8, True)[0]


def test_only_epochs_that_ended_count_whole(tmp_path):
    from gpufeed.analysis import ranks
    from gpufeed.analysis.metrics import loader_summaries
    from gpufeed.analysis.whatif import measure_costs
    from gpufeed.record.reader import load_run

    epochs = dataclasses.replace(STORAGE, persistent_workers=False, epochs=4, steps_per_epoch=20, stop_s=0.05)
    record = load_run(write_run(tmp_path / "run", epochs))
    m, training = ranks.job_metrics(record, loader_summaries(record))
    assert measure_costs(record, training, m).p50.whole_epochs
    for it in record.iterators:
        it.epoch_ends = []
    assert not measure_costs(record, training, m).p50.whole_epochs


def test_an_assumed_term_widens_the_range_to_its_low_and_high_multiple():
    """Stopping workers (z) not measured in the run: the range of a setting that stops its workers each
    epoch covers z at WHATIF_ASSUMED_LOW and _HIGH times the default; the value does not move."""
    from gpufeed.analysis.whatif import Spread, predict
    c = _costs()  # 16 workers started again each epoch of 30 batches: z counts 18 times an epoch
    measured = Spread(c, c, c)
    guessed = Spread(*[dataclasses.replace(c, assumed=("stop_s",))] * 3)
    plain, wide = (predict(s, 16, False, noise=0.03) for s in (measured, guessed))
    assert wide.samples_per_s == plain.samples_per_s
    at = [samples_per_s(dataclasses.replace(c, stop_s=c.stop_s * f), 16, False)[0]
          for f in (th.WHATIF_ASSUMED_LOW, th.WHATIF_ASSUMED_HIGH)]
    assert wide.low == pytest.approx(min(at) * 0.97) and wide.high == pytest.approx(max(at) * 1.03)
    assert wide.low < 0.99 * plain.low and wide.high > 1.01 * plain.high
    # Persistent workers never stop: the term is not in their formula, and their range stays as it was.
    assert predict(guessed, 16, True, noise=0.03) == predict(measured, 16, True, noise=0.03)


def test_nothing_assumed_leaves_the_range_to_the_quartiles_and_the_noise():
    """With every term measured, the range is exactly the p75 and p25 costs' predictions and the noise."""
    from gpufeed.analysis.whatif import Spread, predict
    c = _costs()
    p25, p75 = dataclasses.replace(c, cpu_s=0.050, stop_s=0.004), dataclasses.replace(c, cpu_s=0.060, stop_s=0.008)
    p = predict(Spread(p25, c, p75), 16, False, noise=0.05)
    value = samples_per_s(c, 16, False)[0]
    assert p.samples_per_s == value
    assert p.low == min(samples_per_s(p75, 16, False)[0], value) * (1 - 0.05)
    assert p.high == max(samples_per_s(p25, 16, False)[0], value) * (1 + 0.05)
    # A term assumed 0 (no copy-on-write measured) cannot be widened by a multiple: named, range unmoved.
    zero = Spread(*(dataclasses.replace(x, cow_s=0.0, assumed=("cow_s",)) for x in (p25, c, p75)))
    assert predict(zero, 16, False, noise=0.05) == p


def test_the_terms_a_run_did_not_measure_are_named_in_the_json_and_the_block(tmp_path):
    """Without workers the run shows no hand-off (h), no receive of a ready batch (r) and no workers
    stopping (z): defaults stand in, named; persistent workers show h and r, not z."""
    w0 = run(tmp_path / "w0", CPU_BOUND)
    assert {"handoff_s", "receive_s", "stop_s"} <= set(w0.costs.assumed)
    assert json.loads(json.dumps(w0.to_dict()))["assumed"] == list(w0.costs.assumed)
    persistent = run(tmp_path / "persistent", STORAGE)
    assert "stop_s" in persistent.costs.assumed
    assert "handoff_s" not in persistent.costs.assumed and "receive_s" not in persistent.costs.assumed
    assert "assumed, not measured in this run: stop 6 ms/worker" in block_text(tmp_path / "block", STORAGE)
    # Each prediction of the w0 run with workers has its range widened by the hand-off at least.
    from gpufeed.analysis.whatif import Spread, predict
    c = w0.costs
    measured = Spread(*[dataclasses.replace(c, assumed=())] * 3)
    assert predict(Spread(c, c, c), 4, True).low < predict(measured, 4, True).low


# An asynchronous GPU loop: the host queues a step's work in 2 ms and then waits 18 ms in next() for two
# workers' 40 ms batches, while the GPU works through the step for 19 ms of those 20 (1 ms idle a step,
# CUDA events). Data and GPU are nearly matched: more workers would gain 5%, not ten times.
ASYNC_GPU = dataclasses.replace(STORAGE, cuda=True, wait_s=0.018, compute_s=0.002, gpu_idle_s=0.001,
                                fetch_wall_s=0.040, fetch_cpu_s=0.002, worker_cpu_pct=5.5, train_cpu_pct=10)


def test_an_asynchronous_gpu_loop_takes_its_ceiling_from_the_gpus_own_step(tmp_path):
    """The host's step (delivery to the next request) only queues the GPU's work, which goes on during the
    next next(): the ceiling and the loop bound take the GPU's step from the CUDA events (its period less
    its idle time), never the host's 2 ms (a ceiling of 32 / 2.5 ms, eight times what the GPU can do)."""
    w = run(tmp_path, ASYNC_GPU, workers=16)
    c = w.costs
    assert c.compute_s == pytest.approx(0.002, rel=0.02)
    assert c.gpu_step_s == pytest.approx(0.019, rel=0.02) and c.step_from == "gpu"
    assert w.ceiling_samples_per_s == pytest.approx(32 / 0.019, rel=0.02)
    sixteen = w.predictions[0]
    assert sixteen.limit == LIMIT_LOOP and sixteen.samples_per_s == pytest.approx(32 / 0.019, rel=0.03)
    # The run's own setting: its 2 workers' 40 ms batches against the GPU's 19 ms step.
    yours = run(tmp_path / "yours", ASYNC_GPU)
    assert yours.predictions[0].samples_per_s == pytest.approx(yours.measured_samples_per_s, rel=0.05)
    # A GPU twice as fast halves the GPU's step: the ceiling doubles, and no further.
    fast = answer_run(tmp_path / "run", workers=16, gpu_speedup=2.0)
    assert fast.ceiling_samples_per_s == pytest.approx(2 * w.ceiling_samples_per_s, rel=0.02)
    as_json = fast.to_dict()
    assert as_json["step_from"] == "gpu" and as_json["costs_ms"]["gpu_step_s"] == pytest.approx(19.0, rel=0.02)
    assert "step 2.0 ms on the host, 19.0 ms on the GPU (CUDA events" in block_text(tmp_path / "block", ASYNC_GPU)


def test_a_gpu_loop_that_waits_for_its_step_keeps_the_hosts_step(tmp_path):
    """A loop that waits for the GPU in its step (loss.item()): the GPU idles through the whole wait in
    next(), and its own step is the host's."""
    synced = dataclasses.replace(STORAGE, cuda=True)  # gpu_idle_s None: idle through the whole wait
    c = run(tmp_path, synced).costs
    assert c.gpu_step_s == pytest.approx(c.compute_s, rel=0.02)
    plain = run(tmp_path / "cpu", STORAGE, workers=16)
    assert run(tmp_path / "gpu", synced, workers=16).ceiling_samples_per_s == pytest.approx(
        plain.ceiling_samples_per_s, rel=0.02)


def test_without_resolved_cuda_events_the_hosts_step_stands_in_and_says_so(tmp_path):
    """A GPU run (its copies went to the GPU) whose CUDA events never resolved: the host's step, named."""
    unresolved = dataclasses.replace(ASYNC_GPU, cuda=False, h2d_host_s=0.0005)
    w = run(tmp_path, unresolved, workers=16)
    assert w.costs.cuda and w.costs.gpu_step_s is None and w.to_dict()["step_from"] == "host"
    assert w.ceiling_samples_per_s > 5 * 32 / 0.019  # what the host's step gives: it cannot know better
    assert "CUDA events did not resolve: the host's step stands in" in block_text(tmp_path / "block", unresolved)
    assert "on the GPU" not in block_text(tmp_path / "cpu", STORAGE)


def test_the_gpus_step_spread_is_over_blocks_of_steps_not_the_hosts_run_ahead(tmp_path):
    """The host queues a step in 2.5 ms, then waits 38 ms for the device, turn about; the GPU never idles
    (a 20.25 ms step). Per step the host's periods read 2.5 ms a quarter of the time: the range of the
    GPU's step is that of the means of consecutive steps (WHATIF_GPU_STEP_BLOCK), not the host's steps."""
    ahead = dataclasses.replace(ASYNC_GPU, wait_s=0.0005, cold=(0.036, 0.002), gpu_idle_s=0.0)
    w = run(tmp_path, ahead, workers=16, persistent=True)
    assert w.costs.gpu_step_s == pytest.approx(0.02025, rel=0.02)
    p = w.predictions[0]
    assert p.limit == LIMIT_LOOP and p.samples_per_s == pytest.approx(32 / 0.02025, rel=0.03)
    assert p.high <= p.samples_per_s * (1 + w.noise) * 1.02
