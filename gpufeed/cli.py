"""The ``gpufeed`` command line: ``diagnose``, ``analyze``, ``tune``, ``batch-size``, ``run``, ``demo``,
``report``, ``trace`` and ``watch``.

Exit codes (also in the README):
  0  diagnosed (the command finished, or was stopped after --steps)
  1  gpufeed itself failed (a bug: please report it with the run directory)
  2  bad usage (an unknown flag, a missing command)
  3  the command could not be started
  4  the command failed (non-zero exit or killed); the diagnosis covers what was measured
  5  the DataLoader stalled (no batch for --stall-timeout seconds)
  6  the run directory given to analyze, report, trace, what-if or watch cannot be read
  7  tune, batch-size: nothing to tune (the command never iterated a DataLoader)
  8  batch-size: no batch size fits (fails at batch size 1, budget smaller than the model) or
     the batch size cannot be overridden (a custom batch_sampler)
  130 interrupted by Ctrl-C; the partial record is kept and diagnosed
  143 stopped by a SIGTERM sent to gpufeed (a scheduler, kill); the partial record is kept and diagnosed
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from rich.console import Console

from gpufeed import thresholds as th
from gpufeed._version import __version__
from gpufeed.offload.options import add_options as add_offload_options
from gpufeed.offload.options import settings_from as offload_settings

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_NOT_STARTED = 0, 1, 2, 3
EXIT_COMMAND_FAILED, EXIT_STALLED, EXIT_BAD_RECORD, EXIT_INTERRUPTED = 4, 5, 6, 130
EXIT_NOTHING_TO_TUNE = 7
EXIT_NO_BATCH_SIZE = 8
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process ended by SIGTERM

EXIT_FOR_END = {"completed": EXIT_OK, "steps_reached": EXIT_OK, "failed": EXIT_COMMAND_FAILED,
                "stalled": EXIT_STALLED, "interrupted": EXIT_INTERRUPTED}

DEMO_SCRIPT = Path(__file__).with_name("demo") / "train.py"


def _whole(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


def _positive_int(text: str) -> int:
    value = _whole(text, "a positive whole number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = _whole(text, "0 or a positive whole number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):  # inf and nan parse as floats, but are no duration
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of seconds, got {text!r}")
    return value


def _positive_number(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _path(text: str) -> Path:
    """A path option: '' would silently mean the current directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a file or directory, got ''")
    return Path(text)


def _size(text: str) -> int:
    """Bytes from ``512M``, ``1.5G``, ``8GiB`` or a plain number of bytes."""
    import re
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"must be a size like 512M or 8G, got {text!r}")
    value = float(match.group(1)) * 1024 ** " KMGT".index(match.group(2).upper() or " ")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive size, got {text!r}")
    return int(value)


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a share between 0 and 1, got {text}")
    return value


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=_positive_int, metavar="N",
                   help="measure N steps after the warm-up, then end the command cleanly (default: run to its end)")
    p.add_argument("--warmup", type=_non_negative_int, default=th.DEFAULT_WARMUP_STEPS, metavar="N",
                   help=f"steps left out of the measurement at the start (default {th.DEFAULT_WARMUP_STEPS})")
    p.add_argument("--out", type=_path, metavar="DIR",
                   help="run directory to write (default ./gpufeed-runs/<timestamp>-<name>/)")
    p.add_argument("--json", type=_path, metavar="FILE", help="also write the diagnosis as JSON to FILE")
    p.add_argument("--stall-timeout", type=_positive_float, default=60.0, metavar="SECONDS",
                   help="report a stuck loader after this long without a batch (default 60)")
    p.add_argument("--first-batch-timeout", type=_positive_float, default=th.FIRST_BATCH_TIMEOUT_S,
                   metavar="SECONDS",
                   help="the stall limit for each iterator's first batch, which waits for worker start-up "
                        f"or a filling shuffle buffer (default {th.FIRST_BATCH_TIMEOUT_S:g})")
    p.add_argument("--grace", type=_positive_float, default=th.STOP_GRACE_S, metavar="SECONDS",
                   help="time the command gets to end by itself (its own SIGINT/SIGTERM handler, a checkpoint "
                        "save) after Ctrl-C, a SIGTERM to gpufeed or a stall, before it is killed "
                        f"(default {th.STOP_GRACE_S:g})")
    p.add_argument("--interval", type=_positive_float, default=0.1, metavar="SECONDS",
                   help="sampling interval for CPU, memory and GPU (default 0.1, i.e. 10 Hz)")
    _add_report_option(p)
    _add_tensorboard_option(p)
    p.add_argument("--prometheus", type=_port, metavar="PORT",
                   help="serve the run's data-wait share, samples/s and GPU util per rank for Prometheus "
                        "on this port while it runs (needs prometheus_client)")
    p.add_argument("--prometheus-addr", default="127.0.0.1", metavar="ADDR",
                   help="address the Prometheus exporter binds to (default 127.0.0.1, this host only)")


def _add_tensorboard_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensorboard", type=_path, metavar="LOG_DIR",
                   help="also write data-wait share, samples/s and GPU util as TensorBoard scalars to LOG_DIR")


def _port(text: str) -> int:
    value = _whole(text, "a TCP port (1-65535)")
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"must be a TCP port (1-65535), got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufeed", description="Find out why a PyTorch training job leaves its GPU idle, and fix it.")
    parser.add_argument("--version", action="version", version=f"gpufeed {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="COMMAND")

    exit_codes = "exit codes:\n" + __doc__.split("Exit codes (also in the README):\n", 1)[1].strip("\n")
    p = sub.add_parser("diagnose", help="run a training command unmodified and say what holds the GPU back",
                       usage="gpufeed diagnose [options] -- CMD [ARGS...]", epilog=exit_codes,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_options(p)
    add_offload_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")

    p = sub.add_parser("analyze", help="diagnose a run directory again, from its record alone; several "
                                         "directories (one per node of a job) are merged into one diagnosis")
    p.add_argument("run_dir", type=_path, nargs="+",
                   help="a run directory; several: one per node of a job, merged into one diagnosis")
    p.add_argument("--json", type=_path, metavar="FILE", help="also write the diagnosis as JSON to FILE")
    _add_tensorboard_option(p)

    p = sub.add_parser("tune", help="find the fastest DataLoader settings for a command, by short trials",
                       usage="gpufeed tune [options] -- CMD [ARGS...]", epilog=exit_codes,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=_positive_float, metavar="SECONDS",
                   help="stop starting trials after this long (default: search until done)")
    p.add_argument("--trial-seconds", type=_positive_float, default=th.TUNE_TRIAL_SECONDS, metavar="SECONDS",
                   help=f"measured time per trial, after the warm-up (default {th.TUNE_TRIAL_SECONDS:g})")
    p.add_argument("--warmup", type=_non_negative_int, default=th.DEFAULT_WARMUP_STEPS, metavar="N",
                   help=f"steps left out of each trial's measurement (default {th.DEFAULT_WARMUP_STEPS})")
    p.add_argument("--max-workers", type=_positive_int, metavar="N",
                   help=f"largest num_workers to try (default {th.TUNE_MAX_WORKERS_PER_CORE} per core)")
    p.add_argument("--stall-timeout", type=_positive_float, default=th.TUNE_STALL_TIMEOUT_S, metavar="SECONDS",
                   help=f"a trial with no batch for this long is stopped as hung (default {th.TUNE_STALL_TIMEOUT_S:g})")
    p.add_argument("--out", type=_path, metavar="DIR",
                   help="tune directory: trials, tune.json, best-config.json (default ./gpufeed-runs/<timestamp>-tune-<name>/)")
    p.add_argument("--json", type=_path, metavar="FILE", help="also write the result (tune.json) to FILE")
    _add_report_option(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")

    p = sub.add_parser("batch-size", help="find the largest batch that fits in memory, by short trials",
                       usage="gpufeed batch-size [options] -- CMD [ARGS...]", epilog=exit_codes,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--memory-budget", type=_size, metavar="SIZE",
                   help="CPU: the memory the training process may use, e.g. 8G or 512M (default: the RAM "
                        "available now); CUDA: ignored, the GPU's memory is the capacity")
    p.add_argument("--target", type=_share, default=th.BATCH_TARGET_SHARE, metavar="SHARE",
                   help=f"share of the capacity the batch may use (default {th.BATCH_TARGET_SHARE:g})")
    p.add_argument("--trial-seconds", type=_positive_float, default=th.BATCH_TRIAL_SECONDS, metavar="SECONDS",
                   help=f"measured time per trial, after the warm-up (default {th.BATCH_TRIAL_SECONDS:g})")
    p.add_argument("--warmup", type=_non_negative_int, default=th.BATCH_TRIAL_WARMUP_STEPS, metavar="N",
                   help=f"steps left out of each trial's throughput (default {th.BATCH_TRIAL_WARMUP_STEPS})")
    p.add_argument("--max-trials", type=_positive_int, default=th.BATCH_MAX_TRIALS, metavar="N",
                   help=f"most trials to run (default {th.BATCH_MAX_TRIALS})")
    p.add_argument("--out", type=_path, metavar="DIR",
                   help="batch-size directory: trials, batch_size.json (default ./gpufeed-runs/<timestamp>-batch-size-<name>/)")
    p.add_argument("--json", type=_path, metavar="FILE", help="also write the result (batch_size.json) to FILE")
    _add_report_option(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")

    p = sub.add_parser("run", help="run a command with DataLoader settings from a file (gpufeed tune's best-config.json), "
                                   "or its training DataLoader offloaded to Ray",
                       usage="gpufeed run [--config FILE] [--offload ray [--ray-address ADDR]] -- CMD [ARGS...]")
    p.add_argument("--config", type=_path, metavar="FILE", help="settings file written by gpufeed tune")
    add_offload_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")

    p = sub.add_parser("what-if", help="predict samples/s for other workers, cores or a faster GPU, from a run's record")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--workers", type=_non_negative_int, metavar="N", help="num_workers (default: the run's)")
    p.add_argument("--cores", type=_positive_number, metavar="C", help="cores the job may use (default: the run's)")
    p.add_argument("--gpu-speedup", type=_positive_number, default=1.0, metavar="X",
                   help="the training step X times faster (a faster GPU); default 1")
    p.add_argument("--persistent", action=argparse.BooleanOptionalAction, default=None,
                   help="persistent_workers (default: the run's)")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the answer as JSON to FILE")

    p = sub.add_parser("report", help="write a self-contained HTML report of a run, tune or batch-size directory")
    p.add_argument("run_dir", type=_path, nargs="+",
                   help="a run, tune or batch-size directory; several run directories: one per node of a job, merged")
    p.add_argument("-o", "--out", type=_path, metavar="FILE", help="the HTML file (default RUN_DIR/report.html)")

    p = sub.add_parser("trace", help="write a run as a Chrome trace for Perfetto or chrome://tracing")
    p.add_argument("run_dir", type=_path)
    p.add_argument("-o", "--out", type=_path, metavar="FILE", help="the JSON file (default RUN_DIR/trace.json)")

    p = sub.add_parser("watch", help="live dashboard: GPUs, cores, memory and a running gpufeed diagnose")
    p.add_argument("run_dir", type=_path, nargs="?",
                   help="a running run directory (default: the newest running one under ./gpufeed-runs)")
    p.add_argument("--interval", type=_positive_float, default=1.0, metavar="SECONDS",
                   help="refresh interval (default 1)")

    p = sub.add_parser("demo", help="diagnose a bundled, input-bound training script (under a minute on CPU)")
    _add_run_options(p)
    return parser


def _error(message: str) -> None:
    """One clear sentence on standard error (standard output stays the diagnosis)."""
    Console(stderr=True).print(f"gpufeed: {message}", style="bold red", highlight=False, soft_wrap=True)


def _console() -> Console:
    """Standard output. To a file or a pipe, lines are as wide as their content (rich would cut
    them at 80 columns); COLUMNS, where set, still rules."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=100_000)


# -- output paths, checked before anything runs ------------------------------------------------------
def _creatable(path: Path, option: str) -> str | None:
    """Why ``path`` cannot be created, or None: its nearest existing ancestor must be a writable directory."""
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot write {option} {path}: {ancestor} is a file, not a directory."
    why = _unwritable(ancestor)
    return why and f"cannot write {option} {path}: {ancestor} is not writable ({why})."


def _unwritable(directory: Path) -> str | None:
    """Why no file can be created in ``directory`` (tried for real: root passes every access check)."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return None
    except OSError as error:
        return error.strerror or str(error)


def file_problem(path: Path, option: str) -> str | None:
    """Why an output file cannot be written, or None."""
    if path.is_dir():
        return f"cannot write {option} {path}: it is a directory; give a file name."
    if path.exists():
        return None if os.access(path, os.W_OK) else f"cannot write {option} {path}: it is not writable."
    return _creatable(path, option)


def dir_problem(path: Path, option: str, result_file: str | None = None, what: str = "") -> str | None:
    """Why an output directory cannot be used, or None: it must be new or empty (``result_file``
    there: it already holds a result, said as such), and writable. ``result_file`` None: a log
    directory, which may hold files already."""
    if path.exists() and not path.is_dir():
        return f"cannot use {option} {path}: it is a file; give a directory."
    if not path.is_dir():
        return _creatable(path, option)
    if result_file is not None:
        if (path / result_file).exists():
            return f"{path} already holds a {what}: choose another {option}, or remove it first."
        if any(path.iterdir()):
            return f"cannot use {option} {path}: it is not empty and holds no {what}; give a new or empty directory."
    why = _unwritable(path)
    return why and f"cannot write {option} {path}: it is not writable ({why})."


def _output_files_problem(args: argparse.Namespace) -> str | None:
    """The output files and log directories given: each must be writable (before anything runs)."""
    checks = [(getattr(args, "json", None), "--json"),
              (getattr(args, "report", None) if isinstance(getattr(args, "report", None), Path) else None, "--report")]
    if args.verb in ("report", "trace"):
        checks.append((args.out, "-o"))
    for path, option in checks:
        problem = path is not None and file_problem(path, option)
        if problem:
            return problem
    log_dir = getattr(args, "tensorboard", None)
    return log_dir is not None and dir_problem(log_dir, "--tensorboard") or None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = _console()
    if args.verb is None:
        parser.print_help()
        return EXIT_USAGE
    problem = _output_files_problem(args)
    if problem:
        _error(problem)
        return EXIT_USAGE
    try:
        if args.verb == "analyze":
            return _analyze(args, console)
        if args.verb == "report":
            return _report(args, console)
        if args.verb == "what-if":
            return _what_if(args, console)
        if args.verb == "trace":
            return _trace(args, console)
        if args.verb == "watch":
            return _watch(args)
        if args.verb == "demo":
            return _diagnose([sys.executable, str(DEMO_SCRIPT)], args, console)
        command = list(args.command)
        if command and command[0] == "--":
            command = command[1:]
        if args.verb == "tune":
            return _tune(command, args, console)
        if args.verb == "batch-size":
            return _batch_size(command, args, console)
        if args.verb == "run":
            return _run(command, args)
        return _diagnose(command, args, console)
    except KeyboardInterrupt:
        _error("interrupted.")
        return EXIT_INTERRUPTED


def _diagnose(command: list[str], args: argparse.Namespace, console: Console) -> int:
    from gpufeed.measure.runner import RunOptions, StopSignals, default_run_dir
    from gpufeed.record import schema

    if not command:
        _error("give the training command after --, e.g. gpufeed diagnose -- python train.py")
        return EXIT_USAGE
    out = args.out or default_run_dir(command)
    problem = dir_problem(out, "--out", schema.META_FILE, "gpufeed run")
    if problem:
        _error(problem)
        return EXIT_USAGE
    try:
        offload = offload_settings(args)
    except ValueError as error:
        return _offload_refused(error)
    options = RunOptions(command=command, out=out, steps=args.steps, warmup_steps=args.warmup,
                         stall_timeout_s=args.stall_timeout, interval_s=args.interval, grace_s=args.grace,
                         first_batch_timeout_s=args.first_batch_timeout,
                         extra_env=offload.to_env() if offload else {})
    # Ctrl-C and SIGTERM, however often, stop the run but never cut its record or diagnosis short.
    with StopSignals():
        return _run_and_diagnose(options, args, console)


def _run_and_diagnose(options, args: argparse.Namespace, console: Console) -> int:
    from gpufeed.analysis import analyze
    from gpufeed.measure.runner import CommandNotStarted, RunDirInUse, run_command
    from gpufeed.present.terminal import render

    exporter = None
    if getattr(args, "prometheus", None):
        exporter = _start_exporter(options.out, args.prometheus, args.prometheus_addr, console)
        if exporter is None:
            return EXIT_USAGE
    try:
        result = run_command(options)
    except CommandNotStarted as error:
        _error(str(error))
        return EXIT_NOT_STARTED
    except RunDirInUse as error:
        _error(str(error))
        return EXIT_USAGE
    finally:
        if exporter is not None:
            exporter.shutdown()
    try:
        diagnosis = analyze(result.run_dir)
    except Exception as error:  # a bug in the analysis must not hide that the record is safe
        _error(f"the analysis failed ({type(error).__name__}: {error}); the run record is kept in "
               f"{result.run_dir}.")
        return EXIT_INTERNAL
    render(diagnosis, console)
    _write_json(diagnosis, args.json, console)
    _write_report(result.run_dir, args.report, console)
    _write_tensorboard(result.run_dir, getattr(args, "tensorboard", None), console)
    if result.meta.stop_signal == "SIGTERM":
        return EXIT_TERMINATED
    return EXIT_FOR_END.get(result.meta.end_reason or "", EXIT_COMMAND_FAILED)


def _add_report_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report", type=_path, nargs="?", const=True, metavar="FILE",
                   help="also write the HTML report (default DIR/report.html)")


def _write_report(directory: Path, report: Path | bool | None, console: Console) -> None:
    """``--report``: the HTML report of a run, tune or batch-size directory, after the terminal output."""
    if not report:
        return
    from gpufeed.present.report import DEFAULT_NAME, write_report

    try:
        out = write_report(directory, directory / DEFAULT_NAME if report is True else report)
        console.print(f"Report written to {out}", style="dim")
    except OSError as error:  # what was printed above stands; only the file is missing
        _error(f"cannot write the report {error.filename}: {error.strerror}.")


def _tune(command: list[str], args: argparse.Namespace, console: Console) -> int:
    from gpufeed.present.tune_view import TrialProgress, render_tune
    from gpufeed.tune import BaselineFailed, NoDataLoader, TuneOptions, tune_command
    from gpufeed.tune.command import TUNE_FILE, NotTunable

    out = _result_dir(args.out, "tune", command, TUNE_FILE)
    if out is None:
        return EXIT_USAGE
    options = TuneOptions(command=command, out=out, budget_s=args.budget, seconds=args.trial_seconds,
                          warmup_steps=args.warmup, max_workers=args.max_workers,
                          stall_timeout_s=args.stall_timeout)
    console.print(f"Tuning the training DataLoader of: {' '.join(command)}", highlight=False)
    try:
        with TrialProgress(console, args.trial_seconds, args.warmup) as progress:
            result = tune_command(options, on_trial=progress.finished, on_start=progress.started)
    except (NoDataLoader, NotTunable) as error:
        _error(str(error))
        return EXIT_NOTHING_TO_TUNE
    except BaselineFailed as error:
        _error(str(error))
        return EXIT_COMMAND_FAILED
    render_tune(result, console, out)
    _copy_result(out / TUNE_FILE, args.json, console)
    _write_report(out, args.report, console)
    return EXIT_INTERRUPTED if result.stopped == "interrupted" else EXIT_OK


def _batch_size(command: list[str], args: argparse.Namespace, console: Console) -> int:
    from gpufeed.batchsize import (RESULT_FILE, BatchSizeOptions, NoTrainingLoader, NothingFits, NotOverridable,
                                   YourBatchFailed, find_batch_size)
    from gpufeed.measure.runner import CommandNotStarted, RunDirInUse
    from gpufeed.present.batch_size_view import TrialLines, render_batch_size

    out = _result_dir(args.out, "batch-size", command, RESULT_FILE)
    if out is None:
        return EXIT_USAGE
    options = BatchSizeOptions(command=command, out=out, memory_budget_b=args.memory_budget,
                               target_share=args.target, seconds=args.trial_seconds, warmup_steps=args.warmup,
                               max_trials=args.max_trials)
    console.print(f"Searching the largest batch size of: {' '.join(command)}", highlight=False)
    lines = TrialLines(console)
    try:
        result = find_batch_size(options, on_trial=lines.finished, on_start=lines.started)
    except CommandNotStarted as error:
        _error(str(error))
        return EXIT_NOT_STARTED
    except RunDirInUse as error:
        _error(f"{out} holds trials of an earlier search: choose another --out, or remove it first ({error})")
        return EXIT_USAGE
    except NoTrainingLoader as error:
        _error(str(error))
        return EXIT_NOTHING_TO_TUNE
    except (NotOverridable, NothingFits) as error:
        _error(f"{str(error).rstrip('.')} (trials: {out}).")
        return EXIT_NO_BATCH_SIZE
    except YourBatchFailed as error:
        _error(f"{str(error).rstrip('.')} (trials: {out}).")
        return EXIT_COMMAND_FAILED
    render_batch_size(result, console, out)
    _copy_result(out / RESULT_FILE, args.json, console)
    _write_report(out, args.report, console)
    return EXIT_INTERRUPTED if result.stopped == "interrupted" else EXIT_OK


def _result_dir(out: Path | None, verb: str, command: list[str], result_file: str) -> Path | None:
    """``--out``, or a new ``./gpufeed-runs/<timestamp>-<verb>-<name>/``; None (said why) without a
    command or when the directory already holds a result."""
    from gpufeed.measure.runner import default_run_dir
    if not command:
        _error(f"give the training command after --, e.g. gpufeed {verb} -- python train.py")
        return None
    out = out or default_run_dir([f"{verb}-{_command_name(command)}"])
    problem = dir_problem(out, "--out", result_file, f"{verb} result")
    if problem:
        _error(problem)
        return None
    return out


def _copy_result(result: Path, path: Path | None, console: Console) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(result.read_text())
    except OSError as error:  # checked before the run; the directory may have changed since
        _error(f"cannot write {path}: {error.strerror}.")
        return
    console.print(f"Result written to {path}", style="dim")


def _command_name(command: list[str]) -> str:
    from gpufeed.measure.runner import command_name
    return command_name(command)


def _run(command: list[str], args: argparse.Namespace) -> int:
    """Replace this process with the command, the settings file's DataLoader keywords applied."""
    import os

    from gpufeed.measure.inside import overrides
    from gpufeed.measure.runner import bootstrap_env

    if not command:
        _error("give the training command after --, e.g. gpufeed run --config best-config.json -- python train.py")
        return EXIT_USAGE
    try:
        offload = offload_settings(args)
    except ValueError as error:
        return _offload_refused(error)
    if args.config is None and offload is None:
        _error("give --config FILE (gpufeed tune's best-config.json), --offload ray, or both.")
        return EXIT_USAGE
    env = dict(os.environ, **(offload.to_env() if offload else {}))
    if args.config is not None:
        try:
            config = overrides.Overrides.from_json(args.config.read_text(), str(args.config))
        except OSError as error:
            _error(f"cannot read {args.config}: {error.strerror}.")
            return EXIT_USAGE
        except ValueError as error:
            _error(f"{error}.")
            return EXIT_USAGE
        env[overrides.ENV_OVERRIDES] = config.to_json()
        _error_free_note(f"applying {config.settings.label()} to {config.target()} (said again when it is "
                         "applied, or at the end when no DataLoader matched)")
    env = bootstrap_env(env)
    try:
        os.execvpe(command[0], command, env)
    except OSError as error:
        _error(f"could not start {command[0]!r}: {error.strerror}.")
        return EXIT_NOT_STARTED
    return EXIT_INTERNAL  # pragma: no cover (exec does not return)


def _offload_refused(error: ValueError) -> int:
    from rich.markup import escape

    from gpufeed.offload.options import Unavailable
    _error(escape(f"{error}."))  # "gpufeed[ray]" is no markup
    return EXIT_NOT_STARTED if isinstance(error, Unavailable) else EXIT_USAGE


def _error_free_note(message: str) -> None:
    Console(stderr=True).print(f"gpufeed: {message}", style="dim", highlight=False, soft_wrap=True)


def _analyze(args: argparse.Namespace, console: Console) -> int:
    from gpufeed.analysis import analyze_record
    from gpufeed.present.terminal import render
    from gpufeed.record.merge import load_runs
    from gpufeed.record.reader import RecordError

    try:
        record = load_runs(args.run_dir)
    except RecordError as error:
        _error(_trials_hint(args.run_dir) or str(error))
        return EXIT_BAD_RECORD
    diagnosis = analyze_record(record)
    render(diagnosis, console)
    _write_json(diagnosis, args.json, console)
    _write_tensorboard(record, args.tensorboard, console)
    return EXIT_OK


def _what_if(args: argparse.Namespace, console: Console) -> int:
    from gpufeed.analysis.whatif import answer_run
    from gpufeed.present.whatif_view import render_what_if
    from gpufeed.record.reader import RecordError

    try:
        result = answer_run(args.run_dir, workers=args.workers, cores=args.cores, gpu_speedup=args.gpu_speedup,
                            persistent=args.persistent)
    except RecordError as error:
        _error(str(error))
        return EXIT_BAD_RECORD
    render_what_if(result, console)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return EXIT_OK


def _trials_hint(dirs: list[Path]) -> str | None:
    """A tune or batch-size directory given to analyze: its runs are its trials."""
    for d in dirs:
        trials = d / "trials"
        if trials.is_dir() and not (d / "meta.json").exists():
            example = next((p for p in sorted(trials.iterdir()) if (p / "meta.json").exists()), trials / "NAME")
            return (f"{d} is a tune or batch-size directory, not a run: analyze one of its trials, e.g. "
                    f"gpufeed analyze {example} (or see them all: gpufeed report {d}).")
    return None


def _report(args: argparse.Namespace, console: Console) -> int:
    from gpufeed.present.report import DEFAULT_NAME, build_report
    from gpufeed.record.reader import RecordError

    first = args.run_dir[0]
    try:
        report = build_report(*args.run_dir)
    except RecordError as error:
        _error(str(error))
        return EXIT_BAD_RECORD
    for problem in report.problems:
        _error(problem)
    if not report.readable and args.out is None:
        return EXIT_BAD_RECORD  # nothing to show: leave a directory that may not be ours untouched
    try:
        out = report.write(args.out or first / DEFAULT_NAME)
    except OSError as error:
        _error(f"cannot write {error.filename}: {error.strerror}.")
        return EXIT_USAGE
    console.print(f"Report written to {out}")
    return EXIT_OK if report.readable else EXIT_BAD_RECORD


def _trace(args: argparse.Namespace, console: Console) -> int:
    from gpufeed.present.trace import DEFAULT_NAME, write_trace
    from gpufeed.record.reader import RecordError

    try:
        out = write_trace(args.run_dir, args.out or args.run_dir / DEFAULT_NAME)
    except RecordError as error:
        _error(str(error))
        return EXIT_BAD_RECORD
    except OSError as error:
        _error(f"cannot write {error.filename}: {error.strerror}.")
        return EXIT_USAGE
    console.print(f"Trace written to {out}: open it in https://ui.perfetto.dev or chrome://tracing")
    return EXIT_OK


def _watch(args: argparse.Namespace) -> int:
    from gpufeed.present.watch import watch
    from gpufeed.record.reader import RecordError

    try:
        watch(args.run_dir, interval_s=args.interval)
    except RecordError as error:
        _error(str(error))
        return EXIT_BAD_RECORD
    return EXIT_OK


def _start_exporter(run_dir: Path, port: int, addr: str, console: Console):
    """The Prometheus exporter, serving before the command starts; None (said why) if it cannot."""
    try:
        from gpufeed.integrations.prometheus import serve
        server = serve(run_dir, port, addr)
    except ImportError:
        _error("--prometheus needs the prometheus_client package: pip install 'gpufeed[prometheus]'.")
        return None
    except OSError as error:
        import errno
        import socket
        if isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL:
            _error(f"--prometheus-addr {addr!r} is not a valid address of this host ({error.strerror or error}): "
                   "give one of its IP addresses, or 0.0.0.0 for all.")
        else:
            _error(f"cannot serve Prometheus metrics on {addr}:{port} ({error.strerror or error}); choose another "
                   "--prometheus port.")
        return None
    console.print(f"Prometheus metrics on http://{addr}:{port}/metrics", style="dim")
    return server


def _write_tensorboard(record_or_dir, log_dir: Path | None, console: Console) -> None:
    if log_dir is None:
        return
    from gpufeed.record.reader import RunRecord, load_run
    try:
        from gpufeed.integrations.tensorboard import write_scalars
        record = record_or_dir if isinstance(record_or_dir, RunRecord) else load_run(record_or_dir)
        n = write_scalars(record, log_dir)
    except ImportError:
        _error("--tensorboard needs the tensorboard package: pip install 'gpufeed[tensorboard]'.")
        return
    console.print(f"{n} TensorBoard scalars written to {log_dir}", style="dim")


def _write_json(diagnosis, path: Path | None, console: Console) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(diagnosis.to_dict(), indent=2) + "\n")
    except OSError as error:  # checked before the run; the directory may have changed since
        _error(f"cannot write {path}: {error.strerror}.")
        return
    console.print(f"Diagnosis written to {path}", style="dim")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
