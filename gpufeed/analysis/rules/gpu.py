"""The GPU: does its utilization saw (the nvidia-smi sawtooth), and does it idle while the host
fails to queue work (not for data, not for copies)?"""
from __future__ import annotations

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import Finding, severity_for
from gpufeed.analysis.metrics import Metrics
from gpufeed.analysis.rules.facts import host_idle_share, input_bound, input_share
from gpufeed.units import fmt


def fluctuating_utilization(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if (m.gpu_util_p95_pct is None or m.gpu_util_p5_pct is None
            or m.gpu_util_p95_pct <= th.GPU_UTIL_FLUCTUATING_P95_PCT
            or m.gpu_util_p5_pct >= th.GPU_UTIL_FLUCTUATING_P5_PCT):
        return None
    cause = ("it idles while the loop waits for data (see the findings above)" if input_bound(m)
             else "it idles between bursts of work queued by the host")
    return Finding(
        id="fluctuating_utilization", severity=severity_for(input_share(m)), cost_share=input_share(m),
        message=(f"GPU utilization saws between {fmt(m.gpu_util_p5_pct, '.0f')}% (p5) and {fmt(m.gpu_util_p95_pct, '.0f')}% (p95): "
                 f"the nvidia-smi sawtooth; the GPU works in bursts and {cause}."),
        recommendation=("Fix the input pipeline as the other findings say; the sawtooth flattens when batches "
                        "are ready before the GPU asks." if input_bound(m) else
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
    return host_finding(m, share, "host_bound")


def host_finding(m: Metrics, share: float, finding_id: str) -> Finding:
    """The GPU idle for the host's sake: ``host_bound`` here, ``host_idle`` when no rule fired (``general``)."""
    return Finding(
        id=finding_id, severity=severity_for(share), cost_share=share,
        message=(f"The GPU was busy only {fmt(m.gpu_util_p50_pct, '.0f')}% of the time (p50) although data waits explain "
                 f"just {fmt(input_share(m) or 0, '.0%')}: the host does not queue work fast enough "
                 f"({fmt(share, '.0%')} of the time lost)."),
        recommendation=("Remove per-step synchronisations (loss.item(), printing CUDA tensors, blocking .to()); "
                        "torch.cuda.set_sync_debug_mode('warn') names them. A larger batch or CUDA graphs cut the "
                        "Python cost per sample."),
        evidence={"gpu_util_p50_pct": m.gpu_util_p50_pct, "data_wait_share": m.data_wait_share,
                  "gpu_idle_share": m.gpu_idle_share, "host_idle_share": share},
        thresholds={"gpu_util_p50_pct": th.GPU_UTIL_LOW_PCT, "host_idle_share": th.BOTTLENECK_MIN_SHARE},
    )


def launch_bound(ctx: Context) -> Finding | None:
    """NVML busy nearly all the time, GPM's SM activity low: tiny or launch-bound kernels (a host-side
    cause), not a well-fed GPU. Only where GPM was read (Hopper and newer)."""
    m = ctx.metrics
    if (m.gpu_util_p50_pct is None or m.gpu_sm_active_p50_pct is None
            or m.gpu_util_p50_pct < th.GPU_BUSY_UTIL_PCT or m.gpu_sm_active_p50_pct >= th.SM_ACTIVE_LOW_PCT):
        return None
    idle_sms = 1.0 - m.gpu_sm_active_p50_pct / 100.0
    return Finding(
        id="launch_bound", severity=severity_for(idle_sms), cost_share=None,
        message=(f"The GPU read {fmt(m.gpu_util_p50_pct, '.0f')}% busy (p50, NVML) but only "
                 f"{fmt(m.gpu_sm_active_p50_pct, '.0f')}% of its SMs were active (GPM): its kernels are too small "
                 "to fill it, or the host launches them one at a time. The GPU is not fed, it is waiting on "
                 "the host's launches."),
        recommendation=("Give each kernel more work: a larger batch, fused operations (torch.compile), or CUDA "
                        "graphs (torch.compile(mode=\"reduce-overhead\")) so the host stops launching kernels "
                        "one by one."),
        evidence={"gpu_util_p50_pct": m.gpu_util_p50_pct, "gpu_sm_active_p50_pct": m.gpu_sm_active_p50_pct,
                  "gpu_sm_occupancy_p50_pct": m.gpu_sm_occupancy_p50_pct,
                  "gpu_tensor_active_p50_pct": m.gpu_tensor_active_p50_pct},
        thresholds={"gpu_util_p50_pct": th.GPU_BUSY_UTIL_PCT, "gpu_sm_active_p50_pct": th.SM_ACTIVE_LOW_PCT},
    )
