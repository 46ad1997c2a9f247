"""Slow samples: do a few slow samples hold their batches back, and in-order delivery every batch behind them?

Read from ``analysis/batches.py`` (the workers timed each ``dataset[i]``; each step matched to the
batch its worker made). The finding names the slow indices (and the rule they follow), how often a
batch holds one, what the loop waited for those batches, and what in-order delivery cost: the time it
waited for a batch while a later one was already made, which ``DataLoader(in_order=False)`` (torch >= 2.6)
hands over instead, at the cost of the batches' order.
"""
from __future__ import annotations

from gpufeed import thresholds as th
from gpufeed.analysis.batches import in_order_gain
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import Finding, severity_for
from gpufeed.analysis.rules.wording import change
from gpufeed.units import fmt

IN_ORDER_SINCE = (2, 6)


def _torch_version(ctx: Context) -> tuple[int, int] | None:
    pid = ctx.training.pid if ctx.training is not None else None
    for p in ctx.record.processes:
        v = p.get("torch_version")
        if p.get("pid") == pid and isinstance(v, str):
            try:
                major, minor = v.split(".")[:2]
                return int(major), int(minor)
            except ValueError:
                return None
    return None


def _up_to(share: float | None) -> str:
    gain = in_order_gain(share)  # the same bound for any share of the time that goes
    return f"up to {gain:.2f}x" if gain is not None else "not predicted"


def slow_samples(ctx: Context) -> Finding | None:
    b = ctx.batches
    if (b is None or not b.slow or b.slow_wait_share is None or b.sample_p50_s is None
            or b.slow_wait_share < th.SLOW_SAMPLE_WAIT_SHARE_FLAG):
        return None
    indices = b.slow_indices
    slow_s = sorted(s for _i, s in b.slow)[len(b.slow) // 2]
    named = ", ".join(str(i) for i in indices[:th.SLOW_SAMPLES_NAMED]) + (", ..." if len(indices) > th.SLOW_SAMPLES_NAMED else "")
    if b.rule:
        others = len(b.slow) - b.rule_samples
        which = (f"{b.rule_samples} of them at indices {b.rule} ({named})"
                 + (f", and {others} other{'s' if others != 1 else ''} (a busy machine's stray slow reads, or slow samples "
                    "of another kind)" if others else ""))
    else:
        which = f"indices {named}" if indices else "their indices unknown"
    p99 = f", p99 {fmt(b.sample_p99_s * 1000, '.1f')} ms" if b.sample_p99_s is not None else ""
    in_order = b.in_order_share or 0.0
    message = (f"{len(b.slow)} of the training loader's {b.samples} samples took {th.SLOW_SAMPLE_FACTOR:g}x the median "
               f"sample or more (median {fmt(b.sample_p50_s * 1000, '.1f')} ms{p99}; the slow ones "
               f"{fmt(slow_s * 1000, '.0f')} ms): {which}. {b.slow_batch_share:.0%} of the batches held one, and each "
               f"holds its whole batch back: the loop waited {b.slow_wait_share:.0%} of the time for those batches. ")
    if in_order >= th.SHARE_SAID_MIN:
        message += (f"In-order delivery cost {in_order:.0%} of the time: the loop waited for a batch while a later one "
                    "was already made.")
    version = _torch_version(ctx)
    too_old = version is not None and version < IN_ORDER_SINCE
    fixes = [f"fix or pre-process those samples (they cost {fmt(b.slow_excess_s, '.1f')} s of worker time beyond "
             f"median samples in the window; predicted {_up_to(b.slow_wait_share)})"]
    if in_order >= th.SHARE_SAID_MIN:
        fixes.append(f"where the job tolerates batches out of order, {change(ctx, in_order=False)}: a batch then "
                     "comes as soon as any worker has one; the order of batches, and with it bit-for-bit "
                     f"reproducibility, is given up (predicted {_up_to(in_order)}"
                     + (f"; needs torch >= 2.6, this run has {version[0]}.{version[1]})" if too_old else ")"))
    fixes.append(f"or keep more batches in flight so the others cover a slow one: a deeper prefetch_factor "
                 f"(now {b.prefetch_factor}) or more workers (now {b.workers}); not predicted here, `gpufeed tune` "
                 "measures it")
    return Finding(
        id="slow_samples", severity=severity_for(b.slow_wait_share), cost_share=b.slow_wait_share,
        message=message, recommendation="; ".join(fixes) + ".",
        evidence={"slow_samples": len(b.slow), "samples": b.samples, "slow_indices": indices[:th.SLOW_SAMPLES_NAMED],
                  "index_rule": b.rule, "rule_samples": b.rule_samples, "sample_p50_ms": b.sample_p50_s * 1000,
                  "sample_p99_ms": None if b.sample_p99_s is None else b.sample_p99_s * 1000,
                  "slow_sample_p50_ms": slow_s * 1000, "slow_batch_share": b.slow_batch_share,
                  "slow_wait_share": b.slow_wait_share, "in_order_share": b.in_order_share,
                  "slow_excess_s": b.slow_excess_s, "steps_matched": b.steps_matched,
                  "steps_in_window": b.steps_in_window, "torch_version": ".".join(map(str, version)) if version else None},
        thresholds={"slow_sample_factor": th.SLOW_SAMPLE_FACTOR, "slow_sample_min_s": th.SLOW_SAMPLE_MIN_S,
                    "slow_wait_share": th.SLOW_SAMPLE_WAIT_SHARE_FLAG},
    )
