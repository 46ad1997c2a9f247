"""One rule per question. Each reads the metrics (and the record where it must) and returns a
``Finding`` carrying its evidence and the thresholds it used, or ``None`` when it stays quiet."""
from __future__ import annotations

from gpufeed import thresholds as th
from gpufeed.analysis import memory, tf_data
from gpufeed.analysis.context import Context, Rule
from gpufeed.analysis.findings import INFO, HIGH, Finding, severity_for
from gpufeed.analysis.metrics import Metrics
from gpufeed.analysis.ranks import load_imbalance, straggler_rank
from gpufeed.units import fmt
from gpufeed.record import schema


# -- shared facts ------------------------------------------------------------------------------------
def _input_bound(m: Metrics) -> bool:
    share = input_share(m)
    return share is not None and share >= th.DATA_WAIT_SHARE_FLAG


def _host_saturated(m: Metrics) -> bool:
    if m.cpu_util_pct is None:
        return False
    workers_fill_cores = m.num_workers is not None and m.num_workers >= m.cpu_count
    bar = th.CPU_SATURATED_FULL_WORKERS_PCT if workers_fill_cores else th.CPU_SATURATED_PCT
    return m.cpu_util_pct >= bar


def _workers_asleep(m: Metrics) -> bool:
    """Off the CPU for most of their fetch time, and not because they queue for a core."""
    return (m.worker_fetch_cpu_ratio is not None and m.worker_fetch_cpu_ratio < th.WORKER_ASLEEP_CPU_RATIO
            and not _workers_runnable(m))


def _workers_runnable(m: Metrics) -> bool:
    """The sampler mostly saw the workers runnable (state R): they want a core, they are not waiting on I/O."""
    return m.worker_running_share is not None and m.worker_running_share >= th.WORKER_RUNNABLE_SHARE


def _others_sentence(m: Metrics) -> str:
    """Say so when programs outside the command take a large part of the busy CPU."""
    if m.cpu_cores_command is None or m.cpu_cores_busy is None:
        return ""
    others = m.cpu_cores_busy - m.cpu_cores_command
    if others < th.OTHER_PROGRAMS_CORES:
        return ""
    return f" Other programs used {others:.1f} of the {_cores(m.cpu_count)}; the command used {m.cpu_cores_command:.1f}."


def _wait_sentence(m: Metrics) -> str:
    who = "The GPU" if m.cuda_used else "The training loop"
    if m.focus_rank is not None:
        who += f" of rank {m.focus_rank}"
    return (f"{who} waited for data {fmt(input_share(m), '.0%')} of the time "
            f"(p50 step {fmt(m.step_time_p50_ms, '.0f')} ms, of which {fmt(m.data_wait_p50_ms, '.0f')} ms in next(loader))")


def _wait_evidence(m: Metrics) -> dict:
    return {"data_wait_share": m.data_wait_share, "step_time_p50_ms": m.step_time_p50_ms,
            "data_wait_p50_ms": m.data_wait_p50_ms, "compute_p50_ms": m.compute_p50_ms,
            "compute_per_batch_ms": m.compute_per_batch_ms,
            "samples_per_s": m.samples_per_s, "gpu_idle_share": m.gpu_idle_share}


def _worker_cap(m: Metrics) -> int:
    """Workers a CPU-bound loader can use: every core, less one for a training step that runs on the
    CPU itself (with CUDA the main process mostly waits on the GPU)."""
    return m.cpu_count if m.cuda_used else max(1, m.cpu_count - 1)


def _cpu_ms_per_sample(m: Metrics) -> float | None:
    if m.loader_cpu_bound_samples_per_s:
        return m.cpu_count / m.loader_cpu_bound_samples_per_s * 1000.0
    return None


def _cores(n: int) -> str:
    return f"{n} core{'s' if n != 1 else ''}"


def _tune_hint() -> str:
    return "(`gpufeed tune` measures it)"


# Hugging Face Trainer passes these TrainingArguments to the DataLoaders it builds.
HF_ARGUMENTS = {"num_workers": "dataloader_num_workers", "prefetch_factor": "dataloader_prefetch_factor",
                "persistent_workers": "dataloader_persistent_workers", "pin_memory": "dataloader_pin_memory"}
LIGHTNING_HOOKS = ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader")


def keras_wrapped(config: dict) -> bool:
    """Keras (torch backend) feeds a tf.data pipeline or a PyDataset through
    ``DataLoader(IterableDataset, batch_size=None)``: each DataLoader worker would yield it all again."""
    return config.get("framework") == "keras" and bool(config.get("iterable")) and config.get("batch_size") is None


def change(ctx: Context, **settings) -> str:
    """The DataLoader change for the run's training loader (``change_in``)."""
    return change_in(ctx.training.config if ctx.training is not None else {}, **settings)


def change_in(config: dict, **settings) -> str:
    """The DataLoader change, written where the user makes it: their own ``DataLoader(...)`` call
    with its file:line, or the knob of the framework that builds the loader for them."""
    framework, site = config.get("framework"), config.get("site")
    user = (config.get("user_stack") or [None])[0]
    if keras_wrapped(config):
        return ("Keras builds this DataLoader around its own pipeline (tf.data or a PyDataset, as an IterableDataset "
                "with batch_size=None), so DataLoader workers would each yield the whole dataset again: speed up "
                "Keras's pipeline instead (PyDataset(workers=..., use_multiprocessing=True), or tf.data's "
                "map(num_parallel_calls=tf.data.AUTOTUNE) and prefetch(tf.data.AUTOTUNE))")
    if framework == "transformers":
        args = ", ".join(f"{HF_ARGUMENTS[k]}={v!r}" for k, v in settings.items() if k in HF_ARGUMENTS)
        return f"TrainingArguments({args}) (the Trainer builds the DataLoader{f'; trainer at {user}' if user else ''})"
    args = ", ".join(f"{k}={v!r}" for k, v in settings.items())
    hook = config.get("user_function")
    in_hook = f" (in {hook}())" if hook in LIGHTNING_HOOKS else ""
    origin = config.get("origin_site")
    if origin is not None and origin != site:
        # A framework rebuilt the user's loader (Lightning, accelerate.prepare): change theirs.
        return f"DataLoader(..., {args}) at {origin}{in_hook}"
    if framework == "lightning" and user is not None:
        # Lightning wraps DataLoader.__init__ while its hooks run: the user's call is the first frame of theirs.
        return f"DataLoader(..., {args}) at {user}{in_hook}"
    if site is not None and user is not None and site != user:
        who = f"{framework or 'a library'} builds it"
        return f"DataLoader(..., {args}) in the code at {user} ({who}, at {site})"
    where = f" at {site}" if site else ""
    return f"DataLoader(..., {args}){where}{in_hook}"


# -- the rules ---------------------------------------------------------------------------------------
def too_few_workers(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if not _input_bound(m) or m.num_workers is None or _host_saturated(m) or _workers_asleep(m):
        return None
    suggested = min(max(m.workers_needed or 0, m.num_workers + 1), _worker_cap(m))
    if suggested <= m.num_workers:
        return None
    return Finding(
        id="too_few_workers", severity=severity_for(input_share(m)), cost_share=input_share(m),
        message=(f"{_wait_sentence(m)} while the CPU was only {fmt(m.cpu_util_pct, '.0f')}% busy: the DataLoader has "
                 f"num_workers={m.num_workers} on {_cores(m.cpu_count)} and preparing a batch is CPU work "
                 f"({fmt(m.fetch_ms_per_batch_p50, '.0f')} ms each)."),
        recommendation=f"{change(ctx, num_workers=suggested)} {_tune_hint()}.",
        evidence={**_wait_evidence(m), "num_workers": m.num_workers, "cpu_count": m.cpu_count,
                  "cpu_util_pct": m.cpu_util_pct, "fetch_ms_per_batch_p50": m.fetch_ms_per_batch_p50,
                  "worker_fetch_cpu_ratio": m.worker_fetch_cpu_ratio, "workers_needed": m.workers_needed},
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG, "cpu_util_pct_below": th.CPU_SATURATED_PCT,
                    "worker_fetch_cpu_ratio_at_least": th.WORKER_ASLEEP_CPU_RATIO},
    )


def cpu_saturated(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if (not _input_bound(m) or not _host_saturated(m) or _workers_asleep(m)
            or (m.num_workers or 0) > m.cpu_count):
        return None
    cpu_ms = _cpu_ms_per_sample(m)
    cost = f" ({fmt(cpu_ms, '.1f')} ms of CPU per sample)" if cpu_ms else ""
    return Finding(
        id="cpu_saturated", severity=severity_for(input_share(m)), cost_share=input_share(m),
        message=(f"{_wait_sentence(m)} and all {_cores(m.cpu_count)} were {fmt(m.cpu_util_pct, '.0f')}% busy: "
                 f"the CPU cannot prepare batches faster, so more workers cannot help.{_others_sentence(m)}"),
        recommendation=(f"Make each sample cheaper to prepare{cost}: decode smaller images, cache decoded "
                        "samples, move augmentation to the GPU; or run on more CPU cores."),
        evidence={**_wait_evidence(m), "cpu_util_pct": m.cpu_util_pct, "cpu_count": m.cpu_count,
                  "cpu_cores_command": m.cpu_cores_command, "num_workers": m.num_workers,
                  "loader_cpu_ms_per_sample": cpu_ms},
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG, "cpu_util_pct": th.CPU_SATURATED_PCT},
    )


def storage_latency(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if not _input_bound(m) or not _workers_asleep(m) or m.num_workers is None:
        return None
    needed = max(m.workers_needed or 0, 2 * max(m.num_workers, 1))
    # Latency-bound workers scale past the core count; the cap only keeps the advice sane.
    suggested = min(needed, th.TUNE_MAX_WORKERS_PER_CORE * m.cpu_count)
    return Finding(
        id="storage_latency", severity=severity_for(input_share(m)), cost_share=input_share(m),
        message=(f"{_wait_sentence(m)}. The DataLoader has num_workers={m.num_workers} on {_cores(m.cpu_count)} "
                 f"and the workers were {fmt(m.worker_asleep_share, '.0%')} asleep while fetching "
                 f"({fmt(m.fetch_ms_per_batch_p50, '.0f')} ms a batch): reading data is latency-bound."
                 f"{_others_sentence(m)}"),
        recommendation=(f"{change(ctx, num_workers=suggested, prefetch_factor=th.LATENCY_PREFETCH_FACTOR)}: "
                        f"waiting workers cost little CPU, so more of them than cores pays {_tune_hint()}; "
                        "or move the data to local SSD / cache it."),
        evidence={**_wait_evidence(m), "num_workers": m.num_workers, "cpu_count": m.cpu_count,
                  "worker_asleep_share": m.worker_asleep_share, "worker_fetch_cpu_ratio": m.worker_fetch_cpu_ratio,
                  "fetch_ms_per_batch_p50": m.fetch_ms_per_batch_p50, "workers_needed": m.workers_needed,
                  "iowait_pct": m.iowait_pct, "cpu_util_pct": m.cpu_util_pct},
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG,
                    "worker_fetch_cpu_ratio_below": th.WORKER_ASLEEP_CPU_RATIO,
                    "worker_running_share_below": th.WORKER_RUNNABLE_SHARE},
    )


def too_many_workers(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if (m.num_workers is None or m.num_workers <= m.cpu_count or not _host_saturated(m)
            or m.worker_fetch_cpu_ratio is None or m.worker_fetch_cpu_ratio >= th.WORKER_CONTENDED_CPU_RATIO
            or (m.worker_running_share is not None and not _workers_runnable(m))):
        return None
    running = (f"; {fmt(m.worker_running_share, '.0%')} of worker samples were runnable, waiting for a core"
               if m.worker_running_share is not None else "")
    cost = input_share(m) if _input_bound(m) else None
    return Finding(
        id="too_many_workers", severity=severity_for(cost), cost_share=cost,
        message=(f"{m.num_workers} DataLoader workers compete for {_cores(m.cpu_count)} ({fmt(m.cpu_util_pct, '.0f')}% busy): "
                 f"each was on a CPU only {fmt(m.worker_fetch_cpu_ratio, '.0%')} of the time it spent fetching{running}."),
        recommendation=f"{change(ctx, num_workers=_worker_cap(m))} {_tune_hint()}.",
        evidence={"num_workers": m.num_workers, "cpu_count": m.cpu_count, "cpu_util_pct": m.cpu_util_pct,
                  "worker_fetch_cpu_ratio": m.worker_fetch_cpu_ratio,
                  "worker_running_share": m.worker_running_share, "data_wait_share": m.data_wait_share,
                  "fetch_ms_per_batch_p50": m.fetch_ms_per_batch_p50},
        thresholds={"num_workers_above": m.cpu_count, "cpu_util_pct": th.CPU_SATURATED_PCT,
                    "worker_fetch_cpu_ratio_below": th.WORKER_CONTENDED_CPU_RATIO,
                    "worker_running_share": th.WORKER_RUNNABLE_SHARE},
    )


def thread_oversubscription(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if not m.num_workers or m.worker_fetch_cpu_ratio is None:
        return None
    torch_threads = m.worker_torch_threads or 1
    multithreaded = torch_threads > 1 or m.worker_fetch_cpu_ratio > th.WORKER_MULTITHREAD_CPU_RATIO
    threads_wanted = m.num_workers * max(torch_threads, m.worker_fetch_cpu_ratio)
    if not multithreaded or threads_wanted <= m.cpu_count:
        return None
    cost = input_share(m) if _input_bound(m) else None
    return Finding(
        id="thread_oversubscription", severity=severity_for(cost), cost_share=cost,
        message=(f"{m.num_workers} DataLoader workers each run several compute threads "
                 f"(torch.get_num_threads()={torch_threads}, {fmt(m.worker_fetch_cpu_ratio, '.1f')} cores busy per worker "
                 f"while fetching, {fmt(m.worker_threads_median or 0, '.0f')} OS threads each) on {_cores(m.cpu_count)}: "
                 f"{fmt(threads_wanted, '.0f')} threads contend for them."),
        recommendation=("Give each worker one thread: DataLoader(..., worker_init_fn=lambda _: "
                        "torch.set_num_threads(1)), plus cv2.setNumThreads(0) if OpenCV decodes, "
                        "or OMP_NUM_THREADS=1 in the environment."),
        evidence={"num_workers": m.num_workers, "worker_torch_threads": m.worker_torch_threads,
                  "worker_fetch_cpu_ratio": m.worker_fetch_cpu_ratio,
                  "worker_threads_median": m.worker_threads_median, "cpu_count": m.cpu_count,
                  "data_wait_share": m.data_wait_share},
        thresholds={"worker_fetch_cpu_ratio": th.WORKER_MULTITHREAD_CPU_RATIO, "threads_above": m.cpu_count},
    )


def worker_restart(ctx: Context) -> Finding | None:
    """Workers started again every epoch: by the loader itself (``persistent_workers=False``), or
    because the script builds the loader anew each epoch, where ``persistent_workers`` cannot help."""
    m, t = ctx.metrics, ctx.training
    if (t is None or not m.num_workers or m.iterators < 2
            or m.worker_startup_share is None or m.worker_startup_share < th.WORKER_STARTUP_SHARE_FLAG):
        return None
    workers = f"{m.num_workers} worker{'s' if m.num_workers > 1 else ''}"
    cost = f"{fmt(m.worker_startup_s, '.1f')} s of start-up, {fmt(m.worker_startup_share, '.0%')} of the wall time"
    evidence = {"iterators": m.iterators, "num_workers": m.num_workers, "worker_startup_s": m.worker_startup_s,
                "worker_startup_share": m.worker_startup_share, "startup_s_per_epoch": m.worker_startup_s / m.iterators,
                "loaders_built": t.rebuilt, "site": t.config.get("site")}
    if t.rebuilt > 1:
        persistent = (" Its persistent_workers=True cannot help: the loader is thrown away after each epoch."
                      if t.config.get("persistent_workers") else "")
        return Finding(
            id="loader_rebuilt", severity=severity_for(m.worker_startup_share), cost_share=m.worker_startup_share,
            message=(f"The training DataLoader built at {t.config.get('site')} was built anew {t.rebuilt} times "
                     f"(once an epoch), so its {workers} started again each time: {cost}.{persistent}"),
            recommendation=(f"Build it once, before the epoch loop, with persistent_workers=True: "
                            f"{change(ctx, persistent_workers=True)}, then iterate that same loader every epoch."),
            evidence=evidence, thresholds={"worker_startup_share": th.WORKER_STARTUP_SHARE_FLAG})
    if t.config.get("persistent_workers"):
        return None
    return Finding(
        id="worker_restart", severity=severity_for(m.worker_startup_share), cost_share=m.worker_startup_share,
        message=f"The DataLoader started its {workers} again for each of {m.iterators} epochs: {cost}.",
        recommendation=f"{change(ctx, persistent_workers=True)} keeps the workers alive between epochs.",
        evidence=evidence, thresholds={"worker_startup_share": th.WORKER_STARTUP_SHARE_FLAG})


def pageable_transfer(ctx: Context) -> Finding | None:
    m, t = ctx.metrics, ctx.training
    if (not m.cuda_used or t is None or t.config.get("pin_memory") or m.h2d_pageable_share is None
            or m.h2d_pageable_share < th.PAGEABLE_COPY_SHARE_FLAG):
        return None
    return Finding(
        id="pageable_transfer", severity=severity_for(m.h2d_pageable_share), cost_share=m.h2d_pageable_share,
        message=(f"Copies of batches to the GPU blocked the training loop {fmt(m.h2d_pageable_share, '.0%')} of the time "
                 f"({fmt((m.h2d_bytes_per_step or 0) / 2**20, '.1f')} MiB a step from pageable memory; pin_memory=False)."),
        recommendation=(f"{change(ctx, pin_memory=True)} and batch.to(device, non_blocking=True): the copy "
                        "then overlaps with compute."),
        evidence={"h2d_pageable_share": m.h2d_pageable_share, "h2d_bytes_per_step": m.h2d_bytes_per_step,
                  "pin_memory": False},
        thresholds={"h2d_pageable_share": th.PAGEABLE_COPY_SHARE_FLAG},
    )


def fluctuating_utilization(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if (m.gpu_util_p95_pct is None or m.gpu_util_p5_pct is None
            or m.gpu_util_p95_pct <= th.GPU_UTIL_FLUCTUATING_P95_PCT
            or m.gpu_util_p5_pct >= th.GPU_UTIL_FLUCTUATING_P5_PCT):
        return None
    cause = ("it idles while the loop waits for data (see the findings above)" if _input_bound(m)
             else "it idles between bursts of work queued by the host")
    return Finding(
        id="fluctuating_utilization", severity=severity_for(input_share(m)), cost_share=input_share(m),
        message=(f"GPU utilization saws between {fmt(m.gpu_util_p5_pct, '.0f')}% (p5) and {fmt(m.gpu_util_p95_pct, '.0f')}% (p95): "
                 f"the nvidia-smi sawtooth; the GPU works in bursts and {cause}."),
        recommendation=("Fix the input pipeline as the other findings say; the sawtooth flattens when batches "
                        "are ready before the GPU asks." if _input_bound(m) else
                        "Queue work without synchronising: avoid loss.item() or printing CUDA tensors every "
                        "step (torch.cuda.set_sync_debug_mode('warn') names them)."),
        evidence={"gpu_util_p5_pct": m.gpu_util_p5_pct, "gpu_util_p50_pct": m.gpu_util_p50_pct,
                  "gpu_util_p95_pct": m.gpu_util_p95_pct, "data_wait_share": m.data_wait_share},
        thresholds={"gpu_util_p95_pct": th.GPU_UTIL_FLUCTUATING_P95_PCT,
                    "gpu_util_p5_pct": th.GPU_UTIL_FLUCTUATING_P5_PCT},
    )


def host_bound(ctx: Context) -> Finding | None:
    m = ctx.metrics
    share = host_idle_share(m)
    if share is None or share < th.BOTTLENECK_MIN_SHARE or m.gpu_util_p50_pct >= th.GPU_UTIL_LOW_PCT:
        return None
    return _host_finding(m, share, "host_bound")


def _host_finding(m: Metrics, share: float, finding_id: str) -> Finding:
    return Finding(
        id=finding_id, severity=severity_for(share), cost_share=share,
        message=(f"The GPU was busy only {fmt(m.gpu_util_p50_pct, '.0f')}% of the time (p50) although data waits explain "
                 f"just {fmt(input_share(m) or 0, '.0%')}: the host does not queue work fast enough "
                 f"({fmt(share, '.0%')} of the time lost)."),
        recommendation=("Remove per-step synchronisations (loss.item(), printing CUDA tensors, blocking .to()); "
                        "torch.cuda.set_sync_debug_mode('warn') names them. A larger batch or CUDA graphs cut the "
                        "Python cost per sample."),
        evidence={"gpu_util_p50_pct": m.gpu_util_p50_pct, "data_wait_share": m.data_wait_share,
                  "gpu_idle_share": m.gpu_idle_share, "host_idle_share": share},
        thresholds={"gpu_util_p50_pct": th.GPU_UTIL_LOW_PCT, "host_idle_share": th.BOTTLENECK_MIN_SHARE},
    )


def compute_bound(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if ctx.training is None or m.data_wait_share is None:
        return None
    if any(share is not None and share >= th.BOTTLENECK_MIN_SHARE for kind, share in costs(m).items()
           if kind != COMPUTE):
        return None  # a loss worth naming: its finding explains it; the run is not "compute-bound"
    return Finding(
        id="compute_bound", severity=INFO, cost_share=None,
        message=(f"The input pipeline keeps up: the loop waited for data only {fmt(m.data_wait_share, '.1%')} of the time "
                 f"(p50 step {fmt(m.step_time_p50_ms, '.1f')} ms, {fmt(m.compute_p50_ms, '.1f')} ms of it compute); the loader is "
                 "not the problem."),
        recommendation=("Leave the tf.data pipeline as it is; to go faster, make the step cheaper (mixed precision, "
                        "jit_compile=True, a larger batch if memory allows)." if tf_data.pipeline(ctx) is not None else
                        "Leave the DataLoader as it is; to go faster, make the step cheaper (mixed precision, "
                        "torch.compile, a larger batch if memory allows)."),
        evidence=_wait_evidence(m),
        thresholds={"data_wait_share_below": th.DATA_WAIT_SHARE_FLAG},
    )


def no_dataloader(ctx: Context) -> Finding | None:
    # A command that failed (a syntax error, a missing script) says why in its end message: "wrap it
    # in a DataLoader" would be advice drawn from nothing.
    if ctx.record.iterators or ctx.record.meta.end_reason not in FINISHED_NORMALLY:
        return None
    m = ctx.metrics
    host = f"host CPU averaged {fmt(m.cpu_util_pct, '.0f')}%" if m.cpu_util_pct is not None else "no host samples"
    gpu = (f", GPU utilization p50 {fmt(m.gpu_util_p50_pct, '.0f')}%" if m.gpu_util_p50_pct is not None
           else ", GPU metrics unavailable")
    if ctx.record.processes:
        what = "The command never iterated a torch DataLoader"
    else:
        what = ("No Python process under the command imported torch.utils.data (or it ran with python -I/-E, "
                "which ignores the PYTHONPATH gpufeed instruments through)")
    return Finding(
        id="no_dataloader", severity=INFO, cost_share=None,
        message=f"{what}, so data waits could not be measured ({host}{gpu}).",
        recommendation=("gpufeed measures torch.utils.data.DataLoader; if the script feeds data another way, "
                        "wrap it in a DataLoader or time that code yourself."),
        evidence={"cpu_util_pct": m.cpu_util_pct, "gpu_util_p50_pct": m.gpu_util_p50_pct,
                  "python_processes_instrumented": len(ctx.record.processes)},
    )


def loader_stalled(ctx: Context) -> Finding | None:
    stall = ctx.record.meta.stall or (ctx.record.stalls[0] if ctx.record.stalls else None)
    if not stall:
        return None
    stacks = ctx.record.stacks()
    workers = []
    for proc in stall.get("processes") or []:
        where = _innermost_frame(stacks.get(proc.get("pid"), ""))
        workers.append({"pid": proc.get("pid"), "status": proc.get("status"), "wchan": proc.get("wchan"),
                        "cpu_pct": proc.get("cpu_pct"), "where": where})
    doing = "; ".join(f"pid {w['pid']} {w['status'] or '?'}" + (f" in {w['where']}" if w["where"] else "")
                      for w in workers[1:]) or "no worker state could be read"
    return Finding(
        id="loader_stalled", severity=HIGH, cost_share=1.0,
        message=(f"The DataLoader delivered no batch for {fmt(stall.get('waited_s', 0), '.0f')} s: it is stuck "
                 f"(workers: {doing})."),
        recommendation=("Read the stacks in the run directory's stacks/ folder to see where each worker waits; "
                        "DataLoader(..., timeout=SECONDS) makes a stuck worker raise instead of hanging."),
        evidence={"waited_s": stall.get("waited_s"), "processes": workers},
    )


def _innermost_frame(stack: str) -> str | None:
    """Where the process's main thread was: the innermost frame of the thread whose stack reaches
    the program's entry (``<module>``, or a DataLoader worker's ``_worker_loop``)."""
    blocks = [block.splitlines() for block in stack.split("\n\n")]
    for block in blocks:
        frames = [line.strip() for line in block if line.strip().startswith("File ")]
        if any(line.endswith((" in <module>", " in _worker_loop")) for line in frames):
            return frames[0].replace("File ", "", 1)
    return None


def input_share(m: Metrics) -> float | None:
    """The share of the wall time lost waiting for data. With CUDA events, the GPU's own idle time
    inside next(loader): a host that waits while the GPU still works through queued steps loses
    nothing. Elsewhere (CPU training, no events resolved) the loop's wait, which is then the truth."""
    if m.cuda_used and m.gpu_idle_share is not None:
        return m.gpu_idle_share
    return m.data_wait_share


def host_idle_share(m: Metrics) -> float | None:
    """GPU time idle for reasons other than waiting for data or for copies (CUDA runs with NVML only)."""
    if not m.cuda_used or m.gpu_util_p50_pct is None:
        return None
    return max(0.0, 1.0 - m.gpu_util_p50_pct / 100.0 - (input_share(m) or 0.0) - (m.h2d_pageable_share or 0.0))


INPUT, TRANSFER, HOST, COMPUTE = "input", "transfer", "host", "compute"


def costs(m: Metrics) -> dict[str, float | None]:
    """The wall time split four ways (shares; None where not measured): waiting for data, blocked in
    copies to the GPU, the GPU idle for other host reasons, and the rest, the step's own compute."""
    losses = {INPUT: input_share(m), TRANSFER: m.h2d_pageable_share, HOST: host_idle_share(m)}
    measured = [v for v in losses.values() if v is not None]
    losses[COMPUTE] = max(0.0, 1.0 - sum(measured)) if measured else None
    return losses


# -- every loss worth naming is explained --------------------------------------------------------------
# The findings that explain each kind of loss with a cause and a fix. When none of them fired for a
# loss that reaches the bar, a general finding states the measured facts and how to find the fix.
EXPLAINED_BY = {
    INPUT: {"too_few_workers", "cpu_saturated", "storage_latency", "too_many_workers", "thread_oversubscription",
            "worker_restart", "loader_stalled", "straggler_rank"},
    TRANSFER: {"pageable_transfer"},
    HOST: {"host_bound"},
}


def unexplained_losses(ctx: Context, findings: list[Finding]) -> list[Finding]:
    fired = {f.id for f in findings}
    general = {INPUT: input_wait, TRANSFER: blocking_transfer, HOST: host_idle}
    out = []
    for kind, share in costs(ctx.metrics).items():
        if kind in EXPLAINED_BY and share is not None and share >= th.BOTTLENECK_MIN_SHARE \
                and not fired & EXPLAINED_BY[kind]:
            out.append(general[kind](ctx, share))
    return out


def _tune_command(ctx: Context) -> str:
    command = " ".join(ctx.record.meta.command) or "python train.py"
    return f"gpufeed tune -- {command}"


def input_wait(ctx: Context, share: float) -> Finding:
    """Data waits no specific rule explains: the facts, and the command that measures the fix."""
    m = ctx.metrics
    workers = (f"num_workers={m.num_workers}" if m.num_workers is not None else "an unknown num_workers")
    why = ""
    if m.num_workers is not None and m.num_workers >= _worker_cap(m):
        why = (f" It already has at least as many workers as the job has cores for them ({_worker_cap(m)} of "
               f"{_cores(m.cpu_count)}{'' if m.cuda_used else ', one left for the training step'}), so more "
               "would share the same CPU: whether that still pays is for a measurement to say.")
    cpu_ms = _cpu_ms_per_sample(m)
    return Finding(
        id="input_wait", severity=severity_for(share), cost_share=share,
        message=(f"{_wait_sentence(m)}. The DataLoader has {workers} on {_cores(m.cpu_count)} "
                 f"({fmt(m.cpu_util_pct, '.0f')}% busy); a batch takes "
                 f"{fmt(m.fetch_ms_per_batch_p50, '.0f')} ms to prepare and the step computes for "
                 f"{fmt(m.compute_p50_ms, '.0f')} ms.{why}{_others_sentence(m)}"),
        recommendation=(f"`{_tune_command(ctx)}` measures num_workers, prefetch_factor and persistent_workers on "
                        f"this job; if none helps, make each sample cheaper to prepare"
                        f"{f' ({cpu_ms:.1f} ms of CPU per sample)' if cpu_ms else ''} or run on more cores."),
        evidence={**_wait_evidence(m), "num_workers": m.num_workers, "cpu_count": m.cpu_count,
                  "cpu_util_pct": m.cpu_util_pct, "fetch_ms_per_batch_p50": m.fetch_ms_per_batch_p50,
                  "worker_fetch_cpu_ratio": m.worker_fetch_cpu_ratio, "workers_needed": m.workers_needed,
                  "loader_cpu_ms_per_sample": cpu_ms},
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG},
    )


def blocking_transfer(ctx: Context, share: float) -> Finding:
    m = ctx.metrics
    return Finding(
        id="blocking_transfer", severity=severity_for(share), cost_share=share,
        message=(f"Copies of batches to the GPU blocked the training loop {fmt(share, '.0%')} of the time "
                 f"({fmt((m.h2d_bytes_per_step or 0) / 2**20, '.1f')} MiB a step, the copy itself timed by CUDA events)."),
        recommendation=("batch.to(device, non_blocking=True) from pinned memory (DataLoader(..., pin_memory=True)) "
                        "overlaps the copy with compute; sending fewer bytes (uint8 images, normalised on the GPU) "
                        "shortens it."),
        evidence={"h2d_pageable_share": m.h2d_pageable_share, "h2d_bytes_per_step": m.h2d_bytes_per_step},
        thresholds={"h2d_pageable_share": th.PAGEABLE_COPY_SHARE_FLAG},
    )


def host_idle(ctx: Context, share: float) -> Finding:
    return _host_finding(ctx.metrics, share, "host_idle")


FINISHED_NORMALLY = (schema.END_COMPLETED, schema.END_STEPS_REACHED, schema.END_TIMED_OUT)
# Findings that do not judge the steps, and so stand with too few of them (the stall itself).
FINDINGS_WITHOUT_STEPS = ("loader_stalled",)

# A tf.data pipeline's own causes come before the generic ones they explain (ties keep this order).
RULES: tuple[Rule, ...] = (loader_stalled,) + tf_data.RULES + (
    too_few_workers, cpu_saturated, storage_latency, too_many_workers,
    thread_oversubscription, worker_restart, pageable_transfer, fluctuating_utilization, host_bound,
    compute_bound, no_dataloader, straggler_rank, load_imbalance,
) + memory.RULES
