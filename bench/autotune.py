"""--autotune against your settings and the offline tune winner: full multi-epoch training runs (issue 36).

For each workload, a training script that records every sample index its training loop receives
(``tests/workloads/autotune_target.py``; under torchrun ``tests/workloads/autotune_ddp.py``, a DDP
script with a ``DistributedSampler``, each rank writing its own record), side by side in one run:
- **yours**: the script as it is (its own DataLoader settings; ``torchrun ...`` for the DDP job);
- **autotune**: ``gpufeed run --autotune -- ...``: tuned while it trains, from your settings;
- **tune winner**: ``gpufeed tune -- ...`` first (its search time is reported apart), then
  ``gpufeed run --config best-config.json -- ...``: the winner from the start.

The three are run in turn, ``--repeats`` times (rotating which goes first). Each run is timed whole
(interpreter or launcher start to exit); its samples/s is every rank's samples over that wall time,
the median over the repeats. A second table counts the samples each run delivered and says, rank
by rank, whether its sequence of indices is the plain run's (yours, first repeat, same seed).

    python bench/autotune.py [--workloads storage,cpu,torchrun-storage] [--repeats 3] [--epochs 5]
                             [--steps-per-epoch 400] [--period-s 1] [--trial-seconds 1.5]
                             [--ways autotune,"tune winner"] [--out bench/results/autotune.md]

``--ways`` runs some of the three only (the columns of a way not run read "-").

Goals (issue 36), each PASS or FAIL per workload in the table: autotune's samples/s over the whole run
>= 0.9 of the tune winner's; never below yours beyond the noise (autotune / yours >= 1 - the spread
of your own repeats, (max - min) / median); the samples each rank received equal the plain run's
for that rank exactly (none lost, duplicated or reordered).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the torchrun launcher below

from tests.integration.test_distributed import torchrun  # noqa: E402
from tests.paths import WORKLOADS as SCRIPTS  # noqa: E402

PY = sys.executable
WAYS = ("yours", "autotune", "tune winner")
MIN_STEPS = 2000      # issue 36: every run at least this many training steps (per rank)
WINNER_GOAL = 0.9     # issue 36: autotune's samples/s >= 0.9 of the tune winner's


@dataclass(frozen=True)
class Workload:
    title: str
    script: str
    args: tuple[str, ...]
    ranks: int = 1    # > 1: under torchrun --standalone on this machine (gloo)
    # The full-bench estimate printed at start: seconds per training step (per rank) of each way, a
    # run's start-up, and tune's search; from the runs in bench/results/autotune.md (storage, cpu) and
    # this bench's smoke run (torchrun-storage). An estimate only: no table uses it.
    step_s: tuple[float, float, float] = (0.035, 0.005, 0.0035)
    start_s: float = 3.0
    tune_s: float = 80.0


WORKLOADS = {
    "storage": Workload("storage-latency-bound: 4 ms/sample asleep, 1 worker", "autotune_target.py",
                        ("--sleep-ms", "4", "--workers", "1")),
    "cpu": Workload("CPU-bound: 2 ms of FFTs per sample, num_workers=0", "autotune_target.py",
                    ("--sleep-ms", "0", "--fft-rounds", "320", "--workers", "0"),
                    step_s=(0.018, 0.018, 0.016), tune_s=90.0),
    "torchrun-storage": Workload("torchrun, 2 ranks (gloo, DDP, DistributedSampler): 4 ms/sample asleep, "
                                 "1 worker per rank", "autotune_ddp.py", ("--sleep-ms", "4", "--workers", "1"),
                                 ranks=2, step_s=(0.035, 0.006, 0.005), start_s=7.0, tune_s=120.0),
    "compute": Workload("compute-bound: data ready at once, 2 workers", "autotune_target.py",
                        ("--sleep-ms", "0", "--workers", "2"), step_s=(0.002, 0.002, 0.002)),
}


def estimate_s(keys: list[str], args: argparse.Namespace) -> float:
    """The whole bench's wall time, roughly, before it starts (Workload's figures)."""
    steps = args.epochs * args.steps_per_epoch
    total = 0.0
    for key in keys:
        w = WORKLOADS[key]
        per_repeat = sum(w.start_s + steps * s for way, s in zip(WAYS, w.step_s) if way in args.ways)
        total += (w.tune_s if "tune winner" in args.ways else 0.0) + args.repeats * per_repeat
    return total


def _run(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}")
    return wall, done.stderr


def delivered(record: Path) -> dict[int, list[list[int]]]:
    """Each rank's sample indices, epoch by epoch: a directory of ``rank<R>.json`` (autotune_ddp.py),
    or one file (autotune_target.py: rank 0)."""
    files = sorted(record.glob("rank*.json")) if record.is_dir() else [record]
    data = [json.loads(f.read_text()) for f in files]
    return {d.get("rank", 0): d["delivered"] for d in data}


def every_sample_once(ranks: dict[int, list[list[int]]]) -> bool:
    """Each epoch, the ranks together received every index of the dataset exactly once."""
    epochs = {len(seq) for seq in ranks.values()}
    if len(epochs) != 1:
        return False
    return all(sorted(i for seq in ranks.values() for i in seq[e]) == list(range(sum(len(seq[e]) for seq in ranks.values())))
               for e in range(epochs.pop()))


def differences(plain: dict[int, list[list[int]]], got: dict[int, list[list[int]]]) -> list[str]:
    """How each rank's sequence differs from the plain run's for that rank: [] where every rank's is
    the same, index for index, epoch for epoch."""
    out = []
    for rank in sorted(set(plain) | set(got)):
        if rank not in got or rank not in plain:
            out.append(f"rank {rank}: {'no record' if rank not in got else 'not in the plain run'}")
            continue
        a, b = plain[rank], got[rank]
        if len(a) != len(b):
            out.append(f"rank {rank}: {len(b)} epochs, the plain run {len(a)}")
        for epoch, (x, y) in enumerate(zip(a, b)):
            if x == y:
                continue
            lost, extra, dup = len(set(x) - set(y)), len(set(y) - set(x)), len(y) - len(set(y))
            what = [f"{n} {word}" for n, word in ((lost, "lost"), (extra, "not in the plain run's"), (dup, "duplicated"))
                    if n] or ["reordered"]
            first = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            out.append(f"rank {rank} epoch {epoch}: {', '.join(what)} (first at position {first})")
    return out


def _digest(seq: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(seq).encode()).hexdigest()[:12]


def bench(key: str, args: argparse.Namespace, work: Path) -> dict:
    w = WORKLOADS[key]
    load_before = os.getloadavg()[0]
    launcher = torchrun() if w.ranks > 1 else [PY]
    assert w.ranks in (1, 2), "torchrun() launches 2 ranks"
    script = [*launcher, str(SCRIPTS / w.script), *w.args, "--steps-per-epoch", str(args.steps_per_epoch)]
    winner, tune_s, config = None, None, work / f"tune-{key}" / "best-config.json"
    if "tune winner" in args.ways:
        t0 = time.perf_counter()
        _run([PY, "-m", "gpufeed", "tune", "--trial-seconds", str(args.trial_seconds), "--out", str(config.parent),
              "--", *script, "--epochs", "100000"])
        tune_s = time.perf_counter() - t0
        winner = json.loads(config.read_text())
    env = dict(os.environ, GPUFEED_AUTOTUNE=json.dumps({"period_s": args.period_s}))
    commands = {
        "yours": ([], None),
        "autotune": ([PY, "-m", "gpufeed", "run", "--autotune", "--"], env),
        "tune winner": ([PY, "-m", "gpufeed", "run", "--config", str(config), "--"], None),
    }
    ways = [way for way in WAYS if way in args.ways]
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    sequences: dict[str, list[dict[int, list[list[int]]]]] = {way: [] for way in WAYS}
    for repeat in range(args.repeats):
        order = ways[repeat % len(ways):] + ways[:repeat % len(ways)]
        for way in order:
            record = work / f"{key}-{way.replace(' ', '-')}-{repeat}{'' if w.ranks > 1 else '.json'}"
            prefix, way_env = commands[way]
            wall, stderr = _run([*prefix, *script, "--epochs", str(args.epochs), "--record", str(record)], way_env)
            ranks = delivered(record)
            per_rank = {rank: sum(len(e) for e in seq) for rank, seq in sorted(ranks.items())}
            settled = re.findall(r"settled on (.+?)(?:,| after|$)", stderr, re.M)
            periods = re.findall(r"settled on .* after (\d+) periods", stderr)
            run = {"wall_s": wall, "samples": sum(per_rank.values()), "per_rank": per_rank,
                   "samples_per_s": sum(per_rank.values()) / wall, "once": every_sample_once(ranks),
                   "digests": {rank: _digest(seq) for rank, seq in ranks.items()},
                   "settled": settled[-1] if settled else None,
                   "switches": stderr.count("gpufeed autotune: switched to"),
                   "periods": int(periods[0]) if periods else None}
            runs[way].append(run)
            sequences[way].append(ranks)
            print(f"{key} {way:12} repeat {repeat}: {wall:6.1f} s, {run['samples_per_s']:7.1f} samples/s, "
                  f"{'+'.join(map(str, per_rank.values()))} samples"
                  + (f", {run['switches']} switches, settled on {run['settled'] or '-'}" if way == "autotune" else ""),
                  flush=True)
    plain = sequences["yours"][0] if sequences["yours"] else None   # not run: nothing to compare the order with
    for way in WAYS:
        for run, ranks in zip(runs[way], sequences[way]):
            run["differences"] = None if plain is None else differences(plain, ranks)
    return {"key": key, "title": w.title, "ranks": w.ranks, "tune_s": tune_s, "winner": winner, "runs": runs,
            "load": (load_before, os.getloadavg()[0])}


def _median(runs: list[dict], field: str = "samples_per_s") -> float | None:
    return statistics.median(r[field] for r in runs) if runs else None


def _s(value: float | None, unit: str = " s", spec: str = ".1f") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("**PASS**" if ok else "**FAIL**")


def goals(r: dict) -> dict:
    """The three goals of issue 36 for one workload, from its runs (None: a way needed was not run)."""
    yours, auto, best = (_median(r["runs"][w]) for w in WAYS)
    rates = [x["samples_per_s"] for x in r["runs"]["yours"]]
    noise = (max(rates) - min(rates)) / statistics.median(rates) if rates else None
    vs_winner = auto / best if auto is not None and best is not None else None
    vs_yours = auto / yours if auto is not None and yours is not None else None
    diffs = [x["differences"] for x in r["runs"]["autotune"]]
    exact = None if not diffs or any(d is None for d in diffs) else not any(diffs)
    return {"yours": yours, "autotune": auto, "winner": best, "noise": noise,
            "vs_winner": vs_winner, "winner_ok": None if vs_winner is None else vs_winner >= WINNER_GOAL,
            "vs_yours": vs_yours, "yours_ok": None if vs_yours is None else vs_yours >= 1 - noise,
            "samples_ok": exact}


def tables(results: list[dict], args: argparse.Namespace, command: str, started: str) -> str:
    steps = args.epochs * args.steps_per_epoch
    lines = [f"Command: `{command}`", "",
             f"Started {started}; {os.cpu_count()} cores. Full runs of {args.epochs} epochs x {args.steps_per_epoch} "
             f"batches of 8 ({steps} training steps per rank); {args.repeats} repeats each, run in turn; each figure "
             "the median over the repeats of the run's samples (every rank's) / its wall time (interpreter or "
             f"launcher start to exit); autotune's decision period {args.period_s:g} s; the tune winner from "
             f"`gpufeed tune --trial-seconds {args.trial_seconds:g}` (its search time apart).",
             "",
             "| workload | yours | autotune | tune winner | autotune / winner | >= 0.9 | autotune / yours | noise (yours) "
             "| >= 1 - noise | samples per rank = plain run's | autotune settled on | periods to settle | switches "
             "| winner | tune search |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        g = goals(r)
        autos = r["runs"]["autotune"]
        settled = sorted({x["settled"] or "-" for x in autos})
        periods = ", ".join(str(x["periods"]) if x["periods"] else "-" for x in autos)
        switches = [x["switches"] for x in autos]
        label = " ".join(f"{k}={v}" for k, v in r["winner"]["settings"].items()) if r["winner"] else "-"
        rate = {way: (f"{_s(g[k], '/s', '.0f')} ({_s(_median(r['runs'][way], 'wall_s'))})" if r["runs"][way] else "-")
                for way, k in zip(WAYS, ("yours", "autotune", "winner"))}
        lines.append(f"| {r['title']} | {rate['yours']} | {rate['autotune']} | {rate['tune winner']} | "
                     f"{_s(g['vs_winner'], '', '.2f')} | {_verdict(g['winner_ok'])} | {_s(g['vs_yours'], '', '.2f')} | "
                     f"{_s(g['noise'], '', '.0%')} | {_verdict(g['yours_ok'])} | {_verdict(g['samples_ok'])} | "
                     f"{', '.join(settled) or '-'} | {periods or '-'} | "
                     f"{format(statistics.median(switches), 'g') if switches else '-'} | {label} | "
                     f"{_s(r['tune_s'], ' s', '.0f')} |")
    lines += ["", "Conditions: 1-minute load average before and after each workload: "
              + ", ".join(f"{r['key']} {r['load'][0]:.1f} -> {r['load'][1]:.1f}" for r in results) + "."]
    lines += ["", "Samples delivered per run (each repeat; per rank under torchrun), and, rank by rank, whether the "
                  "sequence of sample indices is the plain run's (yours, first repeat, same seed):", "",
              "| workload | way | samples delivered | plain run | each rank's sequence = plain run's | "
              "each epoch every sample once | differences |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        plain = r["runs"]["yours"][0] if r["runs"]["yours"] else None
        for way in WAYS:
            got = r["runs"][way]
            if not got:
                continue
            counts = ", ".join("+".join(map(str, x["per_rank"].values())) for x in got)
            same = "-" if plain is None else ", ".join(
                f"rank {rank}: {sum(x['digests'].get(rank) == digest for x in got)} of {len(got)}"
                for rank, digest in sorted(plain["digests"].items()))
            diffs = sorted({d for x in got for d in (x["differences"] or [])})
            lines.append(f"| {r['key']} | {way} | {counts} | {'+'.join(map(str, plain['per_rank'].values())) if plain else '-'} "
                         f"| {same} | {sum(x['once'] for x in got)} of {len(got)} | "
                         f"{'; '.join(diffs[:4]) + (f' (+{len(diffs) - 4} more)' if len(diffs) > 4 else '') or '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="storage,cpu,torchrun-storage")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--steps-per-epoch", type=int, default=400)
    p.add_argument("--period-s", type=float, default=1.0)
    p.add_argument("--trial-seconds", type=float, default=1.5)
    p.add_argument("--ways", default=",".join(WAYS), help="which of the three to run (comma-separated)")
    p.add_argument("--out", type=Path, default=None, help="append the tables to this Markdown file")
    args = p.parse_args(argv)
    args.ways = [way.strip() for way in args.ways.split(",")]
    if not args.ways or set(args.ways) - set(WAYS):
        p.error(f"--ways: some of {', '.join(WAYS)}")
    keys = [key.strip() for key in args.workloads.split(",")]
    if set(keys) - set(WORKLOADS):
        p.error(f"--workloads: some of {', '.join(WORKLOADS)}")
    # gpufeed from this checkout, in every command the bench starts
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    command = "python bench/autotune.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    steps = args.epochs * args.steps_per_epoch
    print(f"{command}\n{len(keys)} workloads x {args.repeats} repeats, {steps} steps per run per rank"
          + ("" if steps >= MIN_STEPS else f" (fewer than issue 36's {MIN_STEPS}: not its proof)")
          + f"; estimated wall time {estimate_s(keys, args) / 60:.0f} min", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpufeed-bench-autotune-") as tmp:
        results = [bench(key, args, Path(tmp)) for key in keys]
    text = tables(results, args, command, started)
    print(text)
    if args.out is not None:
        with open(args.out, "a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
