"""Several ranks: one rank whose loader holds every rank back at the collective (``straggler_rank``),
and ranks whose step time or GPU utilization differ (``load_imbalance``). They read the per-rank
numbers that ``analysis/ranks.py`` measures (``Metrics.ranks``); see there for how a rank's wait in
the collective shows in its step compute."""
from __future__ import annotations

import numpy as np

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import Finding, severity_for
from gpufeed.analysis.metrics import Metrics
from gpufeed.analysis.rank_summary import RankSummary
from gpufeed.units import fmt


def straggler_rank(ctx: Context) -> Finding | None:
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


def load_imbalance(ctx: Context) -> Finding | None:
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
