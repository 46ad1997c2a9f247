"""The analysis: reads a run record, computes metrics, runs every rule, names the bottleneck.

Data flows one way: ``record`` → ``metrics.compute`` → ``rules.RULES`` → ``Diagnosis``.
"""
from __future__ import annotations

from pathlib import Path

from gpufeed import thresholds as th
from gpufeed.analysis import batches, quiet, ranks, rules, selfcheck, whatif
from gpufeed.analysis.findings import Diagnosis, Finding
from gpufeed.analysis.metrics import Metrics, fork_steps_in_window, loader_summaries
from gpufeed.record.reader import RunRecord, load_run

__all__ = ["analyze", "analyze_record", "Diagnosis", "Finding", "Metrics"]


def analyze(run_dir: str | Path) -> Diagnosis:
    """Diagnose a run from its directory alone (raises ``RecordError`` if it cannot be read)."""
    return analyze_record(load_run(run_dir))


def analyze_record(record: RunRecord) -> Diagnosis:
    loaders = loader_summaries(record)
    metrics, training = ranks.job_metrics(record, loaders)
    model = whatif.model(record, training, metrics)  # before the rules: cpu_saturated sizes the cores from it
    _charge_forks(record, training, metrics, model)
    inside = batches.analyze(record, training, metrics)  # slow samples, in-order delivery, the wait by stage
    ctx = rules.Context(record=record, metrics=metrics, training=training, what_if=model.answers,
                        quiet=whatif.quiet_machine(model), batches=inside)
    findings = [f for f in (rule(ctx) for rule in rules.RULES) if f is not None]
    findings += rules.unexplained_losses(ctx, findings)
    findings = selfcheck.ranked(findings)  # by the time they cost; memory findings by the bytes they hold
    too_few = _too_few_steps(record, metrics)
    if too_few:  # no finding from nothing: what was measured is shown, and nothing is concluded from it
        findings = [f for f in findings if f.id in rules.FINDINGS_WITHOUT_STEPS]
    warnings = list(record.warnings) + ranks.rank_warnings(record, metrics) + ([too_few] if too_few else [])
    if metrics.throughput_check:
        warnings.append(metrics.throughput_check)
    gpu_error = record.meta.sampler.get("gpu_error")
    what_if = whatif.what_if(record, training, metrics, findings, model)
    findings = selfcheck.attach_gains(findings, what_if)
    not_measured = too_few and "too few steps were measured" or _not_measured(record, metrics)
    if not_measured:  # no finding from nothing: only what needs no steps (a stall; no DataLoader at all)
        findings = [f for f in findings if f.id in rules.FINDINGS_WITHOUT_STEPS or f.id == "no_dataloader"]
    bottleneck = None if not_measured else primary_bottleneck(metrics)
    input_bound, costs = None if not_measured else rules.input_band(metrics), rules.costs(metrics)
    alone = quiet.verdict(bottleneck, input_bound, costs, ctx.quiet, model.answers,
                          any(f.id == "other_programs" for f in findings))
    if alone is not None:  # other programs held cores: the headline is the job's own, the run's kept beside it
        bottleneck, input_bound, costs = alone["bottleneck"], alone["input_bound"], alone["costs"]
    return selfcheck.check(Diagnosis(
        bottleneck=bottleneck, input_bound=input_bound, not_measured=not_measured, costs=costs,
        quiet_machine=alone, checks=[quiet.check_line(alone)] if alone else [],
        findings=findings, metrics=metrics, loaders=loaders, run_dir=str(record.run_dir),
        run_dirs=[str(p.run_dir) for p in record.parts],
        gpu_available=bool(record.samples.gpus) or metrics.cuda_used,
        gpu_unavailable_reason=None if record.samples.gpus else gpu_error,
        run={"command": record.meta.command, "end_reason": record.meta.end_reason,
             "exit_code": record.meta.exit_code, "message": record.meta.message,
             "steps_requested": record.meta.steps_requested},
        warnings=warnings, what_if=what_if,
        batches=None if not_measured or inside is None else inside,
    ))


def _too_few_steps(record: RunRecord, m: Metrics) -> str | None:
    """The sentence saying why no finding is drawn, when a DataLoader ran too few measured steps."""
    if not record.iterators or m.steps >= th.MIN_STEPS_FOR_FINDINGS:
        return None
    return (f"only {m.steps} step{'' if m.steps == 1 else 's'} measured after {m.warmup_steps} warm-up "
            f"step{'' if m.warmup_steps == 1 else 's'}: too few to judge the input pipeline (findings need "
            f"{th.MIN_STEPS_FOR_FINDINGS}): shown is what was measured, and nothing is concluded from it")


def _charge_forks(record: RunRecord, training, m: Metrics, model: whatif.Model) -> None:
    """A CPU-only run pays for each fork of its workers in the steps after it (copy-on-write), time the
    what-if model measured (``cow_s``) and the wait in next() does not show: the input pipeline's."""
    if m.cuda_used or model.spread is None or training is None or not m.wall_s or m.window_start_t is None:
        return
    its = [it for it in record.iterators if training.owns(it)]
    forks = fork_steps_in_window(its, m.window_start_t, m.window_end_t)
    if forks and model.spread.p50.cow_s > 0:
        m.fork_step_share = forks * model.spread.p50.cow_s / m.wall_s


def _not_measured(record: RunRecord, m: Metrics) -> str | None:
    """Why no verdict can be drawn, in one clause; None when the run's steps were measured."""
    if m.data_wait_share is not None:
        return None
    ended = record.meta.end_reason
    if record.iterators:
        return "the DataLoader was iterated, but fewer than 2 of its steps were measured"
    if ended not in rules.general.FINISHED_NORMALLY:
        return "the command ended before any DataLoader delivered a batch"
    if record.processes:
        return ("the command never iterated a torch DataLoader, nor stepped an optimizer or ran a backward pass, so no "
                "training step was timed")
    return "no Python process under the command imported torch.utils.data"


def primary_bottleneck(m: Metrics) -> str | None:
    """The largest loss (waiting for data, copies, other host idle) once it costs the bar
    (``BOTTLENECK_MIN_SHARE``, TensorFlow's 5% for "input-bound"); compute only when no loss reaches
    it. A run whose input pipeline costs 45% is input-bound even though compute takes 55%: it is the
    loss a change can buy back (docs/sources.md, "Is the job input-bound?")."""
    measured = {k: v for k, v in rules.costs(m).items() if v is not None}
    if not measured:
        return None
    losses = {k: v for k, v in measured.items() if k != rules.COMPUTE and v >= th.BOTTLENECK_MIN_SHARE}
    if losses:
        return max(losses, key=lambda k: losses[k])
    return rules.COMPUTE
