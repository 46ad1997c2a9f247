"""Every way a run can go wrong, each done for real: gpufeed must lose nothing and leave nothing.

Each scenario runs ``gpufeed`` as a user would (a subprocess, real DataLoader workers, real
signals) with a marker in its environment that every process of the command inherits, and then
checks: the exit code, that the run record is intact (``gpufeed analyze`` reads it), that the
diagnosis was printed, and that no process carrying the marker is left 2 s after gpufeed ended.

    python bench/faults.py            # every scenario (about 3 minutes on 2 busy cores)
    python bench/faults.py --fast     # the fast half (CI runs it: tests/integration/test_faults.py)

Prints one table and a last line ``N/N scenarios survived, 0 processes left, 0 records lost``;
exits 1 if any scenario did not survive.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "fault_train.py"
MARKER = "GPUFEED_FAULT_MARKER"
LEFT_AFTER_S = 2.0  # the promise: every process of the command gone this long after gpufeed ends


@dataclass
class Outcome:
    exit_code: int | None
    expected_exit: int | None
    record: bool | None = None      # intact (gpufeed analyze reads it); None: no record in this scenario
    diagnosis: bool | None = None   # printed; None: none expected
    left: int = 0                   # processes of the command still running
    checks: dict[str, bool] = field(default_factory=dict)  # scenario-specific facts

    @property
    def survived(self) -> bool:
        return (self.exit_code == self.expected_exit and self.record is not False and self.diagnosis is not False
                and self.left == 0 and all(self.checks.values()))


@dataclass
class Scenario:
    name: str
    fast: bool
    run: Callable[["Bench"], Outcome]


class Bench:
    """One scenario's working directory, marker and helpers."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.marker = uuid.uuid4().hex
        self.run_dir = root / "run"

    # -- running gpufeed -------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        return {**os.environ, MARKER: self.marker, "COLUMNS": "200"}

    def start(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "gpufeed", *args], cwd=self.root, env=self.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def diagnose_args(self, *train_args: str, options: tuple[str, ...] = ()) -> list[str]:
        return ["diagnose", "--out", str(self.run_dir), *options, "--", sys.executable, str(TRAIN), *train_args]

    def gpufeed(self, *args: str, timeout: float = 180) -> tuple[int, str, str]:
        proc = self.start(*args)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        self.stdout, self.stderr = out, err
        return proc.returncode, out, err

    def wait_for_steps(self, proc: subprocess.Popen, min_bytes: int = 1500, timeout: float = 90) -> None:
        """Until the probe has flushed some steps to disk."""
        deadline = time.monotonic() + timeout
        while sum(p.stat().st_size for p in (self.run_dir / "events").glob("*.jsonl")) < min_bytes:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("no steps recorded")
            time.sleep(0.1)

    def finish(self, proc: subprocess.Popen, timeout: float = 60) -> int:
        try:
            self.stdout, self.stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            self.stdout, self.stderr = proc.communicate()
        return proc.returncode

    # -- checking ----------------------------------------------------------------------------------
    def left(self, since: float | None = None) -> int:
        """Processes carrying this scenario's marker, LEFT_AFTER_S after ``since`` (default: now)."""
        deadline = (since or time.monotonic()) + LEFT_AFTER_S
        while True:
            found = []
            for proc in psutil.process_iter(["status"]):
                try:
                    if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.environ().get(MARKER) == self.marker:
                        found.append(proc)
                except (psutil.Error, OSError):
                    pass
            if not found or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        for proc in found:  # leave the machine clean for the next scenario, but count them
            try:
                proc.kill()
            except psutil.Error:
                pass
        return len(found)

    def record_intact(self, run_dir: Path | None = None) -> bool:
        """``gpufeed analyze`` reads the record and exits 0."""
        run_dir = run_dir or self.run_dir
        proc = subprocess.run([sys.executable, "-m", "gpufeed", "analyze", str(run_dir)], cwd=self.root,
                              capture_output=True, text=True, timeout=120)
        return proc.returncode == 0 and "Traceback" not in proc.stderr

    def meta(self) -> dict:
        try:
            return json.loads((self.run_dir / "meta.json").read_text())
        except (OSError, ValueError):
            return {}

    def diagnosis_printed(self) -> bool:
        # The command's own traceback may be on stderr; gpufeed's would come instead of the end.
        return "Bottleneck:" in self.stdout and "Run record:" in self.stdout

    def outcome(self, code: int, expected: int, **checks: bool) -> Outcome:
        """A run's outcome: its record must have an end and be readable, its diagnosis printed."""
        left = self.left()
        ended = self.meta().get("end_reason") is not None
        return Outcome(code, expected, record=ended and self.record_intact(), diagnosis=self.diagnosis_printed(),
                       left=left, checks=checks)


# -- the command misbehaves -----------------------------------------------------------------------------
def crash(b: Bench) -> Outcome:
    code, out, _ = b.gpufeed(*b.diagnose_args("--mode", "crash", "--at", "40"))
    return b.outcome(code, 4, said_why="boom at step 40" in out)


def crash_early(b: Bench) -> Outcome:
    """Crashes at step 12: 2 measured steps after the 10 warm-up ones; no finding from them."""
    code, out, _ = b.gpufeed(*b.diagnose_args("--mode", "crash", "--at", "12", options=("--json", str(b.root / "d.json"))))
    findings = json.loads((b.root / "d.json").read_text())["findings"]
    return b.outcome(code, 4, no_findings=findings == [], said_too_few="too few to judge" in out)


def syntax_error(b: Bench) -> Outcome:
    script = b.root / "broken.py"
    script.write_text("import torch\ndef broken(:\n")
    code, out, _ = b.gpufeed("diagnose", "--out", str(b.run_dir), "--json", str(b.root / "d.json"), "--",
                             sys.executable, str(script))
    findings = json.loads((b.root / "d.json").read_text())["findings"]
    return b.outcome(code, 4, said_syntax_error="SyntaxError" in out, no_advice=findings == [])


def missing_script(b: Bench) -> Outcome:
    code, out, _ = b.gpufeed("diagnose", "--out", str(b.run_dir), "--json", str(b.root / "d.json"), "--",
                             sys.executable, str(b.root / "no_such_train.py"))
    findings = json.loads((b.root / "d.json").read_text())["findings"]
    return b.outcome(code, 4, no_advice=findings == [])


def command_not_found(b: Bench) -> Outcome:
    code, _, err = b.gpufeed("diagnose", "--out", str(b.run_dir), "--", "no-such-trainer-xyz")
    return Outcome(code, 3, record=b.meta().get("end_reason") == "not_started", left=b.left(),
                   checks={"said_why": "Could not start" in err})


def hang(b: Bench) -> Outcome:
    code, out, _ = b.gpufeed(*b.diagnose_args("--mode", "hang-worker", "--at", "30",
                                              options=("--stall-timeout", "3", "--grace", "1")))
    return b.outcome(code, 5, stall_reported="loader_stalled" in out)


def slow_first_batch(b: Bench) -> Outcome:
    """The first batch takes 4 s (spawn start-up, a filling buffer) with a 2 s stall timeout: not a stall."""
    code, out, _ = b.gpufeed(*b.diagnose_args("--mode", "slow-first-batch", "--first-s", "4",
                                              options=("--stall-timeout", "2", "--steps", "40")))
    return b.outcome(code, 0, not_stalled="stalled" not in b.meta().get("end_reason", ""))


def sigkill_child(b: Bench) -> Outcome:
    proc = b.start(*b.diagnose_args())
    b.wait_for_steps(proc)
    os.kill(psutil.Process(proc.pid).children()[0].pid, signal.SIGKILL)
    code = b.finish(proc)
    return b.outcome(code, 4, named_sigkill="SIGKILL" in b.stdout,
                     no_oom_blame="out-of-memory killer (the cgroup" not in b.stdout)


def worker_oom_killed(b: Bench) -> Outcome:
    """A DataLoader worker SIGKILLed mid-run, as the OOM killer would."""
    code, out, _ = b.gpufeed(*b.diagnose_args("--mode", "kill-worker", "--at", "30"))
    return b.outcome(code, 4, named_worker="worker" in out.lower())


# -- signals to gpufeed ------------------------------------------------------------------------------------
def ctrl_c(b: Bench, times: int = 1, mode: str = "steady") -> Outcome:
    proc = b.start(*b.diagnose_args("--mode", mode))
    b.wait_for_steps(proc)
    for _ in range(times):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    code = b.finish(proc)
    return b.outcome(code, 130, said_ctrl_c="Interrupted (Ctrl-C)" in b.stdout)


def ctrl_c_three_times(b: Bench) -> Outcome:
    """Three Ctrl-C within a second while the script runs its own `except KeyboardInterrupt`."""
    out = ctrl_c(b, times=3, mode="own-interrupt")
    out.checks["script_saved"] = "saved" in b.stdout
    return out


def sigterm_gpufeed(b: Bench) -> Outcome:
    proc = b.start(*b.diagnose_args())
    b.wait_for_steps(proc)
    proc.send_signal(signal.SIGTERM)
    code = b.finish(proc)
    return b.outcome(code, 143, named_sigterm="received SIGTERM" in b.stdout,
                     not_called_ctrl_c="Ctrl-C" not in b.stdout)


def users_sigterm_handler(b: Bench) -> Outcome:
    """A SIGTERM handler installed by the script (after torch, as Lightning does) still runs."""
    checkpoint = b.root / "checkpoint.txt"
    proc = b.start(*b.diagnose_args("--mode", "own-sigterm", "--checkpoint", str(checkpoint)))
    b.wait_for_steps(proc)
    proc.send_signal(signal.SIGTERM)
    code = b.finish(proc)
    return b.outcome(code, 143, checkpoint_saved=checkpoint.exists())


def killed_after_grace(b: Bench) -> Outcome:
    proc = b.start(*b.diagnose_args("--mode", "ignore-stop", options=("--grace", "1")))
    b.wait_for_steps(proc)
    proc.send_signal(signal.SIGINT)
    code = b.finish(proc)
    return b.outcome(code, 130, told_killed="so it was killed" in b.stdout)


def sigkill_gpufeed(b: Bench) -> Outcome:
    """gpufeed SIGKILLed while a worker is hung in __getitem__: the watchdog ends everything."""
    proc = b.start(*b.diagnose_args("--mode", "hang-worker", "--at", "30", options=("--stall-timeout", "600")))
    b.wait_for_steps(proc, min_bytes=800)
    time.sleep(2.0)  # the workers are inside __getitem__'s hour-long sleep by now
    proc.kill()
    killed_at = time.monotonic()
    proc.wait()  # not communicate(): a surviving worker holds the output pipes open
    left = b.left(since=killed_at)
    proc.stdout.close()
    proc.stderr.close()
    return Outcome(-9, -9, record=b.record_intact(), diagnosis=None, left=left)


# -- records that are torn, garbage, wrong or newer --------------------------------------------------------
def _good_run(b: Bench) -> Path:
    """A real, short run to damage (made once per bench, copied for each record scenario)."""
    source = b.root.parent / "good-run"
    if not source.exists():
        subprocess.run([sys.executable, "-m", "gpufeed", "diagnose", "--out", str(source), "--steps", "20", "--",
                        sys.executable, str(TRAIN)], cwd=b.root.parent, env=b.env(), capture_output=True, timeout=180)
    import shutil
    shutil.copytree(source, b.run_dir)
    return b.run_dir


def _damaged(b: Bench, damage: Callable[[Path], None], expected: int) -> Outcome:
    run = _good_run(b)
    damage(run)
    results = [subprocess.run([sys.executable, "-m", "gpufeed", *args], cwd=b.root, capture_output=True,
                              text=True, timeout=120)
               for args in (["analyze", str(run)], ["report", str(run), "-o", str(b.root / "r.html")],
                            ["trace", str(run), "-o", str(b.root / "t.json")])]
    codes = {r.returncode for r in results}
    no_traceback = not any("Traceback" in r.stderr for r in results)
    return Outcome(max(codes), expected, record=None,
                   diagnosis=None if expected else "Bottleneck:" in results[0].stdout, left=b.left(),
                   checks={"no_traceback": no_traceback, "one_exit_code": len(codes) == 1})


def _events_file(run: Path) -> Path:
    return max((run / "events").glob("*.jsonl"), key=lambda p: p.stat().st_size)


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def torn_record(b: Bench) -> Outcome:
    return _damaged(b, lambda run: _append(_events_file(run), '{"kind": "steps", "pid": 1, "rows": [[3, 1.'), 0)


def garbage_record(b: Bench) -> Outcome:
    return _damaged(b, lambda run: _append(run / "samples.jsonl", "\x00\xff garbage }{ \n[1, 2]\n"), 0)


def wrong_typed_record(b: Bench) -> Outcome:
    def damage(run: Path) -> None:
        _append(run / "samples.jsonl", '{"t": 1.0, "cpu_pct": 5}\n')
        _append(_events_file(run), '{"kind": "steps", "pid": 1, "iter_id": 0, "rows": 5}\n'
                                   '{"kind": "iterator", "pid": 1, "iter_id": 3}\n')
        meta = json.loads((run / "meta.json").read_text())
        (run / "meta.json").write_text(json.dumps(dict(meta, command=5, cpu_count="two")))
    return _damaged(b, damage, 0)


def newer_record(b: Bench) -> Outcome:
    def damage(run: Path) -> None:
        meta = json.loads((run / "meta.json").read_text())
        (run / "meta.json").write_text(json.dumps(dict(meta, schema_version=meta["schema_version"] + 1)))
    return _damaged(b, damage, 6)


# -- bad paths and arguments: refused before anything runs ------------------------------------------------
def _refused(b: Bench, *args: str, says: str) -> Outcome:
    ran = b.root / "ran.txt"
    code, _, err = b.gpufeed(*args, "--", sys.executable, "-c", f"open({str(ran)!r}, 'w')")
    return Outcome(code, 2, left=b.left(), checks={"said_why": says in err, "command_never_ran": not ran.exists(),
                                                   "no_traceback": "Traceback" not in err})


def bad_paths(b: Bench) -> Outcome:
    (b.root / "a-file").write_text("x")
    (b.root / "busy").mkdir()
    (b.root / "busy" / "notes.txt").write_text("mine")
    outcomes = [_refused(b, "diagnose", "--out", str(b.root / "a-file"), says="is a file"),
                _refused(b, "diagnose", "--out", "", says="must name a file or directory"),
                _refused(b, "diagnose", "--out", str(b.root / "busy"), says="not empty"),
                _refused(b, "diagnose", "--json", str(b.root / "a-file" / "d.json"), says="cannot write"),
                _refused(b, "tune", "--out", str(b.root / "a-file"), says="is a file"),
                _refused(b, "batch-size", "--json", str(b.root / "busy"), says="is a directory")]
    return _all(outcomes)


def bad_arguments(b: Bench) -> Outcome:
    outcomes = [_refused(b, "diagnose", "--interval", "inf", says="finite number"),
                _refused(b, "diagnose", "--interval", "nan", says="finite number"),
                _refused(b, "diagnose", "--steps", "abc", says="must be a positive whole number, got 'abc'"),
                _refused(b, "diagnose", "--prometheus", "9", "--prometheus-addr", "banana",
                         says="not a valid address")]
    return _all(outcomes)


def _all(outcomes: list[Outcome]) -> Outcome:
    worst = next((o for o in outcomes if not o.survived), outcomes[0])
    return Outcome(worst.exit_code, 2, left=sum(o.left for o in outcomes),
                   checks={f"{k}_{i}": v for i, o in enumerate(outcomes) for k, v in o.checks.items()})


SCENARIOS = [
    Scenario("bad paths (--out file/''/busy dir, --json unwritable)", True, bad_paths),
    Scenario("bad arguments (inf, nan, abc, banana)", True, bad_arguments),
    Scenario("command not found", True, command_not_found),
    Scenario("syntax error", True, syntax_error),
    Scenario("missing script", True, missing_script),
    Scenario("torn record line", True, torn_record),
    Scenario("garbage record lines", True, garbage_record),
    Scenario("wrong-typed record lines and meta fields", True, wrong_typed_record),
    Scenario("newer record schema", True, newer_record),
    Scenario("crash at step 40", True, crash),
    Scenario("crash at step 12 (2 measured steps)", True, crash_early),
    Scenario("SIGKILL of gpufeed, worker hung", True, sigkill_gpufeed),
    Scenario("Ctrl-C three times, script's own handler", True, ctrl_c_three_times),
    Scenario("Ctrl-C once", False, ctrl_c),
    Scenario("SIGTERM to gpufeed", False, sigterm_gpufeed),
    Scenario("script's own SIGTERM handler", False, users_sigterm_handler),
    Scenario("killed after --grace", False, killed_after_grace),
    Scenario("SIGKILL of the command", False, sigkill_child),
    Scenario("worker SIGKILLed (OOM)", False, worker_oom_killed),
    Scenario("stalled worker", False, hang),
    Scenario("slow first batch is not a stall", False, slow_first_batch),
]


def run_all(fast: bool, only: str | None = None) -> list[tuple[Scenario, Outcome, float]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpufeed-faults-") as tmp:
        for i, scenario in enumerate(s for s in SCENARIOS if (s.fast or not fast) and (not only or only in s.name)):
            root = Path(tmp) / f"{i:02d}"
            root.mkdir()
            bench = Bench(root)
            t0 = time.monotonic()
            try:
                outcome = scenario.run(bench)
            except Exception as error:  # a scenario that cannot even run is a failure, said as such
                outcome = Outcome(None, 0, left=bench.left(), checks={f"ran ({type(error).__name__}: {error})": False})
            rows.append((scenario, outcome, time.monotonic() - t0))
            print(f"  {scenario.name}: {'ok' if outcome.survived else 'FAILED'} ({time.monotonic() - t0:.1f} s)",
                  file=sys.stderr, flush=True)
    return rows


def _mark(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def table(rows: list[tuple[Scenario, Outcome, float]]) -> str:
    lines = ["| scenario | exit | expected | record intact | diagnosis printed | processes left | checks | survived |",
             "|---|---|---|---|---|---|---|---|"]
    for scenario, o, _ in rows:
        failed = [k for k, v in o.checks.items() if not v]
        checks = "all" if not failed else "failed: " + ", ".join(failed)
        if not o.checks:
            checks = "-"
        lines.append(f"| {scenario.name} | {o.exit_code} | {o.expected_exit} | {_mark(o.record)} | "
                     f"{_mark(o.diagnosis)} | {o.left} | {checks} | {'yes' if o.survived else 'NO'} |")
    survived = sum(o.survived for _, o, _ in rows)
    left = sum(o.left for _, o, _ in rows)
    lost = sum(o.record is False for _, o, _ in rows)
    lines.append("")
    lines.append(f"{survived}/{len(rows)} scenarios survived, {left} processes left, {lost} records lost")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fast", action="store_true", help="only the fast half (CI)")
    p.add_argument("--only", help="only the scenarios whose name contains this")
    args = p.parse_args(argv)
    rows = run_all(args.fast, args.only)
    print(table(rows))
    return 0 if all(o.survived for _, o, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
