"""What one trial came to: how it ended, its run record and the diagnosis of it.

The statuses are shared by the searches' results (``tune.json``, ``batch_size.json``); batch-size
adds ``oom`` (``batchsize/result.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufeed.analysis.findings import Diagnosis
    from gpufeed.analysis.metrics import LoaderSummary
    from gpufeed.record.reader import RunRecord
    from gpufeed.record.schema import RunMeta

OK, FAILED, INTERRUPTED = "ok", "failed", "interrupted"
INTERRUPTED_REASON = "interrupted (Ctrl-C)"


@dataclass
class TrialOutcome:
    """One run of the command as a trial. ``ok``: it ended well (completed, or reached its steps) and
    its record could be read; ``failed``: it did not (``reason`` says why); ``interrupted``: Ctrl-C."""

    status: str
    run_dir: str                        # relative to the search's directory
    elapsed_s: float
    meta: RunMeta                       # how the command ended: end reason, exit code, stderr's tail
    record: RunRecord | None = None     # None: interrupted, or the record could not be read
    diagnosis: Diagnosis | None = None
    reason: str | None = None           # why it failed
    memory_killed: tuple[int, int] | None = None  # (pid, resident bytes) when the memory guard killed it

    @property
    def training(self) -> LoaderSummary | None:
        """The training DataLoader as this run showed it."""
        return self.diagnosis.training if self.diagnosis is not None else None
