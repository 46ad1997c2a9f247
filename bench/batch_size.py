"""The largest batch that fits: gpufeed's search against exhaustive bisection and Lightning's binsearch.

Three strategies on the same real CPU workloads, each under a memory budget, all with the same
definition of "fits": the trial ran and the training process's peak (VmHWM) stayed within
``target x budget``. Every trial is a real run of the unmodified script (``gpufeed batch-size``'s
own trials); a size is run once and its measurement shared by the strategies (so the bench takes
minutes, not a quarter of an hour), while each strategy counts the trials it asked for.

- exhaustive bisection: the largest fitting size in [1, dataset length], bisected to the last sample;
- Lightning ``binsearch`` (its strategy, reimplemented: copy no code): start at 2, double until a
  size fails, then bisect between the last success and the failure until they are adjacent;
- gpufeed: ``BatchSearch`` from the script's own batch size (fit, verify, refine).

gpufeed's answer is then run once more, fresh, to show it fits on a run of its own.

    python bench/batch_size.py [--out bench/results/batch_size.md]
    python bench/batch_size.py --device cuda --out bench/results/batch_size_cuda.md   # on a GPU machine
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpufeed.batchsize.result import BatchTrial  # noqa: E402
from gpufeed.batchsize.search import BatchSearch  # noqa: E402
from gpufeed.batchsize.trials import BatchSizeOptions, BatchTrials  # noqa: E402
from gpufeed.trials.limits import available_ram_b  # noqa: E402
from gpufeed.units import human_bytes  # noqa: E402

# name: (script and arguments, budget, environment). glibc's malloc serves a tensor of less than its
# dynamic mmap threshold (up to 32 MiB) from its heap, whose size then depends on the order of frees:
# the third row fixes the threshold, so every large tensor is mapped and returned at once.
WORKLOADS = {
    "transformer encoder (attention, seq 96)": (
        ["tests/workloads/attention_memory.py", "--seq", "96"], 800 * 2**20, {}),
    "wide activations (conv + element-wise, 32x32)": (
        ["tests/workloads/batch_memory.py", "--side", "32"], 700 * 2**20, {}),
    "wide activations, MALLOC_MMAP_THRESHOLD_=131072": (
        ["tests/workloads/batch_memory.py", "--side", "32"], 700 * 2**20, {"MALLOC_MMAP_THRESHOLD_": "131072"}),
}
# On a GPU the capacity is the device's memory (no budget): larger samples and datasets, so that the
# largest batch stays within the dataset. Not run yet: no GPU was available to this work.
CUDA_WORKLOADS = {
    "transformer encoder (attention, seq 512), CUDA": (
        ["tests/workloads/attention_memory.py", "--seq", "512", "--samples", "200000", "--device", "cuda"], None, {}),
    "wide activations (128x128), CUDA": (
        ["tests/workloads/batch_memory.py", "--side", "128", "--samples", "200000", "--device", "cuda"], None, {}),
}
TARGET = 0.9
TRIAL_SECONDS = 0.5
WARMUP = 1


class SharedTrials:
    """Runs each batch size once (a real trial of the script) and counts what each strategy asks;
    a strategy that asks for a size again (gpufeed's confirmation) gets a new run."""

    def __init__(self, trials: BatchTrials, limit_b: float) -> None:
        self.trials = trials
        self.limit_b = limit_b
        self.cache: dict[int, list[BatchTrial]] = {}
        self.asked: dict[int, int] = {}   # by the gpufeed strategy

    def run(self, batch: int, nth: int = 0) -> BatchTrial:
        runs = self.cache.setdefault(batch, [])
        while len(runs) <= nth:
            runs.append(self.trials(batch, "bench"))
            if runs[-1].status == "interrupted":
                raise KeyboardInterrupt
        return dataclasses.replace(runs[nth])

    def measure(self, batch: int, why: str) -> BatchTrial:
        nth = self.asked[batch] = self.asked.get(batch, -1) + 1
        return self.run(batch, nth)

    def fits(self, batch: int) -> bool:
        return self.fitting(self.run(batch))

    def fitting(self, t: BatchTrial) -> bool:
        return t.status == "ok" and t.peak_mem_b is not None and t.peak_mem_b <= self.limit_b

    def inversions(self) -> int:
        """Pairs of sizes where the larger fitted and the smaller did not (first runs)."""
        first = sorted((b, self.fitting(runs[0])) for b, runs in self.cache.items())
        return sum(1 for i, (_, ok) in enumerate(first) if not ok for _, later in first[i + 1:] if later)


class Counter:
    def __init__(self, fits: Callable[[int], bool]) -> None:
        self._fits, self.count = fits, 0

    def __call__(self, batch: int) -> bool:
        self.count += 1
        return self._fits(batch)


def exhaustive_bisection(fits: Callable[[int], bool], max_batch: int) -> int | None:
    if not fits(1):
        return None
    if fits(max_batch):
        return max_batch
    lo, hi = 1, max_batch
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def lightning_binsearch(fits: Callable[[int], bool], max_batch: int, init: int = 2, max_trials: int = 25) -> int | None:
    """Lightning's BatchSizeFinder mode "binsearch": double until failure, then bisect."""
    size, low, high, trials = init, None, None, 0
    while trials < max_trials:
        trials += 1
        if fits(size):
            low = size
            if high is not None:
                if high - low <= 1:
                    break
                size = (low + high) // 2
            else:
                if size >= max_batch:
                    break
                size = min(size * 2, max_batch)
        else:
            high = size
            lower = low or 0
            if high - lower <= 1:
                break
            size = (lower + high) // 2
    return low


def bench_workload(name: str, script: list[str], budget_b: int | None, env: dict[str, str], tmp: Path) -> dict:
    os.environ.update(env)  # inherited by every trial of this workload
    try:
        return _bench_workload(name, script, budget_b, tmp)
    finally:
        for key in env:
            os.environ.pop(key, None)


def _bench_workload(name: str, script: list[str], budget_b: int | None, tmp: Path) -> dict:
    command = [sys.executable, str(ROOT / script[0]), *script[1:]]
    options = BatchSizeOptions(command=command, out=tmp / re.sub(r"[^A-Za-z0-9]+", "-", name),
                               memory_budget_b=budget_b, target_share=TARGET, seconds=TRIAL_SECONDS,
                               warmup_steps=WARMUP)
    trials = BatchTrials(options, budget_b or available_ram_b())
    first, record = trials.run(None, "your batch size")
    trials.learn(first, record)
    capacity = trials.cuda_total_b if trials.device == "cuda" else budget_b
    if capacity is None:
        raise SystemExit(f"{name}: the script did not use CUDA, so there is no GPU capacity to search against")
    shared = SharedTrials(trials, TARGET * capacity)
    shared.cache[first.batch_size] = [first]
    max_batch = trials.dataset_len
    t0 = time.monotonic()

    exhaustive = Counter(shared.fits)
    best = exhaustive_bisection(exhaustive, max_batch)
    lightning = Counter(shared.fits)
    lightning_best = lightning_binsearch(lightning, max_batch)
    outcome = BatchSearch(shared.measure, TARGET * capacity, trials.yours, max_batch=max_batch).run()
    fresh = trials(outcome.largest_safe, "gpufeed's answer, run again") if outcome.largest_safe else None
    return {
        "name": name, "command": " ".join(["python", *script]), "capacity_b": capacity,
        "exhaustive": best, "exhaustive_trials": exhaustive.count,
        "lightning": lightning_best, "lightning_trials": lightning.count,
        "gpufeed": outcome.largest_safe, "gpufeed_trials": len(outcome.trials),
        "gpufeed_sizes": [t.batch_size for t in outcome.trials], "fit": outcome.fit,
        "fresh": fresh, "fresh_fits": bool(fresh and shared.fitting(fresh)), "inversions": shared.inversions(),
        "notes": outcome.notes, "runs": sum(len(r) for r in shared.cache.values()) + 1,
        "seconds": time.monotonic() - t0,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| workload | capacity (target 90%) | exhaustive bisection: largest (trials) | Lightning binsearch: largest "
        "(trials) | gpufeed: largest (trials) | gpufeed vs exhaustive | gpufeed trials / Lightning's | "
        "gpufeed's answer run again | fit | memory monotonic in batch size? |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gap = (r["gpufeed"] / r["exhaustive"] - 1) if r["gpufeed"] and r["exhaustive"] else None
        fit = r["fit"]
        monotonic = "yes" if not r["inversions"] else f"no: {r['inversions']} inversions"
        fit_text = (f"{human_bytes(fit.intercept_b)} + {human_bytes(fit.per_sample_b)} × batch, R² {fit.r2:.3f}"
                    if fit is not None else "none")
        lines.append(
            f"| {r['name']} | {human_bytes(r['capacity_b'])} ({human_bytes(TARGET * r['capacity_b'])}) "
            f"| {r['exhaustive']} ({r['exhaustive_trials']}) | {r['lightning']} ({r['lightning_trials']}) "
            f"| {r['gpufeed']} ({r['gpufeed_trials']}: {', '.join(map(str, r['gpufeed_sizes']))}) "
            f"| {'N/A' if gap is None else f'{gap:+.1%}'} | {r['gpufeed_trials'] / r['lightning_trials']:.2f} "
            f"| {_fresh(r)} | {fit_text} "
            f"| {monotonic} |")
    return "\n".join(lines)


def _fresh(r: dict) -> str:
    fresh = r["fresh"]
    if fresh is None:
        return "N/A"
    if r["fresh_fits"]:
        return f"fits: peak {human_bytes(fresh.peak_mem_b)}"
    return f"DOES NOT FIT: {fresh.reason or human_bytes(fresh.peak_mem_b)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table (markdown) to this file")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: the workloads under a memory budget; cuda: on the GPU, its memory the capacity")
    args = parser.parse_args()
    rows = []
    workloads = CUDA_WORKLOADS if args.device == "cuda" else WORKLOADS
    with tempfile.TemporaryDirectory(prefix="gpufeed-bench-bs-") as tmp:
        for name, (script, budget, env) in workloads.items():
            print(f"{name} ...", file=sys.stderr, flush=True)
            rows.append(bench_workload(name, script, budget, env, Path(tmp)))
    text = table(rows)
    peak = "CUDA allocator's reserved peak" if args.device == "cuda" else "peak resident memory (VmHWM)"
    notes = (f"\nFits = the trial ran and the training process's {peak} stayed within "
             f"{TARGET:.0%} of the capacity. Each size is a real run of the script ({TRIAL_SECONDS} s measured after "
             f"{WARMUP} warm-up step); a size asked for by several strategies is run once and shared. "
             + "; ".join(f"{r['name']}: {r['runs']} runs, {r['seconds']:.0f} s" for r in rows) + ".\n"
             + "".join(f"\n- {r['name']}: {note}" for r in rows for note in r["notes"]) + "\n")
    print(text + "\n" + notes)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        where = "CUDA" if args.device == "cuda" else f"CPU, {os.cpu_count()} cores, no GPU"
        device = " --device cuda" if args.device == "cuda" else ""
        args.out.write_text(f"`python bench/batch_size.py{device} --out {args.out}` ({where})\n\n{text}\n{notes}")


if __name__ == "__main__":
    main()
