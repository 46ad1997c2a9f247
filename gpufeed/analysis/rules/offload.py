"""The training loader's batches made on Ray (``--offload``): does the loop still wait for them, and
is it the Ray workers' number or the path (sending, pickling, receiving) that holds it back?

The local-worker rules (``loader``) stay quiet on such a run; this one speaks instead.
"""
from __future__ import annotations

import math

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import Finding, severity_for
from gpufeed.analysis.rules.facts import input_bound, input_share
from gpufeed.analysis.rules.wording import wait_evidence, wait_sentence
from gpufeed.units import fmt


def offload_input_wait(ctx: Context) -> Finding | None:
    m = ctx.metrics
    o = m.offload
    if o is None or not input_bound(m):
        return None
    # Each Ray worker makes one batch at a time (its calls run in the order sent), so N of them make
    # N per batch time; the step takes one per compute time: the workers that keep up, by rate.
    per_batch = m.compute_per_batch_ms
    needed = (max(1, math.ceil(o.make_ms_p50 / per_batch - 1e-6)) if o.make_ms_p50 and per_batch else None)
    message = (f"{wait_sentence(m)} with its batches made by {o.described()}: a batch took "
               f"{fmt(o.make_ms_p50, '.1f')} ms ({fmt(o.make_cpu_ms_p50, '.1f')} ms of CPU) in its worker and arrived "
               f"{fmt(o.latency_ms_p50, '.1f')} ms (p50) after it was sent; the step computes for "
               f"{fmt(per_batch, '.1f')} ms a batch.")
    if o.fell_back:
        message += (f" The run lost the cluster and went on with local workers ({o.fell_back}): these numbers "
                    "mix both; measure again with the cluster up.")
    if needed is not None and o.workers is not None and needed > o.workers:
        fix = (f"Give it more Ray workers: `--ray-workers {needed}` (each makes one batch at a time in "
               f"{fmt(o.make_ms_p50, '.1f')} ms; the step takes one every {fmt(per_batch, '.1f')} ms), on a cluster "
               "with that many free CPUs.")
    elif needed is None:
        fix = ("No Ray batch time was recorded: measure again with more steps (`offload` events come every "
               f"{th.OFFLOAD_RECORD_EVERY} batches and at the end).")
    else:
        fix = ("The Ray workers make batches as fast as the step takes them: the wait is the path (pickling each "
               "batch, the object store, receiving it in the training process). Send smaller batches (uint8 images, "
               "normalised on the GPU), or keep more in flight (a larger prefetch_factor).")
    cost = input_share(m)
    return Finding(
        id="offload_input_wait", severity=severity_for(cost), cost_share=cost, message=message, recommendation=fix,
        evidence={**wait_evidence(m), "offload_workers": o.workers, "offload_nodes": o.nodes,
                  "offload_batches": o.batches, "offload_latency_ms_p50": o.latency_ms_p50,
                  "offload_make_ms_p50": o.make_ms_p50, "offload_make_cpu_ms_p50": o.make_cpu_ms_p50,
                  "offload_fell_back": o.fell_back, "ray_workers_needed": needed},
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG},
    )
