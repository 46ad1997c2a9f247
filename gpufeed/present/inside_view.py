"""Inside the training loader's batches, drawn for the report (issue 35.1, 35.3): where the CPU that makes
the batches goes by the user's code, as an icicle chart, and the loop's wait for a batch split by stage,
as a stacked bar. Both are geometry for inline SVG (no script, no network); the template escapes every
label (jinja2 autoescape).

The icicle: the top row is all the time sampled making batches (the training loader's workers' CPU and
their waiting in the user's code, or with ``num_workers=0`` the training process's CPU inside ``next()``),
the second its split by the user's function (``file:line function``), each as its CPU then its waiting (a
second colour), and the CPU outside the user's code (torch's collate, pickling), the third each function's
split by the call beneath it (``own Python code`` where there is none). A box's width is its seconds.
"""
from __future__ import annotations

from typing import Any

from gpufeed.analysis import Diagnosis
from gpufeed.analysis.worker_profile import loader_profile
from gpufeed.record.reader import RunRecord

WIDTH = 1000          # SVG user units across
ROW = 26              # one row's height
CHAR = 6.6            # about one character's width at the labels' 11px
MIN_LABEL = 40        # a box narrower than this carries no label (its title still names it)
OUTSIDE = "outside the user's code (torch's collate, pickling, the worker loop)"


def _clip(text: str, width: float) -> str | None:
    if width < MIN_LABEL:
        return None
    fits = int((width - 6) / CHAR)
    return text if len(text) <= fits else text[:max(fits - 1, 1)] + "…"


def _box(x: float, row: int, w: float, label: str, seconds: float, total: float, kind: str,
         what: str = "of CPU") -> dict[str, Any]:
    return {"x": round(x, 2), "y": row * ROW, "w": round(max(w, 0.0), 2), "kind": kind, "label": label,
            "text": _clip(label, w), "title": f"{label}: {seconds:.3f} s {what}, {seconds / total:.1%}"}


def profile_view(record: RunRecord, d: Diagnosis) -> dict[str, Any] | None:
    """The icicle's boxes for the training loader's profile; None where it was not profiled."""
    if d.training is None:
        return None
    prof = loader_profile(record, d.training)
    total = prof.busy_s if prof is not None else 0.0
    if prof is None or total <= 0:
        return None
    scale = WIDTH / total
    n = prof.processes
    if prof.scope == "next":
        whose = "the training process's CPU inside next(loader) (num_workers=0)"
    else:
        whose = (f"the DataLoader workers' {'CPU and waiting' if prof.waits else 'CPU'} "
                 f"({n} worker{'s' if n != 1 else ''})")
    boxes = [_box(0, 0, WIDTH, f"all sampled: {whose}", total, total, "all", "")]
    x = 0.0
    for f in prof.functions:
        name = f"{f.site} {f.function}"
        boxes.append(_box(x, 1, f.cpu_s * scale, name, f.cpu_s, total, "function"))
        if f.wait_s:
            boxes.append(_box(x + f.cpu_s * scale, 1, f.wait_s * scale, f"{name} waiting", f.wait_s, total,
                              "wait", "waiting"))
        cx = x
        for c in f.calls:
            label = c.call or "own Python code"
            boxes.append(_box(cx, 2, c.busy_s * scale, label, c.busy_s, total, "call",
                              f"({c.cpu_s:.3f} s of CPU, {c.wait_s or 0.0:.3f} s waiting)"))
            cx += c.busy_s * scale
        x += f.busy_s * scale
    if prof.outside_s > 0:
        boxes.append(_box(x, 1, prof.outside_s * scale, OUTSIDE, prof.outside_s, total, "outside"))
    return {"width": WIDTH, "height": 3 * ROW, "boxes": boxes, "samples": prof.samples, "total_s": total,
            "scope": prof.scope, "whose": whose, "waits": prof.waits, "runqueue_s": prof.runqueue_s}


# The stacked bar's stages, in the order a batch passes them, with their colours
STAGE_COLORS = {"samples": "#d62728", "collate": "#ff7f0e", "worker": "#e377c2", "handover": "#9467bd",
                "pinning": "#17becf", "copy": "#1f77b4", "rest": "#c3c8ce"}


def stages_view(d: Diagnosis) -> dict[str, Any] | None:
    """The loop's wait split by stage (shares of the training time) as one stacked bar, with the part of
    the worker's time a later batch was already made (in order) as a bar beneath; None where not split."""
    b = d.batches
    if b is None or b.wait_share is None or b.worker_share is None:
        return None
    parts: list[tuple[str, str, float]] = []
    if b.samples_share is not None and b.collate_share is not None:
        parts += [("samples", "reading samples (dataset[i])", b.samples_share),
                  ("collate", "collating (collate_fn)", b.collate_share),
                  ("worker", "in the worker otherwise (its earlier batches, between samples)",
                   max(b.worker_share - b.samples_share - b.collate_share, 0.0))]
    else:
        parts.append(("worker", "the worker making the batch", b.worker_share))
    parts.append(("handover", "the hand-over (queue, pickling, shared memory, unpickling"
                              + (", pinning" if b.pin_memory and b.pinning_share is None else "") + ")",
                  b.handover_share or 0.0))
    if b.pinning_share is not None:  # measured apart (its pins rows); N/A stays out of the bar
        parts.append(("pinning", "pinning (pin_memory: the batch copied into page-locked memory)", b.pinning_share))
    copy = d.costs.get("transfer") if isinstance(d.costs, dict) else None
    if copy is not None:
        parts.append(("copy", "the copy to the GPU (in the step)", copy))
    total = sum(share for _k, _l, share in parts)
    if total <= 0:
        return None
    if total < 1.0:  # the bar is the whole training time: the rest is the step beside the stages
        parts.append(("rest", "the rest of the training time (the step, not waiting)", 1.0 - total))
    scale = WIDTH / max(total, 1.0)
    segments, x = [], 0.0
    for key, label, share in parts:
        w = share * scale
        segments.append({"key": key, "x": round(x, 2), "w": round(w, 2), "color": STAGE_COLORS[key],
                         "label": label, "points": share * 100, "text": _clip(f"{share * 100:.0f} pts", w),
                         "title": f"{label}: {share * 100:.1f} points of the training time"})
        x += w
    in_order = (b.in_order_share or 0.0) * scale
    return {"width": WIDTH, "segments": segments, "total_points": total * 100, "in_order_w": round(in_order, 2),
            "in_order_points": (b.in_order_share or 0.0) * 100, "sentence": d.wait_by_stage,
            "matched": b.steps_matched, "in_window": b.steps_in_window}
