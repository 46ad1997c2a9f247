"""The DataLoader: does the loop wait for data, and why? Too few workers for idle cores, a CPU
that cannot prepare batches faster, workers asleep on storage, too many workers or threads for
the cores, and workers started again every epoch."""
from __future__ import annotations

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import Finding, severity_for
from gpufeed.analysis.rules.facts import (cpu_ms_per_sample, host_saturated, input_bound, model_describes_the_run,
                                          offloaded, startup_cost_share,
                                          steady_input_share, without_dataloader,
                                          worker_cap, workers_asleep, workers_multithreaded, workers_runnable)
from gpufeed.analysis.rules.wording import (change, cores, others_sentence, restart_sentence, tune_hint,
                                            wait_evidence, wait_sentence)
from gpufeed.analysis.offload_sizing import cores_needed
from gpufeed.settings import epoch_order_note, shuffling_sampler
from gpufeed.units import fmt


def too_few_workers(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if not input_bound(m) or m.num_workers is None or host_saturated(m) or workers_asleep(m) or offloaded(m):
        return None
    suggested = _workers_to_suggest(ctx)
    if suggested <= m.num_workers:
        return None
    return Finding(
        id="too_few_workers", severity=severity_for(steady_input_share(m)), cost_share=steady_input_share(m),
        message=(f"{wait_sentence(m)} while the CPU was only {fmt(m.cpu_util_pct, '.0f')}% busy: the DataLoader has "
                 f"num_workers={m.num_workers} on {cores(m.cpu_count)} and preparing a batch is CPU work "
                 f"({fmt(m.fetch_ms_per_batch_p50, '.0f')} ms each)."),
        recommendation=f"{change(ctx, num_workers=suggested)} {tune_hint()}.",
        evidence={**wait_evidence(m), "num_workers": m.num_workers, "cpu_count": m.cpu_count,
                  "cpu_util_pct": m.cpu_util_pct, "fetch_ms_per_batch_p50": m.fetch_ms_per_batch_p50,
                  "worker_fetch_cpu_ratio": m.worker_fetch_cpu_ratio, "workers_needed": m.workers_needed},
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG, "cpu_util_pct_below": th.CPU_SATURATED_PCT,
                    "worker_fetch_cpu_ratio_at_least": th.WORKER_ASLEEP_CPU_RATIO},
        fix_settings={"num_workers": suggested},
    )


def _workers_to_suggest(ctx: Context) -> int:
    """The model's best worker count with a worker per core at most, where it predicts more workers
    than the run's; else one more than the run's, up to what the cores hold (``worker_cap``). The
    heuristic alone was wrong on a CPU-bound loop on 2 cores whose step is 3% of its time: it kept a
    core for the step and said num_workers=1, which measured 0.90x; the model put w1 at 0.98x and w2
    at 1.48x (1.43-1.54x), and w2 measured 1.49x (tests/workloads/cpu_bound.py, docs/what-if.md)."""
    m = ctx.metrics
    fit = getattr(ctx.what_if, "best_one_per_core", None)
    if fit is not None and fit.num_workers > m.num_workers and model_describes_the_run(ctx.what_if):
        return fit.num_workers
    return min(max(m.workers_needed or 0, m.num_workers + 1), worker_cap(m))


def cpu_saturated(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if (not input_bound(m) or not host_saturated(m) or workers_asleep(m) or offloaded(m) or without_dataloader(m)
            or (m.num_workers or 0) > m.cpu_count):  # a loop without a DataLoader: rules/loop.py says it
        return None
    cpu_ms = cpu_ms_per_sample(m)
    cost = f" ({fmt(cpu_ms, '.1f')} ms of CPU per sample)" if cpu_ms else ""
    # How many cores the step needs, and the --offload command that gives them (docs/offload.md).
    need = cores_needed(m, ctx.what_if, ctx.record.meta.command)
    return Finding(
        id="cpu_saturated", severity=severity_for(steady_input_share(m)), cost_share=steady_input_share(m),
        message=(f"{wait_sentence(m)} and all {cores(m.cpu_count)} were {fmt(m.cpu_util_pct, '.0f')}% busy: "
                 f"the CPU cannot prepare batches faster, so more workers cannot help.{others_sentence(m)}"),
        recommendation=(f"Make each sample cheaper to prepare{cost}: decode smaller images, cache decoded "
                        "samples, move augmentation to the GPU; or run on more CPU cores."
                        + (f" {need.sentence()}" if need else "")),
        evidence={**wait_evidence(m), "cpu_util_pct": m.cpu_util_pct, "cpu_count": m.cpu_count,
                  "cpu_cores_command": m.cpu_cores_command, "num_workers": m.num_workers,
                  "loader_cpu_ms_per_sample": cpu_ms,
                  **({"cores_needed": need.cores, "cores_needed_from": need.source} if need else {})},
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG, "cpu_util_pct": th.CPU_SATURATED_PCT},
    )


def storage_latency(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if not input_bound(m) or not workers_asleep(m) or m.num_workers is None or offloaded(m):
        return None
    settings, why = _storage_fix(ctx)
    loader = (f"{change(ctx, **settings)}: {why} {tune_hint()}; or move the data to local SSD / cache it."
              if settings else f"Move the data to local SSD or cache it: {why}.")
    return Finding(
        id="storage_latency", severity=severity_for(steady_input_share(m)), cost_share=steady_input_share(m),
        message=(f"{wait_sentence(m)}. The DataLoader has num_workers={m.num_workers} on {cores(m.cpu_count)} "
                 f"and the workers were {fmt(m.worker_asleep_share, '.0%')} asleep while fetching "
                 f"({fmt(m.fetch_ms_per_batch_p50, '.0f')} ms a batch): reading data is latency-bound."
                 f"{others_sentence(m)}"),
        recommendation=loader,
        evidence={**wait_evidence(m), "num_workers": m.num_workers, "cpu_count": m.cpu_count,
                  "worker_asleep_share": m.worker_asleep_share, "worker_fetch_cpu_ratio": m.worker_fetch_cpu_ratio,
                  "fetch_ms_per_batch_p50": m.fetch_ms_per_batch_p50, "workers_needed": m.workers_needed,
                  "iowait_pct": m.iowait_pct, "cpu_util_pct": m.cpu_util_pct},
        thresholds={"data_wait_share": th.DATA_WAIT_SHARE_FLAG,
                    "worker_fetch_cpu_ratio_below": th.WORKER_ASLEEP_CPU_RATIO,
                    "worker_running_share_below": th.WORKER_RUNNABLE_SHARE},
        fix_settings=settings or None,
    )


def _storage_fix(ctx: Context) -> tuple[dict, str]:
    """(the DataLoader settings to offer, why). Where the what-if model describes the run, its best
    setting on these cores (workers, and persistent workers where it predicts them), with a deeper
    prefetch where it has workers; nothing where its best is the run's own. Else twice the run's
    workers or as many as keep up with the step by rate, capped at 16 a core. The heuristic alone
    offered num_workers=32 on a loaded 2-core host (storage bench) where the same what-if block
    predicted it at 0.99x and 4 persistent workers at 1,253 samples/s: the fix must be the model's."""
    m = ctx.metrics
    best = getattr(ctx.what_if, "best", None)
    if best is not None and model_describes_the_run(ctx.what_if):
        persistent = bool(ctx.training.config.get("persistent_workers")) if ctx.training is not None else False
        settings: dict = {}
        if best.num_workers != m.num_workers:
            settings["num_workers"] = best.num_workers
        if best.num_workers and best.persistent_workers != persistent:
            settings["persistent_workers"] = best.persistent_workers
        if not settings:
            return {}, (f"the what-if model predicts no DataLoader setting faster than yours on these cores "
                        f"({best.label} is best, limit: {best.limit})")
        if best.num_workers:
            settings["prefetch_factor"] = th.LATENCY_PREFETCH_FACTOR
        more = ("waiting workers cost little CPU, so more of them than cores pays"
                if best.num_workers > max(m.num_workers, m.cpu_count) else
                f"the what-if model's best on these cores ({fmt(best.samples_per_s, ',.0f')} samples/s predicted, "
                f"limit: {best.limit})")
        return settings, more
    needed = max(m.workers_needed or 0, 2 * max(m.num_workers, 1))
    # Latency-bound workers scale past the core count; the cap only keeps the advice sane.
    suggested = min(needed, th.TUNE_MAX_WORKERS_PER_CORE * m.cpu_count)
    return ({"num_workers": suggested, "prefetch_factor": th.LATENCY_PREFETCH_FACTOR},
            "waiting workers cost little CPU, so more of them than cores pays")


def too_many_workers(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if (m.num_workers is None or m.num_workers <= m.cpu_count or not host_saturated(m) or offloaded(m)
            or m.worker_fetch_cpu_ratio is None or m.worker_fetch_cpu_ratio >= th.WORKER_CONTENDED_CPU_RATIO
            or (m.worker_running_share is not None and not workers_runnable(m))):
        return None
    running = (f"; {fmt(m.worker_running_share, '.0%')} of worker samples were runnable, waiting for a core"
               if m.worker_running_share is not None else "")
    cost = steady_input_share(m) if input_bound(m) else None
    return Finding(
        id="too_many_workers", severity=severity_for(cost), cost_share=cost,
        message=(f"{m.num_workers} DataLoader workers compete for {cores(m.cpu_count)} ({fmt(m.cpu_util_pct, '.0f')}% busy): "
                 f"each was on a CPU only {fmt(m.worker_fetch_cpu_ratio, '.0%')} of the time it spent fetching{running}."),
        recommendation=f"{change(ctx, num_workers=worker_cap(m))} {tune_hint()}.",
        evidence={"num_workers": m.num_workers, "cpu_count": m.cpu_count, "cpu_util_pct": m.cpu_util_pct,
                  "worker_fetch_cpu_ratio": m.worker_fetch_cpu_ratio,
                  "worker_running_share": m.worker_running_share, "data_wait_share": m.data_wait_share,
                  "fetch_ms_per_batch_p50": m.fetch_ms_per_batch_p50},
        thresholds={"num_workers_above": m.cpu_count, "cpu_util_pct": th.CPU_SATURATED_PCT,
                    "worker_fetch_cpu_ratio_below": th.WORKER_CONTENDED_CPU_RATIO,
                    "worker_running_share": th.WORKER_RUNNABLE_SHARE},
        fix_settings={"num_workers": worker_cap(m)},
    )


def thread_oversubscription(ctx: Context) -> Finding | None:
    m = ctx.metrics
    if not m.num_workers or m.worker_fetch_cpu_ratio is None or offloaded(m):
        return None
    torch_threads = m.worker_torch_threads or 1
    threads_wanted = m.num_workers * max(torch_threads, m.worker_fetch_cpu_ratio)
    if not workers_multithreaded(m) or threads_wanted <= m.cpu_count:
        return None
    cost = steady_input_share(m) if input_bound(m) else None
    return Finding(
        id="thread_oversubscription", severity=severity_for(cost), cost_share=cost,
        message=(f"{m.num_workers} DataLoader workers each run several compute threads "
                 f"(torch.get_num_threads()={torch_threads}, {fmt(m.worker_fetch_cpu_ratio, '.1f')} cores busy per worker "
                 f"while fetching, {fmt(m.worker_threads_median or 0, '.0f')} OS threads each) on {cores(m.cpu_count)}: "
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
    because the script builds the loader anew each epoch, where ``persistent_workers`` cannot help.

    The cost is measured where it falls inside the window (``facts.startup_cost_share``): in iter(loader),
    in each epoch's first next(), and on a CPU-only run in the steps after the fork (copy-on-write),
    which a wait in next() never shows. A window without a restart in it: the share of the run's
    start-ups (first batch included) over its span."""
    m, t = ctx.metrics, ctx.training
    if t is None or not m.num_workers or m.iterators < 2 or offloaded(m):
        return None
    share = startup_cost_share(m)
    if share is None or share < th.WORKER_STARTUP_SHARE_FLAG:
        return None
    workers = f"{m.num_workers} worker{'s' if m.num_workers > 1 else ''}"
    where = restart_sentence(m)
    cost = (f"{share:.0%} of the time ({where})" if where else
            f"{fmt(m.worker_startup_s, '.1f')} s of start-up, {share:.0%} of the wall time")
    evidence = {"iterators": m.iterators, "num_workers": m.num_workers, "restart_share": share,
                "startup_in_iter_share": m.startup_in_iter_share, "restart_wait_share": m.restart_wait_share,
                "fork_step_share": m.fork_step_share, "worker_startup_s": m.worker_startup_s,
                "worker_startup_share": m.worker_startup_share, "startup_s_per_epoch": m.worker_startup_s / m.iterators,
                "loaders_built": t.rebuilt, "site": t.config.get("site")}
    if t.rebuilt > 1:
        persistent = (" Its persistent_workers=True cannot help: the loader is thrown away after each epoch."
                      if t.config.get("persistent_workers") else "")
        return Finding(
            id="loader_rebuilt", severity=severity_for(share), cost_share=share,
            message=(f"The training DataLoader built at {t.config.get('site')} was built anew {t.rebuilt} times "
                     f"(once an epoch), so its {workers} started again each time: {cost}.{persistent}"),
            recommendation=(f"Build it once, before the epoch loop, with persistent_workers=True: "
                            f"{change(ctx, persistent_workers=True)}, then iterate that same loader every epoch."
                            f"{_order_caveat(t.config)}"),
            evidence=evidence, thresholds={"restart_share": th.WORKER_STARTUP_SHARE_FLAG},
            fix_settings={"persistent_workers": True})
    if t.config.get("persistent_workers"):
        return None
    return Finding(
        id="worker_restart", severity=severity_for(share), cost_share=share,
        message=f"The DataLoader started its {workers} again for each of {m.iterators} epochs: {cost}.",
        recommendation=f"{change(ctx, persistent_workers=True)} keeps the workers alive between epochs.{_order_caveat(t.config)}",
        evidence=evidence, thresholds={"restart_share": th.WORKER_STARTUP_SHARE_FLAG},
        fix_settings={"persistent_workers": True})


def _order_caveat(config: dict) -> str:
    """A sentence on what persistent workers change in a seeded shuffle, where the loader's sampler may
    shuffle (``settings.epoch_order_note``); "" where it does not."""
    note = epoch_order_note(False, True, shuffling_sampler(config))
    return f" {note}." if note else ""
