"""The subcommands that run the training command: ``diagnose`` (and ``demo``), ``tune``, ``batch-size``, ``run``."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from rich.console import Console

from gpufeed.cli.common import (EXIT_COMMAND_FAILED, EXIT_FOR_END, EXIT_INTERNAL, EXIT_INTERRUPTED,
                                EXIT_NO_BATCH_SIZE, EXIT_NOT_STARTED, EXIT_NOTHING_TO_TUNE, EXIT_OK, EXIT_TERMINATED,
                                EXIT_USAGE, dir_problem, print_all, say_error, say_note, write_json,
                                write_report_option, write_tensorboard)
from gpufeed.record import schema
from gpufeed.settings import epoch_order_note

def diagnose(command: list[str], args: argparse.Namespace, console: Console) -> int:
    from gpufeed.measure.processes import StopSignals
    from gpufeed.measure.runner import RunOptions
    from gpufeed.record.layout import default_run_dir

    if not command:
        say_error("give the training command after --, e.g. gpufeed diagnose -- python train.py")
        return EXIT_USAGE
    out = args.out or default_run_dir(command)
    problem = dir_problem(out, "--out", schema.META_FILE, "gpufeed run")
    if problem:
        say_error(problem)
        return EXIT_USAGE
    try:
        extra_env = _loader_env(args)
    except ValueError as error:
        return _offload_refused(error)
    options = RunOptions(command=command, out=out, steps=args.steps, warmup_steps=args.warmup,
                         stall_timeout_s=args.stall_timeout, interval_s=args.interval, grace_s=args.grace,
                         first_batch_timeout_s=args.first_batch_timeout, extra_env=extra_env)
    # Ctrl-C and SIGTERM, however often, stop the run but never cut its record or diagnosis short.
    with StopSignals():
        return _run_and_diagnose(options, args, console)


def _run_and_diagnose(options, args: argparse.Namespace, console: Console) -> int:
    from gpufeed.analysis import analyze
    from gpufeed.measure.runner import CommandNotStarted, RunDirInUse, run_command
    from gpufeed.present.terminal import diagnosis_view

    exporter = None
    if getattr(args, "prometheus", None):
        exporter = _start_exporter(options.out, args.prometheus, args.prometheus_addr, console)
        if exporter is None:
            return EXIT_USAGE
    try:
        result = run_command(options)
    except CommandNotStarted as error:
        say_error(str(error))
        return EXIT_NOT_STARTED
    except RunDirInUse as error:
        say_error(str(error))
        return EXIT_USAGE
    finally:
        if exporter is not None:
            exporter.shutdown()
    try:
        diagnosis = analyze(result.run_dir)
    except Exception as error:  # a bug in the analysis must not hide that the record is safe
        say_error(f"the analysis failed ({type(error).__name__}: {error}); the run record is kept in "
               f"{result.run_dir}.")
        return EXIT_INTERNAL
    print_all(console, diagnosis_view(diagnosis))
    write_json(diagnosis, args.json, console)
    write_report_option(result.run_dir, args.report, console)
    write_tensorboard(result.run_dir, getattr(args, "tensorboard", None), console)
    if result.meta.stop_signal == "SIGTERM":
        return EXIT_TERMINATED
    return EXIT_FOR_END.get(result.meta.end_reason or "", EXIT_COMMAND_FAILED)


def tune(command: list[str], args: argparse.Namespace, console: Console) -> int:
    from gpufeed.present.tune_view import TrialProgress, tune_view
    from gpufeed.tune import BaselineFailed, NoDataLoader, TuneOptions, tune_command
    from gpufeed.tune.command import TUNE_FILE, NotTunable

    out = _result_dir(args.out, "tune", command, TUNE_FILE)
    if out is None:
        return EXIT_USAGE
    options = TuneOptions(command=command, out=out, budget_s=args.budget, seconds=args.trial_seconds,
                          warmup_steps=args.warmup, max_workers=args.max_workers, allow_reorder=args.allow_reorder,
                          stall_timeout_s=args.stall_timeout)
    console.print(f"Tuning the training input pipeline (DataLoader or tf.data) of: {' '.join(command)}",
                  highlight=False)
    try:
        with TrialProgress(console, args.trial_seconds, args.warmup) as progress:
            result = tune_command(options, on_trial=progress.finished, on_start=progress.started)
    except (NoDataLoader, NotTunable) as error:
        say_error(str(error))
        return EXIT_NOTHING_TO_TUNE
    except BaselineFailed as error:
        say_error(str(error))
        return EXIT_COMMAND_FAILED
    print_all(console, tune_view(result, out))
    _copy_result(out / TUNE_FILE, args.json, console)
    write_report_option(out, args.report, console)
    return EXIT_INTERRUPTED if result.stopped == schema.END_INTERRUPTED else EXIT_OK


def batch_size(command: list[str], args: argparse.Namespace, console: Console) -> int:
    from gpufeed.batchsize import (RESULT_FILE, BatchSizeOptions, NoTrainingLoader, NothingFits, NotOverridable,
                                   YourBatchFailed, find_batch_size)
    from gpufeed.measure.runner import CommandNotStarted, RunDirInUse
    from gpufeed.present.batch_size_view import TrialLines, batch_size_view

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
        say_error(str(error))
        return EXIT_NOT_STARTED
    except RunDirInUse as error:
        say_error(f"{out} holds trials of an earlier search: choose another --out, or remove it first ({error})")
        return EXIT_USAGE
    except NoTrainingLoader as error:
        say_error(str(error))
        return EXIT_NOTHING_TO_TUNE
    except (NotOverridable, NothingFits) as error:
        say_error(f"{str(error).rstrip('.')} (trials: {out}).")
        return EXIT_NO_BATCH_SIZE
    except YourBatchFailed as error:
        say_error(f"{str(error).rstrip('.')} (trials: {out}).")
        return EXIT_COMMAND_FAILED
    print_all(console, batch_size_view(result, out))
    _copy_result(out / RESULT_FILE, args.json, console)
    write_report_option(out, args.report, console)
    return EXIT_INTERRUPTED if result.stopped == schema.END_INTERRUPTED else EXIT_OK


def _result_dir(out: Path | None, verb: str, command: list[str], result_file: str) -> Path | None:
    """``--out``, or a new ``./gpufeed-runs/<timestamp>-<verb>-<name>/``; None (said why) without a
    command or when the directory already holds a result."""
    from gpufeed.record.layout import default_result_dir
    if not command:
        say_error(f"give the training command after --, e.g. gpufeed {verb} -- python train.py")
        return None
    out = out or default_result_dir(verb, command)
    problem = dir_problem(out, "--out", result_file, f"{verb} result")
    if problem:
        say_error(problem)
        return None
    return out


def _copy_result(result: Path, path: Path | None, console: Console) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(result.read_text())
    except OSError as error:  # checked before the run; the directory may have changed since
        say_error(f"cannot write {path}: {error.strerror}.")
        return
    console.print(f"Result written to {path}", style="dim")


def run(command: list[str], args: argparse.Namespace) -> int:
    """Replace this process with the command, the settings file's DataLoader keywords applied."""
    import os

    from gpufeed.measure.runner import bootstrap_env

    if not command:
        say_error("give the training command after --, e.g. gpufeed run --config best-config.json -- python train.py")
        return EXIT_USAGE
    try:
        extra_env = _loader_env(args)
    except ValueError as error:
        return _offload_refused(error)
    if args.config is None and not extra_env:
        say_error("give --config FILE (gpufeed tune's best-config.json), --autotune or --offload ray.")
        return EXIT_USAGE
    env = dict(os.environ, **extra_env)
    if args.config is not None:
        try:
            config = _read_config(args.config)
        except OSError as error:
            say_error(f"cannot read {args.config}: {error.strerror}.")
            return EXIT_USAGE
        except ValueError as error:
            say_error(f"{error}.")
            return EXIT_USAGE
        env.update(config.to_env())
        which = "tf.data pipeline" if config.framework == "tensorflow" else "DataLoader"
        say_note(f"applying {config.settings.label()} to {config.target()} (said again when it is "
                 f"applied, or at the end when no {which} matched)")
        stream = _stream_note(args.config, getattr(config.settings, "num_workers", None),
                              getattr(config.settings, "persistent_workers", None))
        if stream:
            say_note(stream)
    if args.autotune:
        say_note("tuning the training DataLoader while it trains (each switch and the winner are said on stderr)")
    env = bootstrap_env(env)
    try:
        os.execvpe(command[0], command, env)
    except OSError as error:
        say_error(f"could not start {command[0]!r}: {error.strerror}.")
        return EXIT_NOT_STARTED
    return EXIT_INTERNAL  # pragma: no cover (exec does not return)


def _stream_note(path: Path, workers: int | None, persistent: bool | None) -> str | None:
    """What the settings change beyond speed. A file ``gpufeed tune`` wrote (it names the command)
    carries its own note: tune knew the script's settings, and says nothing when the winner keeps
    them. Any other file that sets num_workers or persistent_workers gets the note on the condition only
    the script can tell."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict) and "command" in data and "note" in data:
        return data["note"] if isinstance(data["note"], str) else None
    notes = []
    if workers is not None:
        notes.append(f"if your script's num_workers is not {workers}: every sample and its order are kept, but "
                     "each batch's random augmentation draws from another worker's random stream, so a seeded run "
                     f"(torch.manual_seed) gets other augmented batches and its loss curve differs from batch "
                     f"min(yours, {workers}) + 1 on")
    if persistent is not None:
        notes.append(f"if your script's persistent_workers is not {persistent}: "
                     f"{epoch_order_note(not persistent, persistent, None)}")
    return "; ".join(notes) or None


def _read_config(path: Path):
    """A settings file (gpufeed tune's best-config.json): a DataLoader's or a tf.data pipeline's.
    ValueError, naming the key or value, when it is neither."""
    import json

    from gpufeed.measure.inside import overrides, tf_overrides
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None  # said by the reader below, in its own words
    if tf_overrides.is_pipeline_config(data):
        return tf_overrides.PipelineOverrides.from_dict(data, str(path))
    return overrides.Overrides.from_json(text, str(path))


def _loader_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment that asks the command's process for --autotune or --offload (not both: each
    replaces the training loader's iterator). ValueError: the offload options cannot be met."""
    import os

    from gpufeed.settings import ENV_AUTOTUNE
    from gpufeed.offload.options import settings_from as offload_settings
    offload = offload_settings(args)
    autotune = getattr(args, "autotune", False)
    if autotune and offload is not None:
        raise ValueError("--autotune and --offload cannot be combined: each replaces the training "
                         "DataLoader's workers; offload first, then tune the Ray workers' count by hand")
    if offload is not None:
        return offload.to_env()
    if not autotune:
        if getattr(args, "allow_reorder", False):
            raise ValueError("--allow-reorder goes with --autotune (or gpufeed tune): it lets the search try in_order=False")
        return {}
    # Autotune options already in the environment (docs/autotune.md) are kept.
    text = os.environ.get(ENV_AUTOTUNE, "").strip() or "1"
    if getattr(args, "allow_reorder", False):
        from gpufeed.settings import AutotuneSettings, env_of
        given = AutotuneSettings.from_json(text) or AutotuneSettings()
        return env_of(dataclasses.replace(given, allow_reorder=True))
    return {ENV_AUTOTUNE: text}


def _offload_refused(error: ValueError) -> int:
    from rich.markup import escape

    from gpufeed.offload.options import Unavailable
    say_error(escape(f"{error}."))  # "gpufeed[ray]" is no markup
    return EXIT_NOT_STARTED if isinstance(error, Unavailable) else EXIT_USAGE


def _start_exporter(run_dir: Path, port: int, addr: str, console: Console):
    """The Prometheus exporter, serving before the command starts; None (said why) if it cannot."""
    try:
        from gpufeed.integrations.prometheus import serve
        server = serve(run_dir, port, addr)
    except ImportError:
        say_error("--prometheus needs the prometheus_client package: pip install 'gpufeed[prometheus]'.")
        return None
    except OSError as error:
        import errno
        import socket
        if isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL:
            say_error(f"--prometheus-addr {addr!r} is not a valid address of this host ({error.strerror or error}): "
                   "give one of its IP addresses, or 0.0.0.0 for all.")
        else:
            say_error(f"cannot serve Prometheus metrics on {addr}:{port} ({error.strerror or error}); choose another "
                   "--prometheus port.")
        return None
    console.print(f"Prometheus metrics on http://{addr}:{port}/metrics", style="dim")
    return server
