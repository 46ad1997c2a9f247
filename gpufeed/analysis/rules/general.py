"""The run as a whole: the input pipeline keeps up (compute-bound), no DataLoader was measured,
and every loss worth naming is explained: where no specific rule fired for a loss that reaches the
bar, a general finding states the measured facts and how to find the fix."""
from __future__ import annotations

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import INFO, Finding, severity_for
from gpufeed.analysis.rules import tf_data
from gpufeed.analysis.rules.facts import (COMPUTE, HOST, INPUT, TRANSFER, costs, cpu_ms_per_sample, without_dataloader,
                                          worker_cap)
from gpufeed.analysis.rules.gpu import host_finding
from gpufeed.analysis.rules.wording import cores, others_sentence, wait_evidence, wait_sentence
from gpufeed.record import schema
from gpufeed.units import fmt

FINISHED_NORMALLY = (schema.END_COMPLETED, schema.END_STEPS_REACHED, schema.END_TIMED_OUT)


def compute_bound(ctx: Context) -> Finding | None:
    m = ctx.metrics
    loop = without_dataloader(m)  # no DataLoader: the loop's own batch preparation (rules/loop.py)
    if (ctx.training is None and not loop) or m.data_wait_share is None:
        return None
    if any(share is not None and share >= th.BOTTLENECK_MIN_SHARE for kind, share in costs(m).items()
           if kind != COMPUTE):
        return None  # a loss worth naming: its finding explains it; the run is not "compute-bound"
    tf = not loop and tf_data.pipeline(ctx) is not None
    share, step = fmt(m.data_wait_share, '.1%'), (f"p50 step {fmt(m.step_time_p50_ms, '.1f')} ms, "
                                                  f"{fmt(m.compute_p50_ms, '.1f')} ms of it")
    if loop:
        message = (f"The loop's own batch preparation keeps up: it took only {share} of the time ({step} the "
                   "model's forward, backward and optimizer step); the input is not the problem.")
    else:
        message = (f"The input pipeline keeps up: the loop waited for data only {share} of the time ({step} "
                   "compute); the loader is not the problem.")
    leave = "the batch preparation" if loop else "the tf.data pipeline" if tf else "the DataLoader"
    return Finding(
        id="compute_bound", severity=INFO, cost_share=None, message=message,
        recommendation=(f"Leave {leave} as it is; to go faster, make the step cheaper (mixed precision, "
                        f"{'jit_compile=True' if tf else 'torch.compile'}, a larger batch if memory allows)."),
        evidence=wait_evidence(m),
        thresholds={"data_wait_share_below": th.DATA_WAIT_SHARE_FLAG},
    )


def no_dataloader(ctx: Context) -> Finding | None:
    # A command that failed (a syntax error, a missing script) says why in its end message: "wrap it
    # in a DataLoader" would be advice drawn from nothing.
    if ctx.record.iterators or ctx.record.meta.end_reason not in FINISHED_NORMALLY or without_dataloader(ctx.metrics):
        return None  # a loop measured from its optimizer steps needs no DataLoader (rules/loop.py)
    m = ctx.metrics
    host = f"host CPU averaged {fmt(m.cpu_util_pct, '.0f')}%" if m.cpu_util_pct is not None else "no host samples"
    gpu = (f", GPU utilization p50 {fmt(m.gpu_util_p50_pct, '.0f')}%" if m.gpu_util_p50_pct is not None
           else ", GPU metrics unavailable")
    if ctx.record.processes:
        what = "The command never iterated a torch DataLoader, nor stepped an optimizer or ran a backward pass"
    else:
        what = ("No Python process under the command imported torch.utils.data (or it ran with python -I/-E, "
                "which ignores the PYTHONPATH gpufeed instruments through)")
    return Finding(
        id="no_dataloader", severity=INFO, cost_share=None,
        message=f"{what}, so data waits could not be measured ({host}{gpu}).",
        recommendation=("gpufeed times a DataLoader's batches, or a loop's forward, backward and torch.optim "
                        "steps; if the script trains another way, wrap its data in a DataLoader or time that "
                        "code yourself."),
        evidence={"cpu_util_pct": m.cpu_util_pct, "gpu_util_p50_pct": m.gpu_util_p50_pct,
                  "python_processes_instrumented": len(ctx.record.processes)},
    )


# -- every loss worth naming is explained --------------------------------------------------------------
# The findings that explain each kind of loss with a cause and a fix. When none of them fired for a
# loss that reaches the bar, a general finding states the measured facts and how to find the fix.
EXPLAINED_BY = {
    INPUT: {"too_few_workers", "cpu_saturated", "storage_latency", "too_many_workers", "thread_oversubscription",
            "worker_restart", "loader_stalled", "straggler_rank", "offload_input_wait", "loop_batch_preparation"},
    TRANSFER: {"pageable_transfer", "copy_stalls_gpu"},
    HOST: {"host_bound"},
}


def unexplained_losses(ctx: Context, findings: list[Finding]) -> list[Finding]:
    fired = {f.id for f in findings}
    general = {INPUT: input_wait, TRANSFER: blocking_transfer, HOST: host_idle}
    out = []
    for kind, share in costs(ctx.metrics).items():
        if kind in EXPLAINED_BY and share is not None and share >= th.BOTTLENECK_MIN_SHARE \
                and not fired & EXPLAINED_BY[kind]:
            out.append(general[kind](ctx, share))
    return out


def _tune_command(ctx: Context) -> str:
    command = " ".join(ctx.record.meta.command) or "python train.py"
    return f"gpufeed tune -- {command}"


def input_wait(ctx: Context, share: float) -> Finding:
    """Data waits no specific rule explains: the facts, and the command that measures the fix."""
    m = ctx.metrics
    workers = (f"num_workers={m.num_workers}" if m.num_workers is not None else "an unknown num_workers")
    why = ""
    if m.num_workers is not None and m.num_workers >= worker_cap(m):
        why = (f" It already has at least as many workers as the job has cores for them ({worker_cap(m)} of "
               f"{cores(m.cpu_count)}{'' if m.cuda_used else ', one left for the training step'}), so more "
               "would share the same CPU: whether that still pays is for a measurement to say.")
    cpu_ms = cpu_ms_per_sample(m)
    return Finding(
        id="input_wait", severity=severity_for(share), cost_share=share,
        message=(f"{wait_sentence(m)}. The DataLoader has {workers} on {cores(m.cpu_count)} "
                 f"({fmt(m.cpu_util_pct, '.0f')}% busy); a batch takes "
                 f"{fmt(m.fetch_ms_per_batch_p50, '.0f')} ms to prepare and the step computes for "
                 f"{fmt(m.compute_p50_ms, '.0f')} ms.{why}{others_sentence(m)}"),
        recommendation=(f"`{_tune_command(ctx)}` measures num_workers, prefetch_factor and persistent_workers on "
                        f"this job; if none helps, make each sample cheaper to prepare"
                        f"{f' ({cpu_ms:.1f} ms of CPU per sample)' if cpu_ms else ''} or run on more cores."),
        evidence={**wait_evidence(m), "num_workers": m.num_workers, "cpu_count": m.cpu_count,
                  "cpu_util_pct": m.cpu_util_pct, "fetch_ms_per_batch_p50": m.fetch_ms_per_batch_p50,
                  "worker_fetch_cpu_ratio": m.worker_fetch_cpu_ratio, "workers_needed": m.workers_needed,
                  "loader_cpu_ms_per_sample": cpu_ms},
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG},
    )


def blocking_transfer(ctx: Context, share: float) -> Finding:
    m = ctx.metrics
    return Finding(
        id="blocking_transfer", severity=severity_for(share), cost_share=share,
        message=(f"Copies of batches to the GPU blocked the training loop {fmt(share, '.0%')} of the time "
                 f"({fmt((m.h2d_bytes_per_step or 0) / 2**20, '.1f')} MiB a step, the copy itself timed by CUDA events)."),
        recommendation=("batch.to(device, non_blocking=True) from pinned memory (DataLoader(..., pin_memory=True)) "
                        "overlaps the copy with compute; sending fewer bytes (uint8 images, normalised on the GPU) "
                        "shortens it."),
        evidence={"h2d_pageable_share": m.h2d_pageable_share, "h2d_bytes_per_step": m.h2d_bytes_per_step},
        thresholds={"h2d_pageable_share": th.PAGEABLE_COPY_SHARE_FLAG},
    )


def host_idle(ctx: Context, share: float) -> Finding:
    return host_finding(ctx.metrics, share, "host_idle")
