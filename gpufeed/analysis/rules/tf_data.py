"""Rules for TensorFlow's ``tf.data`` pipelines: what in the pipeline's structure makes the loop wait.

They read the training iterator's ``tf_pipeline`` event (its stages as the user wrote them, its
``tf.data.Options``, and the pipeline as TensorFlow ran it after its graph rewrites, from the
profiler's trace) and speak only when the loop waited for input (``DATA_WAIT_SHARE_FLAG``, the
profiler's own "moderately input-bound" bar). Each fix is written in TensorFlow's words, from its
guide "Better performance with the tf.data API".
"""
from __future__ import annotations

from typing import Any

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import Finding, severity_for
from gpufeed.analysis.metrics import Metrics
from gpufeed.units import fmt

AUTOTUNE = -1
CACHEABLE_WORK = ("Map", "ParallelMap", "Interleave", "ParallelInterleave", "FlatMap", "Generator",
                  "TFRecord", "TextLine", "FixedLengthRecord")
PARALLEL_MAPS = ("ParallelMap", "ParallelInterleave", "ParallelBatch", "MapAndBatch")


def pipeline(ctx: Context) -> dict[str, Any] | None:
    """The training iterator's tf.data pipeline, when the training loop iterated one."""
    t = ctx.training
    if t is None or t.config.get("sampler") != "tf.data":
        return None
    return next((p for p in ctx.record.tf_pipelines
                 if p.get("pid") == t.pid and p.get("loader_id") == t.loader_id), None)


def _input_bound_pipeline(ctx: Context) -> dict[str, Any] | None:
    m = ctx.metrics
    if m.data_wait_share is None or m.data_wait_share < th.DATA_WAIT_SHARE_FLAG:
        return None
    return pipeline(ctx)


def _wait(m: Metrics) -> str:
    return (f"The training loop waited for input {fmt(m.data_wait_share, '.0%')} of the time "
            f"(p50 step {fmt(m.step_time_p50_ms, '.1f')} ms, of which {fmt(m.data_wait_p50_ms, '.1f')} ms in "
            "IteratorGetNext)")


def _evidence(m: Metrics, p: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"data_wait_share": m.data_wait_share, "step_time_p50_ms": m.step_time_p50_ms,
            "data_wait_p50_ms": m.data_wait_p50_ms, "samples_per_s": m.samples_per_s,
            "pipeline": " <- ".join(s.get("op", "?") for s in p.get("stages", [])),
            "tf_ran": p.get("tf_name"), **more}


def _ran_parallel(p: dict[str, Any], op: str) -> bool:
    """TensorFlow may have parallelised a sequential map itself (map_parallelization, map-and-batch
    fusion with autotuned parallelism): the trace's stage events say what ran."""
    for name, stats in (p.get("tf_stages") or {}).items():
        stage = name.rsplit("::", 1)[-1]
        if op in stage and stage.startswith(PARALLEL_MAPS) and (stats.get("parallelism") or 0) > 1:
            return True
    return False


def _python_stage(stage: dict[str, Any]) -> bool:
    return bool(stage.get("python_ops")) or stage.get("op") in ("Generator",)


def python_stage(ctx: Context) -> Finding | None:
    p = _input_bound_pipeline(ctx)
    if p is None:
        return None
    stages = [s for s in p.get("stages", []) if _python_stage(s)]
    if not stages:
        return None
    m = ctx.metrics
    ops = sorted({"Dataset.from_generator" if op == "GeneratorDataset" else op
                  for s in stages for op in s.get("python_ops", [])})
    return Finding(
        id="tf_python_stage", severity=severity_for(m.data_wait_share), cost_share=m.data_wait_share,
        message=(f"{_wait(m)}. The pipeline runs Python inside it ({', '.join(ops) or 'a generator'} in "
                 f"{', '.join(s['op'] for s in stages)}): Python holds the GIL, so that stage runs on one core "
                 "whatever num_parallel_calls says, and it competes with the training loop for the interpreter."),
        recommendation=("Write the stage with TensorFlow ops (tf.io, tf.image, tf.strings) instead of "
                        "tf.py_function / tf.numpy_function / Dataset.from_generator, then "
                        "map(fn, num_parallel_calls=tf.data.AUTOTUNE); or run the Python work once, save the result "
                        "(tf.data.Dataset.save, TFRecord) and read that, or .cache() it."),
        evidence=_evidence(m, p, python_stages=[s["op"] for s in stages], python_ops=ops),
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG},
    )


def sequential_map(ctx: Context) -> Finding | None:
    p = _input_bound_pipeline(ctx)
    if p is None:
        return None
    stages = [s for s in p.get("stages", []) if s.get("op") in ("Map", "Interleave")
              and not _python_stage(s) and not _ran_parallel(p, s["op"])]
    if not stages:
        return None
    m = ctx.metrics
    why = ("its function is stateful (random ops), so TensorFlow's map_parallelization left it sequential"
           if any(s.get("stateful") for s in stages) else "TensorFlow ran it sequentially")
    ops = ", ".join(s["op"].lower() for s in stages)
    return Finding(
        id="tf_sequential_map", severity=severity_for(m.data_wait_share), cost_share=m.data_wait_share,
        message=(f"{_wait(m)}. The pipeline's {ops} has no num_parallel_calls and {why}: one element at a time "
                 f"on one of {m.cpu_count} cores."),
        recommendation=(f"dataset.{stages[0]['op'].lower()}(fn, num_parallel_calls=tf.data.AUTOTUNE) (add "
                        "deterministic=False if the order of elements does not matter), and end the pipeline "
                        "with .prefetch(tf.data.AUTOTUNE)."),
        evidence=_evidence(m, p, sequential_stages=[s["op"] for s in stages], cpu_count=m.cpu_count),
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG},
    )


def no_prefetch(ctx: Context) -> Finding | None:
    p = _input_bound_pipeline(ctx)
    # Options set on the finished pipeline (with_options) are no stage of its own.
    stages = [s for s in p.get("stages", []) if s.get("op") != "Options"] if p else []
    if not stages or stages[0].get("op") == "Prefetch":
        return None
    if any(name.split("::")[2:3] == ["Prefetch"] for name in p.get("tf_stages") or {}):
        return None  # TensorFlow injected one (inject_prefetch, on with autotune)
    m = ctx.metrics
    return Finding(
        id="tf_no_prefetch", severity=severity_for(m.data_wait_share), cost_share=m.data_wait_share,
        message=(f"{_wait(m)}. The pipeline does not end with prefetch ({stages[0].get('op')} is its last stage), "
                 "so no buffer of ready batches absorbs a slow one: at most the batch its last stage works on "
                 "is made ahead of the step."),
        recommendation="End the pipeline with dataset.prefetch(tf.data.AUTOTUNE).",
        evidence=_evidence(m, p, last_stage=stages[0].get("op")),
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG},
    )


def cache_small_dataset(ctx: Context) -> Finding | None:
    p = _input_bound_pipeline(ctx)
    if p is None or any(s.get("op") == "Cache" for s in p.get("stages", [])):
        return None
    t = ctx.training
    if t.iterators < 2 or p.get("cardinality") is None:
        return None   # one epoch measured: nothing was read twice
    # Worth keeping: deterministic work (reading files, a map without random ops, a generator).
    cacheable = [s["op"] for s in p.get("stages", []) if s.get("op") in CACHEABLE_WORK and not s.get("stateful")]
    if not cacheable:
        return None
    m = ctx.metrics
    random_stages = [s["op"] for s in p.get("stages", []) if s.get("stateful")]
    where = (f"after {cacheable[0]} and before the random stages ({', '.join(random_stages)}), so augmentation "
             "still differs each epoch" if random_stages else f"after {cacheable[0]}")
    return Finding(
        id="tf_cache", severity=severity_for(m.data_wait_share), cost_share=m.data_wait_share,
        message=(f"{_wait(m)}. The pipeline made the same {p['cardinality']} batches again in each of "
                 f"{t.iterators} epochs measured: nothing is cached."),
        recommendation=(f"dataset.cache() {where}, if the data fits in memory (or cache(filename) on local disk)."),
        evidence=_evidence(m, p, epochs=t.iterators, cardinality=p["cardinality"], cacheable_stages=cacheable),
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG, "epochs_at_least": 2},
    )


def deterministic_order(ctx: Context) -> Finding | None:
    p = _input_bound_pipeline(ctx)
    if p is None or (p.get("options") or {}).get("deterministic") is False:
        return None
    stages = [s for s in p.get("stages", []) if s.get("num_parallel_calls") not in (None, 1)
              and s.get("deterministic") in ("default", "true")]
    if not stages:
        return None
    m = ctx.metrics
    return Finding(
        id="tf_deterministic", severity=severity_for(m.data_wait_share), cost_share=None,
        message=(f"{_wait(m)}. Its parallel stages ({', '.join(s['op'] for s in stages)}) keep the elements in order: "
                 "one slow element holds back those already made after it."),
        recommendation=("If the order of elements does not matter: options = tf.data.Options(); "
                        "options.deterministic = False; dataset = dataset.with_options(options) "
                        "(or deterministic=False in each map)."),
        evidence=_evidence(m, p, ordered_stages=[s["op"] for s in stages]),
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG},
    )


def autotune_off(ctx: Context) -> Finding | None:
    p = _input_bound_pipeline(ctx)
    if p is None:
        return None
    options, root, m = p.get("options") or {}, p.get("tf_root") or {}, ctx.metrics
    budget = root.get("cpu_budget") if isinstance(root.get("cpu_budget"), int) else options.get("autotune_cpu_budget")
    if options.get("autotune") is False:
        what = "autotune is disabled (options.autotune.enabled = False)"
    elif budget and budget < m.cpu_count:
        what = f"autotune may use {budget} of the {m.cpu_count} cores (options.autotune.cpu_budget)"
    else:
        return None
    return Finding(
        id="tf_autotune_off", severity=severity_for(m.data_wait_share), cost_share=m.data_wait_share,
        message=f"{_wait(m)}, and {what}: tf.data cannot raise the parallelism and buffers it needs.",
        recommendation=("options = tf.data.Options(); options.autotune.enabled = True; "
                        "options.autotune.cpu_budget = 0 (all cores); dataset = dataset.with_options(options), "
                        "with num_parallel_calls=tf.data.AUTOTUNE and prefetch(tf.data.AUTOTUNE)."),
        evidence=_evidence(m, p, autotune=options.get("autotune"), cpu_budget=budget, cpu_count=m.cpu_count),
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG},
    )
