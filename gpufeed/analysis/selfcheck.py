"""One self-check before anything is printed: the diagnosis's claims against the record.

The rules each answer one question; this module checks what they say together, in one place, and
demotes or qualifies a claim the record does not bear out, saying so in ``Diagnosis.checks``:

- every DataLoader fix carries its predicted gain (the what-if model, with its range), and a fix
  predicted within the run's own noise is not offered as a fix;
- the headline agrees with the costs and with the gains: COMPUTE is not said while a fix is predicted
  to buy a clear gain, and "the loader is not the problem" (``compute_bound``) never stands beside a
  loss the headline names;
- no finding claims more of the time than the run had, and the time ranking holds time costs only
  (memory findings rank by bytes in their own group);
- the counts said beside each other agree (steps asked, steps measured, warm-up).
"""
from __future__ import annotations

from dataclasses import replace

from gpufeed import thresholds as th
from gpufeed.analysis.findings import LOW, SEVERITY_ORDER, Diagnosis, Finding
from gpufeed.analysis.rules import COMPUTE, INPUT
from gpufeed.analysis.whatif import Prediction, WhatIf


def attach_gains(findings: list[Finding], what_if: WhatIf | None) -> list[Finding]:
    """Each finding whose fix is a DataLoader setting, with its predicted gain over your settings."""
    return [replace(f, gain=_gain(f, what_if)) if f.fix_settings else f for f in findings]


def _gain(f: Finding, what_if: WhatIf | None) -> dict:
    if what_if is None or what_if.cannot_predict or what_if.yours is None or what_if.costs is None:
        return {"cannot_predict": (what_if.cannot_predict if what_if is not None and what_if.cannot_predict
                                   else "the what-if model had nothing to predict from")}
    settings = f.fix_settings or {}
    c = what_if.costs
    workers = int(settings.get("num_workers", c.workers))
    persistent = bool(settings.get("persistent_workers", c.persistent))
    p = _prediction(what_if, workers, persistent)
    if p is None:
        return {"cannot_predict": f"no prediction of {workers} workers{' persistent' if persistent else ''}"}
    base = what_if.yours.samples_per_s
    if not base:
        return {"cannot_predict": "your settings were predicted at 0 samples/s"}
    return {"speedup": p.samples_per_s / base, "low": p.low / base, "high": p.high / base,
            "samples_per_s": p.samples_per_s, "setting": p.label, "noise": what_if.noise,
            "only_workers_predicted": any(k not in ("num_workers", "persistent_workers") for k in settings)}


def _prediction(what_if: WhatIf, workers: int, persistent: bool) -> Prediction | None:
    return next((p for p in what_if.predictions if p.num_workers == workers and p.persistent_workers == persistent
                 and p.gpu_speedup == 1.0), None)


def check(d: Diagnosis) -> Diagnosis:
    """The diagnosis with every claim checked against the record (``d.checks`` says what changed)."""
    checks: list[str] = []
    site = (d.training.config.get("site") if d.training is not None else None)
    findings = [_fix_in_proportion(f, checks, site) for f in d.findings]
    findings = [_cost_within_the_run(f, checks) for f in findings]
    bottleneck = d.bottleneck
    if bottleneck == COMPUTE:
        contradicting = [f for f in findings if f.group == "time" and f.gain and f.gain.get("low")
                         and f.gain["low"] >= th.SELFCHECK_CONTRADICTING_GAIN]
        if contradicting:
            f = contradicting[0]
            bottleneck = INPUT
            checks.append(f"the costs named COMPUTE, but the fix of {f.id} is predicted to gain "
                          f"{f.gain['speedup']:.2f}x ({f.gain['low']:.2f}-{f.gain['high']:.2f}x): the input pipeline "
                          "costs more than its measured wait, so the headline says INPUT")
    if bottleneck != COMPUTE and any(f.id == "compute_bound" for f in findings):
        findings = [f for f in findings if f.id != "compute_bound"]
        checks.append(f"'the loader is not the problem' (compute_bound) was left out: the headline names {bottleneck}")
    findings = ranked(findings)
    checks += _counts(d)
    return replace(d, bottleneck=bottleneck, findings=findings, checks=d.checks + checks)


def ranked(findings: list[Finding]) -> list[Finding]:
    """Time findings by the time they cost, then memory findings by the bytes they hold."""
    def key(f: Finding):
        group = 0 if f.group == "time" else 1
        size = f.cost_share if f.group == "time" else (f.evidence.get("bytes") or 0)
        return group, -(size or 0.0), SEVERITY_ORDER[f.severity]
    return sorted(findings, key=key)


def _fix_in_proportion(f: Finding, checks: list[str], site: str | None = None) -> Finding:
    """A fix predicted within the run's noise is not offered: the finding keeps its facts, and says so.
    The prediction itself must clear the noise, not only its range's upper end: on a loaded host (noise
    25%) storage_latency's num_workers=32 was offered at 0.99x because its range reached 1.30x."""
    gain = f.gain or {}
    speedup, high = gain.get("speedup"), gain.get("high")
    noise = max(gain.get("noise") or 0.0, th.WHATIF_NOISE_FLOOR)
    if speedup is None or high is None or min(speedup, high) >= 1.0 + noise:
        return f
    how = "slower than your settings" if high < 1.0 else f"within this run's noise (±{noise:.0%})"
    checks.append(f"the fix of {f.id} ({gain['setting']}) is predicted at {gain['speedup']:.2f}x "
                  f"({gain['low']:.2f}-{high:.2f}x), {how}: not offered")
    if not f.fix_settings:  # a change to the user's code (a loop without a DataLoader), not a setting
        return replace(f, severity=LOW, recommendation=(
            f"No change is offered: {gain['setting']} is predicted at {gain['speedup']:.2f}x "
            f"({gain['low']:.2f}-{high:.2f}x), {how}."))
    which = f" for the DataLoader at {site}" if site else ""
    return replace(f, severity=LOW, recommendation=(
        f"No DataLoader change is offered{which}: the what-if model puts {gain['setting']} at {speedup:.2f}x your "
        f"settings ({gain['low']:.2f}-{high:.2f}x), {how}. `gpufeed tune` measures whether any setting does better."),
        fix_settings=None)


def _cost_within_the_run(f: Finding, checks: list[str]) -> Finding:
    if f.cost_share is None or f.cost_share <= 1.0:
        return f
    checks.append(f"{f.id} claimed {f.cost_share:.0%} of the time: capped at 100%")
    return replace(f, cost_share=1.0)


def _counts(d: Diagnosis) -> list[str]:
    """Counts said beside each other must agree: the steps --steps asked for and those measured."""
    m, out = d.metrics, []
    asked = d.run.get("steps_requested")
    if d.run.get("end_reason") == "steps_reached" and asked and m.steps and m.steps != asked:
        more = m.warmup_steps - (m.warmup_asked or 0)
        why = (f"{more} more warm-up step{'s' if more != 1 else ''} so that the window starts on an epoch's "
               "boundary" if more > 0 else "whole epochs only")
        out.append(f"--steps {asked} counted the steps after the {m.warmup_asked} warm-up steps; the diagnosis "
                   f"measures {m.steps} of them ({why}: see docs/run-record.md)")
    return out
