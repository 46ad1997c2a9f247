"""Several ranks: per-rank numbers, the job's throughput, and the ``straggler_rank`` and
``load_imbalance`` rules.

In data-parallel training (DistributedDataParallel under torchrun, Lightning, accelerate...) every
rank runs the same step and meets the others at the gradient all-reduce, so one rank whose loader
is slow holds every rank back there: the GPUs idle on all ranks while only one has the problem.

Time in the collective is not measured directly. DDP's all-reduce is started by the reducer's
autograd hooks in C++, so patching ``torch.distributed``'s Python functions would not see it, and
with NCCL it runs asynchronously on the GPU anyway. It shows in what the probe already records:
a rank that waits for another at the all-reduce has a longer step *compute* (delivery of its batch
to the request of the next) while its own data wait stays low. ``sync_wait_p50_ms`` is that excess
over the rank with the shortest compute.

A process counts as a rank when it iterated a DataLoader; its rank comes from the environment its
launcher set (``RANK``, or ``SLURM_PROCID`` etc., see the probe), and is ``None`` under a launcher
that sets none (such a rank is named by its pid).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufeed import thresholds as th
from gpufeed.analysis.findings import Finding, severity_for
from gpufeed.analysis.gpus import process_gpus
from gpufeed.analysis.metrics import (LoaderSummary, Metrics, compute, evaluation_pauses, marked_training, merge_spans,
                                      pick_training)
from gpufeed.analysis.steps import loader_steps
from gpufeed.record import schema
from gpufeed.record.merge import PID_STRIDE
from gpufeed.record.reader import RunRecord
from gpufeed.units import fmt

if TYPE_CHECKING:  # rules.py imports this module for its rule list
    from gpufeed.analysis.rules import Context


@dataclass
class RankSummary:
    """One training process of a multi-rank job, measured over its own window after warm-up."""

    rank: int | None              # RANK (or the launcher's equivalent); None if its launcher set none
    local_rank: int | None
    world_size: int | None
    host: str | None
    pid: int                      # as on its host
    steps_total: int              # batches its training loop took, warm-up included
    steps: int                    # measured (after warm-up)
    samples: int
    samples_per_s: float | None
    data_wait_share: float | None
    data_wait_p50_ms: float | None
    step_time_p50_ms: float | None
    step_time_p90_ms: float | None
    step_time_mean_ms: float | None
    compute_p50_ms: float | None
    sync_wait_p50_ms: float | None   # compute p50 above the rank with the shortest: waiting for the others
    gpu_util_p50_pct: float | None
    # Jensen-Shannon distance of this rank's histogram from the other ranks' pooled one (load_imbalance)
    step_time_js_distance: float | None
    gpu_util_js_distance: float | None
    end: str | None               # how the process ended: "exit", "sigterm", "steps_reached"; None: killed
    exit_code: int | None         # the launcher's report (torchrun), else what the process said (sys.exit, an exception)
    exit_code_source: str | None  # "launcher" or "process"
    error: str | None             # the uncaught exception it died of, if any
    ended_at_s: float | None      # when it ended, seconds after the run started
    window_start_t: float | None = None   # its measured window, on the record's clock
    window_end_t: float | None = None

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"


@dataclass
class _Rank:
    """A rank while it is being analysed: its summary, metrics, loader and step times."""

    summary: RankSummary
    metrics: Metrics
    loader: LoaderSummary
    step_times_s: np.ndarray
    gpu_util_pct: np.ndarray


# -- metrics ----------------------------------------------------------------------------------------
def job_metrics(record: RunRecord, loaders: list[LoaderSummary]) -> tuple[Metrics, LoaderSummary | None]:
    """The run's metrics and the loader they describe.

    One training process: exactly ``metrics.compute``. Several: the metrics of the rank whose
    loader held the job back most (the largest data-wait share), with ``samples_per_s`` replaced by
    the job's throughput and ``ranks`` filled in.
    """
    trainers = training_loaders(loaders)
    if len(trainers) < 2:
        training = marked_training(loaders)
        return compute(record, loaders, training), training
    for s in loaders:
        s.training = any(s is t for t in trainers)
    ranks = [_measure_rank(record, loaders, t) for t in trainers]
    _fill_sync_wait(ranks)
    _fill_distances(ranks)
    ranks.sort(key=lambda r: (r.summary.rank is None, r.summary.rank or 0, r.summary.pid))
    focus = max(ranks, key=lambda r: r.summary.data_wait_share or -1.0)
    m = focus.metrics
    m.focus_rank = focus.summary.rank
    m.ranks = [r.summary for r in ranks]
    m.samples_per_s = _job_samples_per_s(record, ranks)
    return m, focus.loader


def training_loaders(loaders: list[LoaderSummary]) -> list[LoaderSummary]:
    """Each process's training loader, for the processes that took steps (``metrics.pick_training``)."""
    return pick_training(loaders)


def _measure_rank(record: RunRecord, loaders: list[LoaderSummary], loader: LoaderSummary) -> _Rank:
    part = _part_of(record, loader.pid)
    # A merged record: the rank's host numbers (CPU, memory, cores) are those of its own node.
    view = dataclasses.replace(record, samples=part.samples, meta=part.meta) if part is not record else record
    m = compute(view, loaders, loader)
    proc = next((p for p in record.processes if p.get("pid") == loader.pid), {})
    step_times = _step_times(record, loader, m)
    util = _gpu_util(part, loader.pid, proc.get("local_rank"), m)
    reported = _launcher_failures(part).get(loader.pid - part.pid_offset)
    ended = record.ends.get(loader.pid, {})
    summary = RankSummary(
        rank=proc.get("rank"), local_rank=proc.get("local_rank"), world_size=proc.get("world_size"),
        host=proc.get("host"), pid=loader.pid - part.pid_offset,
        steps_total=loader.steps, steps=m.steps, samples=m.samples,
        samples_per_s=m.samples_per_s, data_wait_share=m.data_wait_share, data_wait_p50_ms=m.data_wait_p50_ms,
        step_time_p50_ms=m.step_time_p50_ms, step_time_p90_ms=m.step_time_p90_ms,
        step_time_mean_ms=float(step_times.mean() * 1000.0) if len(step_times) else None,
        compute_p50_ms=m.compute_p50_ms, sync_wait_p50_ms=None,
        gpu_util_p50_pct=float(np.median(util)) if len(util) else None,
        step_time_js_distance=None, gpu_util_js_distance=None, end=record.exits.get(loader.pid),
        exit_code=None, exit_code_source=None, error=ended.get("error"),
        ended_at_s=ended["t"] - record.meta.t_start if "t" in ended else None,
    )
    summary.window_start_t, summary.window_end_t = m.window_start_t, m.window_end_t
    if reported is not None:
        summary.exit_code, summary.exit_code_source = reported[1], "launcher"
    elif ended.get("exit_code") is not None:
        summary.exit_code, summary.exit_code_source = ended["exit_code"], "process"
    return _Rank(summary, m, loader, step_times, util)


def _part_of(record: RunRecord, pid: int) -> RunRecord:
    """The node's own record that holds ``pid`` (the record itself unless it was merged)."""
    return next((p for p in record.parts if p.pid_offset <= pid < p.pid_offset + PID_STRIDE), record)


def _step_times(record: RunRecord, loader: LoaderSummary, m: Metrics) -> np.ndarray:
    """Request to next request, for the steps requested in the rank's measured window."""
    if m.window_start_t is None:
        return np.empty(0)
    steps = loader_steps(record, loader)
    inside = (steps.t_request >= m.window_start_t) & (steps.t_request <= m.window_end_t)
    inside &= np.isfinite(steps.next_request)  # an iterator's last step has no next request
    return (steps.next_request - steps.t_request)[inside]


def _gpu_util(record: RunRecord, pid: int, local_rank: int | None, m: Metrics) -> np.ndarray:
    """NVML utilization of the GPUs on which this process held memory, during its window. Where NVML
    names no process of ours (in a container it reports the host's pids), the GPU numbered like the
    rank's LOCAL_RANK: the usual torch.cuda.set_device(local_rank)."""
    s = record.samples
    if not s.gpus or m.window_start_t is None:
        return np.empty(0)
    mine = {idx for per_gpu in s.gpu_procs for idx, pids in per_gpu.items() if pid in pids}
    mine = mine or set(process_gpus(record, pid))  # the device its torch reported (analysis/gpus.py)
    if not mine and local_rank in s.gpus and not any(pids for per_gpu in s.gpu_procs for pids in per_gpu.values()
                                                     if set(pids) & _tree_pids(record)):
        mine = {local_rank}
    mask = (s.t >= m.window_start_t) & (s.t <= m.window_end_t)
    values = [s.gpus[i]["util_pct"][mask] for i in sorted(mine) if i in s.gpus]
    util = np.concatenate(values) if values else np.empty(0)
    return util[np.isfinite(util)]


def _tree_pids(record: RunRecord) -> set[int]:
    return {int(row[0]) for procs in record.samples.procs for row in procs}


def _fill_sync_wait(ranks: list[_Rank]) -> None:
    computes = [r.summary.compute_p50_ms for r in ranks if r.summary.compute_p50_ms is not None]
    if not computes:
        return
    fastest = min(computes)
    for r in ranks:
        if r.summary.compute_p50_ms is not None:
            r.summary.sync_wait_p50_ms = r.summary.compute_p50_ms - fastest


def _fill_distances(ranks: list[_Rank]) -> None:
    """Each rank's step-time and GPU-utilization histograms against the other ranks' pooled ones."""
    for measure in ("step_time", "gpu_util"):
        values = [r.step_times_s if measure == "step_time" else r.gpu_util_pct for r in ranks]
        usable = [i for i, v in enumerate(values) if len(v) >= th.IMBALANCE_MIN_VALUES]
        if len(usable) < 2:
            continue
        bins = _bins(np.concatenate([values[i] for i in usable]), measure)
        for i in usable:
            rest = np.concatenate([values[j] for j in usable if j != i])
            d = js_distance(np.histogram(values[i], bins)[0], np.histogram(rest, bins)[0])
            setattr(ranks[i].summary, f"{measure}_js_distance", d)


def _job_samples_per_s(record: RunRecord, ranks: list[_Rank]) -> float | None:
    """All ranks' samples over the window they share: from the latest rank's first measured request
    to the earliest rank's last delivery. Capped by the sum of the ranks' own rates, which are
    corrected for batches prepared before their windows opened (see ``metrics.py``)."""
    measured = [r for r in ranks if r.metrics.window_start_t is not None]
    if not measured:
        return None
    t0 = max(r.metrics.window_start_t for r in measured)
    t1 = min(r.metrics.window_end_t for r in measured)
    own = [r.summary.samples_per_s for r in measured if r.summary.samples_per_s is not None]
    cap = sum(own) if own else None
    if t1 <= t0:
        return cap if len(measured) == 1 else None
    samples = 0.0
    pauses = []
    for r in measured:
        steps = loader_steps(record, r.loader)
        samples += float(np.nansum(steps.samples[(steps.t_request >= t0) & (steps.t_deliver <= t1)]))
        its = [it for it in record.iterators if r.loader.owns(it) and len(it.steps)]
        # One rank's evaluation pauses the job: the others wait for it at their next collective.
        pauses += evaluation_pauses(record, its, t0, t1) if its else []
    rate = samples / max(t1 - t0 - sum(b - a for a, b in merge_spans(pauses)), 1e-9)
    return min(rate, cap) if cap is not None else rate


# -- how ranks ended ----------------------------------------------------------------------------------
# torchrun's failure report (torch.distributed.elastic ChildFailedError) names each failed rank:
#   rank      : 1 (local_rank: 1)
#   exitcode  : 3 (pid: 30566)
_TORCHRUN_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
_ROOT_CAUSE = "Root Cause (first observed failure)"


def _launcher_failures(record: RunRecord) -> dict[int, tuple[int, int, bool]]:
    """pid -> (rank, exit code, first to fail) from the launcher's report in the node's stderr."""
    try:
        text = (record.run_dir / schema.STDERR_FILE).read_text(errors="replace")
    except OSError:
        return {}
    report = text[text.rfind("Failures:"):] if "Failures:" in text else ""
    root = report.find(_ROOT_CAUSE)
    out = {}
    for match in _TORCHRUN_FAILURE.finditer(report):
        out[int(match.group(3))] = (int(match.group(1)), int(match.group(2)), 0 <= root < match.start())
    return out


def rank_warnings(record: RunRecord, m: Metrics) -> list[str]:
    """One sentence per rank that died: who, how, after how many steps, the first to fail first;
    the other ranks' records are kept and diagnosed."""
    if len(m.ranks) < 2 or record.meta.end_reason in (schema.END_INTERRUPTED, schema.END_STALLED):
        return []  # gpufeed itself ended the ranks: none of them died
    first = {pid for part in (record.parts or [record]) for pid, f in _launcher_failures(part).items() if f[2]}
    dead = [r for r in m.ranks if r.exit_code not in (None, 0) or r.error or r.end is None]
    dead.sort(key=lambda r: (r.pid not in first, r.ended_at_s if r.ended_at_s is not None else math.inf))
    out = []
    for i, r in enumerate(dead):
        where = f"{r.label} (pid {r.pid}{' on ' + r.host if r.host else ''})"
        if r.exit_code not in (None, 0):
            how = f"was killed by signal {-r.exit_code}" if r.exit_code < 0 else f"exited with code {r.exit_code}"
            how += " (the launcher's report)" if r.exit_code_source == "launcher" else ""
        elif r.end is None:
            how = "left no end in its record: it was killed (SIGKILL, out of memory?) or crashed in native code,"
        else:
            how = "failed"
        error = f" ({r.error})" if r.error else ""
        if i == 0:
            lead = ", the first rank to fail" if len(dead) > 1 else ""
            out.append(f"{where} {how}{error} after {r.steps_total} steps{lead}; the other ranks' records are kept.")
        else:
            out.append(f"{where} ended next: it {how}{error}, after {r.steps_total} steps.")
    return out


# -- rules ---------------------------------------------------------------------------------------------
def straggler_rank(ctx: "Context") -> Finding | None:
    """One rank waits for data while the others wait for it in the collective."""
    ranks = [r for r in ctx.metrics.ranks if r.data_wait_share is not None and r.compute_p50_ms is not None]
    if len(ranks) < 2:
        return None
    slow = max(ranks, key=lambda r: r.data_wait_share)
    others = [r for r in ranks if r is not slow]
    others_wait = float(np.median([r.data_wait_share for r in others]))
    others_wait_ms = float(np.median([r.data_wait_p50_ms or 0.0 for r in others]))
    extra_compute_ms = float(np.median([r.compute_p50_ms for r in others])) - slow.compute_p50_ms
    extra_wait_ms = (slow.data_wait_p50_ms or 0.0) - others_wait_ms
    if (slow.data_wait_share < th.DATA_WAIT_SHARE_FLAG
            or slow.data_wait_share < th.STRAGGLER_WAIT_RATIO * others_wait
            or extra_wait_ms <= 0 or extra_compute_ms < th.STRAGGLER_SYNC_ABSORBED * extra_wait_ms):
        return None
    host = f" on {slow.host}" if slow.host else ""
    return Finding(
        id="straggler_rank", severity=severity_for(slow.data_wait_share), cost_share=slow.data_wait_share,
        message=(f"{slow.label.capitalize()}{host} waited for data {fmt(slow.data_wait_share, '.0%')} of the time "
                 f"(p50 {fmt(slow.data_wait_p50_ms, '.1f')} ms per step in next(loader)), the other ranks "
                 f"{fmt(others_wait, '.0%')}; they waited for it in the collective instead (their step compute "
                 f"was {extra_compute_ms:.1f} ms longer, p50), so every rank ran at {slow.label}'s pace."),
        recommendation=(f"Fix {slow.label}'s input pipeline (its loader's findings say how): more DataLoader "
                        f"workers there, or its data on storage as fast as the other ranks'; check its host for "
                        "other load. Every rank gains what it loses."),
        evidence={"straggler_rank": slow.rank, "straggler_pid": slow.pid, "data_wait_share": slow.data_wait_share,
                  "data_wait_p50_ms": slow.data_wait_p50_ms, "others_data_wait_share": others_wait,
                  "compute_p50_ms": slow.compute_p50_ms, "others_extra_compute_p50_ms": extra_compute_ms,
                  "job_samples_per_s": ctx.metrics.samples_per_s},
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG, "wait_ratio_to_others": th.STRAGGLER_WAIT_RATIO,
                    "sync_absorbed_share": th.STRAGGLER_SYNC_ABSORBED},
    )


def load_imbalance(ctx: "Context") -> Finding | None:
    """Ranks whose GPU utilization or step time distributions differ (Jensen-Shannon distance)."""
    return _imbalance(ctx.metrics, "gpu_util") or _imbalance(ctx.metrics, "step_time")


def _imbalance(m: Metrics, measure: str) -> Finding | None:
    ranks = [r for r in m.ranks if getattr(r, f"{measure}_js_distance") is not None]
    if len(ranks) < 2:
        return None
    # The rank furthest from the others; between equals (two ranks are always equally far apart),
    # the slower one, or the one with the less busy GPU.
    def apart(r: RankSummary) -> tuple[float, float]:
        slow = -(r.gpu_util_p50_pct or 0.0) if measure == "gpu_util" else (r.step_time_mean_ms or 0.0)
        return round(getattr(r, f"{measure}_js_distance"), 6), slow

    worst = max(ranks, key=apart)
    distance = getattr(worst, f"{measure}_js_distance")
    if distance <= th.IMBALANCE_JS_DISTANCE:
        return None
    # The typical value must differ too, by at least one histogram bin: with few steps, noise alone
    # moves values across bins; and ranks synchronized every step share their mean step time.
    if measure == "gpu_util":
        what, unit, typical = "GPU utilization", "%", {r.label: r.gpu_util_p50_pct for r in ranks}
        known = [v for v in typical.values() if v is not None]
        lo, hi = min(known), max(known)
        if hi - lo < th.IMBALANCE_GPU_UTIL_BIN_PCT:
            return None
        cost, typical_name = (hi - lo) / 100.0, "p50"
    else:
        what, unit, typical = "Step time", " ms", {r.label: r.step_time_mean_ms for r in ranks}
        known = [v for v in typical.values() if v is not None]
        lo, hi = min(known), max(known)
        if lo <= 0 or hi / lo < th.IMBALANCE_STEP_TIME_BIN_RATIO:
            return None
        cost, typical_name = 1.0 - lo / hi, "mean"
    spread = ", ".join(f"{k} {fmt(v, '.1f')}{unit}" for k, v in typical.items())
    return Finding(
        id="load_imbalance", severity=severity_for(cost), cost_share=cost,
        message=(f"{what} differs across ranks: {worst.label}'s distribution is {distance:.2f} apart from the "
                 f"other ranks' (Jensen-Shannon distance of their histograms; {typical_name} {spread})."),
        recommendation=("Give every rank the same work: shard the data evenly (DistributedSampler, drop_last=True), "
                        "bucket samples of similar size across ranks, keep rank-0-only work (logging, checkpoints, "
                        "evaluation) out of the training step, and check that the ranks' hosts and GPUs are alike."),
        evidence={"measure": measure, "rank": worst.rank, "pid": worst.pid, "js_distance": distance,
                  **{f"{typical_name}_{k.replace(' ', '_')}": v for k, v in typical.items()}},
        thresholds={"js_distance": th.IMBALANCE_JS_DISTANCE, "min_values_per_rank": th.IMBALANCE_MIN_VALUES,
                    **({"gpu_util_p50_gap_pct": th.IMBALANCE_GPU_UTIL_BIN_PCT} if measure == "gpu_util"
                       else {"step_time_mean_ratio": th.IMBALANCE_STEP_TIME_BIN_RATIO})},
    )


def _bins(pooled: np.ndarray, measure: str) -> np.ndarray:
    if measure == "gpu_util":
        return np.arange(0.0, 100.0 + th.IMBALANCE_GPU_UTIL_BIN_PCT, th.IMBALANCE_GPU_UTIL_BIN_PCT)
    lo, hi = max(float(pooled.min()), 1e-6), max(float(pooled.max()), 1e-6)
    n = max(1, math.ceil(math.log(hi / lo) / math.log(th.IMBALANCE_STEP_TIME_BIN_RATIO)))
    return lo * th.IMBALANCE_STEP_TIME_BIN_RATIO ** np.arange(n + 1)


def js_distance(p: Any, q: Any) -> float:
    """Jensen-Shannon distance (base 2, in [0, 1]) between two histograms of counts."""
    p = np.asarray(p, dtype=float)
    q = np.asarray(q, dtype=float)
    if p.sum() <= 0 or q.sum() <= 0:
        return 0.0
    p, q = p / p.sum(), q / q.sum()
    mid = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        nz = a > 0
        return float(np.sum(a[nz] * np.log2(a[nz] / mid[nz])))

    return math.sqrt(max(0.0, (kl(p) + kl(q)) / 2))
