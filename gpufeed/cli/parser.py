"""The command line's parser: every subcommand, flag and default (``gpufeed --help``)."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from gpufeed import defaults
from gpufeed import thresholds as th
from gpufeed._version import __version__
from gpufeed.cli import common
from gpufeed.offload.options import add_options as add_offload_options

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
    p.add_argument("--stall-timeout", type=_positive_float, default=defaults.STALL_TIMEOUT_S, metavar="SECONDS",
                   help=f"report a stuck loader after this long without a batch (default {defaults.STALL_TIMEOUT_S:g})")
    p.add_argument("--first-batch-timeout", type=_positive_float, default=th.FIRST_BATCH_TIMEOUT_S,
                   metavar="SECONDS",
                   help="the stall limit for each iterator's first batch, which waits for worker start-up "
                        f"or a filling shuffle buffer (default {th.FIRST_BATCH_TIMEOUT_S:g})")
    p.add_argument("--grace", type=_positive_float, default=th.STOP_GRACE_S, metavar="SECONDS",
                   help="time the command gets to end by itself (its own SIGINT/SIGTERM handler, a checkpoint "
                        "save) after Ctrl-C, a SIGTERM to gpufeed or a stall, before it is killed "
                        f"(default {th.STOP_GRACE_S:g})")
    p.add_argument("--interval", type=_positive_float, default=defaults.SAMPLE_INTERVAL_S, metavar="SECONDS",
                   help=f"sampling interval for CPU, memory and GPU (default {defaults.SAMPLE_INTERVAL_S:g}, "
                        f"i.e. {1 / defaults.SAMPLE_INTERVAL_S:g} Hz)")
    add_report_option(p)
    _add_tensorboard_option(p)
    p.add_argument("--prometheus", type=_port, metavar="PORT",
                   help="serve the run's data-wait share, samples/s and GPU util per rank for Prometheus "
                        "on this port while it runs (needs prometheus_client)")
    p.add_argument("--prometheus-addr", default="127.0.0.1", metavar="ADDR",
                   help="address the Prometheus exporter binds to (default 127.0.0.1, this host only)")


def _add_tensorboard_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensorboard", type=_path, metavar="LOG_DIR",
                   help="also write data-wait share, samples/s and GPU util as TensorBoard scalars to LOG_DIR")


def _add_autotune_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--autotune", action="store_true",
                   help="tune the training DataLoader's settings while the command trains, every sample "
                        "delivered exactly once (docs/autotune.md)")


def _add_reorder_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-reorder", action="store_true",
                   help="let the search try in_order=False (torch >= 2.6) where in-order delivery costs time: "
                        "batches then arrive in a different order than the sampler's (each epoch's samples "
                        "unchanged) and runs are no longer bit-for-bit reproducible")


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

    exit_codes = "exit codes:\n" + common.__doc__.split("Exit codes (also in the README):\n", 1)[1].strip("\n")
    p = sub.add_parser("diagnose", help="run a training command unmodified and say what holds the GPU back",
                       usage="gpufeed diagnose [options] -- CMD [ARGS...]", epilog=exit_codes,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_options(p)
    _add_autotune_option(p)
    add_offload_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")

    p = sub.add_parser("analyze", help="diagnose a run directory again, from its record alone; several "
                                         "directories (one per node of a job) are merged into one diagnosis")
    p.add_argument("run_dir", type=_path, nargs="+",
                   help="a run directory; several: one per node of a job, merged into one diagnosis")
    p.add_argument("--json", type=_path, metavar="FILE", help="also write the diagnosis as JSON to FILE")
    _add_tensorboard_option(p)

    p = sub.add_parser("tune", help="find the fastest DataLoader (or tf.data) settings for a command, by short trials",
                       usage="gpufeed tune [options] -- CMD [ARGS...]", epilog=exit_codes,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=_positive_float, metavar="SECONDS",
                   help="stop starting trials after this long (default: search until done)")
    p.add_argument("--trial-seconds", type=_positive_float, default=th.TUNE_TRIAL_SECONDS, metavar="SECONDS",
                   help=f"measured time per trial, after the warm-up (default {th.TUNE_TRIAL_SECONDS:g})")
    p.add_argument("--warmup", type=_non_negative_int, default=th.DEFAULT_WARMUP_STEPS, metavar="N",
                   help=f"steps left out of each trial's measurement (default {th.DEFAULT_WARMUP_STEPS})")
    p.add_argument("--max-workers", type=_positive_int, metavar="N",
                   help=f"largest num_workers (tf.data: num_parallel_calls) to try (default "
                        f"{th.TUNE_MAX_WORKERS_PER_CORE} per core)")
    p.add_argument("--stall-timeout", type=_positive_float, default=th.TUNE_STALL_TIMEOUT_S, metavar="SECONDS",
                   help=f"a trial with no batch for this long is stopped as hung (default {th.TUNE_STALL_TIMEOUT_S:g})")
    p.add_argument("--out", type=_path, metavar="DIR",
                   help="tune directory: trials, tune.json, best-config.json (default ./gpufeed-runs/<timestamp>-tune-<name>/)")
    p.add_argument("--json", type=_path, metavar="FILE", help="also write the result (tune.json) to FILE")
    _add_reorder_option(p)
    add_report_option(p)
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
    add_report_option(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")

    p = sub.add_parser("run", help="run a command with DataLoader or tf.data settings from a file (gpufeed tune's "
                                   "best-config.json), "
                                   "tuned while it trains (--autotune), or its training DataLoader offloaded to Ray",
                       usage="gpufeed run [--config FILE] [--autotune] [--offload ray [--ray-address ADDR]] -- CMD [ARGS...]")
    p.add_argument("--config", type=_path, metavar="FILE", help="settings file written by gpufeed tune")
    _add_autotune_option(p)
    _add_reorder_option(p)  # with --autotune
    add_offload_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")

    p = sub.add_parser("what-if", help="predict samples/s for other workers, cores or a faster GPU, from a run's record")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--workers", type=_non_negative_int, metavar="N", help="num_workers (default: the run's)")
    p.add_argument("--cores", type=_positive_number, metavar="C", help="cores the job may use (default: the run's)")
    p.add_argument("--gpu-speedup", type=_positive_number, default=1.0, metavar="X",
                   help="the training step X times faster (a faster GPU); default 1")
    p.add_argument("--cpu-speedup", type=_positive_number, default=1.0, metavar="X",
                   help="every CPU second X times shorter (a faster host CPU); default 1")
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


def add_report_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report", type=_path, nargs="?", const=True, metavar="FILE",
                   help="also write the HTML report (default DIR/report.html)")
