"""``gpufeed tune``: find the fastest DataLoader settings by measurement, not by guessing.

- ``search.py``: which configuration to try next (steered by the runs' own diagnoses, noise-aware);
- ``command.py``: trials of an unmodified command (the engine in ``gpufeed/trials/``), one record each;
- ``inprocess.py``: the same search over a dataset and a training step inside this process;
- ``result.py``: trials, the winner, and ``tune.json``.
"""
from gpufeed.tune.command import NoDataLoader, TuneOptions, tune_command
from gpufeed.tune.result import Trial, TrialRun, TuneResult, paste_line
from gpufeed.tune.search import BaselineFailed

__all__ = ["tune_command", "TuneOptions", "TuneResult", "Trial", "TrialRun", "BaselineFailed",
           "NoDataLoader", "paste_line"]
