"""``gpufeed batch-size`` in the terminal: a line per trial while it runs, then the table and the answer."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from gpufeed import thresholds as th
from gpufeed.batchsize.result import OK, BatchSizeResult, BatchTrial
from gpufeed.units import count, fmt, human_bytes


class TrialLines:
    """Prints each trial as it starts and as it ends (trials take seconds each)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def started(self, batch_size: int | None, why: str, run_dir: Path) -> None:
        label = "your batch size" if batch_size is None else f"batch {batch_size}"
        self.console.print(Text(f"  trying {label} ({why})...", style="dim"))

    def finished(self, trial: BatchTrial) -> None:
        if trial.fits:
            text = Text(f"  batch {trial.batch_size}: peak {human_bytes(trial.peak_mem_b)}, "
                        f"{fmt(trial.samples_per_s, ',.0f')} samples/s")
        else:
            text = Text(f"  batch {trial.batch_size}: {trial.status}: {trial.reason or ''}", style="red")
        self.console.print(text, highlight=False)


def batch_size_view(result: BatchSizeResult, out_dir: Path | None = None) -> list[RenderableType]:
    """``gpufeed batch-size``'s answer, to print one after another."""
    out: list[RenderableType] = []
    table = Table(title="Trials", title_justify="left", header_style="bold")
    for column, justify in (("batch", "right"), ("status", "left"), ("peak memory", "right"),
                            ("of capacity", "right"), ("samples/s", "right"), ("why tried / why not", "left")):
        table.add_column(column, justify=justify)
    for t in sorted(result.trials, key=lambda t: t.batch_size):
        marks = " ★" if t.batch_size == result.largest_safe else ""
        marks += " knee" if t.batch_size == result.knee else ""
        share = t.peak_mem_b / result.capacity_b if t.peak_mem_b and result.capacity_b else None
        table.add_row(f"{t.batch_size}{marks}", Text(t.status, style="green" if t.status == OK else "red"),
                      human_bytes(t.peak_mem_b), fmt(share, ".0%"), fmt(t.samples_per_s, ",.0f"),
                      Text(t.why if t.fits else (t.reason or t.why), style="dim" if t.fits else "red"))
    out.append(table)
    capacity = (f"{human_bytes(result.capacity_b)} ({'GPU memory' if result.device == 'cuda' else 'memory budget'})")
    out.append(_unhighlighted(f"Capacity {capacity}, target {result.target_share:.0%}: {human_bytes(result.limit_b)}"))
    fit = result.fit
    if fit is not None:
        line = (f"Fit: memory = {human_bytes(fit.intercept_b)} + {human_bytes(fit.per_sample_b)} × batch "
                f"(R² {fit.r2:.3f} over {fit.points} sizes)")
        if not fit.linear and fit.points >= 3:
            line += ": not linear in the batch size, so the answer comes from a bisection on measured trials"
        out.append(_unhighlighted(line))
    safe = result.trial(result.largest_safe)
    if safe is None:
        out.append(Text("No batch size fitted.", style="bold red"))
    else:
        predicted = f"; the fit predicts {result.predicted}" if result.predicted is not None else ""
        out.append(Text.assemble(("Largest safe batch: ", "bold"), (str(safe.batch_size), "bold magenta"),
                                 f"  (verified: peak {human_bytes(safe.peak_mem_b)}, "
                                 f"{fmt(safe.samples_per_s, ',.0f')} samples/s{predicted}; "
                                 f"yours is {result.yours})"))
    fastest = max((t for t in result.trials if t.fits and t.samples_per_s), key=lambda t: t.samples_per_s, default=None)
    if result.knee is not None and fastest is not None:
        out.append(_unhighlighted(f"Knee: throughput stops improving at batch {result.knee} "
                                  f"(within {th.BATCH_KNEE_TOLERANCE:.0%} of the best, {fastest.samples_per_s:,.0f} "
                                  f"samples/s at batch {fastest.batch_size}): larger is not always faster."))
    if safe is not None:
        where = f" at {result.site}" if result.site else ""
        out.append(Text.assemble(("Use: ", "bold green"), f"DataLoader(..., batch_size={safe.batch_size}){where}",
                                 ("  and scale the learning rate with the batch (e.g. linearly, with warm-up)",
                                  "dim")))
        if result.knee is not None and result.knee < safe.batch_size:
            out.append(_unhighlighted(f"     or batch_size={result.knee}: as fast on this machine, with less memory."))
    for note in result.notes:
        out.append(Text(f"note: {note}", style="dim"))
    out.append(Text(f"note: {count(len(result.trials), 'trial')}, {result.elapsed_s:.0f} s", style="dim"))
    if out_dir is not None:
        out.append(Text(f"Trials and their run records: {out_dir}", style="dim"))
    return out


def _unhighlighted(text: str) -> Text:
    """A line as ``console.print(text, highlight=False)`` shows it: markup read, numbers not coloured."""
    return Text.from_markup(text)
