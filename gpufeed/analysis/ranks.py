"""Several ranks: per-rank numbers (``RankSummary``), the job's throughput, and how ranks ended.
The rules that read them, ``straggler_rank`` and ``load_imbalance``, are in ``rules/ranks.py``.

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
from typing import Any

import numpy as np

from gpufeed import thresholds as th
from gpufeed.analysis.gpus import process_gpus
from gpufeed.analysis.intervals import merge_spans
from gpufeed.analysis.metrics import LoaderSummary, Metrics, compute, evaluation_pauses, marked_training, pick_training
from gpufeed.analysis.rank_summary import RankSummary
from gpufeed.analysis.rank_switches import rank_switches
from gpufeed.analysis.steps import loader_steps
from gpufeed.record import schema
from gpufeed.record.merge import PID_STRIDE
from gpufeed.record.reader import RunRecord


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
    switches = rank_switches(record)
    if switches is not None and m.autotuned is not None:
        m.autotuned["ranks"] = switches.to_dict()
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
        _rank, exit_code, _first = reported
        summary.exit_code, summary.exit_code_source = exit_code, "launcher"
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
    return {int(row.pid) for procs in record.samples.procs for row in procs}


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


# -- the ranks' histograms -----------------------------------------------------------------------------
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
