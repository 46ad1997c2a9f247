"""Run the user's command with the probe armed and the sampler watching, and always clean up.

The command runs in a session of its own, so that it and every DataLoader worker under it can be
signalled and ended together; whatever happens (normal end, ``--steps`` reached, crash, stall,
Ctrl-C), ``meta.json`` is finalised and no process of the command's tree is left running.
"""
from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpufeed import defaults
from gpufeed import thresholds as th
from gpufeed._version import __version__
from gpufeed.measure.inside.probe_config import ProbeConfig
from gpufeed.measure.outside.cpus import usable_cpus
from gpufeed.measure.outside.ray_logs import ray_ending
from gpufeed.measure.outside.sampler import Sampler
from gpufeed.measure.processes import POLL_S, StopSignals, Watchdog, die_with_parent, signal_group, terminate_tree
from gpufeed.record import schema
from gpufeed.record.layout import default_run_dir
from gpufeed.record.writer import write_json_atomic

# The sitecustomize that arms every Python process of the command (gpufeed/arming): a folder, not an import.
BOOTSTRAP_DIR = Path(__file__).resolve().parent.parent / "arming" / "bootstrap"
PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the folder gpufeed itself is imported from
STDERR_TAIL_LINES = 20
# Time the command gets to end by itself once the probe has reached --steps (it asks the process
# to exit; a loop fed from a thread may not hear it at once, and must not keep gpufeed waiting).
STEPS_REACHED_GRACE_S = 10.0
# --steps counts training steps (DataLoader batches, or a loop's optimizer steps): a command that has
# taken none this long after its start is told so then, not after it has run to its end.
STEPS_UNCOUNTED_AFTER_S = 20.0


class CommandNotStarted(Exception):
    """The command could not be started at all (not found, not executable)."""


class RunDirInUse(Exception):
    """The run directory already holds a run; appending to it would mix two runs' events."""


@dataclass
class RunOptions:
    command: list[str]
    out: Path | None = None          # the run directory; default ./gpufeed-runs/<timestamp>-<name>
    steps: int | None = None         # measured steps after warm-up; None: run to the end
    warmup_steps: int = defaults.WARMUP_STEPS
    stall_timeout_s: float | None = defaults.STALL_TIMEOUT_S
    # The stall limit of an iterator's first batch (worker start-up); None: the stall timeout. gpufeed
    # diagnose gives it th.FIRST_BATCH_TIMEOUT_S; tune and batch-size trials have their own time limit.
    first_batch_timeout_s: float | None = None
    grace_s: float = th.STOP_GRACE_S  # time the command gets to end by itself once asked to stop
    interval_s: float = defaults.SAMPLE_INTERVAL_S
    extra_env: dict[str, str] = field(default_factory=dict)
    seconds: float | None = None     # measure this long after warm-up, then end the command (tune trials)
    timeout_s: float | None = None   # end the command after this long whatever it does (trials)
    echo_output: bool = True         # show the command's output as it comes; else only on disk (tune trials)


def bootstrap_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` plus what makes every Python process under it load gpufeed's bootstrap."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), env.get("PYTHONPATH")) if p)
    # For a command run by another interpreter: where gpufeed itself can be imported from.
    env["GPUFEED_PACKAGE_PARENT"] = str(PACKAGE_PARENT)
    return env


def probe_config(options: RunOptions, run_dir: Path) -> ProbeConfig:
    """What the probe in the command's processes is told (through their environment)."""
    stall = options.stall_timeout_s or None
    first_batch = None if stall is None else max(options.first_batch_timeout_s or 0.0, stall)
    return ProbeConfig(run_dir=str(run_dir.resolve()),
                       max_steps=None if options.steps is None else options.warmup_steps + options.steps,
                       max_seconds=options.seconds, warmup_steps=options.warmup_steps, stall_timeout_s=stall,
                       first_batch_timeout_s=first_batch)


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    meta: schema.RunMeta


def run_command(options: RunOptions) -> RunResult:
    """Run the command to its end (or to ``steps``); return where the record is and how it ended.

    Raises ``CommandNotStarted`` if it cannot start; Ctrl-C ends the command and returns normally
    with ``end_reason == "interrupted"``.
    """
    run_dir = Path(options.out) if options.out else default_run_dir(options.command)
    meta = start_record(run_dir, options.command, options.steps, options.warmup_steps)
    return RunResult(run_dir, _Run(options, run_dir, meta).execute())


def start_record(run_dir: Path, command: list[str], steps: int | None, warmup_steps: int) -> schema.RunMeta:
    """Create the run directory and its first ``meta.json`` (no end yet)."""
    if (run_dir / schema.META_FILE).exists():
        raise RunDirInUse(f"{run_dir} already holds a gpufeed run: choose another --out, or remove it first.")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / schema.EVENTS_DIR).mkdir(exist_ok=True)
    now_mono, now_unix = time.perf_counter(), time.time()
    cpus = usable_cpus()  # the command inherits gpufeed's affinity and cgroup
    meta = schema.RunMeta(
        schema_version=schema.SCHEMA_VERSION, gpufeed_version=__version__,
        name=run_dir.name, command=list(command), cwd=os.getcwd(),
        hostname=socket.gethostname(), cpu_count=cpus.count, cpus=cpus.to_dict(),
        started_at_unix=now_unix, clock_offset_s=now_unix - now_mono, t_start=now_mono,
        steps_requested=steps, warmup_steps=warmup_steps,
    )
    write_json_atomic(run_dir / schema.META_FILE, meta.to_dict())
    return meta


def finish_record(run_dir: Path, meta: schema.RunMeta, end_reason: str, exit_code: int | None,
                  message: str | None, stderr_tail: list[str] = ()) -> schema.RunMeta:
    """Write how the run ended into ``meta.json``."""
    _remove_empty_stack_files(run_dir / schema.STACKS_DIR)
    meta.t_end = time.perf_counter()
    meta.exit_code = exit_code
    meta.end_reason = end_reason
    meta.message = message
    meta.stderr_tail = [line for line in stderr_tail if line.strip()]
    write_json_atomic(run_dir / schema.META_FILE, meta.to_dict())
    return meta


class _Run:
    def __init__(self, options: RunOptions, run_dir: Path, meta: schema.RunMeta) -> None:
        self.options = options
        self.run_dir = run_dir
        self.meta = meta
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)

    def execute(self) -> schema.RunMeta:
        with StopSignals.active_or_new() as stop:
            return self._execute(stop)

    def _execute(self, stop: "StopSignals") -> schema.RunMeta:
        # Trials keep the command's standard output on disk: it would garble the progress display.
        stdout = None if self.options.echo_output else open(self.run_dir / schema.STDOUT_FILE, "wb")
        oom_kills_before = oom_kill_count()
        try:
            child = subprocess.Popen(
                self.options.command, env=self._child_env(), stdout=stdout, stderr=subprocess.PIPE,
                start_new_session=True, preexec_fn=die_with_parent,
            )
        except (OSError, ValueError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            self._finish(schema.END_NOT_STARTED, None,
                         f"Could not start {self.options.command[0]!r}: {reason}.")
            raise CommandNotStarted(self.meta.message) from error
        finally:
            if stdout is not None:
                stdout.close()  # the child has its own copy
        watchdog = Watchdog(child.pid)
        sampler = Sampler(self.run_dir, child.pid, interval_s=self.options.interval_s)
        sampler.start()
        tee = threading.Thread(target=self._tee_stderr, args=(child.stderr,), daemon=True)
        tee.start()
        end_reason: str | None = None
        ended_in_grace = True
        try:
            end_reason = self._wait(child, sampler, stop)
            if end_reason is not None:
                ended_in_grace = self._ask_to_stop(child, stop.first if end_reason == schema.END_INTERRUPTED
                                                   else signal.SIGTERM)
        finally:
            terminate_tree(child, sampler.seen)
            self.meta.sampler = sampler.stop()
            tee.join(timeout=2.0)
            watchdog.done()
        stopped = end_reason == schema.END_INTERRUPTED and stop.first is not None
        self.meta.stop_signal = signal.Signals(stop.first).name if stopped else None
        self.meta.killed_after_grace_s = None if ended_in_grace else self.options.grace_s
        oom_kills = _difference(oom_kill_count(), oom_kills_before)
        return self._finish_from_exit(end_reason, child.returncode, oom_kills)

    def _ask_to_stop(self, child: subprocess.Popen, sig: int) -> bool:
        """Ask the command to end (Ctrl-C: SIGINT to its group, as a terminal does; else SIGTERM to
        its main process, whose handler may save a checkpoint) and give it the grace to do so.
        True if it ended within the grace."""
        # Python runs a signal handler only between bytecodes: a TensorFlow process stuck in an op
        # sees this instead, from its probe's thread, and writes what it measured (tf_probe.py).
        (self.run_dir / schema.STOP_MARKER).touch()
        if sig == signal.SIGINT:
            signal_group(child.pid, signal.SIGINT)
        else:
            try:
                child.send_signal(signal.SIGTERM)
            except OSError:
                pass
        try:
            child.wait(timeout=self.options.grace_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    def _child_env(self) -> dict[str, str]:
        env = bootstrap_env({**os.environ, **self.options.extra_env})
        env.update(probe_config(self.options, self.run_dir).to_env())
        return env

    def _wait(self, child: subprocess.Popen, sampler: Sampler, stop: "StopSignals") -> str | None:
        stall_marker = self.run_dir / schema.STALL_MARKER
        steps_marker = self.run_dir / schema.STEPS_REACHED_MARKER
        deadline = time.monotonic() + self.options.timeout_s if self.options.timeout_s else None
        steps_reached_at = None
        uncounted_check = time.monotonic() + STEPS_UNCOUNTED_AFTER_S if self.options.steps else None
        while child.poll() is None:
            if stop.first is not None:
                return schema.END_INTERRUPTED
            if stall_marker.exists():
                self._record_stall(stall_marker, sampler)
                return schema.END_STALLED
            now = time.monotonic()
            if deadline is not None and now > deadline:
                return schema.END_TIMED_OUT
            if steps_reached_at is None and steps_marker.exists():
                steps_reached_at = now
            elif steps_reached_at is not None and now - steps_reached_at > STEPS_REACHED_GRACE_S:
                return schema.END_STEPS_REACHED  # the command did not end when asked: end it
            if uncounted_check is not None and now > uncounted_check:
                uncounted_check = None
                if not _any_training(self.run_dir):
                    self._say(f"gpufeed: --steps {self.options.steps} counts training steps (DataLoader batches, or "
                              "a loop's optimizer steps), and none was taken in the first "
                              f"{STEPS_UNCOUNTED_AFTER_S:.0f} s, so it cannot end the command: it runs to its own end "
                              "(Ctrl-C stops it; what was measured is kept).")
            time.sleep(POLL_S)
        return None

    def _say(self, line: str) -> None:
        try:
            print(line, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass

    def _record_stall(self, marker: Path, sampler: Sampler) -> None:
        time.sleep(0.5)  # the workers' stack dumps (SIGUSR1, sent by the probe) land meanwhile
        stall = _read_json(marker) or {}
        pids = [stall.get("pid")] + list(stall.get("worker_pids") or [])
        stall["processes"] = sampler.reader.snapshot([p for p in pids if p])
        self.meta.stall = stall

    def _tee_stderr(self, stream: IO[bytes]) -> None:
        """Show the command's stderr as it comes, keep it on disk, and keep its last lines."""
        partial = b""
        with open(self.run_dir / schema.STDERR_FILE, "ab") as log:
            for chunk in iter(lambda: stream.read1(65536), b""):
                try:
                    if self.options.echo_output:
                        sys.stderr.buffer.write(chunk)
                        sys.stderr.buffer.flush()
                except (OSError, ValueError):
                    pass
                log.write(chunk)
                log.flush()
                *lines, partial = (partial + chunk).split(b"\n")
                self.stderr_tail.extend(line.decode("utf-8", "replace") for line in lines)
        if partial:
            self.stderr_tail.append(partial.decode("utf-8", "replace"))

    def _finish_from_exit(self, end_reason: str | None, exit_code: int | None,
                          oom_kills: int | None = None) -> schema.RunMeta:
        if end_reason is None:
            if (self.run_dir / schema.STEPS_REACHED_MARKER).exists():
                end_reason = schema.END_STEPS_REACHED
            elif exit_code == 0:
                end_reason = schema.END_COMPLETED
            else:
                end_reason = schema.END_FAILED
        message = _end_message(end_reason, exit_code, self.meta, list(self.stderr_tail), self.run_dir, oom_kills)
        if self.meta.killed_after_grace_s is not None:
            message += (f" It had not ended {self.meta.killed_after_grace_s:g} s after being asked to stop "
                        "(--grace), so it was killed.")
        return self._finish(end_reason, exit_code, message)

    def _finish(self, end_reason: str, exit_code: int | None, message: str | None) -> schema.RunMeta:
        return finish_record(self.run_dir, self.meta, end_reason, exit_code, message, list(self.stderr_tail))


def _any_training(run_dir: Path) -> bool:
    """Whether any process of the command has registered a DataLoader iterator or timed a loop's
    training (its event flushed)."""
    for path in (run_dir / schema.EVENTS_DIR).glob("*.jsonl"):
        try:
            with open(path, "rb") as f:
                head = f.read(1 << 20)
                if b'"t_created"' in head or b'"kind":"loop"' in head:
                    return True
        except OSError:
            continue
    return False


def _end_message(end_reason: str, exit_code: int | None, meta: schema.RunMeta, tail: list[str],
                 run_dir: Path, oom_kills: int | None = None) -> str:
    if end_reason == schema.END_COMPLETED:
        return "The command finished normally."
    if end_reason == schema.END_STEPS_REACHED:
        if meta.steps_requested is None:
            return "Stopped the command once the measurement was long enough, as asked."
        return f"Stopped the command after {meta.steps_requested} measured steps, as asked."
    if end_reason == schema.END_TIMED_OUT:
        unmeasured = "" if any((run_dir / schema.EVENTS_DIR).glob("*.jsonl")) else (
            ", and nothing was measured in it (was gpufeed's instrumentation loaded? see stderr.log)")
        return f"Stopped at the time limit: the command had not ended by itself{unmeasured}."
    if end_reason == schema.END_INTERRUPTED:
        if meta.stop_signal == "SIGINT":
            return "Interrupted (Ctrl-C): the command and its DataLoader workers were stopped."
        return (f"Stopped: gpufeed received {meta.stop_signal or 'a signal'} (from a scheduler or kill), so the "
                "command and its DataLoader workers were stopped.")
    if end_reason == schema.END_STALLED:
        waited = (meta.stall or {}).get("waited_s")
        which = "its first batch" if (meta.stall or {}).get("first_batch") else "a batch"
        tf_call = (meta.stall or {}).get("tf_call")
        if tf_call == "train_function" and waited:
            return (f"Keras's training step (train_function, waiting for {which} of its tf.data input or computing) "
                    f"had not returned after {waited:.0f} s, so the command was stopped; see where each thread "
                    "was below.")
        if tf_call and waited:
            return (f"The tf.data iterator delivered no batch for {waited:.0f} s (waiting for {which}), so the "
                    "command was stopped; see where each thread was below.")
        return (f"The DataLoader delivered no batch for {waited:.0f} s (waiting for {which}), so the command was "
                "stopped; see what each worker was doing below." if waited else "The DataLoader stalled.")
    # Python's own error, where there is one, is the cause: Ray's words only when nothing was said.
    ended_by_ray = None if any("Traceback (most recent call last)" in line for line in tail) else ray_ending(run_dir)
    if ended_by_ray is not None:  # Ray ends its driver from C++: nothing was said on stderr
        return (f"Ray ended the training process (pid {ended_by_ray.pid}), which it was making batches for "
                f"(--offload ray): \"{ended_by_ray.words}\" (Ray's log of it: {ended_by_ray.log}). The Ray node the "
                "process was attached to, or the cluster's head, was lost; Ray stops its drivers then, so gpufeed "
                "could not go on with local workers (docs/offload.md).")
    # The last line that says something: launchers (torchrun) end their reports with a rule of "=".
    last = next((line.strip() for line in reversed(tail) if line.strip(" =-*_\t")), "")
    if exit_code is not None and exit_code < 0:
        how = f"was killed by {_signal_name(-exit_code)}"
        if -exit_code == signal.SIGKILL:
            how += _sigkill_cause(oom_kills)
    else:
        how = f"exited with code {exit_code}"
    return f"The command {how}" + (f": {last}" if last else ".")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _sigkill_cause(oom_kills: int | None) -> str:
    """Who sent a SIGKILL, as far as the evidence goes: the OOM killer only when its count rose."""
    if oom_kills:
        return (f" from the kernel's out-of-memory killer (the cgroup's memory.events counted {oom_kills} "
                "OOM kill(s) during the run)")
    if oom_kills == 0:
        return " from outside (another program or a user's kill -9: not the out-of-memory killer, whose count did not rise)"
    return " (by another program, a user's kill -9 or the kernel's out-of-memory killer: no memory.events to tell)"


def oom_kill_count() -> int | None:
    """The ``oom_kill`` count of this process's cgroup (v2 memory.events, hierarchical: every OOM kill
    of a process in it, or below it); None where it cannot be read."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next((line.strip().split(":", 2)[2] for line in f if line.startswith("0::")), None)
        if path is None:
            return None
        with open(f"/sys/fs/cgroup{path.rstrip('/')}/memory.events") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _difference(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def _remove_empty_stack_files(stacks: Path) -> None:
    """Every worker opens a stack file in case of a stall; only the ones written to are kept."""
    for path in stacks.glob("*.txt"):
        try:
            if path.stat().st_size == 0:
                path.unlink()
        except OSError:
            pass
    try:
        stacks.rmdir()
    except OSError:
        pass  # not empty, or not there


def _read_json(path: Path) -> dict[str, Any] | None:
    import json
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
