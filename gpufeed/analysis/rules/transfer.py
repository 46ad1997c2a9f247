"""Copies to the GPU: do copies from pageable memory block the training loop?"""
from __future__ import annotations

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import Finding, severity_for
from gpufeed.analysis.rules.wording import change
from gpufeed.units import fmt


def pageable_transfer(ctx: Context) -> Finding | None:
    m, t = ctx.metrics, ctx.training
    if (not m.cuda_used or t is None or t.config.get("pin_memory") or m.h2d_pageable_share is None
            or m.h2d_pageable_share < th.PAGEABLE_COPY_SHARE_FLAG):
        return None
    return Finding(
        id="pageable_transfer", severity=severity_for(m.h2d_pageable_share), cost_share=m.h2d_pageable_share,
        message=(f"Copies of batches to the GPU blocked the training loop {fmt(m.h2d_pageable_share, '.0%')} of the time "
                 f"({fmt((m.h2d_bytes_per_step or 0) / 2**20, '.1f')} MiB a step from pageable memory; pin_memory=False)."),
        recommendation=(f"{change(ctx, pin_memory=True)} and batch.to(device, non_blocking=True): the copy "
                        "then overlaps with compute."),
        evidence={"h2d_pageable_share": m.h2d_pageable_share, "h2d_bytes_per_step": m.h2d_bytes_per_step,
                  "pin_memory": False},
        thresholds={"h2d_pageable_share": th.PAGEABLE_COPY_SHARE_FLAG},
    )
