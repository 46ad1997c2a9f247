"""What if: samples/s for other DataLoader settings, cores or a faster GPU, from one run's record.

docs/what-if.md has the model, its formulas and what they assume; this package follows its order:

- ``types``    the model's inputs (``Costs``, each field with its symbol), a ``Prediction``, ``WhatIf``;
- ``costs``    measuring the costs from a record, with its corrections (``sampled``: the sampler's
               readings of the host; ``epochs``: starting and stopping workers, an epoch's batches);
- ``formulas`` the three bounds (loop, workers, cores: the smallest binds), samples/s over whole
               epochs, the best setting and the ceiling;
- ``answers``  what ``diagnose`` and ``gpufeed what-if`` show.

The names below are what the rest of gpufeed, the tests and the bench import.
"""
from __future__ import annotations

from gpufeed.analysis.whatif.answers import Model, answer, answer_run, model, quiet_machine, what_if
from gpufeed.analysis.whatif.costs import measure_costs
from gpufeed.analysis.whatif.formulas import (batches_per_s, best_of, best_setting, ceiling, fed_workers, predict,
                                              samples_per_s, setting_label, workers_and_cores_for_ceiling)
from gpufeed.analysis.whatif.types import (LIMIT_CORES, LIMIT_LOOP, LIMIT_WORKERS, CannotPredict, Costs, Prediction,
                                           Spread, WhatIf)

__all__ = ["LIMIT_CORES", "LIMIT_LOOP", "LIMIT_WORKERS", "CannotPredict", "Costs", "Model", "Prediction", "Spread",
           "WhatIf", "answer", "answer_run", "batches_per_s", "best_of", "best_setting", "ceiling", "fed_workers",
           "measure_costs", "model", "predict", "quiet_machine", "samples_per_s", "setting_label", "what_if",
           "workers_and_cores_for_ceiling"]
