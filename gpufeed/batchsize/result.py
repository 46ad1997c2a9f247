"""What ``gpufeed batch-size`` produces: the trials, the fit, the largest safe batch, the knee.

``BatchSizeResult.to_dict()`` is ``batch_size.json`` (schema ``gpufeed.batch_size/1``, ``docs/memory.md``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gpufeed import thresholds as th
from gpufeed.trials.outcome import FAILED, INTERRUPTED, OK

OOM = "oom"  # the trial ran out of memory: the batch does not fit
FORMAT = "gpufeed.batch_size/1"


@dataclass
class BatchTrial:
    """One run of the command at one batch size."""

    batch_size: int
    status: str                          # ok | oom (does not fit) | failed (another error)
    reason: str | None = None            # why it did not fit or failed
    peak_mem_b: int | None = None        # the training process's peak (CUDA: allocator; CPU: VmHWM)
    samples_per_s: float | None = None
    run_dir: str | None = None           # relative to the batch-size directory
    why: str = ""                        # why the search tried it
    elapsed_s: float = 0.0

    @property
    def fits(self) -> bool:
        return self.status == OK

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BatchTrial":
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class Fit:
    """memory = intercept_b + per_sample_b x batch, least squares over the measured peaks."""

    intercept_b: float
    per_sample_b: float
    r2: float
    linear: bool                         # r2 >= the threshold over at least three sizes
    points: int | None                   # None: read from a batch_size.json that does not say
    residual_b: float = 0.0              # root-mean-square distance of the peaks from the line

    def predict(self, limit_b: float) -> int | None:
        """The largest batch whose predicted memory stays within ``limit_b``."""
        if self.per_sample_b <= 0:
            return None
        # Rounded before flooring: a least-squares slope of 2.0000000000000004 must not turn 11 into 10.
        return math.floor(round((limit_b - self.intercept_b) / self.per_sample_b, th.BATCH_FIT_PREDICT_DIGITS))

    def to_dict(self) -> dict[str, Any]:
        return {"intercept_b": self.intercept_b, "per_sample_b": self.per_sample_b, "r2": self.r2,
                "linear": self.linear, "points": self.points, "residual_b": self.residual_b}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Fit":
        return cls(**{"points": None, **_known(cls, d)})


@dataclass
class BatchSizeResult:
    command: list[str]
    device: str                          # cuda | cpu
    capacity_b: int
    target_share: float
    trials: list[BatchTrial]
    fit: Fit | None
    predicted: int | None                # the fit's largest batch within target_share x capacity
    largest_safe: int | None             # the largest batch that ran and fitted (verified)
    knee: int | None                     # the smallest batch within the knee tolerance of the best throughput
    method: str = "fit"                  # fit | search (memory not linear in batch size)
    site: str | None = None              # file:line of the training DataLoader
    yours: int | None = None             # the script's own batch size
    max_batch: int | None = None         # the dataset's length, when it capped the search
    stopped: str | None = None           # None, "max_trials" or "interrupted"
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def limit_b(self) -> float:
        return self.capacity_b * self.target_share

    def trial(self, batch_size: int | None) -> BatchTrial | None:
        return next((t for t in self.trials if t.batch_size == batch_size and t.fits), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": FORMAT, "command": self.command, "device": self.device, "capacity_b": self.capacity_b,
            "target_share": self.target_share,
            "trials": [asdict(t) for t in self.trials],
            "fit": self.fit.to_dict() if self.fit is not None else None,
            "predicted": self.predicted, "largest_safe": self.largest_safe, "knee": self.knee,
            "method": self.method, "site": self.site, "yours": self.yours, "max_batch": self.max_batch,
            "stopped": self.stopped, "elapsed_s": round(self.elapsed_s, 3), "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "BatchSizeResult":
        """``batch_size.json`` read back (``validate.BATCH_SIZE_DOC`` checked first). A field the
        class requires and the file lacks raises ``TypeError``; the others take their defaults."""
        fit = doc.get("fit")
        return cls(**{**_known(cls, doc), "trials": [BatchTrial.from_dict(t) for t in doc["trials"]],
                      "fit": Fit.from_dict(fit) if fit is not None else None})


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """The fields of the dataclass ``cls`` that ``d`` holds (a later gpufeed may write more)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}
