"""What a record line must look like to be read: one small type check per event kind and per file.

A line of valid JSON can still be wrong (a hand-edited file, a bug in another writer, a disk that
flipped a byte inside a number): ``{"t": 1.0, "cpu_pct": 5}``, a ``steps`` event whose ``rows`` is a
number. The reader checks every line here and skips what does not fit, so the analysis only ever
sees the types ``schema.py`` documents. Unknown kinds and unknown fields are allowed (newer writers
of the same schema version may add them); a field that is present must have its type.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Union

from gpufeed.record import schema

Check = Any  # a type hint (int, float | None, list[int], ...) or a callable(value) -> bool


def fits(value: Any, hint: Check) -> bool:
    """Whether a JSON value has the type ``hint`` says (int is not bool; float accepts int)."""
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(fits(value, h) for h in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(fits(v, item) for v in value)
    if origin is tuple:  # a tuple in the dataclass is a list in JSON: tuple[str, ...] only
        item = (typing.get_args(hint) or (Any,))[0]
        return isinstance(value, list) and all(fits(v, item) for v in value)
    if origin is dict:
        key, item = typing.get_args(hint) or (Any, Any)
        return isinstance(value, dict) and all(fits(k, key) and fits(v, item) for k, v in value.items())
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return bool(hint(value))


def _rows(width: int, required: int, cell: Check = float | None) -> Check:
    """Rows of ``required`` to ``width`` cells (older writers wrote fewer): the first ``required``
    (index, times) numbers, the others a number or null."""
    def check(value: Any) -> bool:
        return isinstance(value, list) and all(
            isinstance(row, list) and required <= len(row) <= width
            and all(fits(c, float if i < required else cell) for i, c in enumerate(row)) for row in value)
    return check


def _or_none(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _pid_map(value: Any) -> bool:
    """``{"<pid>": bytes}``: JSON keys are strings."""
    return isinstance(value, dict) and all(isinstance(k, str) and k.isdigit() and fits(v, int)
                                           for k, v in value.items())


# The type of each cell of a sample's rows, by column: ``procs`` and ``others``.
PROC_TYPES: dict[str, Any] = {"pid": int, "ppid": int | None, "cpu_pct": float | None, "threads": int | None,
                              "status": str | None, "rss_b": float | None}
OTHER_TYPES: dict[str, Any] = {"pid": int, "name": str, "cores": (int, float)}  # isinstance's types


def _proc_rows(value: Any) -> bool:
    row_types = tuple(PROC_TYPES.values())
    return isinstance(value, list) and all(
        isinstance(row, list) and len(row) == len(row_types) and all(map(fits, row, row_types)) for row in value)


_GPU = {"index": int, "util_pct": float | None, "mem_used_b": float | None, "mem_total_b": float | None,
        "procs": _or_none(_pid_map)}


def _gpus(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(g, dict) and not fields_problem(g, _GPU, required=("index",))
                                           for g in value)


# Stall: the probe's marker, copied into meta.json with the sampler's view of the processes.
STALL = {"pid": int | None, "iter_id": int | None, "t_request": float | None, "waited_s": float | None,
         "worker_pids": list[int] | None, "first_batch": bool | None, "processes": list[dict] | None,
         "tf_call": str | None}

# kind -> (required fields, optional fields); each field -> its type.
EVENTS: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    "process": ({"pid": int}, {"ppid": int | None, "argv": list[str] | None, "rank": int | None,
                               "local_rank": int | None, "world_size": int | None, "torch_version": str | None,
                               "t": float | None, "host": str | None}),
    "iterator": ({"pid": int, "iter_id": int, "t_created": float, "config": dict},
                 {"loader_id": int, "t_ready": float, "worker_pids": list[int] | None, "torch_threads": int | None,
                  "pin_thread": int | None}),
    "epoch": ({"pid": int, "iter_id": int, "t": float}, {}),
    "epoch_end": ({"pid": int, "iter_id": int, "t_request": float, "t": float}, {}),
    "steps": ({"pid": int, "iter_id": int, "rows": _rows(len(schema.STEP_COLUMNS), 3)}, {}),  # index, t_request, t_deliver
    "cuda": ({"pid": int, "iter_id": int, "rows": _rows(len(schema.CUDA_COLUMNS), 1)}, {}),   # index
    "fetches": ({"pid": int, "rows": _rows(len(schema.FETCH_COLUMNS), 2)},                   # t_start, t_end
                {"worker_id": int | None, "torch_threads": int | None}),
    "h2d": ({"pid": int, "rows": _rows(len(schema.H2D_COLUMNS), 2, float | bool | None)}, {}),  # t, bytes
    "loop": ({"pid": int, "rows": _rows(len(schema.LOOP_COLUMNS), 3)}, {}),  # part, t_start, t_end
    "stall": ({"pid": int}, STALL),
    "override": ({"pid": int}, {"site": str | None, "settings": dict | None, "refused": dict | None}),
    "exit": ({"pid": int}, {"t": float | None, "reason": str | None, "exit_code": int | None, "error": str | None}),
    "memory": ({"pid": int}, {"t": float | None}),
    "profile": ({"pid": int, "samples": int}, {"interval_s": float | None, "outside_s": float | None, "stacks": list | None,
                                                  "wall_interval_s": float | None, "wait_outside_s": float | None,
                                                  "wait_unfiled_s": float | None, "runqueue_s": float | None}),
    "pins": ({"pid": int, "rows": _rows(len(schema.PIN_COLUMNS), 3)}, {}),  # thread, t_start, t_end
    "batch_parts": ({"pid": int, "rows": _rows(len(schema.PART_COLUMNS), 1)}, {"slow": list | None}),
    "shm": ({"pid": int, "t": float}, {"free_b": int | None, "total_b": int | None, "batch_b": int | None,
                                      "tensors": int | None, "worker_id": int | None, "path": str | None,
                                      "sharing_strategy": str | None}),
    "offload": ({"pid": int, "t": float}, {"batches": int, "by_node": dict[str, int], "resent": int | None,
                                          "workers_lost": int | None, "fell_back": str | None,
                                          "latency_ms_p50": float | None, "recent_latency_ms_p50": float | None,
                                          "make_ms_p50": float | None, "make_cpu_ms_p50": float | None,
                                          "workers": int | None}),
    "fork_probe": ({"pid": int, "t_fork": float, "t_forked": float, "t_released": float, "steps": int},
                   {"child_pid": int, "minor_faults": int | None, "default_start_method": str | None}),
    "autotune": ({"pid": int, "action": str, "t": float},
                 {"where": str, "label": str, "old": dict, "new": dict, "settings": dict, "period": dict}),
}

def _other_rows(value: Any) -> bool:
    """[[pid, name, cores], ...]: the busiest programs outside the command."""
    row_types = tuple(OTHER_TYPES.values())
    return isinstance(value, list) and all(
        isinstance(r, list) and len(r) == len(row_types) and all(map(isinstance, r, row_types)) for r in value)


SAMPLE = {"t": float, "cpu_pct": list[float | None] | None, "iowait_pct": float | None,
          "mem_used_b": float | None, "mem_total_b": float | None, "procs": _or_none(_proc_rows),
          "gpus": _or_none(_gpus), "others": _or_none(_other_rows)}

SAMPLER = {"interval_s": float | None, "cpu_s": float | None, "samples": int | None, "gpu_error": str | None}


def fields_problem(obj: dict[str, Any], types_: dict[str, Check], required: tuple[str, ...] | None = None) -> str | None:
    """The first field of ``obj`` that is missing (if required) or of the wrong type, said in words."""
    for name, hint in types_.items():
        if name not in obj:
            if required is not None and name in required:
                return f"{name!r} is missing"
            continue
        if not fits(obj[name], hint):
            return f"{name!r} is {_short(obj[name])}"
    return None


def event_problem(ev: dict[str, Any]) -> str | None:
    """Why an event line does not fit its kind, or None (unknown kinds are let through)."""
    kind = ev.get("kind")
    if not isinstance(kind, str):
        return f"'kind' is {_short(kind)}"
    spec = EVENTS.get(kind)
    if spec is None:
        return None
    required, optional = spec
    problem = fields_problem(ev, {**required, **optional}, required=tuple(required))
    if problem is None and ev.get("kind") == "iterator":
        problem = dataclass_problem(schema.LoaderConfig, ev["config"], "config")
    if problem is None and ev.get("kind") == "exit":
        bad = next((k for k, v in ev.items() if k.endswith("_b") and not fits(v, int | None)), None)
        problem = bad and f"{bad!r} is {_short(ev[bad])}"
    return problem and f"{ev['kind']!r} event: {problem}"


def sample_problem(s: dict[str, Any]) -> str | None:
    problem = fields_problem(s, SAMPLE, required=("t",))
    return problem and f"sample: {problem}"


def dataclass_problem(cls: type, d: Any, what: str) -> str | None:
    """Why ``d`` cannot be read as the dataclass ``cls`` (a missing required field, a wrong type)."""
    if not isinstance(d, dict):
        return f"{what} is {_short(d)}, not an object"
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name not in d:
            if required:
                return f"{what}: {f.name!r} is missing"
        elif not fits(d[f.name], hints[f.name]):
            return f"{what}: {f.name!r} is {_short(d[f.name])}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- tune.json and batch_size.json (docs/tune.md, docs/memory.md), as the report reads them -----------
def _list_of(spec: dict[str, Check], required: tuple[str, ...] = ()) -> Check:
    return lambda value: isinstance(value, list) and all(
        isinstance(item, dict) and fields_problem(item, spec, required) is None for item in value)


def _object(spec: dict[str, Check], required: tuple[str, ...] = ()) -> Check:
    return lambda value: isinstance(value, dict) and fields_problem(value, spec, required) is None


_TUNE_CONFIG = {"num_workers": int | None, "prefetch_factor": int | None, "persistent_workers": bool | None,
                "pin_memory": bool | None, "worker_threads": int | None,
                # a tf.data tune ("framework": "tensorflow")
                "parallel_calls": int | None, "prefetch": int | None, "deterministic": bool | None,
                "private_threadpool_size": int | None, "max_intra_op_parallelism": int | None}
_TUNE_RUN = {"run_dir": str | None, "samples_per_s": float | None, "status": str, "reason": str | None,
             "elapsed_s": float | None}
_TUNE_TRIAL = {"id": int, "label": str | None, "why": str | None, "config": _or_none(_object(_TUNE_CONFIG)),
               "status": str | None, "reason": str | None, "samples_per_s": float | None, "spread": float | None,
               "runs": _or_none(_list_of(_TUNE_RUN)), "elapsed_s": float | None}
_TUNE_SUMMARY = {"config": _or_none(_object(_TUNE_CONFIG)), "samples_per_s": float | None,
                 "spread": float | None, "trial": int | None, "speedup": float | None}
TUNE_DOC = {"command": list[str], "framework": str | None, "site": str | None, "baseline": _or_none(_object(_TUNE_SUMMARY)),
            "best": _or_none(_object(_TUNE_SUMMARY)), "dataloader_kwargs": dict | None,
            "trials": _list_of(_TUNE_TRIAL, ("id",)), "noise": float | None, "budget_s": float | None,
            "elapsed_s": float | None, "stopped": str | None, "confirmation": dict | None,
            "memory_cap": dict | None}

_BATCH_TRIAL = {"batch_size": int, "status": str, "reason": str | None, "peak_mem_b": float | None,
                "samples_per_s": float | None, "run_dir": str | None, "why": str | None, "elapsed_s": float | None}
_FIT = {"intercept_b": float, "per_sample_b": float, "r2": float, "linear": bool, "points": int | None,
        "residual_b": float | None}
BATCH_SIZE_DOC = {"command": list[str], "device": str, "capacity_b": float, "target_share": float,
                  "trials": _list_of(_BATCH_TRIAL, ("batch_size", "status")),
                  "fit": _or_none(_object(_FIT, ("intercept_b", "per_sample_b", "r2", "linear"))),
                  "predicted": int | None, "largest_safe": int | None, "knee": int | None, "method": str | None,
                  "site": str | None, "yours": int | None, "max_batch": int | None, "stopped": str | None,
                  "elapsed_s": float | None, "notes": list[str] | None}


def doc_problem(doc: dict[str, Any], spec: dict[str, Check], required: tuple[str, ...] = ("trials",)) -> str | None:
    """Why a tune.json or batch_size.json does not fit its schema (the first field), or None."""
    return fields_problem(doc, spec, required)
