"""``gpufeed watch``: `watch nvidia-smi` and `top` in one live screen, next to a running diagnosis.

Every refresh reads the host and the GPUs with the reader the outside sampler records with
(``HostReader.read``: /proc and the NVML gateway), keeps a short history per GPU so the sawtooth
shows as a sparkline (GPM's SM activity, occupancy and tensor activity beside utilisation where the
GPU has them, N/A with the reason where not), and, when a ``gpufeed diagnose`` run is going, reads its
run record for the job's recent samples/s, data-wait share, worker states and current findings (and, under
``--autotune``, the settings in force and the last decision; under several ranks, a line per rank
with its settings and its last switch). The run is read
(and analysed) every ``RUN_REFRESH_S`` at most, and less often when that gets slow: a long run's
record takes longer to read than a refresh.

Rich's ``Live`` draws on the alternate screen and redraws in place (no flicker); the terminal is
restored on ``q``, Ctrl-C or any error. A missing reading shows as N/A, never 0.
"""
from __future__ import annotations

import math
import os
import select
import socket
import sys
import termios
import time
import tty
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpufeed.analysis import Diagnosis, analyze_record
from gpufeed.analysis.findings import Finding
from gpufeed.analysis.offloaded import Offload, batches_per_s, events_of
from gpufeed.measure.outside.host import HostReader
from gpufeed.present.autotune_view import rank_lines, settings_timeline
from gpufeed.present.steps import recent, training_steps
from gpufeed.present.terminal import SEVERITY_STYLE
from gpufeed.record import schema
from gpufeed.record.layout import RUNS_ROOT
from gpufeed.record.reader import RecordError, load_meta, load_run
from gpufeed.units import NA, fmt, human_bytes

RUNS_DIR = RUNS_ROOT
HISTORY = 120               # readings kept per series: two minutes at the default refresh
RUN_REFRESH_S = 2.0         # the run record is read at most this often
RECENT_S = 10.0             # "recent" samples/s and data wait: over this many seconds
ALIVE_S = 30.0              # a run whose samples.jsonl is older than this is not running
COMPACT_COLS, COMPACT_ROWS = 80, 24
SPARK = "▁▂▃▄▅▆▇█"
# GPM's metrics beside utilisation (issue 34.6), from the same reading; their three columns take this
# many of the sparklines' columns ("SM active", "occupancy", "tensor" and the padding between).
GPM_KEYS = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct")
GPM_COLS = 28


def sparkline(values: "deque[float | None]", top: float, width: int) -> str:
    """The last ``width`` readings as block characters scaled to ``top``; a missing one is a space."""
    out = []
    for v in list(values)[-width:]:
        if v is None or not math.isfinite(v) or top <= 0:
            out.append(" ")
        else:
            out.append(SPARK[min(len(SPARK) - 1, max(0, int(v / top * (len(SPARK) - 1) + 0.5)))])
    return "".join(out)


@dataclass
class RunState:
    """What the watched run's record says now."""

    run_dir: Path
    command: str = ""
    running: bool = True
    message: str | None = None
    samples_per_s: float | None = None
    data_wait_share: float | None = None
    workers: list[tuple[int, str, float | None]] = field(default_factory=list)  # pid, status, cpu %
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None
    offload: Offload | None = None                  # --offload: the training loader's batches made on Ray
    offload_batches_per_s: float | None = None      # between the run's last two `offload` events
    offload_latency_ms: float | None = None         # p50 over the batches before the last event
    autotune: str | None = None   # --autotune: the settings in force and the last decision, one line
    autotune_ranks: list[str] = field(default_factory=list)  # several ranks: each one's settings and last switch


def find_running_run(root: Path = RUNS_DIR, now: Callable[[], float] = time.time) -> Path | None:
    """The newest run under ``root`` that has not ended and whose sampler wrote recently: a
    ``diagnose`` run, or the trial a ``tune`` is running (``root/<tune>/trials/<trial>``)."""
    if not root.is_dir():
        return None
    runs = [p.parent for pattern in ("*/" + schema.META_FILE, "*/trials/*/" + schema.META_FILE)
            for p in root.glob(pattern)]
    candidates = sorted(runs, key=lambda p: p.stat().st_mtime, reverse=True)
    for run_dir in candidates:
        samples = run_dir / schema.SAMPLES_FILE
        try:
            if load_meta(run_dir).end_reason is None and samples.exists() and now() - samples.stat().st_mtime < ALIVE_S:
                return run_dir
        except (RecordError, OSError):
            continue
    return None


def read_run(run_dir: Path) -> RunState:
    """The run's state now, from its record (a record being written is read as far as it goes)."""
    state = RunState(run_dir=run_dir)
    try:
        record = load_run(run_dir)
    except RecordError as error:
        state.error = str(error)
        return state
    meta = record.meta
    state.command, state.running, state.message = " ".join(meta.command), meta.end_reason is None, meta.message
    d: Diagnosis = analyze_record(record)
    state.samples_per_s, state.data_wait_share = recent(training_steps(record, d), RECENT_S)
    state.findings = d.findings
    training = next((s for s in d.loaders if s.training), None)
    tl = settings_timeline(record, training.pid if training is not None else None)
    if tl is not None and tl.settings:
        switches = len(tl.switches)
        state.autotune = (f"{tl.settings[-1].label} ({switches} switch{'' if switches == 1 else 'es'})  "
                          f"last: {tl.last_words()}")
    state.autotune_ranks = rank_lines(record, meta.t_start)
    latest = [it.worker_pids for it in record.iterators if it.worker_pids]
    workers = set(latest[-1]) if latest else set()
    last = record.samples.procs[-1] if len(record.samples) else []
    state.workers = [(row.pid, row.status, row.cpu_pct) for row in last if row.pid in workers]
    state.offload = d.metrics.offload
    if state.offload is not None and d.training is not None:
        events = events_of(record, d.training.pid)
        state.offload_batches_per_s = batches_per_s(events)
        last_event = events[-1] if events else {}
        state.offload_latency_ms = last_event.get("recent_latency_ms_p50", last_event.get("latency_ms_p50"))
    return state


def offload_line(run: RunState) -> Text:
    """The Ray side of an offloaded run, in one line: workers, batches/s, latency, faults."""
    o = run.offload
    return Text.assemble(("     Ray ", "bold"), f"{fmt(o.workers, 'd')} workers on {fmt(o.nodes, 'd')} nodes · ",
                         ("batches/s ", "bold"), fmt(run.offload_batches_per_s, ",.1f"),
                         ("   latency p50 ", "bold"), fmt(run.offload_latency_ms, ".1f", " ms"),
                         ("   resent/lost ", "bold"), f"{fmt(o.resent, 'd')}/{fmt(o.workers_lost, 'd')}",
                         (f"   fell back to local workers: {o.fell_back}", "yellow") if o.fell_back else "",
                         overflow="ellipsis", no_wrap=True)


class Dashboard:
    """The readings and their history; ``render`` draws them for a terminal of a given size."""

    def __init__(self, reader: HostReader, run_dir: Path | None, discover: bool) -> None:
        self.reader = reader
        self.run_dir = run_dir
        self.discover = discover
        self.line: dict[str, Any] = {}
        self.gpu_util: dict[int, deque] = {}
        self.gpu_mem: dict[int, deque] = {}
        self.cpu_total: deque = deque(maxlen=HISTORY)
        self.gpu_error: str | None = None
        self.run: RunState | None = None
        self.ticks = 0
        self._next_run_t = 0.0

    def tick(self, now: float) -> None:
        self.line = self.reader.read()
        self.ticks += 1
        cores = [c for c in self.line["cpu_pct"] if c is not None]
        self.cpu_total.append(sum(cores) / len(cores) if cores else None)
        for g in self.line["gpus"]:
            self.gpu_util.setdefault(g["index"], deque(maxlen=HISTORY)).append(g["util_pct"])
            self.gpu_mem.setdefault(g["index"], deque(maxlen=HISTORY)).append(g["mem_used_b"])
        if not self.line["gpus"]:
            self.gpu_error = self.reader.nvml.error or "no GPU found"
        if now >= self._next_run_t:
            started = time.monotonic()
            if self.discover and (self.run is None or not self.run.running):
                self.run_dir = find_running_run() or self.run_dir
            if self.run_dir is not None:
                self.run = read_run(self.run_dir)
            # A long run's record is slow to read: never spend more than a quarter of the time on it.
            self._next_run_t = now + max(RUN_REFRESH_S, 4 * (time.monotonic() - started))

    # -- drawing ------------------------------------------------------------------------------

    def render(self, width: int, height: int, interval_s: float) -> RenderableType:
        if width < COMPACT_COLS or height < COMPACT_ROWS:
            return self._compact(width)
        spark_w = max(10, min(HISTORY, width - 50))
        parts: list[RenderableType] = [Text.assemble(
            ("gpufeed watch", "bold"), f"  ·  {socket.gethostname()}  ·  every {interval_s:g} s  ·  #{self.ticks}  ·  ", ("q", "bold"), " to quit")]
        parts.append(self._gpus(spark_w))
        parts.append(self._host(spark_w))
        procs = self._gpu_procs()
        if procs is not None:
            parts.append(procs)
        parts.append(self._run(height))
        return Group(*parts)

    def _gpus(self, spark_w: int) -> RenderableType:
        if not self.line.get("gpus"):
            return Text(f"GPU  {NA}: {self.gpu_error}", style="yellow")
        table = Table(box=None, padding=(0, 1), show_header=True, header_style="bold")
        half = max(8, (spark_w - GPM_COLS) // 2)
        for col in ("GPU", "util", f"last {half} readings", "SM active", "occupancy", "tensor", "memory",
                    f"last {half} readings"):
            table.add_column(col)
        missing = []
        for g in self.line["gpus"]:
            i = g["index"]
            mem_top = g["mem_total_b"] or max((v for v in self.gpu_mem[i] if v is not None), default=0)
            table.add_row(str(i), fmt(g["util_pct"], ".0f", "%"),
                          Text(sparkline(self.gpu_util[i], 100.0, half), style="green"),
                          *(fmt(g.get(key), ".0f", "%") for key in GPM_KEYS),
                          f"{human_bytes(g['mem_used_b'])} / {human_bytes(g['mem_total_b'])}",
                          Text(sparkline(self.gpu_mem[i], mem_top, half), style="magenta"))
            if all(g.get(key) is None for key in GPM_KEYS):
                missing.append(Text(f"GPU {i} SM activity, occupancy, tensor {NA}: {g.get('gpm_na') or 'not read'}",
                                    style="dim"))
        return Group(table, *missing) if missing else table

    def _host(self, spark_w: int) -> RenderableType:
        line = self.line
        cores = line.get("cpu_pct") or []
        total = self.cpu_total[-1] if self.cpu_total else None
        head = Text.assemble(("CPU  ", "bold"), f"{fmt(total, '.0f', '%')} of {len(cores) or NA} cores  ",
                             (sparkline(self.cpu_total, 100.0, spark_w), "cyan"))
        per_core = Text("     ")
        for n, c in enumerate(cores):
            per_core.append(f"{n}:{fmt(c, '>3.0f', '%')} ", style="red" if c is not None and c > 90 else "")
        mem = Text.assemble(("RAM  ", "bold"), f"{human_bytes(line.get('mem_used_b'))} / {human_bytes(line.get('mem_total_b'))}",
                            ("   iowait ", "bold"), fmt(line.get("iowait_pct"), ".1f", "%"))
        return Group(head, per_core, mem)

    def _gpu_procs(self) -> RenderableType | None:
        rows = [(g["index"], int(pid), used) for g in self.line.get("gpus") or [] for pid, used in g["procs"].items()]
        if not rows:
            return None
        table = Table(box=None, padding=(0, 1), header_style="bold", title="GPU processes", title_justify="left")
        for col in ("GPU", "pid", "name", "memory"):
            table.add_column(col)
        for index, pid, used in sorted(rows):
            try:
                name = psutil.Process(pid).name()
            except (psutil.Error, OSError):
                name = NA
            table.add_row(str(index), str(pid), name, human_bytes(used))
        return table

    def _run(self, height: int) -> RenderableType:
        run = self.run
        if run is None:
            where = "" if self.run_dir else f" under ./{RUNS_DIR}"
            return Text(f"No running gpufeed diagnose found{where}: gpufeed watch RUN_DIR picks one.", style="dim")
        if run.error:
            return Text(f"Run {run.run_dir}: {run.error}", style="yellow")
        state = ("running", "green") if run.running else (f"ended: {run.message or ''}", "yellow")
        lines: list[RenderableType] = [
            Text.assemble(("Run  ", "bold"), str(run.run_dir), "  ", (state[0], state[1])),
            Text(f"     {run.command}", style="dim", overflow="ellipsis", no_wrap=True),
            Text.assemble(("     samples/s ", "bold"), fmt(run.samples_per_s, ",.0f"),
                          ("   data wait ", "bold"), fmt(run.data_wait_share, ".0%"), f"  (last {RECENT_S:g} s)"),
        ]
        if run.offload is not None:
            lines.append(offload_line(run))
        if run.autotune:
            lines.append(Text.assemble(("     autotune ", "bold"), run.autotune, overflow="ellipsis", no_wrap=True))
        for line in run.autotune_ranks:  # under several ranks: a line each (seconds since the run started)
            style = "bold red" if line.startswith("RANKS DIFFER") else ""
            lines.append(Text.assemble("       ", (line, style), overflow="ellipsis", no_wrap=True))
        if run.workers:
            workers = Text("     workers ", style="bold")
            for pid, status, cpu in run.workers:
                workers.append(f"{pid} {status} {fmt(cpu, '.0f', '%')}  ", style="" if status == "running" else "dim")
            lines.append(workers)
        room = max(1, height - 14)
        for f in run.findings[:room]:
            lines.append(Text.assemble(f"     {f.severity.upper():<6} ", (f.id, SEVERITY_STYLE[f.severity]), "  ",
                                       f.message, overflow="ellipsis", no_wrap=True))
        return Group(*lines)

    def _compact(self, width: int) -> RenderableType:
        """One short line per source, for a small terminal."""
        lines = []
        for g in self.line.get("gpus") or []:
            lines.append(f"GPU{g['index']} {fmt(g['util_pct'], '.0f', '%')} {human_bytes(g['mem_used_b'])} "
                         f"SM {fmt(g.get('sm_active_pct'), '.0f', '%')} "
                         f"{sparkline(self.gpu_util[g['index']], 100.0, max(4, width - 31))}")
        if not self.line.get("gpus"):
            lines.append(f"GPU {NA}: {self.gpu_error}")
        total = self.cpu_total[-1] if self.cpu_total else None
        lines.append(f"CPU {fmt(total, '.0f', '%')} io {fmt(self.line.get('iowait_pct'), '.0f', '%')} "
                     f"RAM {human_bytes(self.line.get('mem_used_b'))}")
        if self.run is not None and not self.run.error:
            lines.append(f"run {fmt(self.run.samples_per_s, ',.0f')}/s wait {fmt(self.run.data_wait_share, '.0%')}")
            if self.run.findings:
                lines.append(f"{self.run.findings[0].severity.upper()} {self.run.findings[0].id}")
        lines.append(f"#{self.ticks} q: quit")
        return Text("\n".join(line[:width] for line in lines), no_wrap=True, overflow="crop")


@contextmanager
def _keys() -> Iterator[Callable[[float], str | None]]:
    """Single key presses without Enter, while the terminal still turns Ctrl-C into SIGINT."""
    if not sys.stdin.isatty():
        yield lambda timeout: time.sleep(timeout)  # type: ignore[func-returns-value]
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        def read(timeout: float) -> str | None:
            ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
            return os.read(fd, 32).decode(errors="replace") if ready else None
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _follow_terminal_size(console: Console) -> None:
    """The terminal's size now: it may have been resized, and COLUMNS/LINES in the environment
    (which Console trusts) can be stale."""
    try:
        size = os.get_terminal_size(console.file.fileno())
    except (OSError, ValueError, AttributeError):
        return
    console.size = (size.columns, size.lines)


def watch(run_dir: Path | None = None, interval_s: float = 1.0, console: Console | None = None) -> None:
    """Run the dashboard until q or Ctrl-C. ``run_dir`` None: find a running diagnose by itself."""
    if run_dir is not None and not run_dir.is_dir():
        raise RecordError(f"{run_dir} is not a directory (expected a gpufeed run directory).")
    console = console or Console()
    reader = HostReader(root_pid=os.getpid())  # reads the host; records nothing
    board = Dashboard(reader, run_dir, discover=run_dir is None)
    try:
        with _keys() as read_key, Live(console=console, screen=True, auto_refresh=False) as live:
            next_t = time.monotonic()
            while True:
                now = time.monotonic()
                if now >= next_t:
                    board.tick(now)
                    _follow_terminal_size(console)
                    live.update(board.render(console.width, console.height, interval_s), refresh=True)
                    next_t = now + interval_s
                key = read_key(next_t - time.monotonic())
                if key and "q" in key.lower():
                    return
    except KeyboardInterrupt:
        return  # Ctrl-C is how people leave `watch`: a clean exit, not an error
    finally:
        reader.close()
