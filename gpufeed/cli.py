"""The ``gpufeed`` command line: ``diagnose``, ``analyze`` and ``demo``.

Exit codes (also in the README):
  0  diagnosed (the command finished, or was stopped after --steps)
  1  gpufeed itself failed (a bug: please report it with the run directory)
  2  bad usage (an unknown flag, a missing command)
  3  the command could not be started
  4  the command failed (non-zero exit or killed); the diagnosis covers what was measured
  5  the DataLoader stalled (no batch for --stall-timeout seconds)
  6  the run directory given to analyze cannot be read
  130 interrupted by Ctrl-C; the partial record is kept and diagnosed
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from rich.console import Console

from gpufeed import thresholds as th
from gpufeed._version import __version__

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_NOT_STARTED = 0, 1, 2, 3
EXIT_COMMAND_FAILED, EXIT_STALLED, EXIT_BAD_RECORD, EXIT_INTERRUPTED = 4, 5, 6, 130

EXIT_FOR_END = {"completed": EXIT_OK, "steps_reached": EXIT_OK, "failed": EXIT_COMMAND_FAILED,
                "stalled": EXIT_STALLED, "interrupted": EXIT_INTERRUPTED}

DEMO_SCRIPT = Path(__file__).with_name("demo") / "train.py"


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=_positive_int, metavar="N",
                   help="measure N steps after the warm-up, then end the command cleanly (default: run to its end)")
    p.add_argument("--warmup", type=_non_negative_int, default=th.DEFAULT_WARMUP_STEPS, metavar="N",
                   help=f"steps left out of the measurement at the start (default {th.DEFAULT_WARMUP_STEPS})")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="run directory to write (default ./gpufeed-runs/<timestamp>-<name>/)")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the diagnosis as JSON to FILE")
    p.add_argument("--stall-timeout", type=_positive_float, default=60.0, metavar="SECONDS",
                   help="report a stuck loader after this long without a batch (default 60)")
    p.add_argument("--interval", type=_positive_float, default=0.1, metavar="SECONDS",
                   help="sampling interval for CPU, memory and GPU (default 0.1, i.e. 10 Hz)")
    _add_tensorboard_option(p)
    p.add_argument("--prometheus", type=_port, metavar="PORT",
                   help="serve the run's data-wait share, samples/s and GPU util per rank for Prometheus "
                        "on this port while it runs (needs prometheus_client)")
    p.add_argument("--prometheus-addr", default="127.0.0.1", metavar="ADDR",
                   help="address the Prometheus exporter binds to (default 127.0.0.1, this host only)")


def _add_tensorboard_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensorboard", type=Path, metavar="LOG_DIR",
                   help="also write data-wait share, samples/s and GPU util as TensorBoard scalars to LOG_DIR")


def _port(text: str) -> int:
    value = int(text)
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
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")

    p = sub.add_parser("analyze", help="diagnose a run directory again, from its record alone; several "
                                         "directories (one per node of a job) are merged into one diagnosis")
    p.add_argument("run_dir", type=Path, nargs="+",
                   help="a run directory; several: one per node of a job, merged into one diagnosis")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the diagnosis as JSON to FILE")
    _add_tensorboard_option(p)

    p = sub.add_parser("demo", help="diagnose a bundled, input-bound training script (under a minute on CPU)")
    _add_run_options(p)
    return parser


def _error(message: str) -> None:
    """One clear sentence on standard error (standard output stays the diagnosis)."""
    Console(stderr=True).print(f"gpufeed: {message}", style="bold red", highlight=False, soft_wrap=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    if args.verb is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if args.verb == "analyze":
            return _analyze(args, console)
        if args.verb == "demo":
            return _diagnose([sys.executable, str(DEMO_SCRIPT)], args, console)
        command = list(args.command)
        if command and command[0] == "--":
            command = command[1:]
        return _diagnose(command, args, console)
    except KeyboardInterrupt:
        _error("interrupted.")
        return EXIT_INTERRUPTED


def _diagnose(command: list[str], args: argparse.Namespace, console: Console) -> int:
    from gpufeed.analysis import analyze
    from gpufeed.measure.runner import CommandNotStarted, RunDirInUse, RunOptions, default_run_dir, run_command
    from gpufeed.present.terminal import render

    if not command:
        _error("give the training command after --, e.g. gpufeed diagnose -- python train.py")
        return EXIT_USAGE
    options = RunOptions(command=command, out=args.out or default_run_dir(command), steps=args.steps,
                         warmup_steps=args.warmup, stall_timeout_s=args.stall_timeout, interval_s=args.interval)
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
    _write_tensorboard(result.run_dir, getattr(args, "tensorboard", None), console)
    return EXIT_FOR_END.get(result.meta.end_reason or "", EXIT_COMMAND_FAILED)


def _analyze(args: argparse.Namespace, console: Console) -> int:
    from gpufeed.analysis import analyze_record
    from gpufeed.present.terminal import render
    from gpufeed.record.merge import load_runs
    from gpufeed.record.reader import RecordError

    try:
        record = load_runs(args.run_dir)
    except RecordError as error:
        _error(str(error))
        return EXIT_BAD_RECORD
    diagnosis = analyze_record(record)
    render(diagnosis, console)
    _write_json(diagnosis, args.json, console)
    _write_tensorboard(record, args.tensorboard, console)
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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(diagnosis.to_dict(), indent=2) + "\n")
    console.print(f"Diagnosis written to {path}", style="dim")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
