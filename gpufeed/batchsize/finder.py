"""``gpufeed batch-size``: the largest batch that fits, by trials of the unmodified command.

``find_batch_size(options)`` runs the script's own batch size first (it shows where the training
DataLoader is built and on which device), then lets ``search.BatchSearch`` choose the sizes, and
writes ``batch_size.json`` into the batch-size directory with each trial's run record under
``trials/``.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from gpufeed.batchsize.result import INTERRUPTED, BatchSizeResult, BatchTrial
from gpufeed.batchsize.search import BatchSearch, knee
from gpufeed.batchsize.trials import BatchSizeOptions, BatchTrials
from gpufeed.record.writer import write_json_atomic
from gpufeed.trials.layout import BATCH_SIZE_FILE as RESULT_FILE
from gpufeed.trials.limits import available_ram_b

# Seen on this project's CPU workloads (docs/memory.md, bench/results/batch_size.md).
CPU_HEAP_NOTE = ("on CPU, glibc's malloc serves tensors smaller than its dynamic mmap threshold (up to 32 MiB) "
                 "from a heap whose peak depends on the order of frees: peaks vary between runs and are not "
                 "monotonic in the batch size. MALLOC_MMAP_THRESHOLD_=131072 in the environment (or jemalloc / "
                 "tcmalloc) makes them predictable")


def find_batch_size(options: BatchSizeOptions, on_trial: Callable[[BatchTrial], None] | None = None,
                    on_start: Callable[[int | None, str, Path], None] | None = None) -> BatchSizeResult:
    """Search the command's largest safe batch size; write ``batch_size.json`` into ``options.out``.

    Raises ``NoTrainingLoader``, ``NotOverridable``, ``YourBatchFailed`` or ``NothingFits`` with
    one sentence on why there is no answer; the trials' records stay on disk.
    """
    options.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    # The host is protected in any case: a trial may not take more than the budget (CPU) or than
    # the RAM available now.
    host_limit = options.memory_budget_b or available_ram_b()
    trials = BatchTrials(options, host_limit, on_start)
    first, record = trials.run(None, "your batch size")
    if first.status == INTERRUPTED:
        raise KeyboardInterrupt
    trials.learn(first, record)
    capacity = trials.cuda_total_b if trials.device == "cuda" else host_limit
    replay = [first]

    def measure(batch: int, why: str) -> BatchTrial:
        if replay and batch == replay[0].batch_size:  # the script's own size: the run already made
            return replay.pop()
        return trials(batch, why)

    search = BatchSearch(measure, capacity * options.target_share, trials.yours, max_batch=trials.dataset_len,
                         max_trials=options.max_trials, on_trial=on_trial)
    outcome = search.run()
    if outcome.stopped == "interrupted" and outcome.largest_safe is None:
        raise KeyboardInterrupt
    if trials.device == "cpu" and (outcome.unrepeatable or outcome.method == "search"):
        outcome.notes.append(CPU_HEAP_NOTE)
    safe = outcome.largest_safe or 0
    result = BatchSizeResult(
        command=list(options.command), device=trials.device, capacity_b=int(capacity),
        target_share=options.target_share, trials=outcome.trials, fit=outcome.fit, predicted=outcome.predicted,
        largest_safe=outcome.largest_safe, knee=knee([t for t in outcome.trials if t.batch_size <= safe]),
        method=outcome.method, site=trials.site,
        yours=trials.yours, max_batch=trials.dataset_len, stopped=outcome.stopped,
        elapsed_s=time.monotonic() - t0, notes=outcome.notes)
    save(result, options.out)
    return result


def save(result: BatchSizeResult, out: Path) -> None:
    write_json_atomic(out / RESULT_FILE, result.to_dict())
