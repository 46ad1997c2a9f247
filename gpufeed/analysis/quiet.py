"""The verdict on the job itself, as a machine to itself would show it (issue 31, point 9).

Other programs that hold cores slow the job for reasons that are not its own: the demo's verdict
flipped from INPUT to COMPUTE with one busy process beside it. Where they took cores (the
``other_programs`` finding names them, and what they cost, as a cause of their own) and the what-if
model describes this run (``facts.model_describes_the_run``), its prediction of your settings on a
machine no other program shares (``whatif.quiet_machine``) says what binds the job there:

- the step alone (``compute``): the loader keeps up, and the loop would wait
  ``1 - rate / ceiling`` of the time (the ceiling: the step with the data always ready);
- the workers (``workers``): each makes one batch at a time, and the loop waits for them that share.

The two are told apart only where the model's own prediction of the run as it ran (beside the
others) falls in the measured band: then the model reproduces the run's verdict, and the difference
alone is what the other programs made of it.

Where the cores bind (``cores``), the step and the workers share them and the model cannot tell the
input pipeline's part from the step's: the measured verdict stands. Where the quiet machine's band
(TensorFlow's: under 5%, 5-20%, 20% and more) differs from the measured one, the headline becomes the
quiet machine's, the measured verdict is kept beside it (``Diagnosis.quiet_machine``), and the change is
said in ``Diagnosis.checks``.
"""
from __future__ import annotations

from typing import Any

from gpufeed import thresholds as th
from gpufeed.analysis.rules import COMPUTE, INPUT
from gpufeed.analysis.rules.facts import model_describes_the_run
from gpufeed.analysis.whatif import LIMIT_LOOP, LIMIT_WORKERS


def band(share: float) -> str:
    """TensorFlow's input-pipeline bands (``facts.input_band``) for a share."""
    if share >= th.DATA_WAIT_SHARE_HIGH:
        return "highly"
    return "moderately" if share >= th.DATA_WAIT_SHARE_FLAG else "not"


def verdict(bottleneck: str | None, input_bound: str | None, costs: dict[str, float | None], quiet: Any,
            what_if: Any, others_named: bool) -> dict | None:
    """{"bottleneck", "input_bound", "costs", "measured": {the three as measured}, "samples_per_s",
    "setting", "limit", "other_cores"} where the quiet machine's verdict replaces the measured one; else
    None. ``quiet``: ``whatif.quiet_machine``'s (your settings, the same alone); ``others_named``: the
    other_programs finding stands beside the headline."""
    if (not others_named or quiet is None or bottleneck not in (INPUT, COMPUTE) or costs.get(INPUT) is None
            or not model_describes_the_run(what_if) or not getattr(what_if, "ceiling_samples_per_s", None)):
        return None
    yours, alone = quiet
    if alone.limit not in (LIMIT_LOOP, LIMIT_WORKERS):
        return None  # the cores bind: the step's part and the loader's cannot be told apart
    ceiling = what_if.ceiling_samples_per_s
    share = min(max(0.0, 1.0 - alone.samples_per_s / ceiling), 1.0)
    quiet_band = band(share)
    if quiet_band == input_bound or band(max(0.0, 1.0 - yours.samples_per_s / ceiling)) != input_bound:
        return None  # the same verdict alone; or the model, beside the others, does not reach the run's own
    others = {k: v for k, v in costs.items() if k not in (INPUT, COMPUTE)}
    quiet_costs = {**costs, INPUT: share,
                   COMPUTE: max(0.0, 1.0 - share - sum(v for v in others.values() if v is not None))}
    losses = {k: v for k, v in quiet_costs.items() if k != COMPUTE and v is not None and v >= th.BOTTLENECK_MIN_SHARE}
    return {"bottleneck": max(losses, key=lambda k: losses[k]) if losses else COMPUTE, "input_bound": quiet_band,
            "costs": quiet_costs, "measured": {"bottleneck": bottleneck, "input_bound": input_bound, "costs": costs},
            "samples_per_s": alone.samples_per_s, "setting": alone.label, "limit": alone.limit,
            "other_cores": what_if.costs.other_cores if what_if.costs is not None else None}


def check_line(v: dict) -> str:
    """What the self-check says of the change."""
    m = v["measured"]
    return (f"measured beside other programs (they kept {v['other_cores']:.1f} cores busy), the input pipeline cost "
            f"{m['costs'][INPUT]:.0%} and the headline was {m['bottleneck'].upper()}; on a machine to itself the "
            f"what-if model puts your settings at {v['samples_per_s']:,.0f} samples/s, bound by "
            f"{'the step alone' if v['limit'] == LIMIT_LOOP else 'its workers'}, the loop waiting "
            f"{v['costs'][INPUT]:.0%} of the time: the headline is the job's own, {v['bottleneck'].upper()}, and "
            "other_programs names what the others cost")


def headline_note(v: dict | None) -> str:
    """What the headline adds where it is the quiet machine's: "; on a machine to itself (measured beside
    other programs: INPUT, input 9%)"."""
    if not v:
        return ""
    m = v["measured"]
    return (f"; on a machine to itself (measured beside other programs: {m['bottleneck'].upper()}, "
            f"input {m['costs'][INPUT]:.0%})")
