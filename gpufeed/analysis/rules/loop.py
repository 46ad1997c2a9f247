"""Does a loop that takes no batch from a DataLoader wait for its own batch preparation?

Where no training DataLoader was iterated, a step is one optimizer step (``analysis/loop.py``) and
the data wait the loop's own work between the model's: ``get_batch``, slicing a tensor, a generator's
``next()``, the copy to the device. Prepared ahead, in a DataLoader's workers or a background thread,
it overlaps the model's work instead of adding to it.
"""
from __future__ import annotations

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import Finding, severity_for
from gpufeed.analysis.loop import FROM_OPTIMIZER
from gpufeed.analysis.rules.facts import host_saturated, without_dataloader, worker_cap
from gpufeed.analysis.rules.wording import cores, fmt


def loop_batch_preparation(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if not without_dataloader(m) or m.data_wait_share is None:
        return None
    share = m.data_wait_share
    if share < th.DATA_WAIT_SHARE_FLAG or not m.step_time_p50_ms or m.compute_per_batch_ms is None:
        return None
    step = "optimizer step" if m.steps_from == FROM_OPTIMIZER else "backward pass"
    workers = worker_cap(m)
    gain = overlap_gain(share, workers, m.cpu_util_pct, m.samples_per_s)
    busy = ""
    if host_saturated(m):
        # The cores are the model's own threads: work moved beside it takes their time, so only the
        # low end stands (measured slower still on a CPU-only nanoGPT: docs/shapes.md). Offered at
        # that, the self-check withholds the fix (within noise) and the finding keeps its facts.
        busy = (f" All {cores(m.cpu_count)} were {fmt(m.cpu_util_pct, '.0f')}% busy with the model's own threads, "
                "so batches prepared beside it would take its cores; where a core is free for them (the model "
                f"on a GPU) the same change is predicted at up to {gain['high']:.2f}x.")
        gain = dict(gain, speedup=gain["low"], high=gain["low"], free_core_high=gain["high"],
                    setting=f"batches prepared ahead on {cores(m.cpu_count)} all busy")
    return Finding(
        id="loop_batch_preparation", severity=severity_for(share), cost_share=share,
        message=(f"The loop takes no batch from a DataLoader, and {share:.0%} of its time is its own work between "
                 f"the model's (p50 step {fmt(m.step_time_p50_ms, '.1f')} ms from one {step} to the next, of "
                 f"which {fmt(m.data_wait_p50_ms, '.1f')} ms outside the forward, backward and optimizer step): "
                 "taking and preparing the next batch, copying it to the device, logging. The model waits for it "
                 "every step." + busy),
        recommendation=("Prepare the next batch while the model computes: move what the loop does to get a batch "
                        "into a Dataset's __getitem__ (or an IterableDataset's __iter__) and iterate a "
                        f"torch.utils.data.DataLoader with num_workers={workers} (gpufeed then measures and tunes it), "
                        "or fill a queue a few batches ahead from a background thread. "
                        f"Predicted: {gain['low']:.2f}-{gain['high']:.2f}x with {workers} worker{'s' if workers > 1 else ''} "
                        f"preparing batches while the model works (the lower end as busy as the cores were)."),
        evidence={"loop_own_share": share, "step_time_p50_ms": m.step_time_p50_ms,
                  "loop_own_p50_ms": m.data_wait_p50_ms, "model_work_per_step_ms": m.compute_per_batch_ms,
                  "steps_from": m.steps_from, "cpu_util_pct": m.cpu_util_pct, "samples_per_s": m.samples_per_s},
        thresholds={"loop_own_share": th.DATA_WAIT_SHARE_FLAG},
        gain=gain,
    )


def overlap_gain(own_share: float, workers: int, cpu_util_pct: float | None, samples_per_s: float | None) -> dict:
    """The loop's own work ``o`` and the model's ``w`` (shares of a step), the preparation split over
    ``workers`` that run beside the model: the step becomes max(w, o / workers) with a free core for
    each (the high end), and nothing is gained when the cores were all busy already: the low end
    charges the overlapped part in proportion to how busy they were."""
    own, work = own_share / max(workers, 1), 1.0 - own_share
    longer, shorter = max(own, work), min(own, work)
    busy = min(max((cpu_util_pct or 0.0) / 100.0, 0.0), 1.0)
    high = 1.0 / longer
    low = 1.0 / (longer + shorter * busy)
    speedup = (high * low) ** 0.5
    return {"speedup": speedup, "low": low, "high": high, "setting": "batches prepared ahead",
            "samples_per_s": samples_per_s * speedup if samples_per_s else None}
