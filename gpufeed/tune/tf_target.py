"""Which tf.data pipeline a tune of a TensorFlow script changes, and whether a trial really ran with
its settings: both read from the run record's ``tf_pipeline`` event of the training iterator (the
pipeline the step loop or ``fit`` consumed), whose stages carry the sites where the script made them
(``measure/inside/tf_overrides.py``) and what gpufeed changed in them.
"""
from __future__ import annotations

from typing import Any

from gpufeed.measure.inside.tf_overrides import TUNABLE_OPS, PipelineOverrides, parallel_calls
from gpufeed.settings import AUTOTUNE, PipelineSettings


class PipelineNotLocated(Exception):
    """The training pipeline's stages carry no sites: the settings could not be aimed at it."""


def training_pipeline(record: Any, training: Any) -> dict[str, Any] | None:
    """The training iterator's pipeline in the record (its ``tf_pipeline`` event), or None."""
    if training is None or training.config.get("sampler") != "tf.data":
        return None
    return next((p for p in record.tf_pipelines
                 if p.get("pid") == training.pid and p.get("loader_id") == training.loader_id), None)


def pipeline_target(pipeline: dict[str, Any] | None) -> PipelineOverrides:
    """Where the settings go: the call that made the dataset the loop iterates (its last stage), and
    the ``map`` / ``interleave`` (and parallel ``batch``) stages of that pipeline, by their sites."""
    stages = (pipeline or {}).get("stages") or []
    end = stages[0].get("site") if stages else None
    if end is None:
        why = (pipeline or {}).get("error") or ("its stages carry no call site (made outside the Python "
                                                "methods gpufeed wraps, e.g. by a distribution strategy)")
        raise PipelineNotLocated(f"the training tf.data pipeline could not be located in the script: {why}")
    sites = tuple(dict.fromkeys(s["site"] for s in stages if s.get("op") in TUNABLE_OPS and s.get("site")))
    return PipelineOverrides(PipelineSettings(), end=end, stages=sites)


def keeps_order(pipeline: dict[str, Any] | None) -> bool:
    """The script did not give up element order itself (``options.deterministic`` False)."""
    return ((pipeline or {}).get("options") or {}).get("deterministic") is not False


def not_applied(pipeline: dict[str, Any] | None, settings: PipelineSettings, target: PipelineOverrides) -> str | None:
    """Why the trial did not run with ``settings`` (its pipeline was made elsewhere this time, say),
    read from the pipeline it ran; None when every setting is in force."""
    if pipeline is None:
        return "no tf.data pipeline was iterated for training"
    stages = pipeline.get("stages") or []
    if target.end not in {s.get("site") for s in stages}:
        return f"the training pipeline was not made at {target.end} this time: was the script changed?"
    if settings.parallel_calls is not None:
        for stage in stages:
            method = TUNABLE_OPS.get(stage.get("op"))
            if method is None or stage.get("site") not in target.stages:
                continue
            wanted = parallel_calls(method, {"cycle_length": stage.get("cycle_length"), "num_parallel_calls": 1},
                                    settings.parallel_calls)
            if stage.get("num_parallel_calls") != wanted:
                return (f"the {method} at {stage['site']} ran with num_parallel_calls="
                        f"{stage.get('num_parallel_calls')}, not {_word(wanted)}")
    head = _ending(stages)
    if settings.prefetch is not None and not any(s.get("op") == "Prefetch" and s.get("buffer_size") == settings.prefetch
                                                 for s in head):
        return f"the pipeline did not end with prefetch({_word(settings.prefetch)})"
    options = pipeline.get("options") or {}
    for key in ("deterministic", "private_threadpool_size", "max_intra_op_parallelism"):
        wanted = getattr(settings, key)
        if wanted is not None and options.get(key) != wanted:
            return f"the pipeline ran with options {key}={options.get(key)}, not {wanted}"
    return None


def _ending(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stages at the end of the pipeline that only buffer or set options."""
    head = []
    for stage in stages:
        head.append(stage)
        if stage.get("op") not in ("Options", "Prefetch"):
            break
    return head


def _word(value: int | None) -> str:
    return "AUTOTUNE" if value == AUTOTUNE else str(value)
