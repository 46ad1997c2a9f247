"""Numbers about a run, computed from its record alone. The rules read these; so do the front ends.

Longer than 450 lines because every part (steps, loader, host, GPU) fills the one ``Metrics`` below:
the host and GPU parts can move to modules of their own once ``Metrics`` and ``LoaderSummary`` live in
a module of their own (they would import it, and ``compute`` them: a cycle today). The time-span
algebra it shares with the what-if model is in ``intervals.py``.

The measured window (``steps.measurement_window``) opens at the request of the first step after
warm-up and closes at the last delivery of the training loader (the loader the loop iterated most,
``pick_training``), over its one step series (``steps.py``). Throughput in that window is
the smaller of what the loop consumed and what the workers produced: a window that opens while
prepared batches wait in the loader would otherwise count them as if they were made in the window
(docs/sources.md, "A measurement trap"). It is also checked against the loader's CPU-time bound.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gpufeed import thresholds as th
from gpufeed.analysis.gpus import gpus_used, own_gpus
from gpufeed.analysis.intervals import merge_spans, overlap, waited_before
from gpufeed.analysis.loop import busiest_loop
from gpufeed.analysis.offloaded import Offload, of_loader
from gpufeed.analysis.rank_summary import RankSummary
from gpufeed.analysis.steps import StepSeries, loader_steps, measurement_window
from gpufeed.analysis.together import stepped_together, with_partners
from gpufeed.record import schema
from gpufeed.record.cpus import CpuAllowance
from gpufeed.record.reader import IteratorRecord, RunRecord, mean_per_sample
from gpufeed.record.rows import CudaRows, FetchRows, H2dRows, StepRows
from gpufeed.settings import LoaderSettings

RUNNING = "running"


@dataclass
class LoaderSummary:
    """One DataLoader object (all its iterators) in one process."""

    pid: int
    loader_id: int
    config: dict[str, Any]
    iterators: int
    steps: int
    samples: int
    data_wait_s: float
    startup_s: float              # sum over iterators: creation to first batch
    worker_pids: list[int]
    training: bool                # the process's training loader (see ``pick_training``)
    role: str | None = None       # "train" or "eval" as the probe saw it; None in older records
    role_why: str | None = None   # the evidence for the role
    loader_ids: list[int] = field(default_factory=list)  # its DataLoader objects: several when rebuilt at one site
    iter_ids: list[int] = field(default_factory=list)

    @property
    def rebuilt(self) -> int:
        """How many DataLoader objects were built at this site for this role (1: built once)."""
        return len(self.loader_ids)

    def owns(self, it: IteratorRecord) -> bool:
        return it.pid == self.pid and it.iter_id in self.iter_ids


@dataclass
class Metrics:
    """Everything the analysis measured. ``None`` means not measurable in this run (N/A)."""

    # the window
    wall_s: float | None = None               # training time: the window less its evaluation passes
    eval_s: float | None = None               # evaluation passes inside the window, left out of wall_s
    window_start_t: float | None = None       # the window on the record's clock (seconds)
    window_end_t: float | None = None
    steps: int = 0                            # the loop's steps: one per batch of the training loader
    loaders_per_step: int = 1                 # loaders stepped together in each (zip(a, b)): their samples count
    # What a step is: "dataloader" (a batch of the training loader), or where no training DataLoader
    # was iterated, "optimizer" (an optimizer step) or "backward" (analysis/loop.py); None: no steps
    steps_from: str | None = None
    warmup_steps: int = 0                     # the steps before the window: the warm-up asked, and more to start on an epoch
    warmup_asked: int | None = None           # the warm-up asked for (--warmup)
    samples: int = 0
    # throughput
    samples_per_s: float | None = None         # None where the batches' samples could not be counted:
    samples_unknown: str | None = None         # ... and why; throughput is then batches_per_s
    batches_per_s: float | None = None
    samples_per_s_consumed: float | None = None
    samples_per_s_produced: float | None = None
    loader_cpu_bound_samples_per_s: float | None = None
    throughput_check: str | None = None
    # the step
    step_time_p50_ms: float | None = None
    step_time_p90_ms: float | None = None
    data_wait_p50_ms: float | None = None
    data_wait_p90_ms: float | None = None
    compute_p50_ms: float | None = None        # per batch: from its delivery to the next request, less other loaders' waits
    compute_per_batch_ms: float | None = None  # the mean of that: right when one step takes several batches
    data_wait_share: float | None = None
    # the GPU: only the GPUs the job used (``analysis/gpus.py``), never others on the host
    gpu_indices: list[int] = field(default_factory=list)   # NVML indices
    gpu_names: list[str | None] = field(default_factory=list)
    gpu_match: str | None = None              # how they were found, or why none was
    cuda_used: bool = False
    gpu_idle_share: float | None = None       # CUDA events: GPU idle while the loop waited for data
    gpu_util_p5_pct: float | None = None
    gpu_util_p50_pct: float | None = None
    gpu_util_p95_pct: float | None = None
    # GPM (Hopper and newer; None: N/A, gpu_gpm_na says why): the share of SMs busy, of warps resident,
    # of time the tensor pipes ran, p50 over the window on the job's GPUs.
    gpu_sm_active_p50_pct: float | None = None
    gpu_sm_occupancy_p50_pct: float | None = None
    gpu_tensor_active_p50_pct: float | None = None
    gpu_gpm_na: str | None = None
    gpu_mem_used_max_b: float | None = None
    gpu_mem_total_b: float | None = None
    cuda_mem_allocated_peak_b: float | None = None
    cuda_mem_reserved_max_b: float | None = None
    h2d_pageable_share: float | None = None
    h2d_bytes_per_step: float | None = None
    # Pinned copies on the stream the steps run on: the kernels after them wait for them (issue 34.4).
    h2d_stall_share: float | None = None
    # Of the pageable copies' bytes: made by copy_/as_tensor/tensor(device=) (which a DataLoader's
    # pin_memory never pins), and asked non_blocking (None in older records).
    h2d_pageable_outside_loader_share: float | None = None
    h2d_pageable_non_blocking_share: float | None = None
    # the host: the CPUs the job may use (affinity, cgroup quota, SLURM; ``measure/outside/cpus.py``)
    cpu_count: int = 1
    cpu_cores: list[int] = field(default_factory=list)  # host numbers of the cores the job may run on
    cpu_limit: str | None = None               # why the job has fewer CPUs than the host, in words
    cpu_util_pct: float | None = None          # mean over those cores (under a quota: the job's share of it)
    cpu_util_per_core_pct: list[float] = field(default_factory=list)  # one per core in ``cpu_cores``
    cpu_cores_busy: float | None = None        # cores' worth of time busy on those cores (any program)
    cpu_cores_command: float | None = None     # cores used by the command's own process tree
    # The busiest programs outside the command over the window: [{"pid", "name", "cores"}], by cores
    # (the sampler's ``others`` readings, about every 2 s; a reading without a program counts it 0).
    other_programs: list[dict[str, Any]] = field(default_factory=list)
    iowait_pct: float | None = None
    mem_used_max_b: float | None = None
    mem_total_b: float | None = None
    # the loader and its workers
    num_workers: int | None = None
    prefetch_factor: int | None = None
    iterators: int = 0
    worker_startup_s: float | None = None
    worker_startup_share: float | None = None
    # The input pipeline's cost that no next() waited: inside the window, the time iter(loader) took to
    # build each new iterator (forking its workers) before its first next(), and (CPU-only runs) what the
    # training steps paid after each fork of the workers (copy-on-write; the what-if model's cow_s, set by
    # ``analysis.analyze_record``). Shares of ``wall_s``; ``input_share`` adds them to the wait.
    startup_in_iter_share: float | None = None
    fork_step_share: float | None = None
    # Of ``data_wait_share``: the first next() of each iterator whose workers were started inside the
    # window (they start, then make the first batch): with the two above, what restarting costs.
    restart_wait_share: float | None = None
    fetch_ms_per_batch_p50: float | None = None
    worker_fetch_cpu_ratio: float | None = None  # CPU time / wall time while fetching (1.0 = one full core)
    worker_asleep_share: float | None = None     # 1 - that ratio, floored at 0
    worker_busy_share: float | None = None       # share of the window the workers spent fetching
    worker_running_share: float | None = None    # sampler: share in state "running" while making a batch (num_workers=0: the training process in next())
    worker_state_readings: int = 0               # the sampler's readings that share is of
    worker_core_wait_share: float | None = None  # ... runnable while fewer than half a core was idle: waiting for one
    worker_threads_median: float | None = None   # OS threads per worker process
    worker_torch_threads: int | None = None
    worker_rss_max_b: float | None = None
    # The most private memory (USS: pages no other process maps) one of the training loader's workers
    # held: its reading at exit, else at its start (``memory`` and ``exit`` events): what one more worker
    # adds to the host's memory (its resident set counts the pages it shares with the training process)
    worker_private_max_b: float | None = None
    workers_needed: int | None = None            # workers that would keep up with the step, by rate
    # --autotune changed the loader's settings during the run: {"from": your settings, "to": those in
    # force at the end, "switches": n} (labels as ``LoaderSettings.label``); under several ranks also
    # "ranks": ``RankSwitches.to_dict()`` (each rank's switch batches, where they differ, fall-backs).
    # The loader's settings above (num_workers, prefetch_factor, the training loader's config) are then
    # those at the end.
    autotuned: dict[str, Any] | None = None
    # --offload: the batches were made on Ray (``analysis/offloaded.py``); the local-worker numbers
    # above are then N/A, whatever num_workers the config names
    offload: Offload | None = None
    # several ranks (torchrun, or any launcher setting RANK): see ``analysis/ranks.py``. Then
    # ``samples_per_s`` is the job's (all ranks) and the other step and loader numbers are the
    # focus rank's: the one whose loader held the job back most.
    focus_rank: int | None = None
    ranks: list[RankSummary] = field(default_factory=list)  # one per training process

    def to_dict(self) -> dict[str, Any]:
        return {k: json_safe(v) for k, v in asdict(self).items()}


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (np.floating, np.integer)):
        return json_safe(value.item())
    return value


def _pct(values: np.ndarray, q: float) -> float | None:
    values = values[np.isfinite(values)]
    return float(np.percentile(values, q)) if len(values) else None


def _mean(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return float(values.mean()) if len(values) else None


def loader_summaries(record: RunRecord) -> list[LoaderSummary]:
    """One summary per loader of each process: the DataLoader objects built at one site (``file:line``)
    for one role are one loader, built once or anew every epoch; without a site, one object. A framework
    that rebuilds the user's loaders at one line of its own (accelerate's ``prepare(train, eval)``)
    makes one loader per loader of the user's it rebuilt (``origin_site``)."""
    groups: dict[tuple, list[IteratorRecord]] = {}
    for it in record.iterators:
        where = (("site", it.config.site, it.config.origin_site) if it.config.site is not None
                 else ("loader", it.loader_id))
        groups.setdefault((it.pid, where, it.role), []).append(it)
    summaries = []
    lanes = [((pid, role), lane) for (pid, _where, role), its in groups.items() for lane in _used_apart(its)]
    for (pid, role), its in lanes:
        steps = StepRows.concat(it.steps for it in its)
        summaries.append(LoaderSummary(
            pid=pid, loader_id=its[0].loader_id, config=asdict(in_force(its)), iterators=len(its),
            steps=len(steps), samples=int(np.nansum(steps.samples)) if len(steps) else 0,
            data_wait_s=float(steps.wait.sum()) if len(steps) else 0.0,
            startup_s=sum(_startup_s(it) or 0.0 for it in its),
            worker_pids=sorted({p for it in its for p in it.worker_pids}), training=False,
            role=role, role_why=its[-1].role_why, loader_ids=sorted({it.loader_id for it in its}),
            iter_ids=[it.iter_id for it in its],
        ))
    for training in pick_training(summaries):
        training.training = True
    return summaries


def _used_apart(its: list[IteratorRecord]) -> list[list[IteratorRecord]]:
    """The iterators of one site, split into loaders used at the same time: two loaders built by one
    helper and stepped together (``zip(make(a), make(b))``) are two; a loader rebuilt every epoch,
    each built after the last was done, is one."""
    lanes: list[list[IteratorRecord]] = []
    lane_of: dict[int, list[IteratorRecord]] = {}
    for it in sorted(its, key=lambda it: it.t_created):
        lane = lane_of.get(it.loader_id)
        if lane is None:
            lane = next((lane for lane in lanes if _last_use(lane[-1]) <= _first_use(it)), None)
            if lane is None:
                lane = []
                lanes.append(lane)
            lane_of[it.loader_id] = lane
        lane.append(it)
    return lanes


def _first_use(it: IteratorRecord) -> float:
    return float(it.steps.t_request[0]) if len(it.steps) else it.t_created


def _last_use(it: IteratorRecord) -> float:
    return float(it.steps.t_deliver[-1]) if len(it.steps) else it.t_created


def pick_training(loaders: list[LoaderSummary]) -> list[LoaderSummary]:
    """Each process's training loader: the one its loop iterated most among those the probe saw
    train (validation, evaluation and sanity-check loaders never count); a process that iterated
    only evaluation loaders is measured by its most iterated one."""
    best: dict[int, LoaderSummary] = {}
    for s in sorted(loaders, key=lambda s: (s.role == schema.ROLE_EVAL, -s.steps)):
        if s.steps and s.pid not in best:
            best[s.pid] = s
    return list(best.values())


def marked_training(loaders: list[LoaderSummary]) -> LoaderSummary | None:
    """The first loader marked training (``pick_training``: one per process that took steps)."""
    return next((s for s in loaders if s.training), None)


def in_force(its: list[IteratorRecord]) -> schema.LoaderConfig:
    """The loader's settings at the end of the run: its last iterator's, or under ``--autotune`` that
    iterator's last worker pool's (``record/pools.py``), so that the findings' fixes are relative
    to what ran last, not to the settings the run started with."""
    last = its[-1]
    return (last.pools or [last])[-1].config


def autotuned(record: RunRecord, pid: int) -> dict[str, Any] | None:
    """From which settings to which ``--autotune`` took the process's training loader; None when it
    did not run (or its start is not in the record)."""
    events = [ev for ev in record.autotune if ev.get("pid") == pid]
    start = next((ev for ev in events if ev.get("action") == "start"), None)
    switches = [ev for ev in events if ev.get("action") == "switch"]
    try:
        first = LoaderSettings.from_dict(start["user"])
        last = LoaderSettings.from_dict(switches[-1]["new"]) if switches else first
    except (KeyError, TypeError, ValueError):  # no start, or a damaged event: not said rather than guessed
        return None
    return {"from": first.label(), "to": last.label(), "switches": len(switches)}


def _startup_s(it: IteratorRecord) -> float | None:
    """Creation of the iterator (workers start) to its first batch."""
    return float(it.steps.t_deliver[0] - it.t_created) if len(it.steps) else None


def compute(record: RunRecord, loaders: list[LoaderSummary], training: LoaderSummary | None = None) -> Metrics:
    """Metrics of the run; ``loaders`` from ``loader_summaries(record)``. ``training``: the loader to
    measure the step by (default: the one marked training; one rank's, when several ranks ran)."""
    m = Metrics(cpu_count=record.meta.cpu_count, warmup_steps=record.meta.warmup_steps,
                warmup_asked=record.meta.warmup_steps)
    if training is None:
        training = marked_training(loaders)
    window = None
    if training is not None and training.steps:
        its = [it for it in record.iterators if training.owns(it)]
        partners = _stepped_together(record, loaders, training)
        m.loaders_per_step = 1 + len(partners)
        window = _step_metrics(m, record, its, [loader_steps(record, p) for p in partners])
        _loader_metrics(m, record, training, its, window, partners)
        m.autotuned = autotuned(record, training.pid)
        m.worker_private_max_b = _worker_private_max_b(record, training)
        if window is not None:
            m.window_start_t, m.window_end_t = window
    if training is not None and window is not None:
        m.steps_from = "dataloader"
    elif training is None and record.loops:
        window = _loop_metrics(m, record)
    if window is None and len(record.samples):
        window = (float(record.samples.t[0]), float(record.samples.t[-1]))
        m.wall_s = window[1] - window[0]
    if window is not None:
        _host_metrics(m, record, window, training)
        _gpu_metrics(m, record, window, training)
    return m


def _worker_private_max_b(record: RunRecord, training: LoaderSummary) -> float | None:
    readings = [record.memory.get(pid, {}) for pid in training.worker_pids]
    private = [r.get("uss_b", r.get("uss_start_b")) for r in readings]
    return max((float(b) for b in private if b is not None), default=None)


def _stepped_together(record: RunRecord, loaders: list[LoaderSummary], training: LoaderSummary) -> list[LoaderSummary]:
    """The process's other training loaders taken one batch per step of ``training``."""
    lead = loader_steps(record, training)
    return [s for s in loaders if s.pid == training.pid and s is not training and s.role != schema.ROLE_EVAL
            and s.steps and stepped_together(lead, loader_steps(record, s))]


def _step_metrics(m: Metrics, record: RunRecord, its: list[IteratorRecord],
                  partners: list[StepSeries] = ()) -> tuple[float, float] | None:
    """Step time, data wait and throughput of the training loader, after warm-up."""
    # Per step: request, delivery, samples, and the next request of the same iterator (the end of
    # the step's compute). The last step of an iterator has no next request: no compute time.
    # A step that waits on another loader too (a GAN's second loader, a loop over two datasets)
    # spends that wait outside this loader's compute: it is taken out of the step's compute.
    # (Evaluation loaders' waits are not: an evaluation pass is taken out whole, see evaluation_pauses.)
    own = {it.key for it in its}
    others = StepRows.concat(it.steps for it in record.iterators
                             if it.pid == its[0].pid and it.key not in own and it.role != schema.ROLE_EVAL)
    series = with_partners(StepSeries.from_steps(it.steps for it in its), list(partners))
    other_wait = np.nan_to_num(waited_before(others.t_request, others.t_deliver, series.next_request)
                               - waited_before(others.t_request, others.t_deliver, series.t_deliver))
    window = measurement_window(series, its, record.meta.warmup_steps)
    if window is None:
        return None
    t0, t1, warmup = window.t0, window.t1, window.warmup
    measured, other_wait = series[window.measured], other_wait[window.measured]
    m.steps, m.warmup_steps = len(measured), warmup
    # Evaluation passes that paused training are not training time (validation never enters the
    # training step's numbers): out of the window's length, and out of the step they interrupted.
    pauses = evaluation_pauses(record, its, t0, t1)
    m.eval_s = sum(b - a for a, b in pauses) if pauses else None
    m.wall_s = t1 - t0 - (m.eval_s or 0.0)
    paused = overlap(measured.t_deliver, measured.next_request, pauses)
    wait = measured.wait
    step = measured.next_request - measured.t_request - paused
    compute = measured.next_request - measured.t_deliver - paused - other_wait
    m.step_time_p50_ms, m.step_time_p90_ms = (_ms(_pct(step, q)) for q in (50, 90))
    m.data_wait_p50_ms, m.data_wait_p90_ms = (_ms(_pct(wait, q)) for q in (50, 90))
    m.compute_p50_ms = _ms(_pct(compute, 50))
    # Several batches per optimizer step (gradient accumulation, a GAN's critic steps) make the
    # per-batch compute uneven (near 0 between two next() calls, the whole step after the last):
    # its median can be anything, its mean is the time the loop spends on each batch.
    m.compute_per_batch_ms = _ms(_mean(compute))
    # Every data wait of the training process but its evaluation loaders' counts (a second
    # training loader too): the GPU idles either way.
    all_wait = sum(float(np.clip(np.minimum(it.steps.t_deliver, t1) - np.maximum(it.steps.t_request, t0), 0, None).sum())
                   for it in record.iterators
                   if it.pid == its[0].pid and it.role != schema.ROLE_EVAL and len(it.steps))
    m.data_wait_share = all_wait / m.wall_s if m.wall_s > 0 else None
    if m.wall_s > 0:
        m.startup_in_iter_share = _startup_in_iter_s(its, t0, t1, pauses) / m.wall_s
        restarted = [it for it in its if it.worker_pids and len(it.steps) and t0 <= it.t_created < t1]
        m.restart_wait_share = sum(max(min(float(it.steps.t_deliver[0]), t1) - max(float(it.steps.t_request[0]), t0), 0.0)
                                   for it in restarted) / m.wall_s
    # Samples delivered in the window (the first measured step's batch was requested at t0).
    m.samples = int(np.nansum(measured.samples))
    if m.wall_s > 0:
        m.batches_per_s = len(measured) / m.wall_s
        if np.isnan(measured.samples).any():  # some batches not counted: samples/s is not claimed
            m.samples_unknown = next((it.samples_unknown for it in its if it.samples_unknown),
                                     "the probe could not count the samples of some batches")
        else:
            m.samples_per_s_consumed = m.samples / m.wall_s
    return t0, t1


def _loop_metrics(m: Metrics, record: RunRecord) -> tuple[float, float] | None:
    """A loop that iterated no training DataLoader: its steps from its training (analysis/loop.py).
    Its data wait is the loop's own work between the model's (taking and preparing the batch)."""
    found = busiest_loop(record.loops)
    if found is None:
        return None
    _pid, steps = found
    warmup = min(record.meta.warmup_steps, max(len(steps) - 2, 0))
    # The loop's first step has no start (its steps are spans between step ends), so it is the first of
    # the warm-up: --steps N measures N steps here as it does for a DataLoader's batches.
    measured = steps.select(np.arange(len(steps)) >= max(warmup - 1, 0))
    if len(measured) < 2:
        return None
    t0, t1 = float(measured.start[0]), float(measured.end[-1])
    m.steps, m.warmup_steps, m.steps_from = len(measured), warmup, measured.source
    eval_s = float(measured.eval_s.sum())
    m.eval_s = eval_s or None
    m.wall_s = t1 - t0 - eval_s
    own = measured.own
    step = measured.end - measured.start - measured.eval_s
    m.step_time_p50_ms, m.step_time_p90_ms = (_ms(_pct(step, q)) for q in (50, 90))
    m.data_wait_p50_ms, m.data_wait_p90_ms = (_ms(_pct(own, q)) for q in (50, 90))
    m.compute_p50_ms = _ms(_pct(measured.work, 50))
    m.compute_per_batch_ms = _ms(_mean(measured.work))
    if m.wall_s > 0:
        m.data_wait_share = float(own.sum()) / m.wall_s
        m.batches_per_s = len(measured) / m.wall_s
        if np.isnan(measured.samples).any():
            m.samples_unknown = ("a step's model forward took no tensor whose leading dimension counts its "
                                 "samples")
        else:
            m.samples = int(measured.samples.sum())
            m.samples_per_s_consumed = m.samples_per_s = m.samples / m.wall_s
    m.window_start_t, m.window_end_t = t0, t1
    return t0, t1


def _startup_in_iter_s(its: list[IteratorRecord], t0: float, t1: float, pauses: list[tuple[float, float]]) -> float:
    """Time inside [t0, t1] that iter(loader) spent building each iterator (forking its workers) before
    the loop's first next() on it: the input pipeline's cost, though no next() waited for it (a
    non-persistent loader pays it every epoch; the time is otherwise counted as the step's)."""
    # Only where iter() forks workers: a tf.data iterator's or a num_workers=0 one's creation to its first
    # next() is the framework's epoch set-up (Keras), not the input pipeline starting.
    forked = [it for it in its if it.worker_pids and len(it.steps)]
    starts = np.array([it.t_created for it in forked], dtype=float)
    firsts = np.array([it.steps.t_request[0] for it in forked], dtype=float)
    if not len(starts):
        return 0.0
    a, b = np.maximum(starts, t0), np.minimum(firsts, t1)
    return float(np.clip(b - a, 0.0, None).sum() - overlap(a, np.maximum(a, b), pauses).sum())


def fork_steps_in_window(its: list[IteratorRecord], t0: float, t1: float) -> int:
    """Iterators whose workers were forked inside [t0, t1): each fork slows the steps after it."""
    return sum(1 for it in its if it.worker_pids and len(it.steps) and t0 <= it.t_created < t1)


def evaluation_pauses(record: RunRecord, its: list[IteratorRecord], t0: float, t1: float) -> list[tuple[float, float]]:
    """Spans inside [t0, t1] where the training process ran an evaluation loader (from its iterator's
    creation to the next() that ended it, or its last batch) and the training loader took no batch:
    evaluation passes. The next() that ends an epoch shuts its workers down: a Hugging Face Trainer
    evaluating every 8 steps with 8 workers spent 80-95 ms so after each pass, which would otherwise
    count as the training step's. An evaluation loader interleaved with training steps pauses nothing."""
    requests = np.sort(np.concatenate([it.steps.t_request for it in its if len(it.steps)]))
    spans = []
    for it in record.iterators:
        if it.pid != its[0].pid or it.role != schema.ROLE_EVAL or not len(it.steps):
            continue
        ended = max([float(it.steps.t_deliver[-1])] + [t for _request, t in it.epoch_ends])
        a, b = max(it.t_created, t0), min(ended, t1)
        k = int(np.searchsorted(requests, a, side="right"))
        if b > a and not (k < len(requests) and requests[k] < b):
            spans.append((a, b))
    return merge_spans(spans)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _loader_metrics(m: Metrics, record: RunRecord, training: Any, its: list[IteratorRecord],
                    window: tuple[float, float] | None, partners: list[LoaderSummary] = ()) -> None:
    cfg = in_force(its)
    m.num_workers, m.prefetch_factor, m.iterators = cfg.num_workers, cfg.prefetch_factor, len(its)
    startups = [s for s in (_startup_s(it) for it in its) if s is not None]
    m.worker_startup_s = float(sum(startups)) if startups else None
    span = float(max(it.steps.t_deliver[-1] for it in its if len(it.steps)) - its[0].t_created)
    if startups and span > 0:
        m.worker_startup_share = m.worker_startup_s / span

    # Who made this loader's batches: its workers (their fetches), or, with num_workers=0, the
    # training process inside next() (the steps themselves, CPU time taken for some of them).
    producers = set(training.worker_pids) or {training.pid}
    fetches = [f for f in record.fetches if f.pid in producers]
    m.offload = of_loader(record, its)
    if m.offload is not None:  # made on Ray: inside next() is the wait for Ray, not a batch being made
        rows = FetchRows.of([])
    elif training.worker_pids:
        rows = FetchRows.concat(f.rows for f in fetches)
    else:
        rows = _made_in_next(StepRows.concat(it.steps for it in its))
    if len(rows):
        wall = rows.t_end - rows.t_start
        m.fetch_ms_per_batch_p50 = _ms(_pct(wall, 50))
        # CPU time is taken for a sample of the batches in the training process (see the probe).
        timed = np.isfinite(rows.cpu_s)
        if wall[timed].sum() > 0:
            m.worker_fetch_cpu_ratio = float(rows.cpu_s[timed].sum() / wall[timed].sum())
            m.worker_asleep_share = max(0.0, 1.0 - m.worker_fetch_cpu_ratio)
        cpu_per_sample = rows.cpu_s[timed].sum() / max(rows.samples[timed].sum(), 1.0)
        if cpu_per_sample > 0:
            m.loader_cpu_bound_samples_per_s = m.cpu_count / cpu_per_sample
        threads = [f.torch_threads for f in fetches if f.torch_threads is not None and f.worker_id is not None]
        m.worker_torch_threads = max(threads) if threads else None
        if window is not None and m.wall_s:
            t0, t1 = window
            inside = np.clip(np.minimum(rows.t_end, t1) - np.maximum(rows.t_start, t0), 0, None)
            m.worker_busy_share = float(inside.sum() / (m.wall_s * max(len(producers), 1)))
            # What the workers made counts only where their rows reach the window's end: a worker
            # killed at the end (persistent workers at exit) loses its last unflushed second of rows,
            # and a count of nothing is N/A, never 0 samples/s.
            # Loaders stepped together: the step trains on what all their workers made.
            makers = producers.union(*(p.worker_pids for p in partners)) if partners else producers
            made = FetchRows.concat(f.rows for f in record.fetches if f.pid in makers)
            reach = float(made.t_end.max()) if len(made) else -math.inf
            all_workers = training.worker_pids and all(p.worker_pids for p in partners)
            if all_workers and m.samples_unknown is None and reach >= t1 - th.WORKER_ROWS_REACH_S:
                # Counted up to where every worker of the pool running at the end has its rows:
                # persistent workers killed at exit lose their last second unevenly (0-1.2 s measured),
                # and a count over the whole window read 180 samples/s where the loop consumed 370.
                span_end = min(t1, _rows_reach_together(record, makers, [set(it.worker_pids) for it in its]))
                produced = made.samples[(made.t_end >= t0) & (made.t_end <= span_end)]
                # The window's wall time (evaluation passes left out) less the tail cut off.
                span_s = m.wall_s - (t1 - span_end)
                if not np.isnan(produced).any() and produced.sum() > 0 and span_s > 0:
                    m.samples_per_s_produced = float(produced.sum() / span_s)
        # Workers that keep up make one batch per batch's worth of compute (a mean: see above).
        compute_per_batch = (m.compute_per_batch_ms or 0.0) / 1000.0
        if compute_per_batch > 0 and m.fetch_ms_per_batch_p50:
            m.workers_needed = max(1, math.ceil(m.fetch_ms_per_batch_p50 / 1000.0 / compute_per_batch))

    rates = [r for r in (m.samples_per_s_consumed, m.samples_per_s_produced) if r is not None]
    m.samples_per_s = min(rates) if rates else None
    bound = m.loader_cpu_bound_samples_per_s
    if m.samples_per_s is not None and bound is not None and m.samples_per_s > bound * th.CPU_BOUND_TOLERANCE:
        m.throughput_check = (f"{m.samples_per_s:,.0f} samples/s exceeds what {m.cpu_count} cores can prepare "
                              f"({bound:,.0f}/s at the loader's CPU cost): the window likely opened with "
                              "prepared batches waiting; measure more steps")


def _rows_reach_together(record: RunRecord, pids: set[int], pools: list[set[int]]) -> float:
    """The earliest last row among the workers of the pool that made the last row (the pool running at
    the end; an earlier epoch's pool ended with its epoch): up to there none of its rows are missing."""
    last: dict[int, float] = {}
    for f in record.fetches:
        if f.pid in pids and len(f.rows):
            last[f.pid] = max(last.get(f.pid, -math.inf), float(f.rows.t_end.max()))
    if not last:
        return math.inf
    end_pid = max(last, key=last.__getitem__)
    pool = next((p for p in pools if end_pid in p), {end_pid})
    return min(last[p] for p in pool if p in last)


def _made_in_next(steps: StepRows) -> FetchRows:
    """num_workers=0: the training process makes each batch inside next(), so its steps are its fetches."""
    return FetchRows.of(np.column_stack([steps.t_request, steps.t_deliver, steps.cpu_s, steps.samples]))


def _in_window(record: RunRecord, window: tuple[float, float]) -> np.ndarray:
    t = record.samples.t
    mask = (t >= window[0]) & (t <= window[1])
    if not mask.any():  # a short window between two samples: take the nearest sample
        mask = np.zeros(len(t), dtype=bool)
        if len(t):
            mask[int(np.argmin(np.abs(t - (window[0] + window[1]) / 2)))] = True
    return mask


def _host_metrics(m: Metrics, record: RunRecord, window: tuple[float, float], training: Any = None) -> None:
    s = record.samples
    if not len(s):
        return
    mask = _in_window(record, window)
    allowed = CpuAllowance.from_dict(record.meta.cpus, s.cpu_pct.shape[1])
    # Only the cores the job may run on: idle cores it may not use are no headroom for it.
    cores = [c for c in allowed.cores if c < s.cpu_pct.shape[1]] or list(range(s.cpu_pct.shape[1]))
    m.cpu_cores, m.cpu_limit = cores, allowed.describe() or None
    cpu = s.cpu_pct[mask][:, cores]
    per_core = np.nanmean(cpu, axis=0) if cpu.size and np.isfinite(cpu).any() else np.array([])
    m.cpu_util_per_core_pct = [round(float(v), 1) for v in per_core]
    m.cpu_util_pct = _mean(mean_per_sample(cpu)) if cpu.size else None
    m.cpu_cores_busy = _mean(np.nansum(cpu, axis=1) / 100.0) if cpu.size else None
    m.iowait_pct = _mean(s.iowait_pct[mask])
    m.mem_used_max_b = float(np.nanmax(s.mem_used_b[mask])) if np.isfinite(s.mem_used_b[mask]).any() else None
    m.mem_total_b = s.mem_total_b if math.isfinite(s.mem_total_b) else None

    tree_cores = [sum(row.cpu_pct or 0.0 for row in s.procs[i]) / 100.0 for i in np.flatnonzero(mask) if s.procs[i]]
    m.cpu_cores_command = float(np.mean(tree_cores)) if tree_cores else None
    m.other_programs = _other_programs(record, window)
    if allowed.capacity < len(cores) and m.cpu_cores_command is not None:
        # A quota (or SLURM's count) below the cores it may run on: busy is the job's share of its quota.
        m.cpu_util_pct = min(100.0, 100.0 * m.cpu_cores_command / allowed.capacity)

    workers = record.worker_pids
    if not workers:
        _in_process_running_share(m, record, mask, training)
        return
    # A worker's state only says something about its batches while it is making one: between
    # batches it sleeps on its index queue whatever the cause of slowness.
    fetching = {f.pid: f.rows[np.argsort(f.rows.t_start)] for f in record.fetches if f.pid in workers and len(f.rows)}
    states, threads, rss, cores_full = [], [], [], []
    for i in np.flatnonzero(mask):
        idle = len(cores) - float(np.nansum(s.cpu_pct[i, cores])) / 100.0
        for row in s.procs[i]:
            if row.pid in workers:
                threads.append(row.threads)
                rss.append(row.rss_b)
                if _inside_a_fetch(fetching.get(row.pid), s.t[i]):
                    states.append(row.status)
                    cores_full.append(idle < th.WHATIF_CONTENDED_IDLE_CORES)
    if states:
        m.worker_running_share = sum(st == RUNNING for st in states) / len(states)
        m.worker_state_readings = len(states)
        # Runnable with a core idle is not waiting for one: 2 workers sleeping 1 ms at a time on 2
        # idle cores read "running" in 18 of 29 readings (bench/what_if.py's short-epochs record).
        m.worker_core_wait_share = sum(st == RUNNING and full for st, full in zip(states, cores_full)) / len(states)
    if threads:
        m.worker_threads_median = float(np.median([t for t in threads if t is not None] or [np.nan]))
        m.worker_rss_max_b = float(max((r for r in rss if r is not None), default=np.nan))


def _other_programs(record: RunRecord, window: tuple[float, float]) -> list[dict[str, Any]]:
    readings = [rows for t, rows in record.samples.others if window[0] <= t <= window[1]]
    if not readings:
        return []
    cores: dict[int, float] = {}
    names: dict[int, str] = {}
    for rows in readings:
        for row in rows:
            cores[row.pid] = cores.get(row.pid, 0.0) + row.cores
            names[row.pid] = row.name
    programs = [{"pid": pid, "name": names[pid], "cores": total / len(readings)} for pid, total in cores.items()]
    return sorted((p for p in programs if p["cores"] >= th.OTHER_PROGRAM_MIN_CORES), key=lambda p: -p["cores"])


def _in_process_running_share(m: Metrics, record: RunRecord, mask: np.ndarray, training: Any) -> None:
    """num_workers=0: the training process makes each batch inside next(). Its state then tells a
    process waiting for a core (a host busy with other programs, a CPU quota) from one asleep on
    I/O, as the workers' states do for them: its CPU time alone would call both "asleep"."""
    if training is None or training.worker_pids or m.offload is not None:
        return
    its = [it for it in record.iterators if it.key == (training.pid, training.loader_id) and len(it.steps)]
    if not its:
        return
    inside_next = _made_in_next(StepRows.concat(it.steps for it in its))
    inside_next = inside_next[np.argsort(inside_next.t_start)]
    s = record.samples
    states = [row.status for i in np.flatnonzero(mask) for row in s.procs[i]
              if row.pid == training.pid and _inside_a_fetch(inside_next, s.t[i])]
    if states:
        m.worker_running_share = sum(st == RUNNING for st in states) / len(states)
        m.worker_state_readings = len(states)


def _inside_a_fetch(rows: FetchRows | None, t: float) -> bool:
    """Whether time ``t`` falls inside one of a worker's fetches (rows sorted by start)."""
    if rows is None:
        return False
    k = int(np.searchsorted(rows.t_start, t, side="right")) - 1
    return k >= 0 and t <= rows.t_end[k]


def _gpu_metrics(m: Metrics, record: RunRecord, window: tuple[float, float], training: Any) -> None:
    its = [it for it in record.iterators if training is not None and training.owns(it)]
    cuda = CudaRows.concat(it.cuda for it in its)
    if len(cuda):
        m.cuda_used = True
        idle = []
        for it in its:
            in_window = {int(i) for i, t in zip(it.steps.index, it.steps.t_request) if window[0] <= t <= window[1]}
            idle.extend(g for i, g in zip(it.cuda.index, it.cuda.gpu_idle_s) if int(i) in in_window)
        if m.wall_s and idle and m.steps:
            # Events the GPU had not reached by the end were dropped: scale by the share resolved.
            m.gpu_idle_share = float(sum(idle) / m.wall_s * m.steps / len(idle))
        m.cuda_mem_allocated_peak_b = _max(cuda.mem_peak_b)
        m.cuda_mem_reserved_max_b = _max(cuda.mem_reserved_b)
    h2d = record.h2d
    if len(h2d):
        m.cuda_used = True
        inside = h2d[(h2d.t >= window[0]) & (h2d.t <= window[1])]
        pageable = inside[inside.pinned == 0]
        if m.wall_s:
            m.h2d_pageable_share = _copy_seconds(pageable) / m.wall_s
        if m.steps:
            m.h2d_bytes_per_step = float(inside.bytes.sum() / m.steps)
        _copy_kinds(m, inside)

    gpus = record.samples.gpus
    if not gpus:
        return
    mask = _in_window(record, window)
    # The training process's own GPUs where known (each DDP rank's, not pooled over the job's), else the job's.
    used, m.gpu_match = own_gpus(record, training.pid) if training is not None else ([], None)
    if not [i for i in used if i in gpus]:
        used, m.gpu_match = gpus_used(record)
    used = [i for i in used if i in gpus]
    if not used:
        return  # several GPUs, none known to be the job's: N/A, never an average over unrelated ones
    names = {d.get("index"): d.get("name") for d in record.meta.sampler.get("gpus") or []}
    m.gpu_indices, m.gpu_names = used, [names.get(i) for i in used]
    util = np.concatenate([gpus[i]["util_pct"][mask] for i in used])
    m.gpu_util_p5_pct, m.gpu_util_p50_pct, m.gpu_util_p95_pct = (_pct(util, q) for q in (5, 50, 95))
    m.gpu_mem_used_max_b = _max(np.concatenate([gpus[i]["mem_used_b"][mask] for i in used]))
    m.gpu_mem_total_b = _max(np.concatenate([gpus[i]["mem_total_b"] for i in used]))
    for name in ("sm_active", "sm_occupancy", "tensor_active"):
        series = np.concatenate([gpus[i][f"{name}_pct"][mask] for i in used])
        setattr(m, f"gpu_{name}_p50_pct", _pct(series, 50) if np.isfinite(series).any() else None)
    if m.gpu_sm_active_p50_pct is None:
        reasons = sorted({record.samples.gpm_na[i] for i in used if i in record.samples.gpm_na})
        m.gpu_gpm_na = "; ".join(reasons) if reasons else "not recorded"


def _copy_kinds(m: Metrics, inside: H2dRows) -> None:
    """Which copies stall the GPU (pinned ones on the steps' stream: the kernels queued after them wait,
    whatever the host does), and what the pageable ones are made by."""
    on_step = inside.on_step_stream
    pinned = inside.pinned == 1
    if m.wall_s and np.isfinite(on_step[pinned]).any():
        m.h2d_stall_share = _copy_seconds(inside[pinned & (on_step == 1)]) / m.wall_s
    pageable = ~pinned
    api, asked = inside.api[pageable], inside.non_blocking[pageable]
    nbytes = inside.bytes[pageable]
    known = np.isfinite(api)
    if known.any() and nbytes[known].sum() > 0:
        m.h2d_pageable_outside_loader_share = float(nbytes[known & (api != 0)].sum() / nbytes[known].sum())
        m.h2d_pageable_non_blocking_share = float(nbytes[known & (asked == 1)].sum() / nbytes[known].sum())


def _copy_seconds(rows: H2dRows) -> float:
    """The copies' own time: CUDA events around each copy (copy_s), scaled up for copies whose events
    were never resolved. Records without events (older ones) have only the host's time, which also
    holds the wait for GPU work queued before a blocking copy."""
    timed = np.isfinite(rows.copy_s)
    if timed.any():
        return float(rows.copy_s[timed].sum() * len(rows) / timed.sum())
    return float(rows.host_s.sum())


def _max(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return float(values.max()) if len(values) else None
