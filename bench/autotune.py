"""--autotune against your settings and the offline tune winner: full multi-epoch training runs.

For each workload (``tests/workloads/autotune_target.py``, a training script that records every
sample index its training loop receives), side by side in one run:
- **yours**: the script as it is (its own DataLoader settings);
- **autotune**: ``gpufeed run --autotune -- ...``: tuned while it trains, from your settings;
- **tune winner**: ``gpufeed tune`` first (its search time is reported apart), then
  ``gpufeed run --config best-config.json -- ...``: the winner from the start.

The three are run in turn, ``--repeats`` times (rotating which goes first); each figure is the
median wall time of the whole command (interpreter start to exit). A second table counts the samples
each run delivered and says whether its sequence of indices is the plain run's (same seed).

    python bench/autotune.py [--workloads storage,cpu] [--repeats 3] [--epochs 4] [--steps-per-epoch 400]
                             [--period-s 1] [--trial-seconds 1.5] [--out bench/results/autotune.md]

Goals (issue 16): autotune's wall time within 10% of the tune winner's, never slower than yours by
more than the noise (the spread of your own runs); delivered samples equal the plain run's exactly.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "workloads" / "autotune_target.py"
PY = sys.executable
WORKLOADS = {
    "storage": ("storage-latency-bound: 4 ms/sample asleep, 1 worker", ["--sleep-ms", "4", "--workers", "1"]),
    "cpu": ("CPU-bound: 2 ms of FFTs per sample, num_workers=0", ["--sleep-ms", "0", "--fft-rounds", "320", "--workers", "0"]),
    "compute": ("compute-bound: data ready at once, 2 workers", ["--sleep-ms", "0", "--workers", "2"]),
}
WAYS = ("yours", "autotune", "tune winner")


def _run(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}")
    return wall, done.stderr


def _delivered(record: Path) -> tuple[int, str]:
    data = json.loads(record.read_text())
    count = sum(len(epoch) for epoch in data["delivered"])
    return count, hashlib.sha256(json.dumps(data["delivered"]).encode()).hexdigest()[:12]


def bench(key: str, args: argparse.Namespace, work: Path) -> dict:
    title, extra = WORKLOADS[key]
    load_before = os.getloadavg()[0]
    script = [PY, str(SCRIPT), *extra, "--steps-per-epoch", str(args.steps_per_epoch)]
    tune_dir = work / f"tune-{key}"
    t0 = time.perf_counter()
    _run([PY, "-m", "gpufeed", "tune", "--trial-seconds", str(args.trial_seconds), "--out", str(tune_dir),
          "--", *script, "--epochs", "100000"])
    tune_s = time.perf_counter() - t0
    winner = json.loads((tune_dir / "best-config.json").read_text())
    env = dict(os.environ, GPUFEED_AUTOTUNE=json.dumps({"period_s": args.period_s}))
    commands = {
        "yours": ([], None),
        "autotune": ([PY, "-m", "gpufeed", "run", "--autotune", "--"], env),
        "tune winner": ([PY, "-m", "gpufeed", "run", "--config", str(tune_dir / "best-config.json"), "--"], None),
    }
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    for repeat in range(args.repeats):
        order = WAYS[repeat % 3:] + WAYS[:repeat % 3]
        for way in order:
            record = work / f"{key}-{way.replace(' ', '-')}-{repeat}.json"
            prefix, way_env = commands[way]
            wall, stderr = _run([*prefix, *script, "--epochs", str(args.epochs), "--record", str(record)], way_env)
            count, digest = _delivered(record)
            settled = re.findall(r"settled on (.+?)(?:,| after|$)", stderr, re.M)
            switches = stderr.count("gpufeed autotune: switched to")
            periods = re.findall(r"settled on .* after (\d+) periods", stderr)
            runs[way].append({"wall_s": wall, "samples": count, "digest": digest,
                              "settled": settled[-1] if settled else None, "switches": switches,
                              "periods": int(periods[0]) if periods else None})
            print(f"{key} {way:12} repeat {repeat}: {wall:6.1f} s, {count} samples, {digest}"
                  + (f", {switches} switches, settled on {settled[-1] if settled else '-'}" if way == "autotune" else ""),
                  flush=True)
    return {"key": key, "title": title, "tune_s": tune_s, "winner": winner, "runs": runs,
            "load": (load_before, os.getloadavg()[0])}


def _median(runs: list[dict]) -> float:
    return statistics.median(r["wall_s"] for r in runs)


def tables(results: list[dict], args: argparse.Namespace, command: str) -> str:
    lines = [f"Command: `{command}`", "",
             f"Full runs of {args.epochs} epochs x {args.steps_per_epoch} batches of 8; median wall time of "
             f"{args.repeats} repeats each, run in turn; autotune's decision period {args.period_s:g} s; "
             f"the tune winner from `gpufeed tune --trial-seconds {args.trial_seconds:g}` (its search time apart).",
             "",
             "| workload | yours | autotune | tune winner | autotune / winner | autotune / yours | noise (yours) "
             "| autotune settled on | periods to settle | switches | winner | tune search |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        yours, auto, best = (_median(r["runs"][w]) for w in WAYS)
        walls = [x["wall_s"] for x in r["runs"]["yours"]]
        noise = (max(walls) - min(walls)) / statistics.median(walls)
        settled = sorted({x["settled"] or "-" for x in r["runs"]["autotune"]})
        switches = [x["switches"] for x in r["runs"]["autotune"]]
        periods = ", ".join(str(x["periods"]) if x["periods"] else "-" for x in r["runs"]["autotune"])
        winner = r["winner"]["settings"]
        label = " ".join(f"{k}={v}" for k, v in winner.items())
        lines.append(f"| {r['title']} | {yours:.1f} s | {auto:.1f} s | {best:.1f} s | {auto / best:.2f} | "
                     f"{auto / yours:.2f} | {noise:.0%} | {', '.join(settled)} | {periods} | {statistics.median(switches):g} "
                     f"| {label} | {r['tune_s']:.0f} s |")
    lines += ["", f"Conditions: {os.cpu_count()} cores shared with other engineers' runs; 1-minute load average "
                  "before and after each workload: " + ", ".join(f"{r['key']} {r['load'][0]:.1f} -> {r['load'][1]:.1f}"
                                                                 for r in results) + "."]
    lines += ["", "Samples delivered per run (each repeat), and whether the sequence of sample indices is the "
                  "plain run's (yours, same seed):", "",
              "| workload | way | samples delivered | plain run | identical sequence |", "|---|---|---|---|---|"]
    for r in results:
        plain = r["runs"]["yours"][0]
        for way in WAYS:
            counts = ", ".join(str(x["samples"]) for x in r["runs"][way])
            same = sum(x["digest"] == plain["digest"] for x in r["runs"][way])
            lines.append(f"| {r['key']} | {way} | {counts} | {plain['samples']} | {same} of {len(r['runs'][way])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="storage,cpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--steps-per-epoch", type=int, default=400)
    p.add_argument("--period-s", type=float, default=1.0)
    p.add_argument("--trial-seconds", type=float, default=1.5)
    p.add_argument("--out", type=Path, default=None, help="append the tables to this Markdown file")
    args = p.parse_args(argv)
    command = "python bench/autotune.py " + " ".join(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="gpufeed-bench-autotune-") as tmp:
        results = [bench(key, args, Path(tmp)) for key in args.workloads.split(",")]
    text = tables(results, args, command)
    print(text)
    if args.out is not None:
        with open(args.out, "a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
