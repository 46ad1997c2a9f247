"""Load a run directory into typed, array-backed objects for the analysis.

(Longer than 450 lines because it reads every event kind of the record in one pass over its files,
a few lines each; the rows' typed views are in ``rows.py``.)

A run that crashed or was killed leaves torn last lines and no end in ``meta.json``: they are
read as far as they go, and each gap becomes a warning rather than an error. Every line is checked
against the schema (``validate.py``): one that does not fit is skipped and counted, with its file
and line, and a field of ``meta.json`` that does not fit is read as unknown. Only a directory with
no readable ``meta.json``, or one written by a newer gpufeed, is refused.
"""
from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from gpufeed.record import pools, schema, validate
from gpufeed.record.rows import (BatchParts, CudaRows, FetchRows, H2dRows, LoopRows, OtherRow, PartRows, PinRows,
                                 ProcRow, SlowSample, StepRows)


class RecordError(Exception):
    """The run directory cannot be read at all; the message names what is missing."""


class SchemaTooNew(RecordError):
    """The run was written by a newer gpufeed: reading it could misread fields, so nothing is read."""


@dataclass
class IteratorRecord:
    """One DataLoader iterator (one epoch, or several with persistent workers)."""

    pid: int
    iter_id: int
    loader_id: int
    t_created: float
    t_ready: float
    worker_pids: list[int]
    config: schema.LoaderConfig
    steps: StepRows       # in index order
    cuda: CudaRows        # mem columns NaN where not sampled
    epoch_starts: list[float] = field(default_factory=list)  # persistent-worker resets
    # (t_request, t) of each next() that ended an epoch (StopIteration): a non-persistent iterator's
    # workers are shut down inside it. Empty in records older than the ``epoch_end`` event.
    epoch_ends: list[tuple[float, float]] = field(default_factory=list)
    role: str | None = None           # schema.ROLE_TRAIN / ROLE_EVAL; None in records older than roles
    role_why: str | None = None       # the evidence for the role, in words
    samples_from: str | None = None      # how the probe counted samples (docs/run-record.md)
    samples_unknown: str | None = None   # why some batches' samples could not be counted
    torch_threads: int | None = None     # the creating process's torch.get_num_threads(); None in older records
    # The thread that pinned its batches (None: nothing pinned, or an older record), and the rows of
    # batches pinned on that thread in time order (with num_workers=0 the training thread's: every
    # loader it iterates)
    pin_thread: int | None = None
    pins: PinRows = field(default_factory=lambda: PinRows.of([]))
    # The worker pools --autotune switched between inside this iteration, each as recorded (first
    # the one created here); empty when one pool made it (``record/pools.py``).
    pools: list["IteratorRecord"] = field(default_factory=list)

    @property
    def key(self) -> tuple[int, int]:
        """(pid, loader_id): iterators of one DataLoader object share it."""
        return (self.pid, self.loader_id)


@dataclass
class FetchRecord:
    """The batches one process produced (a worker, or the main process when num_workers=0)."""

    pid: int
    worker_id: int | None
    torch_threads: int | None
    rows: FetchRows


@dataclass
class ForkProbeRecord:
    """The probe's fork in the warm-up (``measure/inside/forking.py``): a child that shared the training
    process's pages from ``t_forked`` to ``t_released``, while ``steps`` training steps ran."""

    pid: int
    t_fork: float
    t_forked: float
    t_released: float
    steps: int
    minor_faults: int | None   # the training process's minor page faults meanwhile (None: not readable)
    # How a DataLoader without a multiprocessing_context starts its workers in that process
    default_start_method: str | None = None
    child_pid: int | None = None   # the child (the sampler may list it among the process's children)


@dataclass
class Samples:
    """The sampler's timeline as arrays (NaN where a reading was missing)."""

    t: np.ndarray                 # (n,)
    cpu_pct: np.ndarray           # (n, cores) busy % per core
    iowait_pct: np.ndarray        # (n,)
    mem_used_b: np.ndarray        # (n,)
    mem_total_b: float
    procs: list[list[ProcRow]]    # per sample: one row per process of the command (row.pid, row.cpu_pct...)
    gpus: dict[int, dict[str, np.ndarray]]  # index -> each of schema.GPU_SERIES, (n,) (NaN: N/A)
    gpu_procs: list[dict[int, dict[int, int]]]  # per sample: gpu index -> pid -> used bytes
    # The busiest programs outside the command, about every 2 s: (t, [(pid, name, cores), ...]).
    others: list[tuple[float, list[OtherRow]]] = field(default_factory=list)
    gpm_na: dict[int, str] = field(default_factory=dict)  # gpu index -> why its GPM metrics were N/A (last said)

    def __len__(self) -> int:
        return len(self.t)

    @property
    def cpu_total_pct(self) -> np.ndarray:
        """Busy % over all cores per sample; NaN where no core had a reading (the first sample)."""
        return mean_per_sample(self.cpu_pct)


def mean_per_sample(per_core: np.ndarray) -> np.ndarray:
    """Each sample's (row's) mean over the cores with a reading; NaN for a sample with none (where
    np.nanmean would warn)."""
    counted = np.isfinite(per_core).sum(axis=1)
    return np.divide(np.nansum(per_core, axis=1), counted, out=np.full(len(per_core), np.nan), where=counted > 0)


@dataclass
class RunRecord:
    run_dir: Path
    meta: schema.RunMeta
    processes: list[dict[str, Any]]
    iterators: list[IteratorRecord]
    fetches: list[FetchRecord]
    h2d: H2dRows
    samples: Samples
    stalls: list[dict[str, Any]]
    exits: dict[int, str]         # pid -> exit reason, for processes that got to write one
    warnings: list[str]
    overrides: list[dict[str, Any]] = field(default_factory=list)  # DataLoader settings gpufeed applied
    ends: dict[int, dict[str, Any]] = field(default_factory=dict)  # pid -> its exit event (t, reason, exit_code, error)
    # A record merged from several nodes' runs (``record/merge.py``): the runs it was made of, each
    # on the merged clock; pids of run i are shifted by i * merge.PID_STRIDE (``pid_offset``).
    parts: list["RunRecord"] = field(default_factory=list)
    pid_offset: int = 0
    # pid -> memory readings of the `memory` and `exit` events (uss_start_b, rss_peak_b, uss_b, cuda_mem_peak_b, ...)
    memory: dict[int, dict[str, int]] = field(default_factory=dict)
    # `cuda_device` events: the GPU each training process's torch uses (index, name, uuid, visible)
    cuda_devices: list[dict[str, Any]] = field(default_factory=list)
    # `cuda_stream` events: the device and stream each process's step events were recorded on
    cuda_streams: list[dict[str, Any]] = field(default_factory=list)
    # TensorFlow processes (measure/inside/tf_probe.py): each tf.data pipeline's structure, and the
    # profiler windows the waits were read from.
    tf_pipelines: list[dict[str, Any]] = field(default_factory=list)
    tf_profiles: list[dict[str, Any]] = field(default_factory=list)
    # `loop` rows by pid: a training loop's forward, backward and optimizer steps (analysis/loop.py)
    loops: dict[int, LoopRows] = field(default_factory=dict)
    # `offload` events (--offload: the training loader's batches made on Ray), in time order
    offloads: list[dict[str, Any]] = field(default_factory=list)
    # `autotune` events in time order: every decision of --autotune (docs/autotune.md)
    autotune: list[dict[str, Any]] = field(default_factory=list)
    # `fork_probe` events: what the training step paid while a forked child shared its pages (a merged
    # record of several nodes keeps none: the what-if model covers one training process)
    fork_probes: list[ForkProbeRecord] = field(default_factory=list)
    # `shm` events: each DataLoader worker's first batch (batch_b) against /dev/shm's free space (free_b)
    shm: list[dict[str, Any]] = field(default_factory=list)
    # `batch_parts` events by pid: a map-style worker's batches, its samples and collate timed
    batch_parts: dict[int, BatchParts] = field(default_factory=dict)
    # `profile` events by pid, summed: a worker's stack samples by the user's code (measure/inside/profiler.py):
    # {"interval_s", "samples", "outside_s", "stacks": {(site, function, call): [cpu_s, samples, wait_s]}, "scope":
    # "worker" or "next" (the training process inside next(), num_workers=0), "timeline": [(t, {"site
    # function": cpu_s}, outside_s, {"site function": wait_s}, wait_outside_s)] each event's since the one
    # before, at its flush (empty in older records); the wall-clock sampler's "wall_interval_s",
    # "wait_outside_s", "runqueue_s", "wait_unfiled_s" (wait_s and these None where it was not armed: N/A)}
    profiles: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def worker_pids(self) -> set[int]:
        return {pid for it in self.iterators for pid in it.worker_pids}

    def stacks(self) -> dict[int, str]:
        """Python stacks dumped at a stall, per pid (empty files left out)."""
        out = {}
        for path in sorted((self.run_dir / schema.STACKS_DIR).glob("*.txt")):
            text = path.read_text(errors="replace").strip()
            if text and path.stem.isdigit():
                out[int(path.stem)] = text
        return out


def _lines(path: Path, warnings: list[str], problem=validate.event_problem) -> Iterator[dict[str, Any]]:
    """The lines of a JSON-lines file that are objects fitting the schema (``problem`` says why not);
    the others are skipped, counted and named in one warning per file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        warnings.append(f"{path.name}: unreadable ({error.strerror})")
        return
    torn, wrong = 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            torn += 1
            continue
        why = problem(obj) if isinstance(obj, dict) else f"not an object but {type(obj).__name__}"
        if why:
            wrong.append((number, why))
            continue
        yield obj
    name = path.name if path.parent.name != schema.EVENTS_DIR else f"{schema.EVENTS_DIR}/{path.name}"
    if torn:
        warnings.append(f"{name}: skipped {torn} truncated line(s)")
    if wrong:
        first, why = wrong[0]
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        warnings.append(f"{name}: skipped {len(wrong)} line(s) that do not fit the run-record schema: "
                        f"line {first}, {why}{more}")


def load_meta(run_dir: str | Path, warnings: list[str] | None = None) -> schema.RunMeta:
    """``meta.json``; a field missing or of the wrong type is read as unknown (its default, or a
    stand-in) and named in ``warnings``."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RecordError(f"{run_dir} is not a directory (expected a gpufeed run directory).")
    meta_path = run_dir / schema.META_FILE
    try:
        raw = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecordError(f"{run_dir} has no {schema.META_FILE}: it is not a gpufeed run directory.") from None
    except (OSError, ValueError, RecursionError) as error:
        raise RecordError(f"{meta_path} is unreadable or truncated ({error}).") from None
    if not isinstance(raw, dict) or not validate.fits(raw.get("schema_version"), int):
        raise RecordError(f"{meta_path} has no schema_version: it was not written by gpufeed.")
    if raw["schema_version"] > schema.SCHEMA_VERSION:
        raise SchemaTooNew(f"{run_dir} uses run-record schema {raw['schema_version']}, newer than this "
                          f"gpufeed understands ({schema.SCHEMA_VERSION}): upgrade gpufeed to read it.")
    fields, unknown = _meta_fields(raw, run_dir.name)
    if unknown and warnings is not None:
        warnings.append(f"{schema.META_FILE}: {', '.join(unknown)} missing or of the wrong type: read as unknown")
    return schema.RunMeta(**fields)


# Stand-ins for meta.json's required fields when they are missing or wrong: unknown, never a guess
# that the analysis would take for a measurement (cpu_count is then read off the samples).
_META_STAND_INS: dict[str, Any] = {"gpufeed_version": "?", "command": [], "cwd": "", "hostname": "",
                                   "cpu_count": 0, "started_at_unix": math.nan, "clock_offset_s": 0.0,
                                   "t_start": math.nan}


def _meta_fields(raw: dict[str, Any], name: str) -> tuple[dict[str, Any], list[str]]:
    hints = typing.get_type_hints(schema.RunMeta)
    fields: dict[str, Any] = {}
    unknown: list[str] = []
    for f in dataclasses.fields(schema.RunMeta):
        value = raw.get(f.name)
        ok = f.name in raw and validate.fits(value, hints[f.name])
        if ok and f.name == "stall" and value is not None:
            ok = validate.fields_problem(value, validate.STALL) is None
        if ok and f.name == "sampler":
            ok = validate.fields_problem(value, validate.SAMPLER) is None
        if ok:
            fields[f.name] = value
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name in raw or required:
            unknown.append(f.name)
        if required:
            fields[f.name] = name if f.name == "name" else _META_STAND_INS[f.name]
    return fields, unknown


def load_run(run_dir: str | Path, meta: schema.RunMeta | None = None) -> RunRecord:
    """Read a run directory; ``meta`` stands in for a lost ``meta.json`` (the report reads what is left)."""
    run_dir = Path(run_dir)
    warnings: list[str] = []
    meta = meta if meta is not None else load_meta(run_dir, warnings)
    if meta.end_reason is None:
        warnings.append("the run has no recorded end (gpufeed itself was killed?): read as far as it goes")

    processes, stalls, exits, ends, overrides, memory, cuda_devices = [], [], {}, {}, [], {}, []
    cuda_streams: list[dict[str, Any]] = []
    tf_pipelines, tf_profiles, offloads, autotune, fork_probes, shm = [], [], [], [], [], []
    iterators: dict[tuple[int, int], dict[str, Any]] = {}
    step_rows: dict[tuple[int, int], list] = {}
    cuda_rows: dict[tuple[int, int], list] = {}
    epochs: dict[tuple[int, int], list[float]] = {}
    epoch_ends: dict[tuple[int, int], list[tuple[float, float]]] = {}
    unknown: dict[tuple[int, int], str] = {}
    fetches: dict[int, dict[str, Any]] = {}
    h2d_rows: list = []
    loop_rows: dict[int, list] = {}
    part_rows: dict[int, tuple[list, list]] = {}
    pin_rows: dict[int, list] = {}
    profiles: dict[int, dict[str, Any]] = {}
    event_files = sorted((run_dir / schema.EVENTS_DIR).glob("*.jsonl"))
    for path in event_files:
        for ev in _lines(path, warnings):
            kind, pid = ev.get("kind"), ev.get("pid")
            key = (pid, ev.get("iter_id"))
            if kind == "process":
                ev.setdefault("host", meta.hostname)
                processes.append(ev)
            elif kind == "iterator":
                iterators[key] = ev
            elif kind == "steps":
                step_rows.setdefault(key, []).extend(ev.get("rows", []))
            elif kind == "cuda":
                cuda_rows.setdefault(key, []).extend(ev.get("rows", []))
            elif kind == "epoch":
                epochs.setdefault(key, []).append(ev.get("t"))
            elif kind == "epoch_end":
                epoch_ends.setdefault(key, []).append((ev["t_request"], ev["t"]))
            elif kind == "fetches":
                f = fetches.setdefault(pid, {"worker_id": ev.get("worker_id"),
                                             "torch_threads": ev.get("torch_threads"), "rows": []})
                f["rows"].extend(ev.get("rows", []))
            elif kind == "h2d":
                h2d_rows.extend(ev.get("rows", []))
            elif kind == "pins":
                pin_rows.setdefault(pid, []).extend(ev.get("rows", []))
            elif kind == "loop":
                loop_rows.setdefault(pid, []).extend(ev.get("rows", []))
            elif kind == "stall":
                stalls.append(ev)
            elif kind == "override":
                overrides.append(ev)
            elif kind == "cuda_device":
                cuda_devices.append(ev)
            elif kind == "cuda_stream":
                cuda_streams.append(ev)
            elif kind == "tf_pipeline":
                tf_pipelines.append(ev)
            elif kind == "autotune":
                autotune.append(ev)
            elif kind == "fork_probe":
                fork_probes.append(ForkProbeRecord(pid=pid, t_fork=ev["t_fork"], t_forked=ev["t_forked"],
                                                   t_released=ev["t_released"], steps=ev["steps"],
                                                   minor_faults=ev.get("minor_faults"),
                                                   default_start_method=ev.get("default_start_method"),
                                                   child_pid=ev.get("child_pid")))
            elif kind == "tf_profile":
                tf_profiles.append(ev)
                if ev.get("error"):
                    warnings.append(f"TensorFlow's profiler gave no input waits in pid {pid}: {ev['error']}")
            elif kind == "offload":
                offloads.append(ev)
            elif kind == "shm":
                shm.append(ev)
            elif kind == "profile":
                prof = profiles.setdefault(pid, {"interval_s": ev.get("interval_s"), "samples": 0, "outside_s": 0.0,
                                                 "stacks": {}, "scope": ev.get("scope") or "worker", "timeline": [],
                                                 "wall_interval_s": None, "wait_outside_s": None, "runqueue_s": None,
                                                 "wait_unfiled_s": None})
                prof["samples"] += ev.get("samples") or 0
                prof["outside_s"] += ev.get("outside_s") or 0.0
                # The wall-clock sampler's (absent in older records, and where it was not armed: None, N/A)
                for name in ("wait_outside_s", "runqueue_s", "wait_unfiled_s"):
                    if isinstance(ev.get(name), (int, float)):
                        prof[name] = (prof[name] or 0.0) + ev[name]
                if isinstance(ev.get("wall_interval_s"), (int, float)):
                    prof["wall_interval_s"] = ev["wall_interval_s"]
                by_function: dict[str, float] = {}
                waits: dict[str, float] = {}
                for row in ev.get("stacks") or []:
                    # [site, function, call, cpu_s, samples] before the waits; [..., wait_s] since
                    if not (isinstance(row, list) and len(schema.PROFILE_STACK_COLUMNS) - 1 <= len(row)
                            <= len(schema.PROFILE_STACK_COLUMNS)):
                        continue
                    stack = dict(zip(schema.PROFILE_STACK_COLUMNS, row))
                    if isinstance(stack["cpu_s"], (int, float)) and isinstance(stack["samples"], (int, float)):
                        cell = prof["stacks"].setdefault((str(stack["site"]), str(stack["function"]), stack["call"]),
                                                         [0.0, 0, None])
                        cell[0] += stack["cpu_s"]
                        cell[1] += stack["samples"]
                        name = f"{stack['site']} {stack['function']}"
                        by_function[name] = by_function.get(name, 0.0) + stack["cpu_s"]
                        wait = stack.get("wait_s")
                        if isinstance(wait, (int, float)):
                            cell[2] = (cell[2] or 0.0) + wait
                            waits[name] = waits.get(name, 0.0) + wait
                if isinstance(ev.get("t"), (int, float)):  # the flush's time (older records: none)
                    wait_outside = ev.get("wait_outside_s")
                    prof["timeline"].append((float(ev["t"]), by_function, float(ev.get("outside_s") or 0.0),
                                             waits if isinstance(wait_outside, (int, float)) else None,
                                             float(wait_outside) if isinstance(wait_outside, (int, float)) else None))
            elif kind == "batch_parts":
                rows, slow = part_rows.setdefault(pid, ([], []))
                rows.extend(ev["rows"])
                for r in ev.get("slow") or []:
                    if isinstance(r, list) and len(r) == len(schema.SLOW_COLUMNS):
                        s = SlowSample._make(r)
                        if isinstance(s.t_start, (int, float)) and isinstance(s.seconds, (int, float)):
                            slow.append(s._replace(index=s.index if isinstance(s.index, int) else None))
            elif kind == "samples_unknown":
                unknown.setdefault(key, ev.get("reason"))
            elif kind == "warning":
                warnings.append(f"gpufeed in process {pid}: {ev.get('message')}")
            elif kind == "exit":
                exits[pid] = ev.get("reason")
                ends[pid] = ev
            if kind in ("exit", "memory"):
                readings = memory.setdefault(pid, {})
                readings.update((k, v) for k, v in ev.items() if k.endswith("_b") and isinstance(v, int))
    if not (run_dir / schema.EVENTS_DIR).is_dir():
        warnings.append(f"no {schema.EVENTS_DIR}/ folder: nothing was recorded inside the command")

    iterator_records = []
    pins_by_pid = {pid: PinRows.of(rows) for pid, rows in pin_rows.items()}
    for key, ev in sorted(iterators.items(), key=lambda kv: kv[1].get("t_created", 0.0)):
        steps = StepRows.of(step_rows.get(key, []))
        steps = steps[np.argsort(steps.index, kind="stable")]
        pin_thread = ev.get("pin_thread") if isinstance(ev.get("pin_thread"), int) else None
        pins = pins_by_pid.get(ev["pid"], PinRows.of([]))
        pins = pins[pins.thread == pin_thread] if pin_thread is not None else PinRows.of([])
        pins = pins[np.argsort(pins.t_start, kind="stable")]
        iterator_records.append(IteratorRecord(
            pid=ev["pid"], iter_id=ev["iter_id"], loader_id=ev.get("loader_id", 0),
            t_created=ev["t_created"], t_ready=ev.get("t_ready", ev["t_created"]),
            worker_pids=list(ev.get("worker_pids") or []),
            config=schema.LoaderConfig.from_dict(ev.get("config", {})),
            steps=steps, cuda=CudaRows.of(cuda_rows.get(key, [])),
            epoch_starts=sorted(epochs.get(key, [])), epoch_ends=sorted(epoch_ends.get(key, [])),
            role=ev.get("role"), role_why=ev.get("role_why"),
            samples_from=ev.get("samples_from"), samples_unknown=unknown.get(key),
            torch_threads=ev.get("torch_threads") if isinstance(ev.get("torch_threads"), int) else None,
            pin_thread=pin_thread, pins=PinRows.of(pins),
        ))
    autotune.sort(key=lambda ev: ev["t"])
    iterator_records = pools.file_pools(iterator_records, autotune)
    fetch_records = [FetchRecord(pid=pid, worker_id=f["worker_id"], torch_threads=f["torch_threads"],
                                 rows=FetchRows.of(f["rows"]))
                     for pid, f in sorted(fetches.items())]
    samples = _load_samples(run_dir / schema.SAMPLES_FILE, max(meta.cpu_count, 1), warnings)
    if not (meta.command or meta.end_reason or processes or iterators or fetches or len(samples)):
        raise RecordError(f"{run_dir} holds nothing usable: {schema.META_FILE} does not say what ran or how it "
                          f"ended, and no event or sample fits the run-record schema ({'; '.join(warnings)}).")
    if meta.cpu_count < 1:  # unknown (meta.json did not say): as many cores as the sampler saw
        meta.cpu_count = samples.cpu_pct.shape[1] or 1
    return RunRecord(
        run_dir=run_dir, meta=meta, processes=processes, iterators=iterator_records,
        fetches=fetch_records, h2d=H2dRows.of(h2d_rows),
        samples=samples,
        stalls=stalls, exits=exits, ends=ends, warnings=warnings, overrides=overrides, memory=memory,
        cuda_devices=cuda_devices, cuda_streams=cuda_streams,
        tf_pipelines=tf_pipelines, tf_profiles=tf_profiles, offloads=sorted(offloads, key=lambda e: e["t"]),
        autotune=autotune, fork_probes=fork_probes, shm=sorted(shm, key=lambda e: e["t"]),
        profiles=profiles,
        batch_parts={pid: BatchParts(pid, PartRows.of(rows), slow) for pid, (rows, slow) in part_rows.items()},
        loops={pid: LoopRows.of(rows) for pid, rows in loop_rows.items()},
    )


def _num(value: Any) -> float:
    return np.nan if value is None else float(value)


def _load_samples(path: Path, cpu_count: int, warnings: list[str]) -> Samples:
    lines = list(_lines(path, warnings, validate.sample_problem)) if path.exists() else []
    if not path.exists():
        warnings.append(f"no {schema.SAMPLES_FILE}: no host or GPU timeline")
    cores = max((len(s.get("cpu_pct") or []) for s in lines), default=cpu_count)
    cpu = np.full((len(lines), cores), np.nan)
    gpus: dict[int, dict[str, np.ndarray]] = {}
    gpu_procs: list[dict[int, dict[int, int]]] = []
    gpm_na: dict[int, str] = {}
    for i, s in enumerate(lines):
        row = [_num(v) for v in (s.get("cpu_pct") or [])][:cores]
        cpu[i, :len(row)] = row
        procs_here: dict[int, dict[int, int]] = {}
        for g in s.get("gpus") or []:
            idx = int(g.get("index", 0))
            arrays = gpus.setdefault(idx, {k: np.full(len(lines), np.nan)
                                           for k in schema.GPU_SERIES})
            for k in arrays:
                arrays[k][i] = _num(g.get(k))
            procs_here[idx] = {int(p): int(b) for p, b in (g.get("procs") or {}).items()}
            if g.get("gpm_na") and not str(g["gpm_na"]).startswith("first sample"):
                gpm_na[idx] = str(g["gpm_na"])
        gpu_procs.append(procs_here)
    totals = [s.get("mem_total_b") for s in lines if s.get("mem_total_b")]
    return Samples(
        t=np.array([_num(s.get("t")) for s in lines]),
        cpu_pct=cpu,
        iowait_pct=np.array([_num(s.get("iowait_pct")) for s in lines]),
        mem_used_b=np.array([_num(s.get("mem_used_b")) for s in lines]),
        mem_total_b=float(totals[-1]) if totals else np.nan,
        procs=[_proc_rows(s.get("procs") or []) for s in lines],
        gpus=gpus,
        gpu_procs=gpu_procs, gpm_na=gpm_na,
        others=[(float(s["t"]), [OtherRow.of(r) for r in s["others"]])
                for s in lines if isinstance(s.get("others"), list) and s.get("t") is not None],
    )


def _proc_rows(rows: list[list[Any]]) -> list[ProcRow]:
    make, width = ProcRow._make, len(ProcRow._fields)
    return [make(row) if len(row) == width else ProcRow.of(row) for row in rows]


def load_step_rows(run_dir: str | Path) -> dict[tuple[int, int], StepRows]:
    """(pid, iter_id) -> the steps flushed so far, in the order written: for a run still going,
    without reading the rest of its record."""
    rows: dict[tuple[int, int], list] = {}
    for path in sorted((Path(run_dir) / schema.EVENTS_DIR).glob("*.jsonl")):
        for ev in _lines(path, []):
            if ev.get("kind") == "steps":
                rows.setdefault((ev.get("pid"), ev.get("iter_id")), []).extend(ev.get("rows", []))
    return {key: StepRows.of(r) for key, r in rows.items()}


def load_tf_steps_seen(run_dir: str | Path) -> list[dict[str, Any]]:
    """The ``tf_steps_seen`` events flushed so far (a TensorFlow process's steps, before its trace is read)."""
    return [ev for path in sorted((Path(run_dir) / schema.EVENTS_DIR).glob("*.jsonl"))
            for ev in _lines(path, []) if ev.get("kind") == "tf_steps_seen"]
