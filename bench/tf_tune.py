"""gpufeed tune on TensorFlow scripts: its winner against your pipeline and against AUTOTUNE everywhere.

For each workload (an unmodified Keras script, run for many epochs so that every trial ends on time):
- **tune**: ``gpufeed tune``'s search (tf.data's knobs), its winner and wall time;
- **re-measured**: your pipeline, AUTOTUNE everywhere (``num_parallel_calls`` and ``prefetch``:
  TensorFlow's own answer) and tune's winner, each run again ``--verify`` times, in turn (new runs,
  not the trials' own numbers; the order rotates each round, so that neither a drift of the
  machine's speed nor the position in a round favours one): medians, their spread, and the winner's
  ratio to each. A run counts only when it ended well and its record shows the settings in force on
  the training pipeline (as tune's own trials are checked); the others are counted and said why.

    python bench/tf_tune.py [--workloads storage,cpu] [--trial-seconds 2] [--verify 3] [--budget S] [--out FILE]

Prints a Markdown table (and writes it to ``--out``).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpufeed.measure.inside.tf_overrides import PipelineOverrides  # noqa: E402
from gpufeed.settings import AUTOTUNE, PipelineSettings  # noqa: E402
from gpufeed.trials.engine import TrialRunner  # noqa: E402
from gpufeed.trials.options import TrialOptions  # noqa: E402
from gpufeed.tune import tf_target  # noqa: E402
from gpufeed.tune.command import TuneOptions, tune_command  # noqa: E402

W = ROOT / "tests" / "workloads"
PY = sys.executable
WORKLOADS = {
    "storage": ("Keras fit, a sequential map reading through a Python call with 4 ms of storage latency",
                [PY, str(W / "tf_tune_target.py"), "--epochs", "1000"]),
    "cpu": ("Keras fit, a sequential random map, 150 rounds of 3 TF ops on a 64 x 64 tile per element (tf_train.py fit_slow_map)",
            [PY, str(W / "tf_train.py"), "fit_slow_map", "1000"]),
}


def rate_of(runner: TrialRunner, overrides: PipelineOverrides | None, target: PipelineOverrides) -> float | str:
    """samples/s of one run, or why it does not count (failed, or its settings were not in force)."""
    outcome = runner.run_trial(overrides)
    if outcome.status != "ok" or outcome.diagnosis is None:
        return outcome.reason or outcome.status
    settings = overrides.settings if overrides is not None else PipelineSettings()
    mismatch = tf_target.not_applied(tf_target.training_pipeline(outcome.record, outcome.diagnosis.training),
                                     settings, target)
    if mismatch:
        return mismatch
    rate = outcome.diagnosis.metrics.samples_per_s
    return rate if rate is not None else "no samples/s measured"


def median(values: list[float | str]) -> float | None:
    ok = [v for v in values if not isinstance(v, str)]
    return statistics.median(ok) if ok else None


def spread(values: list[float | str]) -> str:
    ok = [v for v in values if not isinstance(v, str)]
    return f"{min(ok):,.0f}-{max(ok):,.0f}" if ok else "N/A"


def bench(key: str, args: argparse.Namespace, work: Path) -> dict:
    label, command = WORKLOADS[key]
    t0 = time.monotonic()
    result = tune_command(TuneOptions(command=command, out=work / key / "tune", seconds=args.trial_seconds,
                                      warmup_steps=args.warmup, budget_s=args.budget))
    tune_s = time.monotonic() - t0
    target = result.target
    if not isinstance(target, PipelineOverrides):
        raise SystemExit(f"{key}: tune did not tune a tf.data pipeline ({target!r})")
    configs = {"yours": None,
               "AUTOTUNE": dataclasses.replace(target, settings=PipelineSettings(
                   parallel_calls=AUTOTUNE if target.stages else None, prefetch=AUTOTUNE)),
               "winner": dataclasses.replace(target, settings=result.best.settings)}
    runner = TrialRunner(TrialOptions(command=command, out=work / key / "verify", seconds=args.trial_seconds,
                                      warmup_steps=args.warmup))
    rates: dict[str, list[float | str]] = {name: [] for name in configs}
    names = list(configs)
    for round_ in range(args.verify):  # in turn, the order rotated each round
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            rates[name].append(rate_of(runner, configs[name], target))
            print(f"{key} round {round_ + 1}: {name}: {rates[name][-1]}", file=sys.stderr, flush=True)
    return {"key": key, "label": label, "winner_label": result.best.settings.label(), "trials": len(result.trials),
            "runs": sum(len(t.runs) for t in result.trials), "tune_s": tune_s, "tune_speedup": result.speedup,
            "rates": rates, **{name: median(values) for name, values in rates.items()}}


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a and b else "N/A"


def rate_cell(values: list[float | str]) -> str:
    m = median(values)
    ok = sum(not isinstance(v, str) for v in values)
    text = f"{m:,.0f} ({spread(values)})" if m is not None else "N/A"
    return text if ok == len(values) else f"{text}, {ok} of {len(values)} runs counted"


def table(rows: list[dict], args: argparse.Namespace) -> str:
    command = " ".join(["python", "bench/tf_tune.py", *sys.argv[1:]])
    lines = [f"`{command}` (samples/s: median of {args.verify} re-measured runs each, in turn, "
             "with their range; tune's own speed-up is its trials' figure)", "",
             "| workload | tune's winner | tune: configurations (runs), time, its speed-up | yours | "
             "AUTOTUNE everywhere | winner | winner/yours | winner/AUTOTUNE |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['winner_label']} | {r['trials']} ({r['runs']}), {r['tune_s']:.0f} s, "
                     f"{ratio(r['tune_speedup'], 1.0)} | {rate_cell(r['rates']['yours'])} | "
                     f"{rate_cell(r['rates']['AUTOTUNE'])} | {rate_cell(r['rates']['winner'])} | "
                     f"{ratio(r['winner'], r['yours'])} | {ratio(r['winner'], r['AUTOTUNE'])} |")
    failures = [(r["key"], name, v) for r in rows for name, values in r["rates"].items() for v in values
                if isinstance(v, str)]
    lines += [""] + [f"- {r['key']}, {name}, each run in order: "
                     + ", ".join(f"{v:,.0f}" if not isinstance(v, str) else "not counted" for v in values)
                     for r in rows for name, values in r["rates"].items()]
    lines += [f"- {key}, {name}: not counted: {why}" for key, name, why in failures]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--trial-seconds", type=float, default=2.0)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--verify", type=int, default=3)
    p.add_argument("--budget", type=float, default=None, help="tune's budget per workload, seconds")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufeed-tf-tune-") as tmp:
        rows = [bench(key, args, Path(tmp)) for key in args.workloads.split(",")]
    text = table(rows, args)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
