"""The probe's configuration, and the environment that carries it from the runner to the probe.

``gpufeed diagnose`` (and tune's and batch-size's trials) write it with ``to_env`` into the
command's environment, so every Python process under the command reads the same with ``from_env``
(the probe, in ``install.py``; the TensorFlow probe). A new setting is one field here: its
environment variable and how it is read.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping


def _carried(env: str, parse: Callable[[str], Any], default: Any = None) -> Any:
    return field(default=default, metadata={"env": env, "parse": parse})


@dataclass(frozen=True)
class ProbeConfig:
    # Where the events go; unset: nothing is measured (``gpufeed run`` only overrides settings).
    run_dir: str | None = _carried("GPUFEED_RUN_DIR", str)
    # End the process after this many training batches (warm-up included): --steps.
    max_steps: int | None = _carried("GPUFEED_MAX_STEPS", int)
    # End the process this long after the warm-up (tune's and batch-size's trials).
    max_seconds: float | None = _carried("GPUFEED_MAX_SECONDS", float)
    # The warm-up that max_seconds counts from.
    warmup_steps: int = _carried("GPUFEED_WARMUP_STEPS", int, default=0)
    # Seconds without a batch before a loader counts as stuck; None: never.
    stall_timeout_s: float | None = _carried("GPUFEED_STALL_TIMEOUT", float)
    # The same for an iterator's first batch (worker start-up, a filling shuffle buffer).
    first_batch_timeout_s: float | None = _carried("GPUFEED_FIRST_BATCH_TIMEOUT", float)
    # tf.data settings for the training pipeline (JSON, ``tf_overrides.PipelineOverrides``): tune's
    # trials of a TensorFlow script, ``gpufeed run --config``.
    pipeline_overrides: str | None = _carried("GPUFEED_PIPELINE_OVERRIDES", str)
    # The sampling profiler's interval in seconds of CPU (workers, and the training process's next()
    # with num_workers=0; ``profiler.py``); None: its default; 0: off.
    profile_interval_s: float | None = _carried("GPUFEED_PROFILE_INTERVAL", float)

    def to_env(self) -> dict[str, str]:
        """The environment variables that carry the settings that are set."""
        return {f.metadata["env"]: str(getattr(self, f.name)) for f in fields(self)
                if getattr(self, f.name) is not None}

    @classmethod
    def env_of(cls, **values: Any) -> dict[str, str]:
        """The variables that carry just these settings (``to_env`` of the rest would carry defaults)."""
        return {f.metadata["env"]: str(values[f.name]) for f in fields(cls) if values.get(f.name) is not None}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ProbeConfig":
        """What ``to_env`` wrote (a variable that is unset, empty or unreadable keeps its default)."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            text = environ.get(f.metadata["env"])
            if text:
                try:
                    values[f.name] = f.metadata["parse"](text)
                except ValueError:
                    pass
        return cls(**values)

