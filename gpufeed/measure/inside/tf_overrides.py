"""tf.data settings overridden at construction time, without editing the user's script.

``gpufeed tune`` (its trials of a TensorFlow script) and ``gpufeed run --config`` pass the settings
in the probe configuration (``ProbeConfig.pipeline_overrides``: JSON). The dataset methods that build
a pipeline (``map``, ``interleave``, ``batch``, ``prefetch``, and the others that only pass elements
on) are wrapped: each stage made notes its call site (``file:line`` of the user's ``.map(...)``,
read back by ``tf_pipeline.describe``), and a stage made at one of the target's sites gets the
settings before TensorFlow sees its arguments:

- ``num_parallel_calls`` of each ``map`` and ``interleave`` at a target stage site (capped at an
  interleave's own ``cycle_length``: more calls than the cycle TensorFlow refuses, and the cycle
  decides which elements are mixed, so it is the script's), and of a ``batch`` there that sets its own;
- at the ``end`` site (the call that makes the dataset the training loop iterates): the ``prefetch``
  buffer (its own when it is a ``prefetch``, else one is added after it), then the pipeline's
  ``tf.data.Options`` (``deterministic``, ``threading.private_threadpool_size``,
  ``threading.max_intra_op_parallelism``), merged over the script's own (the later options win).

What was changed is kept on the dataset object (``_gpufeed_override``), so the run record's pipeline
shows it. Standard library only at import: this module runs inside the user's process.
"""
from __future__ import annotations

import atexit
import inspect
import json
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

from gpufeed.measure.inside.roles import call_site
from gpufeed.measure.inside.probe_config import ProbeConfig
from gpufeed.settings import AUTOTUNE, PipelineSettings, parse_json

CONFIG_FORMAT = "gpufeed.pipeline-settings/1"
FRAMEWORK = "tensorflow"
# Methods whose stages can be tuned; the others are wrapped only to note where their stage was made
# (any of them can end the pipeline the loop iterates). Not ``apply``: its function is the user's
# code, whose own calls are the stages.
TUNED = ("map", "interleave", "batch", "prefetch")
NOTED = ("shuffle", "repeat", "cache", "take", "skip", "filter", "with_options", "padded_batch", "unbatch",
         "rebatch", "flat_map", "shard", "enumerate", "concatenate", "ignore_errors", "ragged_batch",
         "take_while", "unique", "scan", "group_by_window", "bucket_by_sequence_length", "window")
# The stages whose num_parallel_calls tune sets, as the run record names them (tf_pipeline.py), and
# the method that makes each: a batch only where the script parallelised it itself.
TUNABLE_OPS = {"Map": "map", "ParallelMap": "map", "Interleave": "interleave", "ParallelInterleave": "interleave",
               "ParallelBatch": "batch"}
SITE_ATTR = "_gpufeed_site"
OVERRIDE_ATTR = "_gpufeed_override"


@dataclass(frozen=True)
class PipelineOverrides:
    """Settings for the training pipeline: its stages made at ``stages`` (sites), ending at ``end``."""

    settings: PipelineSettings
    end: str | None = None
    stages: tuple[str, ...] = ()

    framework = FRAMEWORK

    def to_dict(self) -> dict[str, Any]:
        return {"format": CONFIG_FORMAT, "framework": FRAMEWORK, "site": self.end, "stages": list(self.stages),
                "settings": self.settings.to_dict()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def to_env(self) -> dict[str, str]:
        """The environment that carries these settings to the command (the probe configuration's)."""
        return ProbeConfig.env_of(pipeline_overrides=self.to_json())

    def target(self) -> str:
        return f"the tf.data pipeline made at {self.end}"

    @classmethod
    def from_json(cls, text: str, where: str = "the config") -> "PipelineOverrides":
        return cls.from_dict(parse_json(text, where), where)

    @classmethod
    def from_dict(cls, data: Any, where: str = "the config") -> "PipelineOverrides":
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be a JSON object")
        unknown = set(data) - {"format", "framework", "site", "stages", "settings", "samples_per_s", "speedup",
                               "command", "note"}
        if unknown:
            raise ValueError(f"unknown key {sorted(unknown)[0]!r} in {where} "
                             "(known: format, framework, site, stages, settings)")
        if data.get("format", CONFIG_FORMAT) != CONFIG_FORMAT:
            raise ValueError(f"{where} has format {data.get('format')!r}; tf.data settings are {CONFIG_FORMAT!r}")
        end = data.get("site")
        if not isinstance(end, str) or not end:
            raise ValueError(f"site in {where} must name where the training pipeline is made, like 'train.py:42' "
                             "(gpufeed tune writes it)")
        stages = data.get("stages", [])
        if not (isinstance(stages, list) and all(isinstance(s, str) for s in stages)):
            raise ValueError(f"stages in {where} must be a list of 'file:line' strings")
        return cls(PipelineSettings.from_dict(data.get("settings", {}), f"{where}: settings"), end, tuple(stages))


def is_pipeline_config(data: Any) -> bool:
    """Whether a settings file (``best-config.json``) is for tf.data rather than a DataLoader."""
    return isinstance(data, dict) and (data.get("framework") == FRAMEWORK or data.get("format") == CONFIG_FORMAT)


def parallel_calls(method: str, arguments: dict[str, Any], value: int) -> int | None:
    """The ``num_parallel_calls`` to give this stage, or None to leave it: a ``batch`` only where the
    script parallelised it; an ``interleave`` no higher than its own ``cycle_length``."""
    if method == "batch" and arguments.get("num_parallel_calls") is None:
        return None
    if method == "interleave":
        cycle = arguments.get("cycle_length")
        if isinstance(cycle, int) and cycle > 0 and value != AUTOTUNE:
            return min(value, cycle)
    return value


def _options(settings: PipelineSettings) -> Any:
    """The ``tf.data.Options`` these settings set, or None when they set none."""
    if settings.deterministic is None and settings.private_threadpool_size is None \
            and settings.max_intra_op_parallelism is None:
        return None
    import tensorflow as tf
    options = tf.data.Options()
    if settings.deterministic is not None:
        options.deterministic = settings.deterministic
    if settings.private_threadpool_size is not None:
        options.threading.private_threadpool_size = settings.private_threadpool_size
    if settings.max_intra_op_parallelism is not None:
        options.threading.max_intra_op_parallelism = settings.max_intra_op_parallelism
    return options


class _Applied:
    """What ``gpufeed run --config`` did, said on stderr: the pipeline it changed, once; at exit, when
    pipelines were made but none at the target's site, that the settings did nothing."""

    def __init__(self, overrides: PipelineOverrides, say: bool) -> None:
        self.overrides, self.say = overrides, say
        self.stages: list[str] = []       # "map at train.py:30: num_parallel_calls=8"
        self.ends = 0
        self.elsewhere: list[str] = []    # sites where other pipelines ended (made their last stage)
        if say:
            atexit.register(self.at_exit)

    def stage(self, method: str, site: str, changed: dict[str, Any]) -> None:
        text = f"{method} at {site}: " + ", ".join(f"{k}={_word(v)}" for k, v in changed.items())
        if text not in self.stages:
            self.stages.append(text)

    def end(self, changed: dict[str, Any]) -> None:
        self.ends += 1
        if not self.say or self.ends > 1:
            return
        parts = self.stages + [_ending_words(k, v) for k, v in changed.items()]
        sys.stderr.write(f"gpufeed: applied {self.overrides.settings.label()} to {self.overrides.target()}"
                         f" ({'; '.join(parts) or 'nothing to change in it'})\n")

    def made(self, site: str | None) -> None:
        if site is not None and site != self.overrides.end and site not in self.elsewhere:
            self.elsewhere.append(site)

    def at_exit(self) -> None:
        if self.ends or not (self.elsewhere or self.stages):
            return
        changed = f" (only its stages: {'; '.join(self.stages)})" if self.stages else ""
        sys.stderr.write(f"gpufeed: the tf.data settings were NOT applied{changed}: no pipeline was made at "
                         f"{self.overrides.end}; this run made tf.data stages at {', '.join(self.elsewhere[:5])}. The "
                         "script changed since the config was made, or runs from another directory: run `gpufeed "
                         "tune` again.\n")


def _ending_words(key: str, value: Any) -> str:
    if key == "prefetch_added":
        return f"prefetch({_word(value)}) added at its end"
    if key == "buffer_size":
        return f"its prefetch buffer_size={_word(value)}"
    return "options " + ", ".join(f"{k}={v}" for k, v in value.items())


def _word(value: Any) -> str:
    return "AUTOTUNE" if value == AUTOTUNE and not isinstance(value, bool) else str(value)


_local = threading.local()  # depth of wrapped calls: a stage made by TensorFlow inside one is not the user's


def patch_datasets(overrides: PipelineOverrides | None, say: bool) -> None:
    """Wrap the dataset methods (idempotent): note each stage's call site; apply ``overrides``."""
    from tensorflow.python.data.ops import dataset_ops
    import tensorflow

    dataset_cls = dataset_ops.DatasetV2
    if getattr(dataset_cls.map, "_gpufeed_original", None) is not None:
        return
    skip = (os.path.dirname(os.path.abspath(tensorflow.__file__)) + os.sep,
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep)
    applied = _Applied(overrides, say) if overrides is not None else None
    originals = {name: getattr(dataset_cls, name) for name in TUNED + NOTED if hasattr(dataset_cls, name)}

    def wrap(name: str, original: Any) -> Any:
        signature = inspect.signature(original)

        def method(self, *args, **kwargs):
            depth = getattr(_local, "depth", 0)
            if depth:
                return original(self, *args, **kwargs)
            site = call_site(skip, sys._getframe(1))
            _local.depth = 1
            try:
                if applied is None:
                    result = original(self, *args, **kwargs)
                    changed: dict[str, Any] = {}
                else:
                    result, changed = _apply(name, original, signature, self, args, kwargs, site)
            finally:
                _local.depth = 0
            try:
                setattr(result, SITE_ATTR, site)
                if changed:
                    setattr(result, OVERRIDE_ATTR, changed)
            except Exception:
                pass  # a dataset that refuses attributes: it is only not located
            return result

        method._gpufeed_original = original
        method.__wrapped__ = original
        method.__name__, method.__doc__ = name, original.__doc__
        return method

    def _apply(name, original, signature, self, args, kwargs, site):
        settings = overrides.settings
        changed: dict[str, Any] = {}
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:  # arguments TensorFlow refuses anyway: let it say so, in its own words
            return original(self, *args, **kwargs), changed
        arguments = bound.arguments
        if settings.parallel_calls is not None and site in overrides.stages and name in ("map", "interleave", "batch"):
            value = parallel_calls(name, arguments, settings.parallel_calls)
            if value is not None:
                arguments["num_parallel_calls"] = value
                changed["num_parallel_calls"] = value
                applied.stage(name, site, changed)
        is_end = site == overrides.end
        if is_end and name == "prefetch" and settings.prefetch is not None:
            arguments["buffer_size"] = changed["buffer_size"] = settings.prefetch
        result = original(*bound.args, **bound.kwargs)
        try:
            setattr(result, SITE_ATTR, site)  # the script's own stage, below what may be added after it
        except Exception:
            pass
        if not is_end:
            applied.made(site)
            return result, changed
        ending: dict[str, Any] = {k: v for k, v in changed.items() if k == "buffer_size"}
        if name != "prefetch" and settings.prefetch is not None:
            result = originals["prefetch"](result, settings.prefetch)
            changed["prefetch_added"] = ending["prefetch_added"] = settings.prefetch
        options = _options(settings)
        if options is not None:
            result = originals["with_options"](result, options)
            changed["options"] = ending["options"] = {k: v for k, v in settings.to_dict().items()
                                                      if k not in ("parallel_calls", "prefetch")}
        applied.end(ending)
        return result, changed

    for name, original in originals.items():
        setattr(dataset_cls, name, wrap(name, original))


def unpatch_datasets() -> None:
    """The dataset methods as TensorFlow defines them (tests)."""
    from tensorflow.python.data.ops import dataset_ops
    for name in TUNED + NOTED:
        original = getattr(getattr(dataset_ops.DatasetV2, name, None), "_gpufeed_original", None)
        if original is not None:
            setattr(dataset_ops.DatasetV2, name, original)


def from_env() -> PipelineOverrides | None:
    text = ProbeConfig.from_env().pipeline_overrides
    if not text:
        return None
    try:
        return PipelineOverrides.from_json(text, "the tf.data settings")
    except ValueError as error:
        sys.stderr.write(f"gpufeed: tf.data settings not applied: {error}\n")
        return None


def install_from_env() -> None:
    """Once TensorFlow is imported: note every stage's site (the probe's record names the training
    pipeline's stages by it) and apply the settings the environment carries, if any. Without a run
    directory (``gpufeed run --config``) what was applied is said on stderr; in a measured run the
    record's pipeline shows it."""
    config = ProbeConfig.from_env()
    overrides = from_env()
    if overrides is None and not config.run_dir:
        return
    patch_datasets(overrides, say=not config.run_dir)
