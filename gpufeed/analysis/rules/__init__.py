"""The rules: one module per question, each rule a function of the run's ``Context`` that returns a
``Finding`` carrying its evidence and the thresholds it used, or ``None`` when it stays quiet.

- ``stall``: is the DataLoader stuck?
- ``tf_data``: what in a tf.data pipeline's structure makes the loop wait?
- ``loader``: does the loop wait for data, and why (workers, CPU, storage, threads, restarts)?
- ``loop``: does a loop without a DataLoader wait for its own batch preparation?
- ``offload``: with its batches made on Ray (--offload), is it the Ray workers or the path?
- ``transfer``: do copies to the GPU block the loop?
- ``gpu``: does the GPU saw, or idle while the host fails to queue work?
- ``general``: the run as a whole (compute-bound, no DataLoader), and a general finding for every
  loss worth naming that no specific rule explained
- ``others``: do programs outside the command take the cores the job needs?
- ``ranks``: does one rank hold the others back, or do the ranks differ?
- ``memory``: allocator cache, room for a larger batch, leaks, copy-on-read in workers
- ``user_code``: does one function of the dataset's own code hold most of the workers' CPU?
- ``slow_samples``: do a few slow samples hold their batches back, and in-order delivery the rest?
- ``shared_memory``: will the training loader's batches in flight outgrow /dev/shm?

They share ``facts`` (where the time went, and predicates such as "the loop waits for data") and
``wording`` (shared sentences, and the DataLoader change written where the user makes it). A new
finding goes in the module of its question, and into ``RULES`` below.
"""
from __future__ import annotations

from gpufeed.analysis.context import Context, Rule
from gpufeed.analysis.rules import (gpu, general, loader, loop, memory, offload, others, ranks, shared_memory, slow_samples,
                                    stall, tf_data, transfer, user_code)
from gpufeed.analysis.rules.facts import COMPUTE, HOST, INPUT, TRANSFER, costs, host_idle_share, input_band, input_share
from gpufeed.analysis.rules.general import EXPLAINED_BY, unexplained_losses
from gpufeed.analysis.rules.wording import change_in, keras_wrapped

__all__ = ["Context", "Rule", "RULES", "FINDINGS_WITHOUT_STEPS", "EXPLAINED_BY", "unexplained_losses", "costs",
           "input_share", "input_band", "host_idle_share", "INPUT", "TRANSFER", "HOST", "COMPUTE", "change_in", "keras_wrapped"]

# Every rule, in the order their findings are listed when they cost the same: a stuck loader first,
# then a tf.data pipeline's own causes before the generic ones they explain.
RULES: tuple[Rule, ...] = (
    stall.loader_stalled,
    tf_data.python_stage, tf_data.sequential_map, tf_data.no_prefetch, tf_data.cache_small_dataset,
    tf_data.deterministic_order, tf_data.autotune_off,
    loader.too_few_workers, loader.cpu_saturated, loader.storage_latency, loader.too_many_workers,
    loader.thread_oversubscription, loader.worker_restart, slow_samples.slow_samples, user_code.user_code_hotspot, loop.loop_batch_preparation, offload.offload_input_wait,
    others.other_programs,
    transfer.pageable_transfer, transfer.copy_stalls_gpu,
    gpu.fluctuating_utilization, gpu.host_bound, gpu.launch_bound,
    general.compute_bound, general.no_dataloader,
    ranks.straggler_rank, ranks.load_imbalance,
    shared_memory.shm_too_small,
    memory.allocator_cache, memory.batch_too_small, memory.memory_growth, memory.worker_memory_growth,
)

# Findings that do not judge the steps, and so stand with too few of them (the stall itself; shared
# memory too small, which ends a run at its first batches).
FINDINGS_WITHOUT_STEPS = ("loader_stalled", "shm_too_small")
