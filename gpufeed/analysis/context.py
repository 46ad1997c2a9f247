"""What a rule reads, and what a rule is.

Every rule is a function of one ``Context`` (the run record, its metrics and its training loader)
that returns a ``Finding`` or ``None``. This module sits below the rules (``analysis/rules/``) and
below the rank analysis (``analysis/ranks.py``), so that any of them can name the type.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from gpufeed.analysis.findings import Finding
from gpufeed.analysis.metrics import LoaderSummary, Metrics
from gpufeed.analysis.batches import BatchAnalysis
from gpufeed.analysis.whatif import Prediction, WhatIf
from gpufeed.record.reader import RunRecord


@dataclass
class Context:
    record: RunRecord
    metrics: Metrics
    training: LoaderSummary | None   # the training loader (``metrics.pick_training``)
    # The what-if model's answers (``cannot_predict`` says why there are none), measured before the rules
    # run, for a rule that sizes its advice from them; None where not measured.
    what_if: WhatIf | None = None
    # (your settings, the same on a machine no other program shares): ``whatif.quiet_machine``.
    quiet: tuple[Prediction, Prediction] | None = None
    # The training loader's batches inside (``batches.BatchAnalysis``): slow samples, in-order delivery,
    # the wait by stage; None where not measured.
    batches: BatchAnalysis | None = None


Rule = Callable[[Context], Optional[Finding]]
