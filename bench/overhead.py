"""What diagnose costs a training script: the same script plain, under ``gpufeed diagnose``, and
under ``torch.profiler``, side by side in one run.

Each repeat runs the three variants in a fresh random order, so drift on a noisy machine hits all
of them alike; overhead is the median over repeats of the paired ratio (variant / plain) of the
script's own steady-state samples/s. The sampler's CPU use comes from the diagnose runs' records.

    python bench/overhead.py [--repeats 7] [--modes fast slow] [--out bench/results/overhead.md]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "tests" / "workloads" / "overhead.py"
VARIANTS = ("plain", "gpufeed", "torch.profiler")


def run_variant(variant: str, mode: str, steps: int, threads: int, tmp: Path) -> tuple[float, float | None]:
    """The script's own samples/s, and (for gpufeed) the sampler's CPU share of one core."""
    script = [sys.executable, str(WORKLOAD), "--mode", mode, "--steps", str(steps), "--threads", str(threads)]
    run_dir = None
    if variant == "gpufeed":
        run_dir = tmp / f"run-{time.monotonic_ns()}"
        command = [sys.executable, "-m", "gpufeed", "diagnose", "--out", str(run_dir), "--"] + script
    elif variant == "torch.profiler":
        command = script + ["--profiler"]
    else:
        command = script
    out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=tmp).stdout
    result = next(json.loads(line) for line in reversed(out.splitlines()) if line.startswith("{"))
    sampler_share = None
    if run_dir is not None:
        meta = json.loads((run_dir / "meta.json").read_text())
        wall = meta["t_end"] - meta["t_start"]
        sampler_share = meta["sampler"]["cpu_s"] / wall
    return result["samples_per_s"], sampler_share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--modes", nargs="+", default=["fast", "slow"])
    parser.add_argument("--fast-steps", type=int, default=3000)
    parser.add_argument("--slow-steps", type=int, default=150)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads in the script (1 keeps timing steady on a small shared machine)")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for mode in args.modes:
            steps = args.fast_steps if mode == "fast" else args.slow_steps
            sps = {v: [] for v in VARIANTS}
            sampler = []
            for r in range(args.repeats):
                order = list(VARIANTS)
                random.shuffle(order)
                for variant in order:
                    value, share = run_variant(variant, mode, steps, args.threads, tmp)
                    sps[variant].append(value)
                    if share is not None:
                        sampler.append(share)
                print(f"{mode} repeat {r + 1}/{args.repeats}: "
                      + ", ".join(f"{v} {sps[v][-1]:,.0f}/s" for v in VARIANTS), file=sys.stderr)
            plain = sps["plain"]
            ratio = {v: statistics.median(x / p for x, p in zip(sps[v], plain)) for v in VARIANTS[1:]}
            spread = {v: (min(x / p for x, p in zip(sps[v], plain)), max(x / p for x, p in zip(sps[v], plain)))
                      for v in VARIANTS[1:]}
            batch = 32
            rows.append({
                "mode": mode, "step_ms": 1000 * batch / statistics.median(plain),
                "plain": statistics.median(plain), "gpufeed": statistics.median(sps["gpufeed"]),
                "profiler": statistics.median(sps["torch.profiler"]),
                "gpufeed_overhead": 1 - ratio["gpufeed"], "profiler_overhead": 1 - ratio["torch.profiler"],
                "gpufeed_spread": spread["gpufeed"], "profiler_spread": spread["torch.profiler"],
                "sampler_core_share": statistics.median(sampler) if sampler else None,
            })

    lines = [
        f"Median of {args.repeats} paired repeats (variants in random order each repeat); overhead = "
        "1 − median(variant samples/s ÷ plain samples/s); the range is the min–max of that ratio.",
        "",
        "| workload | step (plain) | plain samples/s | gpufeed diagnose samples/s | gpufeed overhead | "
        "torch.profiler samples/s | torch.profiler overhead | sampler CPU (of one core) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        g_lo, g_hi = row["gpufeed_spread"]
        p_lo, p_hi = row["profiler_spread"]
        sampler = f"{row['sampler_core_share']:.2%}" if row["sampler_core_share"] is not None else "N/A"
        lines.append(
            f"| {row['mode']} | {row['step_ms']:.2f} ms | {row['plain']:,.0f} | {row['gpufeed']:,.0f} | "
            f"{row['gpufeed_overhead']:+.1%} (ratio {g_lo:.3f}–{g_hi:.3f}) | {row['profiler']:,.0f} | "
            f"{row['profiler_overhead']:+.1%} (ratio {p_lo:.3f}–{p_hi:.3f}) | {sampler} |")
    # The probe's own cost per batch is too small for this comparison of processes (and for an
    # in-process A/B with a training step in each block, which read 5-26 µs per step in runs of the
    # same code here): bench/hot_path.py measures it without the step.
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        command = "python bench/overhead.py " + " ".join(sys.argv[1:])
        args.out.write_text(f"# Overhead of gpufeed diagnose\n\n`{command.strip()}`\n\n{table}\n")


if __name__ == "__main__":
    main()
