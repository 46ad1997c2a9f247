"""Synthetic run records, written to disk in the documented schema, for unit tests of the analysis.

Each scenario is a small set of knobs over one generator, so a test reads as the situation it
covers ("workers asleep, 2 cores idle") rather than as a pile of numbers.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from gpufeed.record import schema
from gpufeed.record.writer import JsonlWriter, write_json_atomic

MAIN_PID = 1000


@dataclass
class Scenario:
    cpu_count: int = 2
    num_workers: int = 2
    prefetch_factor: int | None = 2
    persistent_workers: bool = False
    pin_memory: bool = False
    batch_size: int = 32
    epochs: int = 1
    rebuilt: bool = False             # the loader built anew each epoch at one site (a loader_id an epoch)
    autotune_pools: int = 1           # worker pools per epoch: --autotune switched mid-epoch between them
    steps_per_epoch: int = 200
    compute_s: float = 0.010          # per step, after the batch arrives
    wait_s: float = 0.0005            # per step, inside next(loader)
    # Every other step waits ``cold[0]`` in next() and then steps for ``cold[1]`` (a step after a long wait
    # runs slower: the CPU idled); None: every step waits wait_s and steps compute_s.
    cold: tuple[float, float] | None = None
    startup_s: float = 0.05           # iterator creation to first batch
    stop_s: float | None = None       # the next() that ends each epoch (workers shut down); None: no epoch_end event
    fetch_wall_s: float = 0.015       # per batch in a worker
    fetch_cpu_s: float = 0.012        # CPU time of that fetch
    worker_torch_threads: int = 1
    train_torch_threads: int | None = None  # the training process's, in its iterator events (None: an older record)
    spin_in_next_s: float | None = None  # num_workers=0: other threads' CPU inside next() (None: no thread_cpu_s)
    # The probe's fork in the warm-up (a ``fork_probe`` event): the fork's own time, and what the two steps
    # that ran while its child lived took beyond compute_s (None: no probe, an older record)
    fork_probe: tuple[float, float, float] | None = None   # (fork_s, first step's extra, second's)
    default_start_method: str = "fork"
    multiprocessing_context: str | None = None
    sampler: str = "RandomSampler"   # the training loader's (shuffle=True)
    worker_os_threads: int = 4
    worker_status: str = "sleeping"
    worker_cpu_pct: float = 30.0      # each worker, every sample (sampler)
    host_cpu_pct: float = 40.0        # every core, every sample
    train_cpu_pct: float = 100.0      # the training process, every sample (sampler)
    # ... but while it starts an epoch's workers (creation to first batch) or stops them (epoch_end):
    # forking, copy-on-write, joining them (None: train_cpu_pct there too)
    restart_cpu_pct: float | None = None
    cuda: bool = False
    gpu_idle_s: float | None = None   # per step, from CUDA events (None: idle through the whole wait)
    h2d_host_s: float | None = None   # per step, pageable copy: the host's time in .to()
    h2d_copy_s: float | None = None   # the copy's own time from CUDA events (None: not recorded)
    # The copy's pinned, non_blocking, on_step_stream and api columns (schema.H2D_COLUMNS; None: an older record)
    h2d_kind: tuple | None = None
    gpu_util_pattern: list[float] | None = None  # NVML readings, cycled
    sm_active_pattern: list[float] | None = None  # GPM's SM activity, cycled (None: GPM N/A, gpm_na says why)
    gpm_na: str | None = "not supported"
    with_loader: bool = True
    # A loop without a DataLoader (with_loader=False): ``loop_steps`` optimizer steps, each the loop's
    # own work (get_batch) for ``loop_own_s``, then forward, backward and optimizer step taking
    # ``loop_work_s`` in all, on batches of ``batch_size``.
    loop_steps: int = 0
    loop_own_s: float = 0.004
    loop_work_s: float = 0.016
    stall_s: float | None = None
    end_reason: str = schema.END_COMPLETED
    warmup_steps: int = 10
    # Evaluation passes (a Trainer's eval_steps): after every ``eval_every`` training steps, an evaluation
    # loader's iterator of 4 batches taking ``eval_s`` in all, ``eval_stop_s`` more in the next() that
    # ends it (its workers shut down: an ``epoch_end`` event), and 1 ms before training goes on; None: no
    # evaluation.
    eval_every: int | None = None
    eval_s: float = 0.1
    eval_stop_s: float = 0.0
    # Several GPUs: NVML readings of GPUs 1.. (the job's is 0), the job's pids in NVML's process list
    # or not (containers, MIG), the probe's `cuda_device` event and the sampler's device list.
    other_gpu_utils: list[float] = field(default_factory=list)
    gpu_procs_listed: bool = True
    cuda_device: dict | None = None
    sampler_extra: dict = field(default_factory=dict)
    # The CPUs the job may use (meta.cpus) and per-core host readings (default: host_cpu_pct on each)
    cpus: dict | None = None
    host_cpu_per_core: list[float] | None = None
    # --offload: the loader config's `offload` flag (no local worker then makes a batch, whatever
    # num_workers says: none is started) and the `offload` events, each written at its "t"
    offload: dict | None = None
    offload_events: list[dict] = field(default_factory=list)
    # Programs outside the command: the sampler's ``others`` rows ([pid, name, cores]), every 2 s
    others: list[list] | None = None
    # Each worker's ``shm`` reading before its first batch: (batch_b, free_b, total_b) (None: no reading)
    shm: tuple[int, int, int] | None = None
    # Each worker's ``profile`` stacks ([site, function, call, cpu_s, samples], ...) and its CPU outside them
    profile: list[list] | None = None
    profile_outside_s: float = 0.0
    # The wall-clock sampler's (rows then carry wait_s as their 6th column): each worker's waiting outside
    # the user's code and its time waiting for a core; None: not armed
    profile_waits: tuple[float, float] | None = None


def _loop_rows(events: JsonlWriter, sc: Scenario, t: float) -> float:
    rows = []
    for _ in range(sc.loop_steps):
        t += sc.loop_own_s
        third = sc.loop_work_s / 3
        rows.append([schema.LOOP_FORWARD, t, t + third, sc.batch_size, None])
        rows.append([schema.LOOP_BACKWARD, t + third, t + 2 * third, None, None])
        rows.append([schema.LOOP_OPTIMIZER, t + 2 * third, t + sc.loop_work_s, None, 0])
        t += sc.loop_work_s
    events.write({"kind": "loop", "pid": MAIN_PID, "rows": rows})
    return t


def write_run(path: Path, sc: Scenario) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    events = JsonlWriter(path / schema.EVENTS_DIR / f"{MAIN_PID}.jsonl")
    events.write({"kind": "process", "pid": MAIN_PID, "ppid": 1, "argv": ["train.py"], "t": 0.0,
                  "rank": None, "local_rank": None, "world_size": None, "torch_version": "2.13.0"})
    t = 1.0
    worker_pid = itertools.count(2000)
    all_workers: list[int] = []
    config = {"num_workers": sc.num_workers, "pin_memory": sc.pin_memory,
              "prefetch_factor": sc.prefetch_factor if sc.num_workers else None,
              "persistent_workers": sc.persistent_workers, "batch_size": sc.batch_size, "drop_last": False,
              "dataset_type": "Synthetic", "dataset_len": sc.batch_size * sc.steps_per_epoch, "iterable": False,
              "sampler": sc.sampler, "batch_sampler": "BatchSampler",
              "multiprocessing_context": sc.multiprocessing_context}
    if sc.offload is not None:
        config["offload"] = sc.offload
    if sc.rebuilt:
        config["site"] = "train.py:12"
    t_first = t
    switches = 0
    restarts: list[tuple[float, float]] = []
    if sc.with_loader and sc.autotune_pools > 1:
        events.write({"kind": "autotune", "pid": MAIN_PID, "action": "start", "t": t, "period_s": 0.5,
                      "iterable": False, "user": _autotune_settings(sc, sc.num_workers)})
    if sc.with_loader:
        for epoch in range(sc.epochs):
            workers = [] if sc.offload is not None else [next(worker_pid) for _ in range(sc.num_workers)]
            all_workers += workers
            t_created = t
            iter_id = epoch * sc.autotune_pools
            events.write({"kind": "iterator", "pid": MAIN_PID, "iter_id": iter_id,
                          "loader_id": epoch if sc.rebuilt else 0, "t_created": t_created, "t_ready": t_created + 0.001, "worker_pids": workers,
                          "config": config, **({"torch_threads": sc.train_torch_threads}
                                               if sc.train_torch_threads is not None else {})})
            rows, cuda_rows, h2d_rows = [], [], []
            t += sc.startup_s - sc.wait_s
            restarts.append((t_created, t + sc.wait_s))
            for i in range(sc.steps_per_epoch):
                t_req = t
                wait_s, compute_s = sc.cold if sc.cold and i % 2 else (sc.wait_s, sc.compute_s)
                t_del = t_req + wait_s
                # With num_workers=0 the batch is made inside next(): the probe takes its CPU time
                # for one step in 8.
                cpu = sc.fetch_cpu_s if not workers and i % 8 == 0 else None
                if cpu is not None and sc.spin_in_next_s is not None:  # the process's CPU, and the thread's own
                    rows.append([i, t_req, t_del, sc.batch_size, cpu + sc.spin_in_next_s, cpu])
                else:
                    rows.append([i, t_req, t_del, sc.batch_size, cpu])
                if sc.cuda:
                    cuda_rows.append([i, sc.wait_s if sc.gpu_idle_s is None else sc.gpu_idle_s, 1e9, 2e9, 1.5e9])
                if sc.h2d_host_s is not None:
                    pinned, *kind = sc.h2d_kind or (False,)
                    h2d_rows.append([t_del + 0.0001, 4 * 2**20, sc.h2d_host_s, pinned, sc.h2d_copy_s, *kind])
                t = t_del + compute_s + _fork_probe_extra(sc, epoch, i)
                if sc.eval_every and (i + 1) % sc.eval_every == 0:
                    t = _evaluation_pass(events, sc, t, 1000 + epoch * sc.steps_per_epoch + i)
            if sc.fork_probe is not None and not epoch:
                events.write(_fork_probe_event(sc, rows))
            bounds = [round(k * sc.steps_per_epoch / sc.autotune_pools) for k in range(sc.autotune_pools)]
            for k, (a, b) in enumerate(zip(bounds, bounds[1:] + [sc.steps_per_epoch])):
                start, end = t_created + sc.startup_s * 0.5, t if b == sc.steps_per_epoch else rows[b - 1][2]
                if k:  # autotune switched mid-epoch: a new pool, while the old one delivers what it had in flight
                    start = rows[max(a - sc.num_workers * (sc.prefetch_factor or 0), 0)][1]
                    switches += 1
                    pool = _autotune_switch(events, sc, start, switches)
                    workers = [next(worker_pid) for _ in range(pool["num_workers"])]
                    all_workers += workers
                    events.write({"kind": "iterator", "pid": MAIN_PID, "iter_id": iter_id + k, "loader_id": 0,
                                  "t_created": start + 1e-4, "t_ready": start + 0.001, "worker_pids": workers,
                                  "config": {**config, **pool}})
                renumbered = [[i - a, *row[1:]] for i, row in enumerate(rows[a:b], a)]
                events.write({"kind": "steps", "pid": MAIN_PID, "iter_id": iter_id + k, "rows": renumbered})
                if cuda_rows:
                    events.write({"kind": "cuda", "pid": MAIN_PID, "iter_id": iter_id + k,
                                  "rows": [[i - a, *row[1:]] for i, row in enumerate(cuda_rows[a:b], a)]})
                _write_fetches(path, sc, workers, start, end, b - a)
            if h2d_rows:
                events.write({"kind": "h2d", "pid": MAIN_PID, "rows": h2d_rows})
            if sc.stop_s is not None:
                events.write({"kind": "epoch_end", "pid": MAIN_PID, "iter_id": iter_id + sc.autotune_pools - 1,
                              "t_request": t, "t": t + sc.stop_s})
                restarts.append((t, t + sc.stop_s))
                t += sc.stop_s
            if sc.stall_s is not None and epoch == sc.epochs - 1:
                events.write({"kind": "stall", "pid": MAIN_PID, "iter_id": iter_id + k, "t_request": t,
                              "waited_s": sc.stall_s, "worker_pids": workers})
                t += sc.stall_s
    elif sc.loop_steps:
        t = _loop_rows(events, sc, t)
    else:
        t += 3.0
    for ev in sc.offload_events:
        events.write({"kind": "offload", "pid": MAIN_PID, **ev})
    if switches:
        last = _autotune_settings(sc, sc.num_workers + switches)
        events.write({"kind": "autotune", "pid": MAIN_PID, "action": "settled", "t": t, "settings": last,
                      "label": f"w{last['num_workers']} p{last['prefetch_factor']}", "samples_per_s": 3000.0,
                      "user_samples_per_s": 1500.0, "speedup": 2.0, "noise": 0.03, "trials": switches,
                      "periods": switches + 1, "stopped": None})
    if sc.cuda_device is not None:
        events.write({"kind": "cuda_device", "pid": MAIN_PID, "t": t_first, **sc.cuda_device})
    events.close()
    _write_samples(path, sc, t_first, t, all_workers, restarts)
    stall = None
    if sc.stall_s is not None:
        stall = {"pid": MAIN_PID, "waited_s": sc.stall_s, "worker_pids": all_workers[-sc.num_workers:],
                 "processes": [{"pid": MAIN_PID, "name": "python", "status": "sleeping", "cpu_pct": 0.0,
                                "threads": 5, "wchan": "futex_wait"}]
                 + [{"pid": p, "name": "python", "status": "sleeping", "cpu_pct": 0.0, "threads": 3,
                     "wchan": "hrtimer_nanosleep"} for p in all_workers[-sc.num_workers:]]}
        (path / schema.STACKS_DIR).mkdir(exist_ok=True)
        for p in all_workers[-sc.num_workers:]:
            (path / schema.STACKS_DIR / f"{p}.txt").write_text(
                'Thread 0x2 (most recent call first):\n  File "/usr/lib/python3/threading.py", line 331 in wait\n\n'
                'Current thread 0x1 (most recent call first):\n  File "/data/hang.py", line 12 in __getitem__\n'
                '  File "/torch/utils/data/_utils/worker.py", line 374 in _worker_loop\n')
    meta = schema.RunMeta(schema_version=schema.SCHEMA_VERSION, gpufeed_version="test", name=path.name,
                          command=["python", "train.py"], cwd=str(path), hostname="test", cpu_count=sc.cpu_count,
                          started_at_unix=1.7e9, clock_offset_s=1.7e9, t_start=0.0, t_end=t + 0.5,
                          exit_code=0 if sc.end_reason == schema.END_COMPLETED else 1, end_reason=sc.end_reason,
                          message="test", warmup_steps=sc.warmup_steps, stall=stall, cpus=sc.cpus,
                          sampler={"interval_s": 0.1, "samples": 0, "cpu_s": 0.0,
                                   "gpu_error": None if sc.gpu_util_pattern else "NVML library not found",
                                   **sc.sampler_extra})
    write_json_atomic(path / schema.META_FILE, meta.to_dict())
    return path


def _evaluation_pass(events: JsonlWriter, sc: Scenario, t: float, iter_id: int) -> float:
    """An evaluation loader's pass from ``t`` (4 batches in ``eval_s``, then its workers' shutdown);
    returns when it ended."""
    events.write({"kind": "iterator", "pid": MAIN_PID, "iter_id": iter_id, "loader_id": 1, "t_created": t,
                  "t_ready": t + 0.001, "worker_pids": [], "role": schema.ROLE_EVAL,
                  "config": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                             "persistent_workers": False, "batch_size": sc.batch_size, "drop_last": False,
                             "dataset_type": "Eval", "dataset_len": 4 * sc.batch_size, "iterable": False,
                             "sampler": "SequentialSampler", "batch_sampler": "BatchSampler",
                             "multiprocessing_context": None}})
    each = sc.eval_s / 4
    events.write({"kind": "steps", "pid": MAIN_PID, "iter_id": iter_id,
                  "rows": [[k, t + k * each, t + (k + 0.5) * each, sc.batch_size, None] for k in range(4)]})
    last = t + 3.5 * each
    events.write({"kind": "epoch_end", "pid": MAIN_PID, "iter_id": iter_id, "t_request": last + 0.5 * each,
                  "t": last + 0.5 * each + sc.eval_stop_s})
    return t + sc.eval_s + sc.eval_stop_s + 0.001  # the Trainer's own work after the pass


def _fork_probe_extra(sc: Scenario, epoch: int, index: int) -> float:
    """The probe's fork as measure/inside/forking.py makes it: after the warm-up's 8th batch of 10 (its
    warmup - 2nd), for two steps. What the step of batch ``index`` takes beyond compute_s."""
    if sc.fork_probe is None or epoch:
        return 0.0
    fork_s, first, second = sc.fork_probe
    return {sc.warmup_steps - 3: fork_s + first, sc.warmup_steps - 2: second}.get(index, 0.0)


def _fork_probe_event(sc: Scenario, rows: list) -> dict:
    """Its event: forked just after the 8th delivery, its child let go after the warm-up's last."""
    t_fork = rows[sc.warmup_steps - 3][2] + 1e-5
    return {"kind": "fork_probe", "pid": MAIN_PID, "child_pid": 99, "t_fork": t_fork,
            "t_forked": t_fork + sc.fork_probe[0], "t_released": rows[sc.warmup_steps - 1][2] + 1e-5,
            "steps": 2, "minor_faults": 9000, "default_start_method": sc.default_start_method}


def _autotune_settings(sc: Scenario, workers: int) -> dict:
    return {"num_workers": workers, "prefetch_factor": sc.prefetch_factor, "persistent_workers": sc.persistent_workers,
            "pin_memory": sc.pin_memory}


def _autotune_switch(events: JsonlWriter, sc: Scenario, t: float, n: int) -> dict:
    """--autotune's ``n``-th switch (to one more worker each time), as its event says; the new pool's settings."""
    old, new = _autotune_settings(sc, sc.num_workers + n - 1), _autotune_settings(sc, sc.num_workers + n)
    events.write({"kind": "autotune", "pid": MAIN_PID, "action": "switch", "t": t, "old": old, "new": new,
                  "label": f"w{new['num_workers']} p{new['prefetch_factor']}", "where": "mid-epoch"})
    return {k: new[k] for k in ("num_workers", "prefetch_factor", "persistent_workers")}


def _write_fetches(path: Path, sc: Scenario, workers: list[int], t0: float, t1: float, batches: int) -> None:
    producers = workers
    if not producers:
        return  # num_workers=0: the steps carry it
    per_producer = max(1, batches // len(producers))
    for n, pid in enumerate(producers):
        writer = JsonlWriter(path / schema.EVENTS_DIR / f"{pid}.jsonl")
        span = (t1 - t0) / per_producer
        rows = []
        for k in range(per_producer):
            start = t0 + k * span
            rows.append([start, start + min(sc.fetch_wall_s, span), sc.fetch_cpu_s, sc.batch_size])
        if sc.shm is not None:
            batch_b, free_b, total_b = sc.shm
            writer.write({"kind": "shm", "pid": pid, "t": t0, "path": "/dev/shm", "free_b": free_b - n * batch_b,
                          "total_b": total_b, "batch_b": batch_b, "tensors": 2, "sharing_strategy": "file_descriptor",
                          "worker_id": n})
        if sc.profile is not None:
            writer.write({"kind": "profile", "pid": pid, "interval_s": 0.01, "outside_s": sc.profile_outside_s,
                          "samples": sum(r[4] for r in sc.profile) + round(sc.profile_outside_s / 0.01),
                          "stacks": sc.profile,
                          **({"wall_interval_s": 0.01, "wait_outside_s": sc.profile_waits[0], "wait_unfiled_s": 0.0,
                              "runqueue_s": sc.profile_waits[1]} if sc.profile_waits is not None else {})})
        writer.write({"kind": "fetches", "pid": pid, "worker_id": n,
                      "torch_threads": sc.worker_torch_threads, "rows": rows})
        writer.close()


def _write_samples(path: Path, sc: Scenario, t0: float, t1: float, workers: list[int],
                   restarts: list[tuple[float, float]] = ()) -> None:
    writer = JsonlWriter(path / schema.SAMPLES_FILE)
    lines, t, k = [], t0, 0
    while t <= t1:
        train_pct = sc.train_cpu_pct
        if sc.restart_cpu_pct is not None and k:  # a reading covers the 0.1 s before it
            share = sum(max(min(b, t) - max(a, t - 0.1), 0.0) for a, b in restarts) / 0.1
            train_pct = share * sc.restart_cpu_pct + (1 - share) * sc.train_cpu_pct
        procs = [[MAIN_PID, 1, train_pct, 6, "running", 500 * 2**20]]
        procs += [[w, MAIN_PID, sc.worker_cpu_pct, sc.worker_os_threads, sc.worker_status, 200 * 2**20]
                  for w in workers]
        gpus = []
        if sc.gpu_util_pattern:
            util = sc.gpu_util_pattern[k % len(sc.gpu_util_pattern)]
            gpus = [{"index": 0, "util_pct": util, "mem_used_b": 30 * 2**30, "mem_total_b": 80 * 2**30,
                     "procs": {str(MAIN_PID): 30 * 2**30} if sc.gpu_procs_listed else {}}]
            if sc.sm_active_pattern:
                active = sc.sm_active_pattern[k % len(sc.sm_active_pattern)]
                gpus[0].update(sm_active_pct=active, sm_occupancy_pct=active / 2, tensor_active_pct=0.0, gpm_na=None)
            else:
                gpus[0].update(sm_active_pct=None, sm_occupancy_pct=None, tensor_active_pct=None, gpm_na=sc.gpm_na)
            gpus += [{"index": i, "util_pct": u, "mem_used_b": 70 * 2**30, "mem_total_b": 80 * 2**30,
                      "procs": {"77777": 70 * 2**30}} for i, u in enumerate(sc.other_gpu_utils, 1)]
        cores = sc.host_cpu_per_core or [sc.host_cpu_pct] * sc.cpu_count
        lines.append({"t": t, "cpu_pct": cores, "iowait_pct": 0.5,
                      "mem_used_b": 8 * 2**30, "mem_total_b": 24 * 2**30, "procs": procs, "gpus": gpus})
        if sc.others is not None and k % 20 == 0:
            lines[-1]["others"] = sc.others
        t += 0.1
        k += 1
    writer.write_many(lines)
    writer.close()


# -- several ranks (torchrun) -------------------------------------------------------------------------
@dataclass
class RankSpec:
    """One rank of a synthetic data-parallel job (num_workers=0, so its steps are all it writes)."""

    wait_s: float = 0.0005            # per step, inside next(loader)
    compute_s: float = 0.010          # per step, its own forward/backward
    batch_size: int = 32
    gpu_util: list[float] | None = None  # NVML readings of its GPU, cycled
    end: str | None = "exit"          # its exit event's reason; None: no exit event (killed)
    batch_cpu_s: float | None = None  # the CPU of each batch made in next(), timed one step in 8 (None: untimed)
    cpu_pct: float = 90.0             # the training process's CPU, every sampler reading


def write_ddp_run(path: Path, ranks: list[RankSpec], steps: int = 100, synchronized: bool = True,
                  hostname: str = "node0", rank_base: int = 0, world_size: int | None = None,
                  t0: float = 1.0, clock_offset_s: float = 1.7e9, pid_base: int = MAIN_PID,
                  stderr: str = "", end_reason: str = schema.END_COMPLETED) -> Path:
    """A data-parallel job's record on one node. ``synchronized``: the ranks meet in an all-reduce at
    the end of every step, so each step lasts as long as the slowest rank's wait plus compute."""
    path.mkdir(parents=True, exist_ok=True)
    world_size = world_size or len(ranks)
    clocks = [t0] * len(ranks)
    rows: list[list] = [[] for _ in ranks]
    for k in range(steps):
        if synchronized:
            clocks = [max(clocks)] * len(ranks)
        step_end = max(c + r.wait_s + r.compute_s for c, r in zip(clocks, ranks))
        for i, r in enumerate(ranks):
            rows[i].append([k, clocks[i], clocks[i] + r.wait_s, r.batch_size, r.batch_cpu_s if k % 8 == 0 else None])
            clocks[i] = step_end if synchronized else clocks[i] + r.wait_s + r.compute_s
    t_end = max(clocks)
    for i, r in enumerate(ranks):
        pid = pid_base + i
        events = JsonlWriter(path / schema.EVENTS_DIR / f"{pid}.jsonl")
        events.write({"kind": "process", "pid": pid, "ppid": 1, "argv": ["train.py"], "t": 0.0,
                      "rank": rank_base + i, "local_rank": i, "world_size": world_size, "torch_version": "2.13.0"})
        config = {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "persistent_workers": False,
                  "batch_size": r.batch_size, "drop_last": False, "dataset_type": "Synthetic",
                  "dataset_len": r.batch_size * steps, "iterable": False, "sampler": "DistributedSampler",
                  "batch_sampler": "BatchSampler", "multiprocessing_context": None}
        events.write({"kind": "iterator", "pid": pid, "iter_id": 0, "loader_id": 0, "t_created": t0 - 0.05,
                      "t_ready": t0 - 0.05, "worker_pids": [], "config": config})
        events.write({"kind": "steps", "pid": pid, "iter_id": 0, "rows": rows[i]})
        if r.end is not None:
            events.write({"kind": "exit", "pid": pid, "t": t_end, "reason": r.end})
        events.close()
    samples = JsonlWriter(path / schema.SAMPLES_FILE)
    lines, t, n = [], t0, 0
    while t <= t_end:
        gpus = [{"index": i, "util_pct": r.gpu_util[n % len(r.gpu_util)], "mem_used_b": 2**30,
                 "mem_total_b": 16 * 2**30, "procs": {str(pid_base + i): 2**30}}
                for i, r in enumerate(ranks) if r.gpu_util]
        lines.append({"t": t, "cpu_pct": [40.0, 40.0], "iowait_pct": 0.0, "mem_used_b": 8 * 2**30,
                      "mem_total_b": 24 * 2**30, "procs": [[pid_base + i, 1, r.cpu_pct, 6, "running", 2**29]
                                                           for i, r in enumerate(ranks)], "gpus": gpus})
        t += 0.1
        n += 1
    samples.write_many(lines)
    samples.close()
    (path / schema.STDERR_FILE).write_text(stderr)
    meta = schema.RunMeta(schema_version=schema.SCHEMA_VERSION, gpufeed_version="test", name=path.name,
                          command=["torchrun", "train.py"], cwd=str(path), hostname=hostname, cpu_count=2,
                          started_at_unix=clock_offset_s + t0, clock_offset_s=clock_offset_s, t_start=t0 - 0.1,
                          t_end=t_end + 0.5, exit_code=0 if end_reason == schema.END_COMPLETED else 1,
                          end_reason=end_reason, message="test", warmup_steps=10,
                          sampler={"interval_s": 0.1, "samples": len(lines), "cpu_s": 0.0,
                                   "gpu_error": None if any(r.gpu_util for r in ranks) else "NVML library not found"})
    write_json_atomic(path / schema.META_FILE, meta.to_dict())
    return path


@dataclass
class RankAutotune:
    """--autotune's events on one rank of ``write_ddp_run``'s job: each switch as (t, batch, from
    workers, to workers); a fall-back to your settings (``declined``) at (t, batch); rank 0 also writes
    the search's periods, each (t, elapsed_s, workers, {rank: samples/s})."""

    switches: list[tuple[float, int, int, int]] = field(default_factory=list)
    declined: tuple[float, int] | None = None
    periods: list[tuple[float, float, int, dict[int, float]]] = field(default_factory=list)


def add_rank_autotune(path: Path, ranks: list[RankAutotune], user_workers: int = 1, pid_base: int = MAIN_PID,
                      t_start: float = 1.0, rank_base: int = 0) -> Path:
    """Append each rank's autotune events to ``write_ddp_run``'s record (as ``autotune/ranks.py`` writes
    them: ``rank`` on every rank's own events, ``batch`` on its switches)."""
    def settings(w: int) -> dict:
        return {"num_workers": w, "prefetch_factor": 2 if w else None, "persistent_workers": False}

    def label(w: int) -> str:
        return f"w{w} p2" if w else "w0"

    for i, spec in enumerate(ranks):
        pid = pid_base + i
        events = JsonlWriter(path / schema.EVENTS_DIR / f"{pid}.jsonl")
        events.write({"kind": "autotune", "pid": pid, "action": "start", "t": t_start, "rank": rank_base + i,
                      "user": settings(user_workers), "iterable": False, "period_s": 0.3})
        for t, elapsed, workers, rates in spec.periods:
            events.write({"kind": "autotune", "pid": pid, "action": "measured", "t": t, "why": "test",
                          "period": {"settings": settings(workers), "label": label(workers), "elapsed_s": elapsed,
                                     "samples_per_s": min(rates.values()), "wait_share": 0.5, "batches": 10,
                                     "ranks": [{"rank": r, "samples_per_s": v, "wait_share": 0.5}
                                               for r, v in rates.items()]}})
        for t, batch, old, new in spec.switches:
            events.write({"kind": "autotune", "pid": pid, "action": "switch", "t": t, "rank": rank_base + i, "batch": batch,
                          "old": settings(old), "new": settings(new), "label": label(new), "where": "mid-epoch"})
        if spec.declined is not None:
            t, batch = spec.declined
            events.write({"kind": "autotune", "pid": pid, "action": "declined", "t": t, "rank": rank_base + i, "batch": batch,
                          "said": i == 0, "why": "autotune is off for every rank: rank 1 did not reach batch "
                                                 f"{batch} within 3 s; your settings from now on"})
        events.close()
    return path
