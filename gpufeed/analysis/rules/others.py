"""Other programs on the machine: do programs outside the command take the cores the job needs?

Named with what the sampler saw of them (pid, name, cores, about every 2 s) and what they cost: the
what-if model's prediction of the same settings on a machine no other program shares, against its
prediction of the run as it ran (``whatif.quiet_machine``). A job whose input pipeline or CPU step
does not need the cores they took costs nothing, and the finding stays quiet.
"""
from __future__ import annotations

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import MEDIUM, Finding, severity_for
from gpufeed.analysis.rules.facts import input_share
from gpufeed.analysis.rules.wording import cores
from gpufeed.units import fmt


def other_programs(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if ctx.training is None or m.data_wait_share is None or m.cpu_cores_busy is None or m.cpu_cores_command is None:
        return None  # nothing of the job measured: nothing they could have cost it
    taken = m.cpu_cores_busy - m.cpu_cores_command
    share = input_share(m)
    needs_cpu = not m.cuda_used or (share is not None and share >= th.DATA_WAIT_SHARE_FLAG)
    if taken < th.OTHER_PROGRAMS_CORES or not needs_cpu:
        return None
    named = ", ".join(f"pid {p['pid']} ({p['name']}) {p['cores']:.1f} cores" for p in m.other_programs[:3])
    who = f": {named}" if named else " (which ones was not read: the sampler names them on Linux)"
    quiet = ctx.quiet
    cost, gain = None, None
    if quiet is not None:
        yours, alone = quiet
        if yours.samples_per_s > 0:
            gain = alone.samples_per_s / yours.samples_per_s
            cost = max(0.0, 1.0 - 1.0 / gain)
    # The model predicts the loader's bounds on the freed cores, not a CPU step sped up by them: where it
    # sees no gain but the machine was saturated, the job could have had at most C / (C - o) as much CPU.
    saturated = m.cpu_cores_busy >= th.CPU_SATURATED_PCT / 100.0 * m.cpu_count and taken < m.cpu_count
    at_most = m.cpu_count / (m.cpu_count - taken) if saturated else None
    if gain is not None and gain >= 1.0 + th.WHATIF_NOISE_FLOOR:
        what = (f"; on a machine to itself the what-if model puts this run at {gain:.2f}x its samples/s "
                f"({alone.low / yours.samples_per_s:.2f}-{alone.high / yours.samples_per_s:.2f}x), so they cost it "
                f"{cost:.0%} of its time")
    elif at_most is not None and at_most >= 1.0 + th.WHATIF_NOISE_FLOOR:
        cost = None  # a bound, not a prediction: ranked after the costs that were measured
        what = (f"; the machine was saturated ({m.cpu_cores_busy:.1f} of {m.cpu_count} cores busy) and the job got "
                f"{m.cpu_cores_command:.1f}, so on a machine to itself it could run at most {at_most:.1f}x as fast "
                "(the what-if model, which does not speed up a CPU step, predicts no gain for its loader alone)")
    else:
        return None  # they took cores this job did not need
    return Finding(
        id="other_programs", severity=severity_for(cost) if cost is not None else MEDIUM, cost_share=cost,
        message=(f"Other programs took {taken:.1f} of the job's {cores(m.cpu_count)} during the run{who}{what}. "
                 "The job's own figures are measured beside them."),
        recommendation=("Stop or move those programs, or give the job cores of its own (taskset, a cgroup or "
                        "container CPU set); then measure again: the input pipeline's findings above assume the "
                        "cores as this run had them."),
        evidence={"other_cores": taken, "cpu_cores_busy": m.cpu_cores_busy, "cpu_cores_command": m.cpu_cores_command,
                  "programs": m.other_programs, "quiet_machine_speedup": gain, "speedup_at_most": at_most,
                  "cpu_count": m.cpu_count, "input_share": share},
        thresholds={"other_cores": th.OTHER_PROGRAMS_CORES, "program_cores": th.OTHER_PROGRAM_MIN_CORES},
    )
