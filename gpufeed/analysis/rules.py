"""One rule per question. Each reads the metrics (and the record where it must) and returns a
``Finding`` carrying its evidence and the thresholds it used, or ``None`` when it stays quiet."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gpufeed import thresholds as th
from gpufeed.analysis import memory
from gpufeed.analysis.findings import INFO, HIGH, Finding, severity_for
from gpufeed.analysis.metrics import LoaderSummary, Metrics
from gpufeed.analysis.ranks import load_imbalance, straggler_rank
from gpufeed.units import fmt
from gpufeed.record import schema
from gpufeed.record.reader import RunRecord


@dataclass
class Context:
    record: RunRecord
    metrics: Metrics
    training: LoaderSummary | None   # the loader the training loop iterated most


Rule = Callable[[Context], "Finding | None"]


# -- shared facts ------------------------------------------------------------------------------------
def _input_bound(m: Metrics) -> bool:
    return m.data_wait_share is not None and m.data_wait_share >= th.DATA_WAIT_SHARE_FLAG


def _host_saturated(m: Metrics) -> bool:
    return m.cpu_util_pct is not None and m.cpu_util_pct >= th.CPU_SATURATED_PCT


def _workers_asleep(m: Metrics) -> bool:
    """Off the CPU for most of their fetch time, and not because they queue for a core."""
    return (m.worker_fetch_cpu_ratio is not None and m.worker_fetch_cpu_ratio < th.WORKER_ASLEEP_CPU_RATIO
            and not _workers_runnable(m))


def _workers_runnable(m: Metrics) -> bool:
    """The sampler mostly saw the workers runnable (state R): they want a core, they are not waiting on I/O."""
    return m.worker_running_share is not None and m.worker_running_share >= th.WORKER_RUNNABLE_SHARE


def _others_sentence(m: Metrics) -> str:
    """Say so when programs outside the command take a large part of the busy CPU."""
    if m.cpu_cores_command is None or m.cpu_cores_busy is None:
        return ""
    others = m.cpu_cores_busy - m.cpu_cores_command
    if others < th.OTHER_PROGRAMS_CORES:
        return ""
    return f" Other programs used {others:.1f} of the {m.cpu_count} cores; the command used {m.cpu_cores_command:.1f}."


def _wait_sentence(m: Metrics) -> str:
    who = "The GPU" if m.cuda_used else "The training loop"
    if m.focus_rank is not None:
        who += f" of rank {m.focus_rank}"
    return (f"{who} waited for data {fmt(m.data_wait_share, '.0%')} of the time "
            f"(p50 step {fmt(m.step_time_p50_ms, '.0f')} ms, of which {fmt(m.data_wait_p50_ms, '.0f')} ms in next(loader))")


def _wait_evidence(m: Metrics) -> dict:
    return {"data_wait_share": m.data_wait_share, "step_time_p50_ms": m.step_time_p50_ms,
            "data_wait_p50_ms": m.data_wait_p50_ms, "compute_p50_ms": m.compute_p50_ms,
            "samples_per_s": m.samples_per_s, "gpu_idle_share": m.gpu_idle_share}


def _worker_cap(m: Metrics) -> int:
    """Workers a CPU-bound loader can use: every core, less one for a training step that runs on the
    CPU itself (with CUDA the main process mostly waits on the GPU)."""
    return m.cpu_count if m.cuda_used else max(1, m.cpu_count - 1)


def _cpu_ms_per_sample(m: Metrics) -> float | None:
    if m.loader_cpu_bound_samples_per_s:
        return m.cpu_count / m.loader_cpu_bound_samples_per_s * 1000.0
    return None


def _tune_hint() -> str:
    return "(`gpufeed tune` measures it)"


# -- the rules ---------------------------------------------------------------------------------------
def too_few_workers(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if not _input_bound(m) or m.num_workers is None or _host_saturated(m) or _workers_asleep(m):
        return None
    suggested = min(max(m.workers_needed or 0, m.num_workers + 1), _worker_cap(m))
    if suggested <= m.num_workers:
        return None
    return Finding(
        id="too_few_workers", severity=severity_for(m.data_wait_share), cost_share=m.data_wait_share,
        message=(f"{_wait_sentence(m)} while the CPU was only {fmt(m.cpu_util_pct, '.0f')}% busy: the DataLoader has "
                 f"num_workers={m.num_workers} on {m.cpu_count} cores and preparing a batch is CPU work "
                 f"({fmt(m.fetch_ms_per_batch_p50, '.0f')} ms each)."),
        recommendation=f"DataLoader(..., num_workers={suggested}) {_tune_hint()}.",
        evidence={**_wait_evidence(m), "num_workers": m.num_workers, "cpu_count": m.cpu_count,
                  "cpu_util_pct": m.cpu_util_pct, "fetch_ms_per_batch_p50": m.fetch_ms_per_batch_p50,
                  "worker_fetch_cpu_ratio": m.worker_fetch_cpu_ratio, "workers_needed": m.workers_needed},
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG, "cpu_util_pct_below": th.CPU_SATURATED_PCT,
                    "worker_fetch_cpu_ratio_at_least": th.WORKER_ASLEEP_CPU_RATIO},
    )


def cpu_saturated(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if (not _input_bound(m) or not _host_saturated(m) or _workers_asleep(m)
            or (m.num_workers or 0) > m.cpu_count):
        return None
    cpu_ms = _cpu_ms_per_sample(m)
    cost = f" ({fmt(cpu_ms, '.1f')} ms of CPU per sample)" if cpu_ms else ""
    return Finding(
        id="cpu_saturated", severity=severity_for(m.data_wait_share), cost_share=m.data_wait_share,
        message=(f"{_wait_sentence(m)} and all {m.cpu_count} cores were {fmt(m.cpu_util_pct, '.0f')}% busy: "
                 f"the CPU cannot prepare batches faster, so more workers cannot help.{_others_sentence(m)}"),
        recommendation=(f"Make each sample cheaper to prepare{cost}: decode smaller images, cache decoded "
                        "samples, move augmentation to the GPU; or run on more CPU cores."),
        evidence={**_wait_evidence(m), "cpu_util_pct": m.cpu_util_pct, "cpu_count": m.cpu_count,
                  "cpu_cores_command": m.cpu_cores_command, "num_workers": m.num_workers,
                  "loader_cpu_ms_per_sample": cpu_ms},
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG, "cpu_util_pct": th.CPU_SATURATED_PCT},
    )


def storage_latency(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if not _input_bound(m) or not _workers_asleep(m) or m.num_workers is None:
        return None
    needed = max(m.workers_needed or 0, 2 * max(m.num_workers, 1))
    # Latency-bound workers scale past the core count; the cap only keeps the advice sane.
    suggested = min(needed, th.TUNE_MAX_WORKERS_PER_CORE * m.cpu_count)
    return Finding(
        id="storage_latency", severity=severity_for(m.data_wait_share), cost_share=m.data_wait_share,
        message=(f"{_wait_sentence(m)}. The DataLoader has num_workers={m.num_workers} on {m.cpu_count} cores "
                 f"and the workers were {fmt(m.worker_asleep_share, '.0%')} asleep while fetching "
                 f"({fmt(m.fetch_ms_per_batch_p50, '.0f')} ms a batch): reading data is latency-bound."
                 f"{_others_sentence(m)}"),
        recommendation=(f"DataLoader(..., num_workers={suggested}, prefetch_factor={th.LATENCY_PREFETCH_FACTOR}): "
                        f"waiting workers cost little CPU, so more of them than cores pays {_tune_hint()}; "
                        "or move the data to local SSD / cache it."),
        evidence={**_wait_evidence(m), "num_workers": m.num_workers, "cpu_count": m.cpu_count,
                  "worker_asleep_share": m.worker_asleep_share, "worker_fetch_cpu_ratio": m.worker_fetch_cpu_ratio,
                  "fetch_ms_per_batch_p50": m.fetch_ms_per_batch_p50, "workers_needed": m.workers_needed,
                  "iowait_pct": m.iowait_pct, "cpu_util_pct": m.cpu_util_pct},
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG,
                    "worker_fetch_cpu_ratio_below": th.WORKER_ASLEEP_CPU_RATIO,
                    "worker_running_share_below": th.WORKER_RUNNABLE_SHARE},
    )


def too_many_workers(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if (m.num_workers is None or m.num_workers <= m.cpu_count or not _host_saturated(m)
            or m.worker_fetch_cpu_ratio is None or m.worker_fetch_cpu_ratio >= th.WORKER_CONTENDED_CPU_RATIO
            or (m.worker_running_share is not None and not _workers_runnable(m))):
        return None
    running = (f"; {fmt(m.worker_running_share, '.0%')} of worker samples were runnable, waiting for a core"
               if m.worker_running_share is not None else "")
    cost = m.data_wait_share if _input_bound(m) else None
    return Finding(
        id="too_many_workers", severity=severity_for(cost), cost_share=cost,
        message=(f"{m.num_workers} DataLoader workers compete for {m.cpu_count} cores ({fmt(m.cpu_util_pct, '.0f')}% busy): "
                 f"each was on a CPU only {fmt(m.worker_fetch_cpu_ratio, '.0%')} of the time it spent fetching{running}."),
        recommendation=f"DataLoader(..., num_workers={_worker_cap(m)}) {_tune_hint()}.",
        evidence={"num_workers": m.num_workers, "cpu_count": m.cpu_count, "cpu_util_pct": m.cpu_util_pct,
                  "worker_fetch_cpu_ratio": m.worker_fetch_cpu_ratio,
                  "worker_running_share": m.worker_running_share, "data_wait_share": m.data_wait_share,
                  "fetch_ms_per_batch_p50": m.fetch_ms_per_batch_p50},
        thresholds={"num_workers_above": m.cpu_count, "cpu_util_pct": th.CPU_SATURATED_PCT,
                    "worker_fetch_cpu_ratio_below": th.WORKER_CONTENDED_CPU_RATIO,
                    "worker_running_share": th.WORKER_RUNNABLE_SHARE},
    )


def thread_oversubscription(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if not m.num_workers or m.worker_fetch_cpu_ratio is None:
        return None
    torch_threads = m.worker_torch_threads or 1
    multithreaded = torch_threads > 1 or m.worker_fetch_cpu_ratio > th.WORKER_MULTITHREAD_CPU_RATIO
    threads_wanted = m.num_workers * max(torch_threads, m.worker_fetch_cpu_ratio)
    if not multithreaded or threads_wanted <= m.cpu_count:
        return None
    cost = m.data_wait_share if _input_bound(m) else None
    return Finding(
        id="thread_oversubscription", severity=severity_for(cost), cost_share=cost,
        message=(f"{m.num_workers} DataLoader workers each run several compute threads "
                 f"(torch.get_num_threads()={torch_threads}, {fmt(m.worker_fetch_cpu_ratio, '.1f')} cores busy per worker "
                 f"while fetching, {fmt(m.worker_threads_median or 0, '.0f')} OS threads each) on {m.cpu_count} cores: "
                 f"{fmt(threads_wanted, '.0f')} threads contend for them."),
        recommendation=("Give each worker one thread: DataLoader(..., worker_init_fn=lambda _: "
                        "torch.set_num_threads(1)), plus cv2.setNumThreads(0) if OpenCV decodes, "
                        "or OMP_NUM_THREADS=1 in the environment."),
        evidence={"num_workers": m.num_workers, "worker_torch_threads": m.worker_torch_threads,
                  "worker_fetch_cpu_ratio": m.worker_fetch_cpu_ratio,
                  "worker_threads_median": m.worker_threads_median, "cpu_count": m.cpu_count,
                  "data_wait_share": m.data_wait_share},
        thresholds={"worker_fetch_cpu_ratio": th.WORKER_MULTITHREAD_CPU_RATIO, "threads_above": m.cpu_count},
    )


def worker_restart(ctx: Context) -> Finding | None:
    m, t = ctx.metrics, ctx.training
    if (t is None or not m.num_workers or t.config.get("persistent_workers") or m.iterators < 2
            or m.worker_startup_share is None or m.worker_startup_share < th.WORKER_STARTUP_SHARE_FLAG):
        return None
    return Finding(
        id="worker_restart", severity=severity_for(m.worker_startup_share), cost_share=m.worker_startup_share,
        message=(f"The DataLoader started its {m.num_workers} worker{'s' if m.num_workers > 1 else ''} again "
                 f"for each of {m.iterators} epochs: "
                 f"{fmt(m.worker_startup_s, '.1f')} s of start-up, {fmt(m.worker_startup_share, '.0%')} of the wall time."),
        recommendation="DataLoader(..., persistent_workers=True) keeps the workers alive between epochs.",
        evidence={"iterators": m.iterators, "num_workers": m.num_workers, "worker_startup_s": m.worker_startup_s,
                  "worker_startup_share": m.worker_startup_share,
                  "startup_s_per_epoch": m.worker_startup_s / m.iterators},
        thresholds={"worker_startup_share": th.WORKER_STARTUP_SHARE_FLAG},
    )


def pageable_transfer(ctx: Context) -> Finding | None:
    m, t = ctx.metrics, ctx.training
    if (not m.cuda_used or t is None or t.config.get("pin_memory") or m.h2d_pageable_share is None
            or m.h2d_pageable_share < th.PAGEABLE_COPY_SHARE_FLAG):
        return None
    return Finding(
        id="pageable_transfer", severity=severity_for(m.h2d_pageable_share), cost_share=m.h2d_pageable_share,
        message=(f"Copies of batches to the GPU blocked the training loop {fmt(m.h2d_pageable_share, '.0%')} of the time "
                 f"({fmt((m.h2d_bytes_per_step or 0) / 2**20, '.1f')} MiB a step from pageable memory; pin_memory=False)."),
        recommendation=("DataLoader(..., pin_memory=True) and batch.to(device, non_blocking=True): the copy "
                        "then overlaps with compute."),
        evidence={"h2d_pageable_share": m.h2d_pageable_share, "h2d_bytes_per_step": m.h2d_bytes_per_step,
                  "pin_memory": False},
        thresholds={"h2d_pageable_share": th.PAGEABLE_COPY_SHARE_FLAG},
    )


def fluctuating_utilization(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if (m.gpu_util_p95_pct is None or m.gpu_util_p5_pct is None
            or m.gpu_util_p95_pct <= th.GPU_UTIL_FLUCTUATING_P95_PCT
            or m.gpu_util_p5_pct >= th.GPU_UTIL_FLUCTUATING_P5_PCT):
        return None
    cause = ("it idles while the loop waits for data (see the findings above)" if _input_bound(m)
             else "it idles between bursts of work queued by the host")
    return Finding(
        id="fluctuating_utilization", severity=severity_for(m.data_wait_share), cost_share=m.data_wait_share,
        message=(f"GPU utilization saws between {fmt(m.gpu_util_p5_pct, '.0f')}% (p5) and {fmt(m.gpu_util_p95_pct, '.0f')}% (p95): "
                 f"the nvidia-smi sawtooth; the GPU works in bursts and {cause}."),
        recommendation=("Fix the input pipeline as the other findings say; the sawtooth flattens when batches "
                        "are ready before the GPU asks." if _input_bound(m) else
                        "Queue work without synchronising: avoid loss.item() or printing CUDA tensors every "
                        "step (torch.cuda.set_sync_debug_mode('warn') names them)."),
        evidence={"gpu_util_p5_pct": m.gpu_util_p5_pct, "gpu_util_p50_pct": m.gpu_util_p50_pct,
                  "gpu_util_p95_pct": m.gpu_util_p95_pct, "data_wait_share": m.data_wait_share},
        thresholds={"gpu_util_p95_pct": th.GPU_UTIL_FLUCTUATING_P95_PCT,
                    "gpu_util_p5_pct": th.GPU_UTIL_FLUCTUATING_P5_PCT},
    )


def host_bound(ctx: Context) -> Finding | None:
    m = ctx.metrics
    share = host_idle_share(m)
    if share is None or share < th.BOTTLENECK_MIN_SHARE or m.gpu_util_p50_pct >= th.GPU_UTIL_LOW_PCT:
        return None
    return Finding(
        id="host_bound", severity=severity_for(share), cost_share=share,
        message=(f"The GPU was busy only {fmt(m.gpu_util_p50_pct, '.0f')}% of the time (p50) although data waits explain "
                 f"just {fmt(m.data_wait_share or 0, '.0%')}: the host does not queue work fast enough."),
        recommendation=("Remove per-step synchronisations (loss.item(), printing CUDA tensors, blocking .to()); "
                        "torch.cuda.set_sync_debug_mode('warn') names them. A larger batch or CUDA graphs cut the "
                        "Python cost per sample."),
        evidence={"gpu_util_p50_pct": m.gpu_util_p50_pct, "data_wait_share": m.data_wait_share,
                  "host_idle_share": share},
        thresholds={"gpu_util_p50_pct": th.GPU_UTIL_LOW_PCT, "host_idle_share": th.BOTTLENECK_MIN_SHARE},
    )


def compute_bound(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if ctx.training is None or m.data_wait_share is None or _input_bound(m):
        return None
    if host_idle_share(m) is not None and host_idle_share(m) >= th.BOTTLENECK_MIN_SHARE:
        return None
    return Finding(
        id="compute_bound", severity=INFO, cost_share=None,
        message=(f"The input pipeline keeps up: the loop waited for data only {fmt(m.data_wait_share, '.1%')} of the time "
                 f"(p50 step {fmt(m.step_time_p50_ms, '.1f')} ms, {fmt(m.compute_p50_ms, '.1f')} ms of it compute); the loader is "
                 "not the problem."),
        recommendation=("Leave the DataLoader as it is; to go faster, make the step cheaper (mixed precision, "
                        "torch.compile, a larger batch if memory allows)."),
        evidence=_wait_evidence(m),
        thresholds={"data_wait_share_below": th.DATA_WAIT_SHARE_FLAG},
    )


def no_dataloader(ctx: Context) -> Finding | None:
    # A command that failed (a syntax error, a missing script) says why in its end message: "wrap it
    # in a DataLoader" would be advice drawn from nothing.
    if ctx.record.iterators or ctx.record.meta.end_reason not in FINISHED_NORMALLY:
        return None
    m = ctx.metrics
    host = f"host CPU averaged {fmt(m.cpu_util_pct, '.0f')}%" if m.cpu_util_pct is not None else "no host samples"
    gpu = (f", GPU utilization p50 {fmt(m.gpu_util_p50_pct, '.0f')}%" if m.gpu_util_p50_pct is not None
           else ", GPU metrics unavailable")
    if ctx.record.processes:
        what = "The command never iterated a torch DataLoader"
    else:
        what = ("No Python process under the command imported torch.utils.data (or it ran with python -I/-E, "
                "which ignores the PYTHONPATH gpufeed instruments through)")
    return Finding(
        id="no_dataloader", severity=INFO, cost_share=None,
        message=f"{what}, so data waits could not be measured ({host}{gpu}).",
        recommendation=("gpufeed measures torch.utils.data.DataLoader; if the script feeds data another way, "
                        "wrap it in a DataLoader or time that code yourself."),
        evidence={"cpu_util_pct": m.cpu_util_pct, "gpu_util_p50_pct": m.gpu_util_p50_pct,
                  "python_processes_instrumented": len(ctx.record.processes)},
    )


def loader_stalled(ctx: Context) -> Finding | None:
    stall = ctx.record.meta.stall or (ctx.record.stalls[0] if ctx.record.stalls else None)
    if not stall:
        return None
    stacks = ctx.record.stacks()
    workers = []
    for proc in stall.get("processes") or []:
        where = _innermost_frame(stacks.get(proc.get("pid"), ""))
        workers.append({"pid": proc.get("pid"), "status": proc.get("status"), "wchan": proc.get("wchan"),
                        "cpu_pct": proc.get("cpu_pct"), "where": where})
    doing = "; ".join(f"pid {w['pid']} {w['status'] or '?'}" + (f" in {w['where']}" if w["where"] else "")
                      for w in workers[1:]) or "no worker state could be read"
    return Finding(
        id="loader_stalled", severity=HIGH, cost_share=1.0,
        message=(f"The DataLoader delivered no batch for {fmt(stall.get('waited_s', 0), '.0f')} s: it is stuck "
                 f"(workers: {doing})."),
        recommendation=("Read the stacks in the run directory's stacks/ folder to see where each worker waits; "
                        "DataLoader(..., timeout=SECONDS) makes a stuck worker raise instead of hanging."),
        evidence={"waited_s": stall.get("waited_s"), "processes": workers},
    )


def _innermost_frame(stack: str) -> str | None:
    """Where the process's main thread was: the innermost frame of the thread whose stack reaches
    the program's entry (``<module>``, or a DataLoader worker's ``_worker_loop``)."""
    blocks = [block.splitlines() for block in stack.split("\n\n")]
    for block in blocks:
        frames = [line.strip() for line in block if line.strip().startswith("File ")]
        if any(line.endswith((" in <module>", " in _worker_loop")) for line in frames):
            return frames[0].replace("File ", "", 1)
    return None


def host_idle_share(m: Metrics) -> float | None:
    """GPU time idle for reasons other than waiting for data (CUDA runs with NVML only)."""
    if not m.cuda_used or m.gpu_util_p50_pct is None:
        return None
    return max(0.0, 1.0 - m.gpu_util_p50_pct / 100.0 - (m.data_wait_share or 0.0))


FINISHED_NORMALLY = (schema.END_COMPLETED, schema.END_STEPS_REACHED, schema.END_TIMED_OUT)
# Findings that do not judge the steps, and so stand with too few of them (the stall itself).
FINDINGS_WITHOUT_STEPS = ("loader_stalled",)

RULES: tuple[Rule, ...] = (
    loader_stalled, too_few_workers, cpu_saturated, storage_latency, too_many_workers,
    thread_oversubscription, worker_restart, pageable_transfer, fluctuating_utilization, host_bound,
    compute_bound, no_dataloader, straggler_rank, load_imbalance,
) + memory.RULES
