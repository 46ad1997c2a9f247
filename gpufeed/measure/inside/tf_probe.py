"""The probe for TensorFlow: measures tf.data input waits of an unmodified TensorFlow 2.x script.

Keras ``fit`` takes each batch inside a ``tf.function`` (``IteratorGetNext`` in the graph), where no
Python wrapper sees it; so the waits are read the way TensorFlow reads them, from its profiler's
trace (``tf_trace.py``). The profiler runs in this process for one window: from the first training
step Python sees until ``--steps`` is reached, the process ends, or ``PROFILE_WINDOW_S`` have
passed (its trace grows with every op, so it is not left running for hours). Python sees a step as:

- a call of Keras's ``train_function`` (``steps_per_execution`` steps each): ``fit``;
- ``next()`` on a ``tf.data`` iterator (``OwnedIterator.__next__``): custom loops, eager or calling a
  ``tf.function`` per batch.

These ticks start the profiler and end the run after ``--steps``; the steps themselves (request and
delivery of each batch) come from the trace, which is read only when the window ends: until then
the ticks are written every ``LIVE_STEPS_INTERVAL_S`` (``tf_steps_seen``), so that a tune trial's
progress shows its rate while it runs. Each iterator's dataset is read when the iterator is made
(``tf_pipeline.py``), for the findings. Everything is written with the PyTorch probe's ``Probe``
(same files, same ``process`` and ``exit`` events); ``docs/run-record.md`` lists the kinds.

The stall watch (``--stall-timeout``) sees the calls Python waits in: a custom loop's ``next()``
(no batch delivered) and a Keras ``train_function`` call (the step, its input included, has not
returned). Before it reports a stall it reads the trace, so the steps made before it are on disk:
the stuck thread is inside TensorFlow's C++, where a Python signal handler does not run, so the
process will be killed, not asked.
"""
from __future__ import annotations

import atexit
import glob
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from gpufeed.measure.inside import lifecycle, tf_overrides, tf_pipeline, tf_trace
from gpufeed.measure.inside.patches import active_probe
from gpufeed.measure.inside.patching import patch
from gpufeed.measure.inside.probe import Probe
from gpufeed.measure.inside.probe_config import ProbeConfig
from gpufeed.record import schema

# The longest profiled window: the trace holds every op of every step and of every element (26 MB
# for 128 steps of 16 elements of a 250-op map), kept in memory until the window ends.
PROFILE_WINDOW_S = 30.0
PROFILE_DIR = "tf-profile"  # <run_dir>/tf-profile/<pid>/: TensorFlow's own trace (TensorBoard opens it)
# How often the steps Python saw start are written while the profiler runs (``tf_steps_seen``): the
# live rate of a tune trial's progress, twice per refresh of its display (present/tune_view.py).
LIVE_STEPS_INTERVAL_S = 0.25
_clock = time.perf_counter


@dataclass
class TfWait:
    """A call Python waits in, as the stall watch reads it (``lifecycle.stalled_wait``): a custom
    loop's ``next()`` or Keras's ``train_function``. ``next_index`` 0: the first call on a new
    iterator, which waits for tracing, a filling shuffle buffer (--first-batch-timeout)."""

    call: str
    waiting_since: float
    next_index: int
    iter_id: None = None
    worker_pids: list[int] = field(default_factory=list)


def unix_to_clock_offset_s(tries: int = 16) -> tuple[float, float]:
    """``(time.time(), time.time() - _clock())``, from the bracketed read with the shortest bracket: one
    unlucky preemption between two plain reads would shift every traced wait by milliseconds."""
    best_gap, best = float("inf"), (0.0, 0.0)
    for _ in range(tries):
        before = _clock()
        unix = time.time()
        after = _clock()
        if after - before < best_gap:
            best_gap, best = after - before, (unix, unix - (before + after) / 2)
    return best


class TfProbe:
    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.probe: Probe | None = None         # made at the first step (``_probe_for``)
        self.steps_started = 0
        self.t_profile: float | None = None     # when the profiler started; None before
        self.finished = False
        self.clock_at_start: tuple[float, float] | None = None  # (unix, unix - clock) at the profiler's start
        self.logdir = os.path.join(run_dir, PROFILE_DIR, str(os.getpid()))
        self.pipelines: list[dict[str, Any]] = []          # one per dataset object seen
        self._pipeline_of: dict[int, int] = {}              # id(dataset) -> index in pipelines
        self._iterators: list[tuple[float, int]] = []       # (t_created, pipeline index)
        self._step_marker: Any = None
        self._seen_written_at: float | None = None           # the last ``tf_steps_seen`` event
        self.waiting: TfWait | None = None                   # the call Python waits in now, if any
        self._iterators_called = 0                           # iterators made before the last call
        self.distributing = False                            # inside a strategy's distributed __iter__
        self.building = False                                # inside Keras's model build (it peeks a batch)
        self._ended_calls: list[tuple[float, float]] = []    # next() calls that ended an epoch (StopIteration)

    # -- what Python sees ------------------------------------------------------------------------
    def iterator_created(self, dataset: Any, t_created: float) -> None:
        if self.distributing:
            return  # a strategy's per-device iterator: its distributed iterator names the user's dataset
        index = self._pipeline_of.get(id(dataset))
        if index is None:
            try:
                description = tf_pipeline.describe(dataset)
            except Exception as error:  # never break training for a measurement
                description = {"stages": [], "options": {}, "cardinality": None, "error": repr(error)[:300]}
            index = self._pipeline_of[id(dataset)] = len(self.pipelines)
            self.pipelines.append(description)
        self._iterators.append((t_created, index))

    def tick(self, steps: int) -> None:
        """Before a step (or ``steps`` of them) starts."""
        if self.finished:
            return
        if self.probe is None:
            self.probe = _probe_for(self)
        if lifecycle.limits_reached(self.probe, self.steps_started, _clock()):  # --steps, a trial's time
            self.finish()
            self.probe.total_steps = self.steps_started
            self.probe.steps_reached()
        if self.t_profile is None:
            self._start_profiler()
        elif _clock() - self.t_profile >= PROFILE_WINDOW_S:
            self.finish()
        self._mark_step()
        self.steps_started += steps
        self._write_steps_seen()

    def _write_steps_seen(self) -> None:
        """While the window is open, every ``LIVE_STEPS_INTERVAL_S``: the steps started so far."""
        now = _clock()
        if self.finished or (self._seen_written_at is not None and now - self._seen_written_at < LIVE_STEPS_INTERVAL_S):
            return
        self._seen_written_at = now
        batch_size = _batch(self.pipelines[self._iterators[-1][1]])[0] if self._iterators else None
        self.probe.event("tf_steps_seen", t=now, steps=self.steps_started, batch_size=batch_size)

    # -- the stall watch ---------------------------------------------------------------------------
    def call_started(self, call: str) -> None:
        """Python enters ``next()`` or ``train_function``: the stall watch times it."""
        first = len(self._iterators) != self._iterators_called
        self._iterators_called = len(self._iterators)
        self.waiting = TfWait(call, _clock(), 0 if first else 1)

    def call_ended(self, end_of_data: bool = False) -> None:
        """``end_of_data``: the call raised StopIteration. The iterator op it ran is in the trace too,
        but delivered no batch: it is left out of the steps (a DataLoader's is an ``epoch_end``)."""
        if end_of_data and self.waiting is not None:
            self._ended_calls.append((self.waiting.waiting_since, _clock()))
        self.waiting = None

    def check_stall(self) -> None:
        """From the probe's background thread: a call waited past its limit. The trace is read first
        (the steps so far), then the stall is reported as a DataLoader's is."""
        waiting = self.waiting
        stalled = lifecycle.stalled_wait(self.probe, [waiting] if waiting is not None else []) \
            if self.probe is not None else None
        if stalled is None:
            return
        self.finish_quietly()
        lifecycle.report_stall(self.probe, *stalled, tf_call=stalled[1].call)

    def finish_quietly(self) -> None:
        """``finish`` from the probe's own thread, which must go on flushing whatever it raises."""
        try:
            self.finish()
        except Exception:
            pass

    def _mark_step(self) -> None:
        """A step marker from this tick to the next, as Keras 2 wrote one around each step: with it,
        TensorFlow's input-pipeline analyzer (TensorBoard's profiler) reads the same trace."""
        if self._step_marker is not None:
            self._step_marker.__exit__(None, None, None)
            self._step_marker = None
        if self.finished:
            return
        import tensorflow as tf
        try:
            self._step_marker = tf.profiler.experimental.Trace("train", step_num=self.steps_started, _r=1)
            self._step_marker.__enter__()
        except Exception:
            self._step_marker = None

    # -- the profiler window ----------------------------------------------------------------------
    def _start_profiler(self) -> None:
        import tensorflow as tf
        self.t_profile = _clock()
        self.clock_at_start = unix_to_clock_offset_s()
        try:
            options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=1, python_tracer_level=0,
                                                               device_tracer_level=0)
            tf.profiler.experimental.start(self.logdir, options=options)
        except Exception as error:  # e.g. the script profiles itself: then it owns the profiler
            self.finished = True
            self.probe.event("tf_profile", t_start=self.t_profile, t_end=None, path=None,
                             error=f"{type(error).__name__}: {error}"[:300])

    def finish(self) -> None:
        """Stop the profiler, read its trace, and record the steps it saw (once)."""
        if self.finished or self.t_profile is None:
            self.finished = True
            return
        self.finished = True
        self._mark_step()
        import tensorflow as tf
        t_end, error, path = _clock(), None, None
        try:
            tf.profiler.experimental.stop()
            files = sorted(glob.glob(os.path.join(self.logdir, "plugins", "profile", "*", "*.xplane.pb")),
                           key=os.path.getmtime)
            path = files[-1] if files else None
            if path is None:
                raise FileNotFoundError(f"the profiler wrote no trace under {self.logdir}")
            with open(path, "rb") as f:
                traces = tf_trace.read_xspace(f.read(), tf_trace.ClockMap(*self.clock_at_start,
                                                                         *unix_to_clock_offset_s()))
            self._record(traces)
        except Exception as error_:
            error = f"{type(error_).__name__}: {error_}"[:300]
        self.probe.event("tf_profile", t_start=self.t_profile, t_end=t_end,
                         path=os.path.relpath(path, self.probe.run_dir) if path else None, error=error)
        self.probe.flush()

    def _record(self, traces: list[tf_trace.IteratorTrace]) -> None:
        written: set[int] = set()
        for iter_id, trace in enumerate(traces):
            trace.waits = [(t0, t1) for t0, t1 in trace.waits
                           if not any(a <= t0 and t1 <= b for a, b in self._ended_calls)]
            if not trace.waits:
                continue
            first = trace.waits[0][0]
            # The iterator made last before its first batch: its dataset is this pipeline's.
            made = [(t, index) for t, index in self._iterators if t <= first]
            t_created, index = made[-1] if made else (first, None)
            loader_id = index if index is not None else len(self.pipelines) + iter_id
            pipeline = self.pipelines[index] if index is not None else {"stages": [], "options": {}}
            batch_size, drop_remainder = _batch(pipeline)
            self.probe.event("iterator", iter_id=iter_id, loader_id=loader_id, t_created=t_created,
                             t_ready=t_created, worker_pids=[], config=_config(pipeline, batch_size, drop_remainder))
            if loader_id not in written:
                written.add(loader_id)
                self.probe.event("tf_pipeline", loader_id=loader_id, **pipeline, tf_name=trace.name,
                                 tf_root=_plain(trace.root_stats), tf_stages=_plain(trace.stages))
            rows = [(i, t0, t1, batch_size, None) for i, (t0, t1) in enumerate(trace.waits)]
            self.probe.event("steps", iter_id=iter_id, rows=rows)


def _plain(value: Any) -> Any:
    """Trace stats as JSON: ids are 64-bit and useless to a reader; everything else as it is."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k not in ("id", "parent_id", "element_id")}
    return value


def _batch(pipeline: dict[str, Any]) -> tuple[int | None, bool]:
    for stage in pipeline.get("stages", []):
        if "batch_size" in stage and isinstance(stage["batch_size"], int):
            return stage["batch_size"], bool(stage.get("drop_remainder"))
    return None, False


def _config(pipeline: dict[str, Any], batch_size: int | None, drop_remainder: bool) -> dict[str, Any]:
    """The ``iterator`` event's config: LoaderConfig's fields, the DataLoader-only ones left null."""
    return {"num_workers": None, "pin_memory": False, "prefetch_factor": None, "persistent_workers": False,
            "batch_size": batch_size, "drop_last": drop_remainder, "dataset_type": "tf.data.Dataset",
            "dataset_len": pipeline.get("cardinality"), "iterable": True, "sampler": "tf.data",
            "batch_sampler": None, "multiprocessing_context": None, "site": None}


# -- hooks ---------------------------------------------------------------------------------------------
_tf_probe: TfProbe | None = None


def patch_tensorflow(tf_probe: TfProbe) -> None:
    global _tf_probe
    _tf_probe = tf_probe
    from tensorflow.python.data.ops import iterator_ops
    from tensorflow.python.eager import context
    owned = iterator_ops.OwnedIterator

    def make_create(original):
        def _create_iterator(self, dataset):
            t_created = _clock()
            result = original(self, dataset)
            if _tf_probe is not None:
                _tf_probe.iterator_created(dataset, t_created)
            return result
        return _create_iterator

    def make_next(original):
        def __next__(self):
            tf_probe = _tf_probe
            # Not a tf.function's tracing, nor the batch Keras takes to build the model.
            if tf_probe is None or tf_probe.building or not context.executing_eagerly():
                return original(self)
            tf_probe.tick(1)
            tf_probe.call_started("next")
            ended = False
            try:
                return original(self)
            except StopIteration:
                ended = True
                raise
            finally:
                tf_probe.call_ended(ended)
        return __next__

    patch(owned, "_create_iterator", make_create)
    patch(owned, "__next__", make_next)
    patch_distribute(make_next)


def patch_distribute(make_next: Any) -> None:
    """A distribution strategy's datasets (``experimental_distribute_dataset``, and Keras ``fit``
    under a strategy): the strategy rebuilds the user's dataset on each device (a graph copy, whose
    stages carry no sites) and iterates that; the iterator is recorded as made from the user's own
    dataset instead, so its stages, batch size and findings are the script's. A custom loop's
    ``next()`` on the distributed iterator is its step, as on a plain one."""
    try:
        from tensorflow.python.distribute import input_lib
    except ImportError:
        return

    def make_iter(original):
        def __iter__(self):
            tf_probe = _tf_probe
            datasets = getattr(self, "_datasets", None) or [None]  # from a function: the first worker's
            user = getattr(self, "_original_dataset", None) or datasets[0]
            if tf_probe is None or user is None or tf_probe.distributing:
                return original(self)
            t_created = _clock()
            tf_probe.distributing = True
            try:
                result = original(self)
            finally:
                tf_probe.distributing = False
            tf_probe.iterator_created(user, t_created)
            return result
        return __iter__

    for name in ("DistributedDataset", "DistributedDatasetsFromFunction"):
        if hasattr(input_lib, name):
            patch(getattr(input_lib, name), "__iter__", make_iter)
    if hasattr(input_lib, "DistributedIteratorBase"):
        patch(input_lib.DistributedIteratorBase, "__next__", make_next)


def patch_keras(module: Any) -> None:
    """Keras's TensorFlow trainer: each ``train_function`` call runs ``steps_per_execution`` steps."""
    trainer = getattr(module, "TensorFlowTrainer", None)
    if trainer is None or not ProbeConfig.from_env().run_dir:
        return

    def make(original):
        def make_train_function(self, force=False):
            result = original(self, force)
            function = self.train_function
            if function is not None and not getattr(function, "_gpufeed_ticks", False):
                def train_function(iterator):
                    tf_probe = _tf_probe
                    if tf_probe is None:
                        return function(iterator)
                    tf_probe.tick(max(1, int(getattr(self, "steps_per_execution", 1) or 1)))
                    tf_probe.call_started("train_function")
                    try:
                        return function(iterator)
                    finally:
                        tf_probe.call_ended()
                train_function._gpufeed_ticks = True
                self.train_function = train_function
            return result
        return make_train_function

    patch(trainer, "make_train_function", make)

    def make_build(original):
        def _maybe_symbolic_build(self, *args, **kwargs):
            # Under a strategy, Keras takes one batch with next() to build the model: not a step.
            if _tf_probe is None:
                return original(self, *args, **kwargs)
            _tf_probe.building = True
            try:
                return original(self, *args, **kwargs)
            finally:
                _tf_probe.building = False
        return _maybe_symbolic_build

    if hasattr(trainer, "_maybe_symbolic_build"):
        patch(trainer, "_maybe_symbolic_build", make_build)


def install_from_env(_module: Any = None) -> TfProbe | None:
    """Called once TensorFlow is imported in a process started by ``gpufeed diagnose``. Nothing is
    recorded until the process iterates a tf.data dataset (``TfProbe.tick``): a PyTorch script that
    imports TensorFlow on the side keeps the torch probe as its only one."""
    global _tf_probe
    tf_overrides.install_from_env()  # tf.data settings (tune's trials, gpufeed run --config)
    run_dir = ProbeConfig.from_env().run_dir
    if not run_dir or _tf_probe is not None:
        return _tf_probe
    tf_probe = TfProbe(run_dir)
    patch_tensorflow(tf_probe)
    return tf_probe


def _probe_for(tf_probe: TfProbe) -> Probe:
    """The process's probe: the torch probe if it runs, else one of our own."""
    probe = active_probe()
    if probe is not None:  # atexit runs finish before the probe's close, registered earlier
        atexit.register(tf_probe.finish)
        return probe
    # A TensorFlow-only process: its own event file, as the torch probe writes it.
    probe = _TfProcessProbe.from_config(ProbeConfig.from_env())
    probe.tf_probe = tf_probe
    atexit.register(probe.close)
    lifecycle.flush_on_sigterm(probe)
    lifecycle.note_how_it_ends(probe)
    tf = sys.modules.get("tensorflow")
    probe.event("process", **lifecycle.process_fields(), torch_version=None, tf_version=getattr(tf, "__version__", None))
    return probe


class _TfProcessProbe(Probe):
    """The probe of a TensorFlow process: however it closes (exit, SIGTERM, ``--steps``), the
    profiler's trace is read first, so the steps it holds are written; its stall watch watches the
    calls Python waits in (``TfProbe.check_stall``)."""

    tf_probe: TfProbe | None = None

    def close(self, reason: str = "exit") -> None:
        if self.tf_probe is not None:
            self.tf_probe.finish_quietly()  # the exit event is written whatever the trace gave
        super().close(reason)

    def check_stall(self) -> None:
        """Each second, from the probe's background thread: a stall, and whether gpufeed asked the
        command to stop (its SIGTERM waits for a main thread stuck in an op: the trace is read now)."""
        if self.tf_probe is None:
            return
        self.tf_probe.check_stall()
        if os.path.exists(os.path.join(self.run_dir, schema.STOP_MARKER)):
            self.tf_probe.finish_quietly()
