"""Memory: what the figures mean, and what they say about the batch size and about leaks.

Four rules, each with the readings it needs (computed here from the record, not in ``metrics.py``):

- ``allocator_cache``: nvidia-smi counts what PyTorch's caching allocator holds (reserved), which is
  more than the live tensors ever needed (allocated peak): the rest is cached free blocks.
- ``batch_too_small``: the step's peak used a small share of the GPU while the GPU was not busy:
  a larger batch fits (memory grows about linearly with it) and usually feeds the GPU better.
- ``memory_growth``: the training process's memory rises step after step, steadily: a leak (the
  classic being a loss kept with its graph), with its rate per step.
- ``worker_memory_growth``: DataLoader workers' private memory grew over their life: copy-on-read
  of Python objects held by the Dataset.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import INFO, LOW, MEDIUM, Finding
from gpufeed.analysis.rules import tf_data
from gpufeed.record.rows import StepRows
from gpufeed.units import fmt, human_bytes


def _training_memory(ctx: Context) -> dict[str, int]:
    """The training process's readings at exit (``exit`` event), if it wrote them."""
    return ctx.record.memory.get(ctx.training.pid, {}) if ctx.training is not None else {}


def _cuda_figures(ctx: Context) -> tuple[float | None, float | None, float | None]:
    """(allocated peak, reserved peak, device capacity), exact at exit when written, else sampled."""
    m, exit_ = ctx.metrics, _training_memory(ctx)
    allocated = exit_.get("cuda_mem_peak_b", m.cuda_mem_allocated_peak_b)
    reserved = exit_.get("cuda_mem_reserved_peak_b", m.cuda_mem_reserved_max_b)
    capacity = exit_.get("cuda_mem_total_b", m.gpu_mem_total_b)
    return allocated, reserved, capacity


def allocator_cache(ctx: Context) -> Finding | None:
    allocated, reserved, capacity = _cuda_figures(ctx)
    if not allocated or not reserved or reserved < th.ALLOCATOR_CACHE_RATIO * allocated:
        return None
    cache = reserved - allocated
    bar = th.ALLOCATOR_CACHE_MIN_SHARE * capacity if capacity else th.ALLOCATOR_CACHE_MIN_B
    if cache < bar:
        return None
    used = ctx.metrics.gpu_mem_used_max_b
    seen = (f"nvidia-smi showed up to {human_bytes(used)} used"
            + (f" ({fmt(used / capacity, '.0%')} of {human_bytes(capacity)})" if capacity else "") + "; "
            if used else "")
    return Finding(
        id="allocator_cache", severity=INFO, cost_share=None, group="memory",
        message=(f"{seen}PyTorch's caching allocator reserved up to {human_bytes(reserved)}, but live tensors "
                 f"peaked at {human_bytes(allocated)}: {human_bytes(cache)} of it is cached free blocks, kept for "
                 "reuse. That is neither a leak nor a full GPU."),
        recommendation=("Nothing to fix for speed. If another process needs the memory, torch.cuda.empty_cache() "
                        "hands the cache back; if you hit out-of-memory while much is reserved but unallocated "
                        "(fragmentation, torch.cuda.memory_summary() shows it), set "
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."),
        evidence={"cuda_mem_reserved_peak_b": reserved, "cuda_mem_allocated_peak_b": allocated,
                  "cache_b": cache, "gpu_mem_used_max_b": used, "gpu_mem_total_b": capacity,
                  "reserved_over_allocated": reserved / allocated},
        thresholds={"reserved_over_allocated": th.ALLOCATOR_CACHE_RATIO, "cache_b": bar},
    )


def batch_too_small(ctx: Context) -> Finding | None:
    m = ctx.metrics
    _allocated, reserved, capacity = _cuda_figures(ctx)
    batch = ctx.training.config.get("batch_size") if ctx.training is not None else None
    if not reserved or not capacity or not batch:
        return None
    share = reserved / capacity
    busy = m.gpu_util_p95_pct is not None and m.gpu_util_p95_pct >= th.BATCH_HEADROOM_GPU_UTIL_P95_PCT
    if share >= th.BATCH_HEADROOM_MAX_SHARE or busy:
        return None
    # memory = a + b x batch with a > 0: the batch can grow by at least target x capacity / peak.
    factor = th.BATCH_TARGET_SHARE * capacity / reserved
    util = f"; GPU utilization p95 was {fmt(m.gpu_util_p95_pct, '.0f')}%" if m.gpu_util_p95_pct is not None else ""
    return Finding(
        id="batch_too_small", severity=LOW, cost_share=None, group="memory",
        message=(f"The training process used at most {human_bytes(reserved)} of the GPU's {human_bytes(capacity)} "
                 f"({share:.0%}) with batch_size={batch}{util}: memory grows about linearly with the batch, so a "
                 f"batch at least {factor:.1f}x larger fits, and a larger batch is the cheapest way to keep a fast "
                 "GPU busy."),
        recommendation=("`gpufeed batch-size -- CMD` finds the largest batch that fits and the size beyond which "
                        "throughput stops improving; scale the learning rate with the batch."),
        evidence={"cuda_mem_reserved_peak_b": reserved, "gpu_mem_total_b": capacity, "memory_share": share,
                  "batch_size": batch, "batch_factor_at_least": factor, "gpu_util_p95_pct": m.gpu_util_p95_pct},
        thresholds={"memory_share_below": th.BATCH_HEADROOM_MAX_SHARE,
                    "gpu_util_p95_pct_below": th.BATCH_HEADROOM_GPU_UTIL_P95_PCT},
    )


@dataclass(frozen=True)
class Growth:
    """A straight line through (steps done, bytes) readings."""

    what: str
    start_b: float
    end_b: float
    per_step_b: float
    r2: float
    steps: int
    points: int


def _line(steps: np.ndarray, values: np.ndarray, what: str) -> Growth | None:
    keep = np.isfinite(steps) & np.isfinite(values)
    steps, values = steps[keep], values[keep]
    if len(values) < th.MEMORY_GROWTH_MIN_POINTS or np.ptp(steps) <= 0:
        return None
    slope, intercept = np.polyfit(steps, values, 1)
    total = float(((values - values.mean()) ** 2).sum())
    r2 = 1.0 - float(((values - (intercept + slope * steps)) ** 2).sum()) / total if total > 0 else 0.0
    return Growth(what, float(values[0]), float(values[-1]), float(slope), r2, int(np.ptp(steps)), len(values))


def training_growth(ctx: Context) -> Growth | None:
    """Memory of the training process against steps, over the measured window: CUDA allocated
    memory (sampled by the probe every 0.5 s) when CUDA is used, else its resident set (sampler)."""
    t = ctx.training
    if t is None:
        return None
    its = [it for it in ctx.record.iterators if t.owns(it) and len(it.steps)]
    if not its:
        return None
    steps = StepRows.concat(it.steps for it in its)
    steps = steps[np.argsort(steps.t_deliver)]
    warmup = min(ctx.metrics.warmup_steps, max(len(steps) - 2, 0))
    t0 = steps.t_request[warmup] if len(steps) > warmup else np.inf
    if any(len(it.cuda) for it in its):
        # Step indices restart with each epoch's iterator: number the steps across the run.
        offsets = np.cumsum([0] + [len(it.steps) for it in its[:-1]])
        step = np.concatenate([it.cuda.index + offset for it, offset in zip(its, offsets) if len(it.cuda)])
        allocated = np.concatenate([it.cuda.mem_allocated_b for it in its if len(it.cuda)])
        kept = (step >= warmup) & np.isfinite(allocated)
        step, allocated = step[kept], allocated[kept]
        order = np.argsort(step)
        return _line(step[order], allocated[order], "allocated CUDA memory")
    s = ctx.record.samples
    times, rss = [], []
    # Readings after the last step are left out: as the loop ends, the process frees what it held
    # (a leak of 1 GB fell back to 600 MB once the last step was taken) while the step count stands.
    t_last = steps.t_deliver[-1]
    for i in np.flatnonzero((s.t >= t0) & (s.t <= t_last)):
        for row in s.procs[i]:
            if row.pid == t.pid and row.rss_b:
                times.append(s.t[i])
                rss.append(row.rss_b)
    done = np.searchsorted(steps.t_deliver, np.array(times, dtype=float))  # steps delivered by each reading
    return _line(done.astype(float), np.array(rss, dtype=float), "resident memory")


def memory_growth(ctx: Context) -> Finding | None:
    g = training_growth(ctx)
    if tf_data.pipeline(ctx) is not None:
        return None  # TensorFlow's profiler, which gpufeed runs there, keeps its trace in memory: not a leak
    if g is None or g.r2 < th.MEMORY_GROWTH_MIN_R2 or g.per_step_b <= 0:
        return None
    grown = g.per_step_b * g.steps
    if grown < th.MEMORY_GROWTH_MIN_B or grown < th.MEMORY_GROWTH_MIN_SHARE * g.start_b:
        return None
    return Finding(
        id="memory_growth", severity=MEDIUM, cost_share=None, group="memory",
        message=(f"The training process's {g.what} rose steadily from {human_bytes(g.start_b)} to "
                 f"{human_bytes(g.end_b)} over {g.steps} steps, {human_bytes(g.per_step_b)} per step "
                 f"(R² {g.r2:.2f}): memory that grows step after step is a leak, and the run will end out of memory."),
        recommendation=("Find what is kept across steps: accumulate loss.item() (or loss.detach()), not the loss "
                        "tensor with its graph; detach outputs you store; clear lists of tensors. "
                        "torch.cuda.memory._record_memory_history() (CUDA) or tracemalloc (CPU) shows what grows."),
        evidence={"bytes": grown, "memory": g.what, "start_b": g.start_b, "end_b": g.end_b, "per_step_b": g.per_step_b,
                  "grown_b": grown, "r2": g.r2, "steps": g.steps, "readings": g.points},
        thresholds={"r2": th.MEMORY_GROWTH_MIN_R2, "grown_b": th.MEMORY_GROWTH_MIN_B,
                    "grown_share_of_start": th.MEMORY_GROWTH_MIN_SHARE},
    )


def worker_memory_growth(ctx: Context) -> Finding | None:
    """Workers' private memory grew. Copy-on-read is claimed only with its evidence: the workers'
    shared pages fell as their private ones rose (a forked page turns private when written); else the
    growth is named for what it is, memory the worker allocated itself (a cache, decoded samples kept)."""
    t = ctx.training
    if t is None or not t.worker_pids:
        return None
    grown, turned_private, produced = [], [], 0.0
    for pid in t.worker_pids:
        readings = ctx.record.memory.get(pid, {})
        if "uss_start_b" in readings and "uss_b" in readings:
            grown.append(readings["uss_b"] - readings["uss_start_b"])
            if "shared_start_b" in readings and "shared_b" in readings:
                turned_private.append(readings["shared_start_b"] - readings["shared_b"])
            produced += sum(float(np.nansum(f.rows.samples)) for f in ctx.record.fetches if f.pid == pid)
    if not grown:
        return None
    total, rss = float(sum(grown)), ctx.metrics.worker_rss_max_b
    per_worker = total / len(grown)
    # What the copies cost is the memory held at once: workers started again each epoch never live
    # together (the demo's one worker, started 3 times, copied 29 MiB each: 29 MiB held, not 87).
    together = min(len(grown), int(t.config.get("num_workers") or len(grown)))
    at_once = per_worker * together
    if at_once < th.MEMORY_GROWTH_MIN_B or (rss and per_worker < th.MEMORY_GROWTH_MIN_SHARE * rss):
        return None
    shared_fell = sum(turned_private) / len(turned_private) if turned_private else None
    copy_on_read = shared_fell is not None and shared_fell >= th.COPY_ON_READ_SHARED_SHARE * per_worker
    alive = (f"{together} alive at once" if together < len(grown) else f"all {together} alive together")
    evidence = {"bytes": at_once, "workers": len(grown), "workers_alive_together": together,
                "uss_growth_per_worker_b": per_worker, "uss_growth_held_at_once_b": at_once,
                "shared_fall_per_worker_b": shared_fell, "worker_rss_max_b": rss, "samples_produced": produced,
                "uss_growth_per_1k_samples_b": total / produced * 1000 if produced else None}
    thresholds = {"uss_growth_held_at_once_b": th.MEMORY_GROWTH_MIN_B,
                  "uss_growth_share_of_rss": th.MEMORY_GROWTH_MIN_SHARE,
                  "shared_fall_share_of_growth": th.COPY_ON_READ_SHARED_SHARE}
    if copy_on_read:
        return Finding(
            id="worker_memory_growth", severity=MEDIUM, cost_share=None, group="memory",
            message=(f"{len(grown)} DataLoader worker processes ({alive}) each copied {human_bytes(per_worker)} of the "
                     f"memory they shared with the training process, {human_bytes(at_once)} held at once: their shared "
                     f"pages fell by {human_bytes(shared_fell)} each as their private ones rose (resident set "
                     f"{human_bytes(rss)} each, which hides it). That is copy-on-read: reading a Python object writes "
                     "its reference count, so every page of Python objects a worker reads becomes its own copy."),
            recommendation=("Hold the Dataset's samples in a few large objects instead of many small ones: numpy arrays "
                            "or torch tensors (strings as one bytes buffer plus offsets), or read them from disk in "
                            "__getitem__ (pytorch/pytorch#13246)."),
            evidence=evidence, thresholds=thresholds)
    why = ("their shared pages did not fall as much, so this is not copy-on-read" if shared_fell is not None
           else "shared memory was not read, so whether it is copy-on-read cannot be told")
    return Finding(
        id="worker_memory_growth", severity=LOW, cost_share=None, group="memory",
        message=(f"{len(grown)} DataLoader worker processes ({alive}) each grew their private memory by "
                 f"{human_bytes(per_worker)}, {human_bytes(at_once)} held at once; {why}: the workers allocate it "
                 "themselves (a cache in the Dataset, decoded samples kept, a library's buffers)."),
        recommendation=("Find what __getitem__ or the transforms keep between samples (tracemalloc started in "
                        "worker_init_fn shows it); bound any cache, or share one built before the workers fork."),
        evidence=evidence, thresholds=thresholds)
