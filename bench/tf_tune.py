"""gpufeed tune on TensorFlow scripts: its winner against your pipeline and against AUTOTUNE everywhere.

For each workload (an unmodified Keras script, run for many epochs so that every trial ends on time):
- **tune**: ``gpufeed tune``'s search (tf.data's knobs), its winner and wall time;
- **re-measured**: your pipeline, AUTOTUNE everywhere (``num_parallel_calls`` and ``prefetch``:
  TensorFlow's own answer) and tune's winner, each run again ``--verify`` times, in turn (new runs,
  not the trials' own numbers): medians, and the winner's ratio to each.

    python bench/tf_tune.py [--workloads storage,cpu] [--trial-seconds 2] [--verify 3] [--out FILE]

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

from gpufeed.settings import AUTOTUNE, PipelineSettings  # noqa: E402
from gpufeed.trials.engine import TrialRunner  # noqa: E402
from gpufeed.trials.options import TrialOptions  # noqa: E402
from gpufeed.tune.command import TuneOptions, tune_command  # noqa: E402

W = ROOT / "tests" / "workloads"
PY = sys.executable
WORKLOADS = {
    "storage": ("Keras fit, a sequential map reading through a Python call with 4 ms of storage latency",
                [PY, str(W / "tf_tune_target.py"), "--epochs", "1000"]),
    "cpu": ("Keras fit, a sequential random map of 500 TF ops per element (tf_train.py fit_slow_map)",
            [PY, str(W / "tf_train.py"), "fit_slow_map", "1000"]),
}


def rate_of(runner: TrialRunner, overrides) -> float | None:
    outcome = runner.run_trial(overrides)
    m = outcome.diagnosis.metrics if outcome.diagnosis is not None and outcome.status == "ok" else None
    return m.samples_per_s if m is not None else None


def median(values: list[float | None]) -> float | None:
    ok = [v for v in values if v is not None]
    return statistics.median(ok) if ok else None


def bench(key: str, args: argparse.Namespace, work: Path) -> dict:
    label, command = WORKLOADS[key]
    t0 = time.monotonic()
    result = tune_command(TuneOptions(command=command, out=work / key / "tune", seconds=args.trial_seconds,
                                      warmup_steps=args.warmup))
    tune_s = time.monotonic() - t0
    target = result.target
    configs = {"yours": None,
               "AUTOTUNE": dataclasses.replace(target, settings=PipelineSettings(
                   parallel_calls=AUTOTUNE if target.stages else None, prefetch=AUTOTUNE)),
               "winner": dataclasses.replace(target, settings=result.best.settings)}
    runner = TrialRunner(TrialOptions(command=command, out=work / key / "verify", seconds=args.trial_seconds,
                                      warmup_steps=args.warmup))
    rates: dict[str, list[float | None]] = {name: [] for name in configs}
    for _ in range(args.verify):  # in turn, so that a drift of the machine's speed hits all alike
        for name, overrides in configs.items():
            rates[name].append(rate_of(runner, overrides))
    got = {name: median(values) for name, values in rates.items()}
    return {"key": key, "label": label, "winner": result.best.settings.label(), "trials": len(result.trials),
            "runs": sum(len(t.runs) for t in result.trials), "tune_s": tune_s, "tune_speedup": result.speedup, **got}


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a and b else "N/A"


def table(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [f"`python bench/tf_tune.py --trial-seconds {args.trial_seconds:g} --verify {args.verify}` "
             f"(samples/s, medians of {args.verify} re-measured runs each, in turn)", "",
             "| workload | tune's winner | trials (runs), time | yours | AUTOTUNE everywhere | winner | "
             "winner/yours | winner/AUTOTUNE |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['winner']} | {r['trials']} ({r['runs']}), {r['tune_s']:.0f} s | "
                     f"{r['yours'] or 0:,.0f} | {r['AUTOTUNE'] or 0:,.0f} | {r['winner'] or 0:,.0f} | "
                     f"{ratio(r['winner'], r['yours'])} | {ratio(r['winner'], r['AUTOTUNE'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--trial-seconds", type=float, default=2.0)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--verify", type=int, default=3)
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
