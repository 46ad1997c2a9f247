"""What the analysis returns: findings with their evidence, and the diagnosis of a run."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpufeed import thresholds as th
from gpufeed.analysis.metrics import LoaderSummary, Metrics, json_safe, marked_training
from gpufeed.analysis.batches import BatchAnalysis
from gpufeed.analysis.whatif.types import WhatIf

HIGH, MEDIUM, LOW, INFO = "high", "medium", "low", "info"
SEVERITY_ORDER = {HIGH: 0, MEDIUM: 1, LOW: 2, INFO: 3}

BOTTLENECKS = ("input", "transfer", "host", "compute")


def severity_for(cost_share: float | None) -> str:
    if cost_share is None:
        return LOW
    if cost_share >= th.SEVERITY_HIGH_SHARE:
        return HIGH
    if cost_share >= th.SEVERITY_MEDIUM_SHARE:
        return MEDIUM
    return LOW


@dataclass(frozen=True)
class Finding:
    """One thing that holds the GPU back (or a statement that nothing does), with its proof."""

    id: str
    severity: str                    # high | medium | low | info
    message: str                     # one sentence, numbers first
    recommendation: str              # the exact change: a DataLoader keyword or a line of code
    evidence: dict[str, Any]         # the measured numbers behind the message, units in the names
    thresholds: dict[str, float] = field(default_factory=dict)  # the bars those numbers crossed
    cost_share: float | None = None  # share of the wall time this costs; findings are ranked by it
    # The DataLoader settings the fix sets ({"num_workers": 6, ...}); None: the fix is not a setting.
    fix_settings: dict[str, Any] | None = None
    # The fix's predicted gain (``selfcheck.attach_gains``): {"speedup", "low", "high", "samples_per_s",
    # "setting"}, or {"cannot_predict": why}; None where the fix is not a DataLoader setting.
    gain: dict[str, Any] | None = None
    group: str = "time"              # "time": ranked by the time it costs; "memory": by the bytes it holds

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["evidence"] = {k: json_safe(v) for k, v in self.evidence.items()}
        d["cost_share"] = json_safe(self.cost_share)
        d["gain"] = None if self.gain is None else {k: json_safe(v) for k, v in self.gain.items()}
        return d


@dataclass
class Diagnosis:
    """The analysis of one run: its primary bottleneck, findings (ranked), metrics and loaders."""

    bottleneck: str | None           # one of BOTTLENECKS (``analysis.primary_bottleneck``); None when not measured
    findings: list[Finding]
    metrics: Metrics
    loaders: list[LoaderSummary]
    run_dir: str
    gpu_available: bool
    gpu_unavailable_reason: str | None
    run: dict[str, Any]              # command, end_reason, exit_code, message
    warnings: list[str] = field(default_factory=list)
    run_dirs: list[str] = field(default_factory=list)  # a job merged from several nodes: all its runs
    # The wall time split by BOTTLENECKS (shares; None where not measured): the headline's numbers.
    costs: dict[str, float | None] = field(default_factory=dict)
    what_if: WhatIf | None = None    # predictions for other settings
    # TensorFlow's bands of the input pipeline's share: "highly" (>= 20%), "moderately" (5-20%), "not".
    input_bound: str | None = None
    not_measured: str | None = None  # why there is no verdict (then ``bottleneck`` is None)
    checks: list[str] = field(default_factory=list)  # what the self-check changed, and why (``selfcheck``)
    # Other programs held cores, and the headline (bottleneck, input_bound, costs) is the job's own on a
    # machine to itself (``analysis/quiet.py``): the model's figures, and under "measured" the run's.
    quiet_machine: dict[str, Any] | None = None
    # The training loader's batches inside (``batches.BatchAnalysis``): the wait by stage, slow samples
    batches: BatchAnalysis | None = None

    @property
    def wait_by_stage(self) -> str | None:
        """The loop's wait split by stage, in words (None where not measured)."""
        if self.batches is None:
            return None
        return self.batches.sentence(self.metrics.data_wait_share, self.costs.get("transfer"))

    @property
    def training(self) -> LoaderSummary | None:
        """The training process's training loader (``metrics.pick_training``); with several ranks every
        rank's is marked, and this is the first of them."""
        return marked_training(self.loaders)

    def finding(self, finding_id: str) -> Finding | None:
        return next((f for f in self.findings if f.id == finding_id), None)

    @property
    def finding_ids(self) -> list[str]:
        return [f.id for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        return {
            "bottleneck": self.bottleneck,
            "input_bound": self.input_bound,
            "not_measured": self.not_measured,
            "checks": self.checks,
            "costs": {k: json_safe(v) for k, v in self.costs.items()},
            "quiet_machine": json_safe(self.quiet_machine),
            "findings": [f.to_dict() for f in self.findings],
            "metrics": self.metrics.to_dict(),
            "loaders": [asdict(s) for s in self.loaders],
            "run_dir": self.run_dir,
            "gpu_available": self.gpu_available,
            "gpu_unavailable_reason": self.gpu_unavailable_reason,
            "run": self.run,
            "warnings": self.warnings,
            "run_dirs": self.run_dirs or [self.run_dir],
            "what_if": self.what_if.to_dict() if self.what_if is not None else None,
            "batches": self.batches.to_dict() if self.batches is not None else None,
            "wait_by_stage": self.wait_by_stage,
        }
