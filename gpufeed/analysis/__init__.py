"""The analysis: reads a run record, computes metrics, runs every rule, names the bottleneck.

Data flows one way: ``record`` → ``metrics.compute`` → ``rules.RULES`` → ``Diagnosis``.
"""
from __future__ import annotations

from pathlib import Path

from gpufeed import thresholds as th
from gpufeed.analysis import ranks, rules, whatif
from gpufeed.analysis.findings import SEVERITY_ORDER, Diagnosis, Finding
from gpufeed.analysis.metrics import Metrics, loader_summaries
from gpufeed.record.reader import RunRecord, load_run

__all__ = ["analyze", "analyze_record", "Diagnosis", "Finding", "Metrics"]


def analyze(run_dir: str | Path) -> Diagnosis:
    """Diagnose a run from its directory alone (raises ``RecordError`` if it cannot be read)."""
    return analyze_record(load_run(run_dir))


def analyze_record(record: RunRecord) -> Diagnosis:
    loaders = loader_summaries(record)
    metrics, training = ranks.job_metrics(record, loaders)
    model = whatif.model(record, training, metrics)  # before the rules: cpu_saturated sizes the cores from it
    ctx = rules.Context(record=record, metrics=metrics, training=training, what_if=model.answers)
    findings = [f for f in (rule(ctx) for rule in rules.RULES) if f is not None]
    findings += rules.unexplained_losses(ctx, findings)
    # Ranked by the time they cost; findings that cost nothing measurable come last.
    findings.sort(key=lambda f: (-(f.cost_share or 0.0), SEVERITY_ORDER[f.severity]))
    too_few = _too_few_steps(record, metrics)
    if too_few:  # no finding from nothing: what was measured is shown, and nothing is concluded from it
        findings = [f for f in findings if f.id in rules.FINDINGS_WITHOUT_STEPS]
    warnings = list(record.warnings) + ranks.rank_warnings(record, metrics) + ([too_few] if too_few else [])
    if metrics.throughput_check:
        warnings.append(metrics.throughput_check)
    gpu_error = record.meta.sampler.get("gpu_error")
    what_if = whatif.what_if(record, training, metrics, findings, model)
    return Diagnosis(
        bottleneck=None if too_few else primary_bottleneck(
            metrics, has_data=bool(record.iterators) or len(record.samples) > 0),
        costs=rules.costs(metrics),
        findings=findings, metrics=metrics, loaders=loaders, run_dir=str(record.run_dir),
        run_dirs=[str(p.run_dir) for p in record.parts],
        gpu_available=bool(record.samples.gpus) or metrics.cuda_used,
        gpu_unavailable_reason=None if record.samples.gpus else gpu_error,
        run={"command": record.meta.command, "end_reason": record.meta.end_reason,
             "exit_code": record.meta.exit_code, "message": record.meta.message},
        warnings=warnings, what_if=what_if,
    )


def _too_few_steps(record: RunRecord, m: Metrics) -> str | None:
    """The sentence saying why no finding is drawn, when a DataLoader ran too few measured steps."""
    if not record.iterators or m.steps >= th.MIN_STEPS_FOR_FINDINGS:
        return None
    return (f"only {m.steps} step{'' if m.steps == 1 else 's'} measured after {m.warmup_steps} warm-up "
            f"step{'' if m.warmup_steps == 1 else 's'}: too few to judge the input pipeline (findings need "
            f"{th.MIN_STEPS_FOR_FINDINGS}): shown is what was measured, and nothing is concluded from it")


def primary_bottleneck(m: Metrics, has_data: bool) -> str | None:
    """What takes the largest share of the wall time: waiting for data, copies, other host idle, or the
    step's own compute (``rules.costs``). A 3.2 s step with 5% of data wait is compute-bound; the
    headline quantifies the rest ("COMPUTE; input costs 5%") and findings explain every loss."""
    if not has_data:
        return None
    measured = {k: v for k, v in rules.costs(m).items() if v is not None}
    if not measured:
        return rules.COMPUTE
    # On a tie a loss wins over compute: a loss can be fixed.
    return max(measured, key=lambda k: (measured[k], k != rules.COMPUTE))
