"""The facts the rules share, each computed from the metrics in one place: where the wall time
went (``costs``), and predicates such as "the loop waits for data" or "the host is saturated".

``tune`` steers its search by the same facts (``input_bound``, ``workers_multithreaded``), so that
a trial's run is judged as the diagnosis judges it.
"""
from __future__ import annotations

from gpufeed import thresholds as th
from gpufeed.analysis.loop import FROM_BACKWARD, FROM_OPTIMIZER
from gpufeed.analysis.metrics import Metrics

INPUT, TRANSFER, HOST, COMPUTE = "input", "transfer", "host", "compute"


def input_share(m: Metrics) -> float | None:
    """The share of the wall time the input pipeline costs. Its wait: with CUDA events, the GPU's own
    idle time inside next(loader) (a host that waits while the GPU still works through queued steps
    loses nothing); elsewhere (CPU training, no events resolved) the loop's wait, which is then the
    truth. Plus what no next() waited: building each new iterator in iter(loader) (forking its
    workers), and on a CPU-only run what the steps paid after each fork (copy-on-write)."""
    wait = m.gpu_idle_share if m.cuda_used and m.gpu_idle_share is not None else m.data_wait_share
    if wait is None:
        return None
    return wait + (m.startup_in_iter_share or 0.0) + (0.0 if m.cuda_used else m.fork_step_share or 0.0)


def restart_share(m: Metrics) -> float | None:
    """Of ``input_share``: what starting the workers again inside the window cost (iter(loader), each
    epoch's first batch, the steps slowed by the fork); None where no iterator's workers started in it."""
    parts = [m.startup_in_iter_share, m.restart_wait_share, None if m.cuda_used else m.fork_step_share]
    if not m.restart_wait_share and not m.fork_step_share:
        return None
    return sum(p or 0.0 for p in parts)


def startup_cost_share(m: Metrics) -> float | None:
    """What starting workers costs, the one definition that the worker_restart and loader_rebuilt
    findings, the what-if model's restart terms and tune's and autotune's persistent-workers fix
    (``tune/causes.py``) all read: ``restart_share`` where workers started inside the window (a live
    decision period's iter() and first batches), else the run's start-ups (creation to first batch)
    over its span; None where neither was measured."""
    share = restart_share(m)
    return m.worker_startup_share if share is None else share


def steady_input_share(m: Metrics) -> float | None:
    """The input pipeline's share once its workers run: ``input_share`` less ``restart_share``, the wait
    that more workers, more CPU or faster storage can buy back (restarts have their own fix)."""
    share = input_share(m)
    if share is None:
        return None
    return max(share - (restart_share(m) or 0.0), 0.0)


def input_band(m: Metrics) -> str | None:
    """How input-bound the run is, in the bands of TensorFlow's input-pipeline analyzer: "highly" (20%
    and more of the time), "moderately" (5-20%), "not" (under 5%); None where not measured."""
    share = input_share(m)
    if share is None:
        return None
    if share >= th.DATA_WAIT_SHARE_HIGH:
        return "highly"
    return "moderately" if share >= th.DATA_WAIT_SHARE_FLAG else "not"


def host_idle_share(m: Metrics) -> float | None:
    """GPU time idle for reasons other than waiting for data or for copies (CUDA runs with NVML only)."""
    if not m.cuda_used or m.gpu_util_p50_pct is None:
        return None
    return max(0.0, 1.0 - m.gpu_util_p50_pct / 100.0 - (input_share(m) or 0.0) - (transfer_share(m) or 0.0))


def transfer_share(m: Metrics) -> float | None:
    """Copies to the GPU as they cost: pageable ones block the host, pinned ones on the steps' stream
    stall the kernels queued after them (None where neither was measured)."""
    parts = [v for v in (m.h2d_pageable_share, m.h2d_stall_share) if v is not None]
    return sum(parts) if parts else None


def costs(m: Metrics) -> dict[str, float | None]:
    """The wall time split four ways (shares; None where not measured): waiting for data, blocked in
    copies to the GPU, the GPU idle for other host reasons, and the rest, the step's own compute."""
    losses = {INPUT: input_share(m), TRANSFER: transfer_share(m), HOST: host_idle_share(m)}
    measured = [v for v in losses.values() if v is not None]
    losses[COMPUTE] = max(0.0, 1.0 - sum(measured)) if measured else None
    return losses


def without_dataloader(m: Metrics) -> bool:
    """The run was measured from a loop that iterates no DataLoader (its steps are optimizer steps or
    backward passes): the loader's questions do not apply; ``rules/loop.py`` asks its own."""
    return m.steps_from in (FROM_OPTIMIZER, FROM_BACKWARD)


def input_bound(m: Metrics) -> bool | None:
    """The loop waited for its running workers long enough to name it (None: the wait was not measured).
    What restarting them costs is judged apart (``restart_share``, the worker_restart finding)."""
    share = steady_input_share(m)
    return None if share is None else share >= th.DATA_WAIT_SHARE_FLAG


def offloaded(m: Metrics) -> bool:
    """The training loader's batches were made on Ray (--offload): no local worker made them, so the
    rules about local workers (their count, CPU, sleep, restarts) have nothing to judge."""
    return m.offload is not None


def host_saturated(m: Metrics) -> bool:
    if m.cpu_util_pct is None:
        return False
    workers_fill_cores = m.num_workers is not None and m.num_workers >= m.cpu_count
    bar = th.CPU_SATURATED_FULL_WORKERS_PCT if workers_fill_cores else th.CPU_SATURATED_PCT
    return m.cpu_util_pct >= bar


def workers_asleep(m: Metrics) -> bool:
    """Off the CPU for most of their fetch time, and not because they queue for a core."""
    return (m.worker_fetch_cpu_ratio is not None and m.worker_fetch_cpu_ratio < th.WORKER_ASLEEP_CPU_RATIO
            and not workers_runnable(m))


def workers_runnable(m: Metrics) -> bool:
    """The sampler mostly saw the workers runnable (state R): they want a core, they are not waiting on I/O."""
    return m.worker_running_share is not None and m.worker_running_share >= th.WORKER_RUNNABLE_SHARE


def workers_multithreaded(m: Metrics) -> bool:
    """Each DataLoader worker ran several compute threads: torch's own, or more than a core busy while fetching."""
    return ((m.worker_torch_threads or 1) > 1
            or (m.worker_fetch_cpu_ratio or 0) > th.WORKER_MULTITHREAD_CPU_RATIO)


def worker_cap(m: Metrics) -> int:
    """Workers a CPU-bound loader can use: every core, less one for a training step that runs on the
    CPU itself (with CUDA the main process mostly waits on the GPU)."""
    return m.cpu_count if m.cuda_used else max(1, m.cpu_count - 1)


def model_describes_the_run(what_if) -> bool:
    """The what-if model's prediction of the run's own settings is within ``WHATIF_SIZING_MAX_ERROR`` of
    what the run measured: a rule may size its fix from the model's answers (``whatif.WhatIf``)."""
    measured, yours = getattr(what_if, "measured_samples_per_s", None), getattr(what_if, "yours", None)
    return bool(measured and yours is not None
                and abs(yours.samples_per_s - measured) <= th.WHATIF_SIZING_MAX_ERROR * measured)


def cpu_ms_per_sample(m: Metrics) -> float | None:
    if m.loader_cpu_bound_samples_per_s:
        return m.cpu_count / m.loader_cpu_bound_samples_per_s * 1000.0
    return None
