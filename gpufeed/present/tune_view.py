"""``gpufeed tune`` in the terminal: a progress bar per trial while it runs, then the table and the winner."""
from __future__ import annotations

import threading
from pathlib import Path

from rich import box
from rich.console import Console, RenderableType
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from gpufeed.settings import LoaderSettings, PipelineSettings
from gpufeed.analysis.steps import live_samples_per_s
from gpufeed.tune.result import OK, Trial, TuneResult, paste_line
from gpufeed.units import count, fmt

REFRESH_S = 0.5


class TrialProgress:
    """One bar per trial: its configuration, samples/s so far (from its record), best so far."""

    def __init__(self, console: Console, seconds: float, warmup_steps: int) -> None:
        self.seconds = seconds
        self.warmup_steps = warmup_steps
        self.best: float | None = None
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=24), TimeElapsedColumn(),
            TextColumn("{task.fields[rate]}"), TextColumn("[dim]{task.fields[best]}"),
            console=console, transient=False)
        self._current: tuple[int, Path] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> "TrialProgress":
        self.progress.start()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.progress.stop()

    def started(self, settings: LoaderSettings | PipelineSettings, why: str, run_dir: Path) -> None:
        # The very first run is the script as it is: its settings are known only once it has run.
        label = settings.label() if settings.to_dict() else "yours, as is"
        task = self.progress.add_task(f"{label:<22} [dim]{why[:38]}[/]", total=self.seconds,
                                      rate="", best=self._best_text())
        self._current = (task, run_dir)

    def finished(self, trial: Trial) -> None:
        current, self._current = self._current, None
        if current is None:
            return
        run = trial.runs[-1]
        if run.status == OK and run.samples_per_s is not None:
            self.best = max(self.best or 0.0, run.samples_per_s)
            rate = f"{run.samples_per_s:,.0f} samples/s"
        else:
            rate = f"[red]{run.status}: {(run.reason or '')[:50]}"
        self.progress.update(current[0], completed=self.seconds, rate=rate, best=self._best_text())

    def _best_text(self) -> str:
        return f"best {self.best:,.0f}/s" if self.best else ""

    def _poll(self) -> None:
        while not self._stop.wait(REFRESH_S):
            current = self._current
            if current is None:
                continue
            task, run_dir = current
            rate = live_samples_per_s(run_dir, self.warmup_steps)
            elapsed = self.progress.tasks[task].elapsed or 0.0
            # Never full before the trial ends: a finished task stops its clock.
            self.progress.update(task, completed=min(elapsed, 0.99 * self.seconds),
                                 rate=f"{rate:,.0f} samples/s so far" if rate else "warming up")


def tune_view(result: TuneResult, out_dir: Path | None = None) -> list[RenderableType]:
    """``gpufeed tune``'s answer, to print one after another."""
    out: list[RenderableType] = []
    base = result.baseline.samples_per_s
    table = Table(title="Trials", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for column, justify in (("#", "right"), ("configuration", "left"), ("samples/s", "right"),
                            ("spread", "right"), ("runs", "right"), ("vs yours", "right"), ("why tried", "left")):
        table.add_column(column, justify=justify)
    for t in result.trials:
        mark = " ★" if t is result.best else ""
        if t.ok:
            rate, ratio = f"{t.samples_per_s:,.0f}", fmt(t.samples_per_s / base if base else None, ".2f", "×")
        else:
            rate, ratio = Text(t.status, style="red"), Text((t.reason or "")[:60], style="red")
        table.add_row(str(t.id), t.settings.label() + mark, rate, fmt(t.spread, ".0%"), str(len(t.runs)), ratio,
                      Text(t.why, style="dim"))
    out.append(table)
    best = result.best
    speedup = result.speedup
    head = Text.assemble(("Best: ", "bold"), (best.settings.label(), "bold magenta"),
                         f"  {fmt(best.samples_per_s, ',.0f')} samples/s, ",
                         (f"{fmt(speedup, '.2f')}× ", "bold green"),
                         f"your configuration ({result.baseline.settings.label()}: {fmt(base, ',.0f')} samples/s)")
    out.append(head)
    c = result.confirmation
    if c and c.get("speedup") is not None:
        tried = next((t for t in result.trials if t.id == c.get("of")), None)
        label = tried.settings.label() if tried is not None else "the winner"
        if c.get("kept_yours"):
            out.append(Text(f"Confirmed against yours in {c['pairs']} alternated pairs: {label} at {c['speedup']:.2f}× "
                            f"({c['low']:.2f}-{c['high']:.2f}×), a tie: your configuration stays.", style="yellow"))
        else:
            out.append(Text(f"Confirmed in {c['pairs']} alternated pairs of runs, yours then {label}: "
                            f"{c['speedup']:.2f}× ({c['low']:.2f}-{c['high']:.2f}×).", style="green"))
    elif best is not result.baseline:
        out.append(Text("Not confirmed against yours in alternated pairs (the search ended first): the speed-up "
                        "is one set of trials against another.", style="yellow"))
    if best is result.baseline or (best.settings == result.baseline.settings):
        out.append("Your configuration is already the fastest measured (within the noise).")
    else:
        out.append(Text.assemble(("Paste: ", "bold green"), paste_line(best.settings, result.training_config)))
    notes = [f"ties: throughputs within {result.noise:.0%} of each other (the measured run-to-run spread) "
             "count as equal; the cheapest of them wins"]
    stream = result.stream_note()
    if stream:
        notes.append(stream)
    notes += [n for n in (result.memory_note(),) if n]
    reorder = result.reorder or {}
    if reorder.get("allowed"):  # said whether or not it was tried, and what it costs where it won
        notes.append(result.reorder_note() or ("reordering allowed (--allow-reorder): in_order=False "
                                               + ("was tried and lost" if reorder.get("tried") else
                                                  "was not tried: in-order delivery cost no more than the noise")))
    hint = result.reorder_hint()
    if hint:
        notes.append(hint)
    if result.stopped == "budget":
        notes.append(f"the budget of {result.budget_s:.0f} s ran out: the search stopped early")
    elif result.stopped == "interrupted":
        notes.append("interrupted (Ctrl-C): best of the trials measured so far")
    notes.append(f"{count(len(result.trials), 'configuration')}, {count(sum(len(t.runs) for t in result.trials), 'run')}, "
                 f"{result.elapsed_s:.0f} s")
    out += [Text(f"note: {note}", style="dim") for note in notes]
    if out_dir is not None:
        out.append(Text(f"Trials and their run records: {out_dir}", style="dim"))
        out.append(Text(f"Train with the winner, unmodified: gpufeed run --config {out_dir / 'best-config.json'} "
                        f"-- {' '.join(result.command)}", style="dim"))
    return out
