"""PyTorch Lightning: ``Trainer(callbacks=[GpufeedCallback()])``.

Measures every DataLoader batch the fit takes (the same probe as ``gpufeed diagnose``), diagnoses
the fit when it ends, puts the findings in the logs (the ``lightning.pytorch`` logger, which
Lightning shows) and the headline numbers in the Trainer's loggers (``gpufeed/data_wait_share``,
``gpufeed/samples_per_s``, ...). Under ``gpufeed diagnose`` it stands aside: diagnose measures.
With several ranks each rank writes its own record (``OUT/rank{N}``); ``gpufeed analyze`` merges them.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import lightning.pytorch as pl

from gpufeed import thresholds as th
from gpufeed.integrations import UNDER_DIAGNOSE, FitSession, log_lines, scalars

log = logging.getLogger("lightning.pytorch.gpufeed")


class GpufeedCallback(pl.Callback):
    def __init__(self, out: str | os.PathLike[str] | None = None, warmup_steps: int = th.DEFAULT_WARMUP_STEPS) -> None:
        self.session = FitSession(out, warmup_steps)
        self.diagnosis: Any = None   # the fit's diagnosis, once it has ended

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        run_dir = self.session.start()
        log.info(f"gpufeed: measuring the input pipeline into {run_dir}" if run_dir else f"gpufeed: {UNDER_DIAGNOSE}")

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._report(trainer, self.session.finish())

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._report(trainer, self.session.finish(exception))

    def _report(self, trainer: pl.Trainer, diagnosis: Any) -> None:
        if diagnosis is None:
            return
        self.diagnosis = diagnosis
        for line in log_lines(diagnosis):
            log.info(line)
        values = scalars(diagnosis)
        for logger in trainer.loggers:
            logger.log_metrics(values, step=trainer.global_step)
            logger.save()
