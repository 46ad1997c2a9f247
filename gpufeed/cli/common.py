"""What every subcommand shares: exit codes, messages, and the output paths checked before anything runs.

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
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterable

from rich.console import Console, RenderableType

from gpufeed.record import schema

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_NOT_STARTED = 0, 1, 2, 3
EXIT_COMMAND_FAILED, EXIT_STALLED, EXIT_BAD_RECORD, EXIT_INTERRUPTED = 4, 5, 6, 130
EXIT_NOTHING_TO_TUNE = 7
EXIT_NO_BATCH_SIZE = 8
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process ended by SIGTERM

EXIT_FOR_END = {schema.END_COMPLETED: EXIT_OK, schema.END_STEPS_REACHED: EXIT_OK, schema.END_FAILED: EXIT_COMMAND_FAILED,
                schema.END_STALLED: EXIT_STALLED, schema.END_INTERRUPTED: EXIT_INTERRUPTED}


def say_error(message: str) -> None:
    """One clear sentence on standard error (standard output stays the diagnosis)."""
    Console(stderr=True).print(f"gpufeed: {message}", style="bold red", highlight=False, soft_wrap=True)


def print_all(console: Console, renderables: Iterable[RenderableType]) -> None:
    """A presenter's view (``present/``: a list of renderables), printed one after another."""
    for part in renderables:
        console.print(part)


def stdout_console() -> Console:
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


def output_files_problem(args: argparse.Namespace) -> str | None:
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


def write_report_option(directory: Path, report: Path | bool | None, console: Console) -> None:
    """``--report``: the HTML report of a run, tune or batch-size directory, after the terminal output."""
    if not report:
        return
    from gpufeed.present.report import DEFAULT_NAME, write_report

    try:
        out = write_report(directory, directory / DEFAULT_NAME if report is True else report)
        console.print(f"Report written to {out}", style="dim")
    except OSError as error:  # what was printed above stands; only the file is missing
        say_error(f"cannot write the report {error.filename}: {error.strerror}.")


def say_note(message: str) -> None:
    Console(stderr=True).print(f"gpufeed: {message}", style="dim", highlight=False, soft_wrap=True)


def write_tensorboard(record_or_dir, log_dir: Path | None, console: Console) -> None:
    if log_dir is None:
        return
    from gpufeed.record.reader import RunRecord, load_run
    try:
        from gpufeed.integrations.tensorboard import write_scalars
        record = record_or_dir if isinstance(record_or_dir, RunRecord) else load_run(record_or_dir)
        n = write_scalars(record, log_dir)
    except ImportError:
        say_error("--tensorboard needs the tensorboard package: pip install 'gpufeed[tensorboard]'.")
        return
    console.print(f"{n} TensorBoard scalars written to {log_dir}", style="dim")


def write_json(diagnosis, path: Path | None, console: Console) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(diagnosis.to_dict(), indent=2) + "\n")
    except OSError as error:  # checked before the run; the directory may have changed since
        say_error(f"cannot write {path}: {error.strerror}.")
        return
    console.print(f"Diagnosis written to {path}", style="dim")
