"""The terminal summary: numbers first, then findings ranked by the time they cost."""
from __future__ import annotations

from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpufeed.analysis.findings import HIGH, INFO, LOW, MEDIUM, Diagnosis, Finding
from gpufeed.present.prose import (FINDINGS_BY_TIME, MEMORY_BY_BYTES, autotuned_sentence, cpus_sentence,
                                   gpus_named, headline, offload_sentence, rank_switches_sentence, warmup_sentence)
from gpufeed.present.whatif_view import what_if_block
from gpufeed.units import NA, fmt, human_bytes, rate_fmt

SEVERITY_STYLE = {HIGH: "bold red", MEDIUM: "yellow", LOW: "cyan", INFO: "green"}


def numbers_table(d: Diagnosis) -> Table:
    m = d.metrics
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    if m.steps:
        rate = (f"{rate_fmt(m.batches_per_s)} batches/s" if m.samples_unknown
                else f"{rate_fmt(m.samples_per_s)} samples/s")
        unknown = f"; samples not counted: {m.samples_unknown}" if m.samples_unknown else ""
        evaluation = f"; {m.eval_s:.1f} s of evaluation left out" if m.eval_s else ""
        table.add_row("Throughput", f"{rate} over {m.steps} steps "
                                    f"({m.wall_s:.1f} s, after {warmup_sentence(m)}{evaluation}){unknown}")
        training = d.training
        loop = m.steps_from in ("optimizer", "backward")
        if loop:
            table.add_row("Training", f"a loop without a DataLoader: a step is one {m.steps_from} "
                                      f"{'step' if m.steps_from == 'optimizer' else 'pass'}")
        if training is not None and training.config.get("site"):
            built = f", built {training.rebuilt} times" if training.rebuilt > 1 else ""
            table.add_row("Training", f"the DataLoader at {training.config['site']}{built} · "
                                      f"{training.role_why or 'iterated most'}")
        table.add_row("Step time", f"p50 {fmt(m.step_time_p50_ms, '.1f', ' ms')} · "
                                   f"p90 {fmt(m.step_time_p90_ms, '.1f', ' ms')} · "
                                   f"compute p50 {fmt(m.compute_p50_ms, '.1f', ' ms')}, "
                                   f"mean {fmt(m.compute_per_batch_ms, '.1f', ' ms')} per batch")
        tf_data = any(s.training and s.config.get("sampler") == "tf.data" for s in d.loaders)
        table.add_row("Data wait", f"{fmt(m.data_wait_share, '.0%')} of the wall time · "
                                   f"p50 {fmt(m.data_wait_p50_ms, '.1f', ' ms')} per step in "
                                   + ("IteratorGetNext (tf.data)" if tf_data else
                                      "the loop's own code, outside the model" if loop else "next(loader)"))
        if d.wait_by_stage:
            table.add_row("Wait split", d.wait_by_stage)
    if d.gpu_available and not m.gpu_indices and m.gpu_match and not m.cuda_used:
        gpu = f"{NA}: {m.gpu_match}"
    elif d.gpu_available:
        gpu = (f"{gpus_named(m)}util p5/p50/p95 {fmt(m.gpu_util_p5_pct, '.0f')}/{fmt(m.gpu_util_p50_pct, '.0f')}/"
               f"{fmt(m.gpu_util_p95_pct, '.0f', '%')} · idle waiting for data {fmt(m.gpu_idle_share, '.0%')} · "
               f"memory {human_bytes(m.gpu_mem_used_max_b)} of {human_bytes(m.gpu_mem_total_b)}")
        if not m.gpu_indices and m.gpu_match:
            gpu += f" · NVML figures {NA}: {m.gpu_match}"
        elif m.gpu_indices:  # GPM beside utilisation (Hopper and newer), or why not
            gpu += (f" · SM active p50 {fmt(m.gpu_sm_active_p50_pct, '.0f', '%')}, occupancy "
                    f"{fmt(m.gpu_sm_occupancy_p50_pct, '.0f', '%')}, tensor {fmt(m.gpu_tensor_active_p50_pct, '.0f', '%')}"
                    if m.gpu_sm_active_p50_pct is not None else f" · SM activity {NA}: {m.gpu_gpm_na}")
    else:
        gpu = f"{NA}: {d.gpu_unavailable_reason or 'no GPU found'}"
    table.add_row("GPU", gpu)
    table.add_row("CPU", f"{fmt(m.cpu_util_pct, '.0f', '%')} of {cpus_sentence(m)} · iowait {fmt(m.iowait_pct, '.0f', '%')} · "
                         f"RAM {human_bytes(m.mem_used_max_b)} of {human_bytes(m.mem_total_b)}")
    if m.offload is not None:  # the batches were made on Ray: no local worker to describe
        table.add_row("Offload", offload_sentence(m.offload))
    elif m.num_workers is not None:
        if m.num_workers:
            workers = (f"{m.num_workers} worker{'s' if m.num_workers > 1 else ''} · asleep {fmt(m.worker_asleep_share, '.0%')} of their fetch time · "
                       f"{fmt(m.fetch_ms_per_batch_p50, '.0f', ' ms')} per batch · "
                       f"{fmt(m.worker_threads_median, '.0f')} threads each")
        else:
            workers = f"num_workers=0: batches made in the training process ({fmt(m.fetch_ms_per_batch_p50, '.0f', ' ms')} each)"
        if m.worker_startup_s is not None:
            workers += f" · start-up {m.worker_startup_s:.2f} s ({fmt(m.worker_startup_share, '.0%')})"
        table.add_row("Loader", autotuned_sentence(m) + workers)
    switches = rank_switches_sentence(m)
    if switches:  # several ranks autotuned: the same batches on every rank, or loudly not
        differ = bool(m.autotuned["ranks"]["differ"])
        table.add_row("Switches", Text(switches, style="bold red" if differ else ""))
    return table


MAX_RANK_ROWS = 16  # a large job shows the ranks that wait for data most; the JSON has them all


def ranks_table(d: Diagnosis) -> Table:
    """One row per rank: where the step time went on each (several ranks only). Times are p50 in ms;
    "sync" is compute above the rank with the shortest: time spent waiting for the others."""
    ranks = d.metrics.ranks
    if len(ranks) > MAX_RANK_ROWS:
        shown = sorted(ranks, key=lambda r: -(r.data_wait_share or 0.0))[:MAX_RANK_ROWS]
        ranks = [r for r in ranks if any(r is x for x in shown)]
    hosts = len({r.host for r in ranks}) > 1
    gpus = any(r.gpu_util_p50_pct is not None for r in ranks)
    columns = [("rank", ""), ("host", "")] if hosts else [("rank", "")]
    columns += [("steps", ""), ("samp/s", ""), ("wait", "share"), ("wait", "ms"), ("step", "ms"), ("p90", "ms"),
                ("comp", "ms"), ("sync", "ms")] + ([("GPU", "util")] if gpus else []) + [("end", "")]
    table = Table(box=None, padding=(0, 1), header_style="bold")
    for name, _unit in columns:
        table.add_column(name, justify="left" if name in ("rank", "host", "end") else "right")
    table.add_row(*(unit for _name, unit in columns), style="dim")
    for r in ranks:
        end = f"exit {r.exit_code}" if r.exit_code not in (None, 0) else (r.end or "killed")
        cells = [r.label.replace("rank ", "")] + ([r.host or NA] if hosts else [])
        cells += [str(r.steps), fmt(r.samples_per_s, ",.0f"), fmt(r.data_wait_share, ".0%"),
                  fmt(r.data_wait_p50_ms, ".1f"), fmt(r.step_time_p50_ms, ".1f"), fmt(r.step_time_p90_ms, ".1f"),
                  fmt(r.compute_p50_ms, ".1f"), fmt(r.sync_wait_p50_ms, ".1f")]
        cells += [fmt(r.gpu_util_p50_pct, ".0f", "%")] if gpus else []
        table.add_row(*cells, end)
    if len(d.metrics.ranks) > len(ranks):
        table.caption = f"{len(ranks)} of {len(d.metrics.ranks)} ranks: those that waited most; --json has all"
    return table


def finding_block(index: int, f: Finding) -> Group:
    head = Text.assemble((f"{index}. ", "bold"), (f"{f.severity.upper():<6}", SEVERITY_STYLE[f.severity]),
                         (f" {f.id}", "bold"), "  ", f.message)
    fix = Text.assemble(("   fix: ", "bold green"), f.recommendation, (gain_sentence(f), "green"))
    evidence = ", ".join(f"{k}={_evidence_value(v)}" for k, v in f.evidence.items()
                         if v is not None and not isinstance(v, (list, dict)))
    return Group(head, fix, Text(f"   evidence: {evidence}", style="dim"))


def gain_sentence(f: Finding) -> str:
    """" (predicted 1.17x your samples/s, 1.08-1.23x: w1 persistent on 2 cores)", or why no gain is predicted."""
    g = f.gain
    if not g or not f.fix_settings:
        return ""
    if g.get("cannot_predict"):
        return f" (gain not predicted: {g['cannot_predict']})"
    rest = "; prefetch_factor is not predicted, only the workers" if g.get("only_workers_predicted") else ""
    return f" (predicted {g['speedup']:.2f}x your samples/s, {g['low']:.2f}-{g['high']:.2f}x: {g['setting']}{rest})"


def _evidence_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def diagnosis_view(d: Diagnosis) -> list[RenderableType]:
    """The summary of a diagnosis, to print one after another (``gpufeed diagnose``, ``analyze``)."""
    run = d.run
    status_style = "green" if run.get("end_reason") in ("completed", "steps_reached") else "bold red"
    out: list[RenderableType] = [Text.assemble(("gpufeed ", "bold"), ("· ", "dim"), " ".join(run.get("command") or []))]
    if run.get("message"):
        out.append(Text(run["message"], style=status_style))
    out.append(Text.assemble(("Bottleneck: ", "bold"), (headline(d), "bold magenta")))
    out.append(Panel(numbers_table(d), title="measured", title_align="left", expand=False))
    if len(d.metrics.ranks) > 1:
        focus = f" (above: rank {d.metrics.focus_rank}'s; throughput: the job's)" \
            if d.metrics.focus_rank is not None else " (throughput above: the job's)"
        out.append(Panel(ranks_table(d), title=f"{len(d.metrics.ranks)} ranks{focus}", title_align="left",
                         expand=False))
    timed = [f for f in d.findings if f.group == "time"]
    memory = [f for f in d.findings if f.group != "time"]
    if timed:
        out.append(Text(f"{FINDINGS_BY_TIME}:", style="bold"))
        out += [finding_block(i, f) for i, f in enumerate(timed, 1)]
    if memory:
        out.append(Text(f"{MEMORY_BY_BYTES}:", style="bold"))
        out += [finding_block(i, f) for i, f in enumerate(memory, len(timed) + 1)]
    block = what_if_block(d.what_if)
    if block is not None:
        out.append(block)
    out += [Text(f"note: {w}", style="yellow") for w in d.warnings]
    out += [Text(f"self-check: {c}", style="yellow") for c in d.checks]
    dirs = " ".join(d.run_dirs or [d.run_dir])
    out.append(Text(f"Run record{'s' if len(d.run_dirs) > 1 else ''}: {dirs}  (gpufeed analyze {dirs})", style="dim"))
    return out


def render(d: Diagnosis, console: Console | None = None) -> None:
    """``diagnosis_view`` printed (the notebook API, tests); the command line prints the view itself."""
    console = console or Console()
    for part in diagnosis_view(d):
        console.print(part)
