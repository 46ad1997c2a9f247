"""Loops without a DataLoader (tests/real/scripts/loops.py): what gpufeed says against what its fix
and its probe measure by the script's own clock.

For each loop shape: one ``gpufeed diagnose`` (samples/s against the script's own count over its
window, and the predicted gain of ``loop_batch_preparation``); then ``--repeats`` rounds, each in a
fresh random order, of the script plain, with ``--prefetch`` (the fix: batches prepared ahead on a
background thread) and plain under ``gpufeed diagnose`` (the probe's overhead, its loop hooks
included). Ratios are per round, against that round's plain run; medians with their range.

    python bench/loops.py [--shapes gpt,lstm,generator] [--repeats 3] [--out bench/results/loops.md]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.real.real_run import SCRIPTS, diagnose, finding, own_samples_per_s  # noqa: E402

STEPS = 400
SKIP = 20  # the script's first steps: imports warm, the memmap opened, the queue filled


def script(shape: str, *extra: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / "loops.py"), "--shape", shape, "--steps", str(STEPS), "--read-ms", "4",
            *extra]


def own_rate(path: Path) -> float:
    """Samples/s by the script's own count, from its SKIP-th step to its last, evaluation left out."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [r for r in rows if "t" in r][SKIP:]
    t0, t1 = steps[0]["t"], steps[-1]["t"]
    evaluation = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in (r["eval"] for r in rows if "eval" in r))
    return sum(r["n"] for r in steps[1:]) / (t1 - t0 - evaluation)


def timed(shape: str, variant: str, tmp: Path) -> float:
    own = tmp / f"{shape}-{variant}-{time.monotonic_ns()}.jsonl"
    env = dict(os.environ, OWN_COUNT=str(own))
    command = script(shape, "--prefetch") if variant == "prefetch" else script(shape)
    if variant == "gpufeed":
        command = [sys.executable, "-m", "gpufeed", "diagnose", "--out", str(tmp / own.stem), "--", *command]
    subprocess.run(command, env=env, cwd=tmp, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300)
    return own_rate(own)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="gpt,lstm,generator")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "loops.md")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M")
    rows = []
    for shape in args.shapes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp)
            diag = diagnose(tmp_path, script(shape), "--steps", "120", "--warmup", "5", timeout=300)
            m = diag["metrics"]
            gain = finding(diag, "loop_batch_preparation")["gain"]
            own = own_samples_per_s(diag, tmp_path / "own.jsonl")
            ratios: dict[str, list[float]] = {"prefetch": [], "gpufeed": []}
            for _ in range(args.repeats):
                order = ["plain", "prefetch", "gpufeed"]
                random.shuffle(order)
                rate = {variant: timed(shape, variant, tmp_path) for variant in order}
                for variant in ratios:
                    ratios[variant].append(rate[variant] / rate["plain"])
            rows.append(dict(shape=shape, gpufeed=m["samples_per_s"], own=own, share=m["data_wait_share"],
                             gain=gain, prefetch=ratios["prefetch"], overhead=ratios["gpufeed"]))
            print(shape, rows[-1], flush=True)
    lines = [f"# Loops without a DataLoader ({started}, `python bench/loops.py --repeats {args.repeats}`)", "",
             "| loop | gpufeed samples/s | the script's own | loop's own work | predicted fix | measured fix "
             "(prefetch / plain) | under gpufeed / plain |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        g = r["gain"]
        lines.append(f"| {r['shape']} | {r['gpufeed']:,.0f} | {r['own']:,.0f} ({r['gpufeed'] / r['own']:.3f}) | "
                     f"{r['share']:.0%} | {g['speedup']:.2f}x ({g['low']:.2f}-{g['high']:.2f}) | {spread(r['prefetch'])} | "
                     f"{spread(r['overhead'])} |")
    lines += ["", f"{args.repeats} rounds, each plain, --prefetch and under gpufeed in a fresh random order; the ratios "
              "are per round (median, range). Samples/s by the script's own clock from its "
              f"{SKIP}th step of {STEPS}."]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
