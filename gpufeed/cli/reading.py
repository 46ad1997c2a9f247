"""The subcommands that read records: ``analyze``, ``what-if``, ``report``, ``trace``, ``watch``."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from gpufeed.cli.common import (EXIT_BAD_RECORD, EXIT_OK, EXIT_USAGE, print_all, say_error, write_json,
                                write_tensorboard)
from gpufeed.record.layout import TRIALS_DIR

def analyze(args: argparse.Namespace, console: Console) -> int:
    from gpufeed.analysis import analyze_record
    from gpufeed.present.terminal import diagnosis_view
    from gpufeed.record.merge import load_runs
    from gpufeed.record.reader import RecordError

    try:
        record = load_runs(args.run_dir)
    except RecordError as error:
        say_error(_trials_hint(args.run_dir) or str(error))
        return EXIT_BAD_RECORD
    diagnosis = analyze_record(record)
    print_all(console, diagnosis_view(diagnosis))
    write_json(diagnosis, args.json, console)
    write_tensorboard(record, args.tensorboard, console)
    return EXIT_OK


def what_if(args: argparse.Namespace, console: Console) -> int:
    from gpufeed.analysis.whatif import answer_run
    from gpufeed.present.whatif_view import what_if_view
    from gpufeed.record.reader import RecordError

    try:
        result = answer_run(args.run_dir, workers=args.workers, cores=args.cores, gpu_speedup=args.gpu_speedup,
                            persistent=args.persistent, cpu_speedup=args.cpu_speedup)
    except RecordError as error:
        say_error(str(error))
        return EXIT_BAD_RECORD
    print_all(console, what_if_view(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return EXIT_OK


def _trials_hint(dirs: list[Path]) -> str | None:
    """A tune or batch-size directory given to analyze: its runs are its trials."""
    for d in dirs:
        trials = d / TRIALS_DIR
        if trials.is_dir() and not (d / "meta.json").exists():
            example = next((p for p in sorted(trials.iterdir()) if (p / "meta.json").exists()), trials / "NAME")
            return (f"{d} is a tune or batch-size directory, not a run: analyze one of its trials, e.g. "
                    f"gpufeed analyze {example} (or see them all: gpufeed report {d}).")
    return None


def report(args: argparse.Namespace, console: Console) -> int:
    from gpufeed.present.report import DEFAULT_NAME, build_report
    from gpufeed.record.reader import RecordError

    first = args.run_dir[0]
    try:
        report = build_report(*args.run_dir)
    except RecordError as error:
        say_error(str(error))
        return EXIT_BAD_RECORD
    for problem in report.problems:
        say_error(problem)
    if not report.readable and args.out is None:
        return EXIT_BAD_RECORD  # nothing to show: leave a directory that may not be ours untouched
    try:
        out = report.write(args.out or first / DEFAULT_NAME)
    except OSError as error:
        say_error(f"cannot write {error.filename}: {error.strerror}.")
        return EXIT_USAGE
    console.print(f"Report written to {out}")
    return EXIT_OK if report.readable else EXIT_BAD_RECORD


def trace(args: argparse.Namespace, console: Console) -> int:
    from gpufeed.present.trace import DEFAULT_NAME, write_trace
    from gpufeed.record.reader import RecordError

    try:
        out = write_trace(args.run_dir, args.out or args.run_dir / DEFAULT_NAME)
    except RecordError as error:
        say_error(str(error))
        return EXIT_BAD_RECORD
    except OSError as error:
        say_error(f"cannot write {error.filename}: {error.strerror}.")
        return EXIT_USAGE
    console.print(f"Trace written to {out}: open it in https://ui.perfetto.dev or chrome://tracing")
    return EXIT_OK


def watch(args: argparse.Namespace) -> int:
    from gpufeed.present.watch import watch
    from gpufeed.record.reader import RecordError

    try:
        watch(args.run_dir, interval_s=args.interval)
    except RecordError as error:
        say_error(str(error))
        return EXIT_BAD_RECORD
    return EXIT_OK
