"""``gpufeed batch-size``: the largest batch that fits in memory, and where throughput stops improving.

- ``search.py``: which batch size to try next (fit memory = a + b x batch, verify, bisect if not linear);
- ``trials.py``: a trial of an unmodified command at one batch size (the engine in ``gpufeed/trials/``);
- ``finder.py``: the two together, and ``batch_size.json``;
- ``result.py``: trials, the fit, the answer.

In code::

    from gpufeed.batchsize import BatchSizeOptions, find_batch_size
    result = find_batch_size(BatchSizeOptions(["python", "train.py"], out=Path("bs"), memory_budget_b=8 << 30))
    print(result.largest_safe, result.knee)

``BatchSearch(measure, limit_b, start)`` runs the same search over any ``measure(batch_size, why)``.
"""
from gpufeed.batchsize.finder import RESULT_FILE, find_batch_size
from gpufeed.batchsize.result import BatchSizeResult, BatchTrial, Fit
from gpufeed.batchsize.search import BatchSearch, NothingFits, YourBatchFailed
from gpufeed.batchsize.trials import BatchSizeOptions, NoTrainingLoader, NotOverridable

__all__ = ["find_batch_size", "BatchSizeOptions", "BatchSizeResult", "BatchTrial", "Fit", "BatchSearch",
           "NothingFits", "YourBatchFailed", "NoTrainingLoader", "NotOverridable", "RESULT_FILE"]
