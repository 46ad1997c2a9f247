"""The search over a tf.data pipeline's knobs (``settings.PipelineSettings``), with tune's own noise
rules: the same ``Search`` measures, compares with the noise, repeats what is close, settles ties
and keeps the budget; only the space and its steps differ.

The space, kept small on purpose (each point is a run of the whole command):

- ``num_parallel_calls`` of the pipeline's ``map`` / ``interleave`` stages (one value for all of
  them: the slowest stage decides the pipeline's rate, and TensorFlow's own AUTOTUNE is the answer
  that sets each apart), on a ladder 2, 4, 8, ... refined by 3, 6, 12, ... up to
  ``--max-workers`` (16 per core by default), and ``tf.data.AUTOTUNE``; past the core count with a
  private thread pool of as many threads (``private_threadpool_size``), without which the calls
  queue for tf.data's shared pool of one thread per core;
- the ``prefetch`` buffer at the end: AUTOTUNE (TensorFlow sizes and resizes it itself; no fixed
  depth is tried: a buffer cannot make a producer that does not keep up any faster);
- ``options.deterministic = False``, only where a parallel stage could hand elements out of order and
  the loop still waits for data (it gives up a reproducible order: among ties, the order is kept);
- ``options.threading.max_intra_op_parallelism = 1`` and ``private_threadpool_size = cores``, only
  when the best run kept every core busy: then tf.data's element threads and each op's own threads
  (and the model's) oversubscribe the cores, and these are TensorFlow's two knobs for it.

The steps:

1. your pipeline twice (the noise), then **AUTOTUNE everywhere** (``num_parallel_calls`` and
   ``prefetch``): TensorFlow's own answer, always measured, so the winner is compared with it honestly;
2. when the loop waited for data, **climb** fixed parallelism 2 → 4 → 8 ... (prefetch as the best so
   far has it; past the cores with a pool as large) until two steps in a row bring nothing, as the
   worker climb does;
3. **refine** next to the peak, on the side of its better neighbour;
4. **options** on the best: ``deterministic = False``, then the two threading options, each kept
   only when faster by more than the noise;
5. ties (within half the noise) go to the cheapest: order kept, no fixed thread count (AUTOTUNE
   follows the machine the job runs on, not the one it was tuned on), fewer threads, fewer changes.
"""
from __future__ import annotations

import dataclasses

from gpufeed import thresholds as th
from gpufeed.settings import AUTOTUNE, PipelineSettings
from gpufeed.tune.result import Trial
from gpufeed.tune.model_start import waits_for_data as _waits_for_data
from gpufeed.tune.search import Search

AUTOTUNE_EVERYWHERE = "AUTOTUNE everywhere: TensorFlow's own answer"


def pipeline_cheapness(s: PipelineSettings) -> tuple:
    """Order among tied configurations (see the module's step 5)."""
    def fixed(value: int | None) -> int:
        return 0 if value in (None, AUTOTUNE) else value
    return (s.deterministic is False, fixed(s.parallel_calls), fixed(s.prefetch), s.private_threadpool_size or 0,
            s.max_intra_op_parallelism is not None, len(s.to_dict()))


class PipelineSearch(Search):
    """``Search`` over ``PipelineSettings``. ``parallel_stages``: the pipeline has a ``map`` or
    ``interleave`` to parallelise; ``ordered``: it still hands elements out in order (the script did
    not set ``deterministic`` False itself)."""

    normalise = staticmethod(lambda settings: settings)
    cheapness = staticmethod(pipeline_cheapness)

    def __init__(self, measure, baseline: PipelineSettings, cpu_count: int, *, parallel_stages: bool,
                 ordered: bool = True, **kwargs) -> None:
        super().__init__(measure, baseline, cpu_count, **kwargs)
        self.cpu_count = max(cpu_count, 1)
        self.parallel_stages = parallel_stages
        self.ordered = ordered

    def _steps(self, baseline: Trial) -> None:
        auto = self._measured(PipelineSettings(parallel_calls=AUTOTUNE if self.parallel_stages else None,
                                               prefetch=AUTOTUNE), AUTOTUNE_EVERYWHERE)
        if self._faster(auto, self.best):
            self.best = auto
        if self.parallel_stages and (_waits_for_data(baseline) is not False or _waits_for_data(auto)):
            self._climb_parallel()
            self._refine_parallel()
        self._options()

    def _template(self) -> PipelineSettings:
        """The best so far, as the start of a step that changes the parallelism."""
        return self.best.settings

    def _with_parallel(self, settings: PipelineSettings, n: int) -> PipelineSettings:
        """``n`` parallel calls, and past the cores a private thread pool of ``n`` to run them: tf.data's
        shared pool has one thread per core, so more calls than cores only queue there (measured: 2, 4
        and 8 calls of a 4 ms storage read all gave 1.9x on 2 cores: docs/tensorflow.md)."""
        paired = settings.private_threadpool_size is not None and settings.private_threadpool_size == settings.parallel_calls
        pool = n if n > self.cpu_count else None if paired else settings.private_threadpool_size
        return dataclasses.replace(settings, parallel_calls=n, private_threadpool_size=pool)

    def _climb_parallel(self) -> None:
        """Fixed num_parallel_calls up the ladder while throughput rises; two steps in a row that do
        not rise end it (one can dip: a thread's hand-over costs before more of them pay)."""
        misses, previous = 0, None
        for n in (n for n in th.TUNE_TF_PARALLEL_LADDER if n <= self.max_workers):
            why = "more parallel calls: the loop waited for data"
            if n > self.cpu_count:
                why += f" (and a pool of {n} threads: tf.data's own has one per core)"
            trial = self._measured(self._with_parallel(self._template(), n), why)
            if self._faster(trial, self.best):
                self.best = trial
            misses = 0 if previous is None or self._faster(trial, previous) else misses + 1
            previous = trial
            if misses >= 2:
                break

    def _refine_parallel(self) -> None:
        best = self.best
        n = best.settings.parallel_calls
        if n in (None, AUTOTUNE):
            return
        tried = {t.settings.parallel_calls: t for t in self.trials.values()
                 if t.ok and t.settings.parallel_calls not in (None, AUTOTUNE)
                 and self._with_parallel(t.settings, n) == self._with_parallel(best.settings, n)}
        self._refine(n, tried, th.TUNE_TF_PARALLEL_REFINE, lambda r: self._with_parallel(best.settings, r),
                     "parallel calls")

    def _options(self) -> None:
        self._try_changes(self._option_changes())

    def _option_changes(self):
        """(why, change) for each option a measured cause on the best configuration points at."""
        best = self.best
        parallel = self.parallel_stages and best.settings.parallel_calls is not None
        if parallel and self.ordered and best.settings.deterministic is None and _waits_for_data(best):
            yield ("elements out of order (options.deterministic = False): the loop still waited for data",
                   {"deterministic": False})
        m = best.diagnosis.metrics if best.diagnosis is not None else None
        if m is not None and m.cpu_cores_command is not None and m.cpu_count \
                and m.cpu_cores_command >= th.TUNE_CORES_FULL_SHARE * m.cpu_count:
            full = f"the run kept {m.cpu_cores_command:.1f} of {m.cpu_count} cores busy"
            if best.settings.max_intra_op_parallelism is None:
                yield f"one thread per op (max_intra_op_parallelism = 1): {full}", {"max_intra_op_parallelism": 1}
            if best.settings.private_threadpool_size is None:
                yield (f"tf.data's own pool of {self.cpu_count} threads: {full}",
                       {"private_threadpool_size": self.cpu_count})
