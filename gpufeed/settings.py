"""The DataLoader settings gpufeed can override: the one vocabulary of tune, batch-size, the
overrides applied inside the training process, ``gpufeed run --config`` and the report.

At the bottom of the package (it imports nothing of gpufeed), so every layer may use it; standard
library only, because the probe imports it inside the user's process.
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, fields
from typing import Any


def random_stream_note(workers_before: int | None, workers_after: int | None) -> str | None:
    """What a change of ``num_workers`` does beyond speed, or None when it changes none.

    DataLoader seeds worker k with base_seed + k and hands batch b to worker b mod num_workers (without
    workers, the training process's own stream makes every batch): with another count, each batch's
    random augmentation draws from another stream. The samples and their order are kept (the sampler
    runs in the training process); a seeded run's augmented batches, and so its loss curve, differ
    from batch min(before, after) + 1 on: the batches before it are each their worker's first under
    both counts, the next one is not (with no workers on one side, from the first batch). Keeping
    them would need each worker to replay the streams of the count it replaces, one batch after
    another, which no parallel loader can do (tests/real/test_seeded_augment.py: 2 -> 3 workers)."""
    if workers_before is None or workers_after is None or workers_before == workers_after:
        return None
    first = min(workers_before, workers_after) + 1
    return (f"num_workers {workers_before} -> {workers_after} keeps every sample and its order, but each batch's "
            "random augmentation draws from another worker's random stream: a seeded run (torch.manual_seed) "
            f"gets other augmented batches than your settings give, and its loss curve differs from batch {first} "
            "on")


@dataclass(frozen=True)
class LoaderSettings:
    """DataLoader keywords gpufeed can set. ``None`` leaves the user's value as it is."""

    num_workers: int | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    pin_memory: bool | None = None
    batch_size: int | None = None
    worker_threads: int | None = None   # cap on threads inside each worker (torch and thread pools)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "settings") -> "LoaderSettings":
        """Build from JSON; raises ``ValueError`` naming an unknown key or a wrong type."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be a JSON object, got {type(data).__name__}")
        types = {f.name: (bool if f.name in ("persistent_workers", "pin_memory") else int) for f in fields(cls)}
        for key, value in data.items():
            if key not in types:
                raise ValueError(f"unknown DataLoader setting {key!r} in {where} "
                                 f"(known: {', '.join(sorted(types))})")
            wanted = types[key]
            # bool is an int in Python: refuse it where a number is meant, and the reverse.
            if value is not None and (type(value) is not wanted):
                raise ValueError(f"{where}.{key} must be {'true or false' if wanted is bool else 'a whole number'}, "
                                 f"got {value!r}")
            if wanted is int and value is not None and value < (0 if key == "num_workers" else 1):
                raise ValueError(f"{where}.{key} must be at least {0 if key == 'num_workers' else 1}, got {value}")
        return cls(**data)

    def label(self) -> str:
        """A short name for tables and directories, e.g. ``w8 p4 persistent t1``."""
        parts = []
        if self.num_workers is not None:
            parts.append(f"w{self.num_workers}")
        if self.prefetch_factor is not None and (self.num_workers or 0) > 0:
            parts.append(f"p{self.prefetch_factor}")
        if self.persistent_workers and (self.num_workers or 0) > 0:
            parts.append("persistent")
        if self.pin_memory:
            parts.append("pinned")
        if self.worker_threads is not None and (self.num_workers or 0) > 0:
            parts.append(f"t{self.worker_threads}")
        if self.batch_size is not None:
            parts.append(f"b{self.batch_size}")
        return " ".join(parts) or "as is"

    def label_beside_workers(self) -> str:
        """The settings other than num_workers, in words, naming a line of trials plotted against
        num_workers: ``prefetch 4 · persistent``, or ``the script's own`` when none is set."""
        parts = [f"prefetch {self.prefetch_factor}" if self.prefetch_factor is not None else None,
                 "persistent" if self.persistent_workers else None,
                 "pin_memory" if self.pin_memory else None,
                 f"{self.worker_threads} threads/worker" if self.worker_threads is not None else None]
        return " · ".join(p for p in parts if p) or "the script's own"


AUTOTUNE = -1  # tf.data.AUTOTUNE: TensorFlow picks the value itself, and keeps adjusting it


@dataclass(frozen=True)
class PipelineSettings:
    """The ``tf.data`` knobs gpufeed can set on the training pipeline. ``None`` leaves the script's
    own value; ``AUTOTUNE`` (-1) is ``tf.data.AUTOTUNE``.

    - ``parallel_calls``: ``num_parallel_calls`` of every ``map`` and ``interleave`` of the pipeline
      (an interleave's capped at the ``cycle_length`` the script gives it), and of a ``batch`` that
      sets its own;
    - ``prefetch``: ``buffer_size`` of the ``prefetch`` that ends the pipeline (one is added at the
      end when it has none);
    - ``deterministic``, ``private_threadpool_size``, ``max_intra_op_parallelism``: the pipeline's
      ``tf.data.Options`` (``options.deterministic``, ``options.threading.*``).
    """

    parallel_calls: int | None = None
    prefetch: int | None = None
    deterministic: bool | None = None
    private_threadpool_size: int | None = None
    max_intra_op_parallelism: int | None = None

    framework = "tensorflow"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def config_dict(self) -> dict[str, Any]:
        """Every knob, ``None`` for the script's own: ``tune.json``'s ``config``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "settings") -> "PipelineSettings":
        """Build from JSON; raises ``ValueError`` naming an unknown key or a wrong value."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        for key, value in data.items():
            if key not in known:
                raise ValueError(f"unknown tf.data setting {key!r} in {where} (known: {', '.join(sorted(known))})")
            if value is None:
                continue
            if key == "deterministic":
                if type(value) is not bool:
                    raise ValueError(f"{where}.{key} must be true or false, got {value!r}")
                continue
            if type(value) is not int:
                raise ValueError(f"{where}.{key} must be a whole number, got {value!r}")
            lowest = AUTOTUNE if key in ("parallel_calls", "prefetch") else 1
            if value < lowest or value == 0:
                allowed = "at least 1, or -1 for tf.data.AUTOTUNE" if lowest == AUTOTUNE else "at least 1"
                raise ValueError(f"{where}.{key} must be {allowed}, got {value}")
        return cls(**data)

    def label(self) -> str:
        """A short name for tables and directories, e.g. ``parallel 8 prefetch AUTOTUNE unordered``."""
        def value(v: int) -> str:
            return "AUTOTUNE" if v == AUTOTUNE else str(v)
        parts = []
        if self.parallel_calls is not None:
            parts.append(f"parallel {value(self.parallel_calls)}")
        if self.prefetch is not None:
            parts.append(f"prefetch {value(self.prefetch)}")
        if self.deterministic is not None:
            parts.append("ordered" if self.deterministic else "unordered")
        if self.private_threadpool_size is not None:
            parts.append(f"pool {self.private_threadpool_size}")
        if self.max_intra_op_parallelism is not None:
            parts.append(f"intra-op {self.max_intra_op_parallelism}")
        return " ".join(parts) or "as is"

    def label_beside_workers(self) -> str:
        """The settings other than num_parallel_calls (the report's axis), naming a line of trials."""
        return dataclasses.replace(self, parallel_calls=None).label().replace("as is", "the script's own")
