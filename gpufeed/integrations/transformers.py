"""Hugging Face ``transformers``: ``Trainer(..., callbacks=[GpufeedTrainerCallback()])``.

Measures every DataLoader batch the training takes (the same probe as ``gpufeed diagnose``),
diagnoses it when training ends, puts the findings in the logs (the ``transformers`` logger, at
warning level for findings that cost time, which the Trainer shows by default) and the headline
numbers in the Trainer's log history (``state.log_history``, which ``report_to`` integrations and
``trainer_state.json`` carry). Under ``gpufeed diagnose`` it stands aside: diagnose measures.
"""
from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback
from transformers.utils import logging

from gpufeed import thresholds as th
from gpufeed.integrations import UNDER_DIAGNOSE, FitSession, log_lines, scalars

log = logging.get_logger("transformers.gpufeed")


class GpufeedTrainerCallback(TrainerCallback):
    def __init__(self, out: str | os.PathLike[str] | None = None, warmup_steps: int = th.DEFAULT_WARMUP_STEPS) -> None:
        self.session = FitSession(out, warmup_steps)
        self.diagnosis: Any = None   # the training's diagnosis, once it has ended

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run_dir = self.session.start()
        log.info(f"gpufeed: measuring the input pipeline into {run_dir}" if run_dir else f"gpufeed: {UNDER_DIAGNOSE}")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        diagnosis = self.session.finish()
        if diagnosis is None:
            return
        self.diagnosis = diagnosis
        costly = {f.id for f in diagnosis.findings if f.cost_share}
        for line, finding in zip(log_lines(diagnosis), [None] + diagnosis.findings):
            (log.warning if finding is not None and finding.id in costly else log.info)(line)
        state.log_history.append({**scalars(diagnosis), "step": state.global_step})
