"""Trials: short runs of an unmodified command with DataLoader settings overridden, each in its own
process with its own run record. ``gpufeed tune`` and ``gpufeed batch-size`` are searches on top.

- ``options.py``: what every trial is run with (the command, its directory, how long it measures);
- ``engine.py``: run one trial: the command with its settings, its status, record and diagnosis;
- ``limits.py``: how a trial is bounded: a time limit, a host-memory guard, out of memory recognised;
- ``layout.py``: the directory a search writes: ``trials/NN-label/`` and the result files.

Importing the package imports nothing else: the result classes of the searches use ``layout``
without pulling in the runner.
"""
