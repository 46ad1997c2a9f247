"""Copies to the GPU, as they cost: do pageable copies block the training loop, and do copies on the
stream the steps run on stall the GPU's kernels? And would ``pin_memory=True`` alone help?"""
from __future__ import annotations

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import Finding, severity_for
from gpufeed.analysis.metrics import Metrics
from gpufeed.analysis.rules.wording import change
from gpufeed.units import fmt


def pin_alone_would_not_help(m: Metrics) -> str | None:
    """Why pinning the DataLoader's batches alone would not free the host of the pageable copies
    (None where it would, or where it is not known)."""
    outside, asked = m.h2d_pageable_outside_loader_share, m.h2d_pageable_non_blocking_share
    if outside is not None and outside >= th.PIN_ALONE_MAJORITY:
        return (f"pin_memory=True alone would not help: {fmt(outside, '.0%')} of these bytes are copied by copy_(), "
                "torch.as_tensor(..., device=) or torch.tensor(..., device=) from memory the DataLoader does not "
                "pin; pin that memory yourself (tensor.pin_memory()) or copy the loader's pinned batch")
    if asked is not None and 1.0 - asked >= th.PIN_ALONE_MAJORITY:
        return ("pin_memory=True alone would not help: the copies do not ask non_blocking=True, and a copy from "
                "pinned memory without it still holds the host until it is done")
    return None


def pageable_transfer(ctx: Context) -> Finding | None:
    m, t = ctx.metrics, ctx.training
    if (not m.cuda_used or t is None or m.h2d_pageable_share is None
            or m.h2d_pageable_share < th.PAGEABLE_COPY_SHARE_FLAG):
        return None
    pinned_loader = bool(t.config.get("pin_memory"))
    why_not = pin_alone_would_not_help(m)
    if pinned_loader and why_not is None:
        return None  # the loader pins its batches: these pageable copies are not its own (said nowhere else)
    if pinned_loader:
        fix = f"The DataLoader already has pin_memory=True, yet these copies are pageable; {why_not}."
    else:
        fix = (f"{change(ctx, pin_memory=True)} and batch.to(device, non_blocking=True): the copy then overlaps "
               "with compute." + (f" But {why_not}." if why_not else ""))
    return Finding(
        id="pageable_transfer", severity=severity_for(m.h2d_pageable_share), cost_share=m.h2d_pageable_share,
        message=(f"Copies of batches to the GPU blocked the training loop {fmt(m.h2d_pageable_share, '.0%')} of the time "
                 f"({fmt((m.h2d_bytes_per_step or 0) / 2**20, '.1f')} MiB a step from pageable memory; "
                 f"pin_memory={pinned_loader})."),
        recommendation=fix,
        evidence={"h2d_pageable_share": m.h2d_pageable_share, "h2d_bytes_per_step": m.h2d_bytes_per_step,
                  "pin_memory": pinned_loader, "pin_memory_alone_helps": why_not is None,
                  "h2d_pageable_outside_loader_share": m.h2d_pageable_outside_loader_share,
                  "h2d_pageable_non_blocking_share": m.h2d_pageable_non_blocking_share},
        thresholds={"h2d_pageable_share": th.PAGEABLE_COPY_SHARE_FLAG, "pin_alone_majority": th.PIN_ALONE_MAJORITY},
    )


def copy_stalls_gpu(ctx: Context) -> Finding | None:
    """Pinned, non_blocking copies on the stream the steps run on: the host runs ahead, but the kernels
    queued after each copy wait for it (a stream runs its work in order). Pinning is already done."""
    m = ctx.metrics
    share = m.h2d_stall_share
    if not m.cuda_used or share is None or share < th.COPY_STALL_SHARE_FLAG:
        return None
    return Finding(
        id="copy_stalls_gpu", severity=severity_for(share), cost_share=share,
        message=(f"Copies to the GPU from pinned memory stalled the GPU {fmt(share, '.0%')} of the time: they run on "
                 "the stream the steps run on, so the kernels queued after each copy wait for it, non_blocking or "
                 f"not ({fmt((m.h2d_bytes_per_step or 0) / 2**20, '.1f')} MiB a step)."),
        recommendation=("pin_memory=True alone would not help (the copies are already pinned): copy the next batch "
                        "on a side stream while this one computes (a prefetcher: torch.cuda.Stream(), the copy "
                        "inside `with torch.cuda.stream(side):`, then torch.cuda.current_stream().wait_stream(side) "
                        "and batch.record_stream() before use), or send fewer bytes (uint8 images, normalised on "
                        "the GPU)."),
        evidence={"h2d_stall_share": share, "h2d_bytes_per_step": m.h2d_bytes_per_step, "pin_memory_alone_helps": False},
        thresholds={"h2d_stall_share": th.COPY_STALL_SHARE_FLAG},
    )
