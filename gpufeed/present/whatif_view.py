"""The "what if" block: the model's predictions (analysis/whatif/), each with its range."""
from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from gpufeed import thresholds as th
from gpufeed.analysis.whatif import Costs, Prediction, WhatIf


def _line(p: Prediction, measured: float | None = None) -> Text:
    why = p.why + (f", measured {measured:,.0f}" if measured is not None else "")
    return Text.assemble(("   ", ""), (f"{p.label:<28}", "bold"),
                         f" {p.samples_per_s:>9,.0f} samples/s  ({p.low:,.0f}-{p.high:,.0f}; limit: {p.limit})",
                         (f"  {why}" if why else "", "dim"))


# How the block names a cost the run did not measure (``Costs.assumed``), and its unit.
_ASSUMED = {"handoff_s": ("hand-off", "ms/batch", 1), "spawn_s": ("spawn", "ms/worker", 0),
            "stop_s": ("stop", "ms/worker", 0), "cow_s": ("copy-on-write", "ms/fork", 0),
            "receive_s": ("receive", "ms/batch", 1), "spin_s": ("spin", "ms/step", 1)}


def _assumed_line(c: Costs) -> Text | None:
    """One line naming the costs this run did not measure: a default stands in, and the ranges cover it
    at WHATIF_ASSUMED_LOW to _HIGH times its value (docs/what-if.md, "Uncertainty")."""
    if not c.assumed:
        return None
    named = []
    for term in c.assumed:
        name, unit, digits = _ASSUMED.get(term, (term, "ms", 1))
        named.append(f"{name} {getattr(c, term) * 1e3:.{digits}f} {unit}")
    return Text(f"   assumed, not measured in this run: {', '.join(named)} (ranges cover "
                f"{th.WHATIF_ASSUMED_LOW:g}-{th.WHATIF_ASSUMED_HIGH:g}x of each)", style="dim")


def _gpu_step(c: Costs) -> str:
    """Which step the loop bound takes on a GPU run: the GPU's own (CUDA events) or, where they did not
    resolve, the host's in its place (docs/what-if.md, g_gpu)."""
    if c.gpu_step_s is not None:
        return f" on the host, {c.gpu_step_s * 1e3:.1f} ms on the GPU (CUDA events; the loop bound takes the longer)"
    if c.cuda:
        return " on the host (CUDA events did not resolve: the host's step stands in for the GPU's)"
    return ""


def what_if_block(w: WhatIf | None) -> Group | None:
    if w is None:
        return None
    head = Text("What if (a model of the loader fed by this run's per-batch costs; docs/what-if.md):", style="bold")
    if w.cannot_predict:
        return Group(head, Text(f"   cannot predict: {w.cannot_predict}.", style="yellow"))
    c = w.costs
    lines = [head, Text(f"   per batch: {c.cpu_s * 1e3:.1f} ms CPU + {c.sleep_s * 1e3:.1f} ms asleep in a worker; "
                        f"step {c.compute_s * 1e3:.1f} ms"
                        + (f" ({c.loop_step_s * 1e3:.1f} ms after a batch that was ready)"
                           if abs(c.loop_step_s - c.compute_s) >= 0.1 * c.compute_s else "")
                        + _gpu_step(c)
                        + f"; training process {c.main_cpu_s * 1e3:.1f} ms CPU"
                        + (f", and its {c.step_threads} threads spin {c.spin_s * 1e3:.1f} ms a step while it waits"
                           if c.spin_s >= 5e-5 else "")  # what .1f would print as 0.0: none
                        + (f"; each fork of workers costs its step {c.cow_s * 1e3:.0f} ms (copy-on-write)"
                           if c.cow_s >= 5e-4 else ""), style="dim")]
    assumed = _assumed_line(c)
    if assumed is not None:
        lines.append(assumed)
    if c.ranks > 1:
        lines.append(Text(f"   {c.ranks} ranks share these {c.cores:g} cores, each with its own loader at the settings "
                          "below: samples/s are the job's (every rank's), from the costs of the rank that waited most",
                          style="dim"))
    if c.worker_threads > 1:
        lines.append(Text(f"   every setting with {c.worker_threads} torch threads in each worker, as in this run: "
                          "a thread cap changes a batch's CPU by what one run cannot show (gpufeed tune measures it)",
                          style="dim"))
    lines.append(Text(f"   ceiling (data always ready): {w.ceiling_samples_per_s:,.0f} samples/s, "
                      f"reached with {w.workers_for_ceiling} worker{'s' if w.workers_for_ceiling != 1 else ''}"
                      + (f" and {w.cores_for_ceiling} core{'s' if w.cores_for_ceiling != 1 else ''} free for it "
                         f"(this machine has {c.cores:g}"
                         + (f"; other programs used {c.other_cores:.1f}" if c.other_cores >= 0.1 else "") + ")"
                         if w.cores_for_ceiling else f" on these {c.cores:g} cores")))
    lines += [_line(p, w.measured_samples_per_s if p is w.yours else None) for p in w.predictions]
    return Group(*lines)


def what_if_view(w: WhatIf) -> list[RenderableType]:
    """``gpufeed what-if``: the block alone, to print one after another."""
    block = what_if_block(w)
    out: list[RenderableType] = [] if block is None else [block]
    if w.measured_samples_per_s is not None and not w.cannot_predict:
        out.append(Text(f"   measured in this run: {w.measured_samples_per_s:,.0f} samples/s "
                        f"(model: {w.yours.samples_per_s:,.0f})", style="dim"))
    return out
