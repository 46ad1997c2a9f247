"""The what-if model's answers: for a diagnosis (your settings, each finding's DataLoader fix, the best,
the ceiling, the same run on a quiet machine) and for ``gpufeed what-if`` (the settings asked).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from gpufeed import thresholds as th
from gpufeed.analysis.metrics import LoaderSummary, Metrics
from gpufeed.analysis.whatif.costs import measure_costs
from gpufeed.analysis.whatif.formulas import best_setting, ceiling, predict, workers_and_cores_for_ceiling
from gpufeed.analysis.whatif.types import CannotPredict, Costs, Prediction, Spread, WhatIf
from gpufeed.record.reader import RunRecord
from gpufeed.record.rows import StepRows


@dataclass(frozen=True)
class Model:
    """The model measured from a run before the rules read it (a rule may size its advice from its
    answers), and the costs the findings' fixes are predicted from after."""

    answers: WhatIf               # your settings, the ceiling, the best; or why it cannot predict
    spread: Spread | None = None


def model(record: RunRecord, training: LoaderSummary | None, m: Metrics) -> Model:
    try:
        spread = measure_costs(record, training, m)
    except CannotPredict as reason:
        return Model(WhatIf(cannot_predict=str(reason)))
    return Model(_answers(spread, _run_noise(record, training, m), m), spread)


def quiet_machine(measured: Model) -> tuple[Prediction, Prediction] | None:
    """(your settings as run, the same on a machine no other program shares), or None where the model
    cannot predict or other programs took no cores."""
    spread, answers = measured.spread, measured.answers
    if spread is None or answers.yours is None or spread.p50.other_cores <= 0:
        return None
    quiet = spread.each(lambda x: replace(x, other_cores=0.0))
    c = spread.p50
    return answers.yours, predict(quiet, c.workers, c.persistent, noise=answers.noise or 0.0,
                                  why="on a machine no other program shares")


def what_if(record: RunRecord, training: LoaderSummary | None, m: Metrics, findings: list = (),
            measured: Model | None = None) -> WhatIf:
    """The answers ``diagnose`` shows: your settings, each finding's DataLoader fix, the best
    (``measured``: the run's model, measured already)."""
    measured = measured or model(record, training, m)
    spread = measured.spread
    if spread is None:
        return measured.answers
    result = replace(measured.answers, predictions=list(measured.answers.predictions))
    seen = {(result.yours.num_workers, result.yours.persistent_workers)}
    for why, w, p in _finding_settings(findings, spread.p50):
        if (w, p) not in seen:
            seen.add((w, p))
            result.predictions.append(predict(spread, w, p, noise=result.noise, why=why))
    if (result.best.num_workers, result.best.persistent_workers) not in seen:
        result.predictions.append(result.best)
    return result


def answer(record: RunRecord, training: LoaderSummary | None, m: Metrics, *, workers: int | None = None,
           cores: float | None = None, gpu_speedup: float = 1.0, persistent: bool | None = None,
           other_cores: float | None = None, cpu_speedup: float = 1.0) -> WhatIf:
    """``gpufeed what-if``: the prediction for the settings asked (the run's own for those not given),
    and the best on the cores asked. ``other_cores``: the cores other programs take (default: what
    they took during the run); ``cpu_speedup``: a host CPU that many times faster."""
    try:
        spread = measure_costs(record, training, m)
    except CannotPredict as reason:
        return WhatIf(cannot_predict=str(reason))
    if other_cores is not None:
        spread = spread.each(lambda x: replace(x, other_cores=other_cores))
    spread = spread.each(lambda x: x.on_faster_cpu(cpu_speedup))
    result = _answers(spread, _run_noise(record, training, m), m, cores, gpu_speedup)
    c = spread.p50
    w = c.workers if workers is None else workers
    p = c.persistent if persistent is None else persistent
    asked = predict(spread, w, p, cores=cores, gpu_speedup=gpu_speedup, noise=result.noise, why="as asked")
    result.predictions = [asked] + ([result.best] if result.best.label != asked.label else [])
    if cpu_speedup != 1.0:
        result.predictions = [replace(x, label=f"{x.label}, CPU {cpu_speedup:g}x") for x in result.predictions]
    return result


def _answers(spread: Spread, noise: float, m: Metrics, cores: float | None = None,
             gpu_speedup: float = 1.0) -> WhatIf:
    """Your settings, the ceiling, what reaches it and the best setting, on ``cores`` (default: the run's)."""
    c = spread.p50
    cores = c.cores if cores is None else cores
    yours = predict(spread, c.workers, c.persistent, noise=noise, why="your settings")
    needed_w, needed_c = workers_and_cores_for_ceiling(c, gpu_speedup)
    return WhatIf(costs=replace(c, cores=cores), noise=noise, measured_samples_per_s=m.samples_per_s, yours=yours,
                  ceiling_samples_per_s=ceiling(c, gpu_speedup),
                  best=best_setting(spread, cores=cores, gpu_speedup=gpu_speedup, noise=noise),
                  best_one_per_core=best_setting(spread, cores=cores, gpu_speedup=gpu_speedup, noise=noise,
                                                 max_workers=max(int(cores), 1), persistent=c.persistent,
                                                 why="best with a worker per core at most"),
                  predictions=[yours], workers_for_ceiling=needed_w,
                  cores_for_ceiling=needed_c if needed_c > cores - c.other_cores else None)


def _finding_settings(findings, c: Costs):
    """(why, workers, persistent) for the DataLoader change each finding's fix sets (``fix_settings``)."""
    for f in findings:
        found = getattr(f, "fix_settings", None) or {}
        if "num_workers" not in found and "persistent_workers" not in found:
            continue
        w = int(found.get("num_workers", c.workers))
        persistent = bool(found.get("persistent_workers", c.persistent))
        if w == 0:
            continue
        yield f"the fix of {f.id}", w, persistent


def _run_noise(record: RunRecord, training: LoaderSummary | None, m: Metrics) -> float:
    """The run's own noise: how far the throughputs of its two halves differ (at least the floor)."""
    noise = th.WHATIF_NOISE_FLOOR
    if training is None or m.window_start_t is None or m.window_end_t is None:
        return noise
    its = [it for it in record.iterators if training.owns(it)]  # a loader rebuilt each epoch: all its builds
    steps = StepRows.concat(it.steps for it in its)
    t0, t1 = m.window_start_t, m.window_end_t
    mid = (t0 + t1) / 2
    delivered = steps.t_deliver
    halves = [steps.samples[(delivered > a) & (delivered <= b)].sum() / (b - a) for a, b in ((t0, mid), (mid, t1))]
    if min(halves) > 0:
        noise = max(noise, abs(halves[0] - halves[1]) / (halves[0] + halves[1]))
    return min(noise, th.TUNE_NOISE_CAP)


def answer_run(run_dir, **asked) -> WhatIf:
    """``answer`` for a run directory (raises ``RecordError`` when it cannot be read)."""
    from gpufeed.analysis import ranks
    from gpufeed.analysis.metrics import loader_summaries
    from gpufeed.record.reader import load_run

    record = load_run(run_dir)
    m, training = ranks.job_metrics(record, loader_summaries(record))
    return answer(record, training, m, **asked)
