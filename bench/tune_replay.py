"""The tune search replayed on the run records a ``bench/tune_vs_grid.py --keep DIR`` run left: which
configurations the search would measure, and what it would pick, without running anything.

Each configuration's recorded runs (tune's, the grid's, the verification's) are its measurements: the
search's first request gets the first of them, a repeat the next (round-robin). A configuration with
no record fails, as a trial would. Time is the sum of the replayed runs' own durations, against the
grid's; quality is the median of every recorded run of the pick against that of the grid's best.
A change to ``gpufeed/tune/search.py`` is checked here in seconds; ``tune_vs_grid.py`` measures it.

    python bench/tune_replay.py DIR [--workloads storage,cpu,...] [--max-workers 16] [--log]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpufeed.analysis import analyze  # noqa: E402
from gpufeed.record.reader import load_meta  # noqa: E402
from gpufeed.settings import LoaderSettings  # noqa: E402
from gpufeed.trials.engine import ENDED_WELL  # noqa: E402
from gpufeed.tune.result import FAILED, OK, TrialRun  # noqa: E402
from gpufeed.tune.search import Search, normalise  # noqa: E402


@dataclass
class Recorded:
    """Every recorded run of one configuration, in the order they ran."""

    runs: list[TrialRun] = field(default_factory=list)
    served: int = 0

    def next(self) -> TrialRun:
        run = self.runs[self.served % len(self.runs)]
        self.served += 1
        return run

    @property
    def median(self) -> float | None:
        rates = [r.samples_per_s for r in self.runs if r.status == OK]
        return statistics.median(rates) if rates else None


def _run(run_dir: Path) -> TrialRun:
    """The trial as ``CommandTrials`` judged it: a run that did not end well failed."""
    meta = load_meta(run_dir)
    elapsed = (meta.t_end or meta.t_start) - meta.t_start
    if meta.end_reason not in ENDED_WELL:
        return TrialRun(FAILED, None, elapsed, str(run_dir), meta.end_reason)
    diagnosis = analyze(run_dir)
    rate = diagnosis.metrics.samples_per_s
    return TrialRun(OK if rate else FAILED, rate, elapsed, str(run_dir), diagnosis=diagnosis)


def _settings(diagnosis) -> LoaderSettings:
    config = diagnosis.training.config
    return normalise(LoaderSettings(num_workers=config.get("num_workers", 0),
                                    prefetch_factor=config.get("prefetch_factor"),
                                    persistent_workers=bool(config.get("persistent_workers")),
                                    pin_memory=bool(config.get("pin_memory"))))


def load(workload_dir: Path) -> tuple[LoaderSettings, dict[str, Recorded], float]:
    """The user's settings, the recorded runs by configuration label, and the grid's time."""
    yours = _run(workload_dir / "tune" / "trials" / "00-yours")
    baseline = _settings(yours.diagnosis)
    by_label: dict[str, Recorded] = {}
    grid_s = 0.0
    for part in ("tune", "grid", "verify"):
        for run_dir in sorted(p for p in (workload_dir / part / "trials").glob("*") if p.is_dir()):
            name = run_dir.name.split("-", 1)[1]
            label = baseline.label() if name == "yours" else name.replace("-", " ")
            run = yours if run_dir.name == "00-yours" and part == "tune" else _run(run_dir)
            by_label.setdefault(label, Recorded()).runs.append(run)
            if part == "grid":
                grid_s += run.elapsed_s
    return baseline, by_label, grid_s


def replay(workload_dir: Path, max_workers: int, log: bool) -> str:
    baseline, recorded, grid_s = load(workload_dir)
    asked: list[str] = []

    def measure(settings: LoaderSettings, why: str) -> TrialRun:
        label = normalise(settings).label()
        asked.append(f"{label} ({why})")
        if label not in recorded:
            return TrialRun(FAILED, None, 0.0, reason="not recorded")
        return recorded[label].next()

    search = Search(measure, baseline, cpu_count=2, max_workers=max_workers)
    result = search.run()
    runs = [r for t in result.trials for r in t.runs]
    grid = {label: r.median for label, r in recorded.items() if r.median}
    grid_best = max(grid, key=grid.get)
    pick = result.best.settings.label()
    quality = (grid.get(pick) or 0.0) / grid[grid_best]
    line = (f"| {workload_dir.name} | {baseline.label()} | {pick} | {grid_best} | {quality:.2f} "
            f"| {len(runs)} | {sum(r.elapsed_s for r in runs) / grid_s:.0%} |")
    agreement = "N/A" if search.model.agreement is None else f"{search.model.agreement:.2f}"
    details = [*asked, f"model agreement {agreement}, noise {search.noise:.3f}"]
    return line + ("\n" + "\n".join(f"    {a}" for a in details) if log else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kept", type=Path, help="the --keep DIR of a bench/tune_vs_grid.py run")
    parser.add_argument("--workloads", help="comma-separated (default: every workload kept)")
    parser.add_argument("--max-workers", type=int, default=16)
    parser.add_argument("--log", action="store_true", help="list what the search measured, and why")
    args = parser.parse_args()
    keys = args.workloads.split(",") if args.workloads else sorted(
        p.name for p in args.kept.iterdir() if (p / "grid" / "trials").is_dir())
    print("| workload | yours | pick | best recorded | pick / best (median of its runs) | runs | time / grid's |")
    print("|---|---|---|---|---|---|---|")
    for key in keys:
        print(replay(args.kept / key, args.max_workers, args.log), flush=True)


if __name__ == "__main__":
    main()
