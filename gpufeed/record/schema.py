"""Schema of the run record (version 2: version 1 and TensorFlow processes). ``docs/run-record.md``
is the prose version.

A run directory holds::

    meta.json            RunMeta: the command, the host, how and why the run ended
    events/<pid>.jsonl   events from each instrumented Python process (and its DataLoader workers)
    samples.jsonl        the outside sampler's timeline (host CPU, memory, process tree, GPUs)
    stderr.log           the command's standard error, as the user saw it
    stacks/<pid>.txt     Python stacks of a stalled loader's processes (only after a stall)
    stall.json           the stall, as the probe saw it (only after a stall)
    steps-reached        present when gpufeed ended the command after ``--steps``

Times are seconds on the host's monotonic clock (``time.perf_counter()``, which on Linux is
CLOCK_MONOTONIC and so comparable across processes of one host). ``RunMeta.clock_offset_s``
converts them to Unix time. Sizes are bytes, shares are fractions in [0, 1], percentages are
named ``*_pct``. A reading that could not be taken is ``null``, never 0.

Event lines (``events/<pid>.jsonl``), one JSON object each, told apart by ``kind``:

``process``   pid, ppid, argv, rank, local_rank, world_size (from torchrun's RANK etc., else
              SLURM's, Open MPI's or PMI's variables; null when none is set), torch_version, t
``iterator``  pid, iter_id, loader_id (one per DataLoader object, never reused), t_created, t_ready,
              worker_pids, role ("train" or "eval"; absent in older records), role_why (its evidence),
              config (LoaderConfig fields), samples_from (how its batches' samples are counted:
              docs/run-record.md), torch_threads (the creating process's torch.get_num_threads()),
              pin_thread (the native id of the thread that pins its batches: its pin thread, or the
              training thread with num_workers=0; null where nothing is pinned; absent in older records)
``epoch``     pid, iter_id, t: a persistent-worker iterator was reset for a new epoch
``steps``     pid, iter_id, rows of [index, t_request, t_deliver, samples, cpu_s, thread_cpu_s]; cpu_s
              is the process CPU time inside next() for one batch in 8 when num_workers=0 (the batch
              is made there), else null; thread_cpu_s the calling thread's share of it (absent in
              older records)
``fetches``   pid, worker_id, torch_threads, rows of [t_start, t_end, cpu_s, samples]: one batch
              made by a DataLoader worker each
``cuda``      pid, iter_id, rows of [index, gpu_idle_s, mem_allocated_b, mem_reserved_b, mem_peak_b]
``h2d``       pid, rows of [t, bytes, host_s, pinned, copy_s, non_blocking, on_step_stream, api]: host-to-device
              tensor copies; host_s is the host's time in the call (a blocking copy first waits for
              queued GPU work), copy_s the copy's own time from CUDA events around it on the copy's
              stream (null where not resolved, or not recorded during a CUDA graph capture);
              non_blocking: the call asked non_blocking=True (only a pinned copy then leaves the host free); on_step_stream: 1 where the copy
              went on the stream the steps run on (the kernels after it wait for it), 0 on another
              stream (a prefetcher's), null where the steps' stream was not known yet; api: 0
              Tensor.to/.cuda, 1 Tensor.copy_, 2 torch.as_tensor(device=), 3 torch.tensor(device=)
              (the last three columns absent in older records)
``cuda_device`` pid, t, index, name, uuid, visible (CUDA_VISIBLE_DEVICES), order (CUDA_DEVICE_ORDER),
              source: a GPU the process used, named when the probe first saw it used ("the batch's
              copy" or "the optimizer's parameters"; never merely torch's current device)
``cuda_stream`` pid, t, device, device_source, stream_id, default, source: the device and stream the
              steps' CUDA events were recorded on from then on ("the device's default stream" until the
              optimizer steps, then "the stream current at the optimizer's step")
``loop``      pid, rows of [part, t_start, t_end, samples, optimizer] (LOOP_COLUMNS): the timed parts of
              a training loop (forward, evaluation forward, backward, optimizer step), read as steps
              where the process iterated no training DataLoader (analysis/loop.py)
``stall``     pid, iter_id, t_request, waited_s, worker_pids, first_batch: no batch for ``--stall-timeout``
              seconds (``--first-batch-timeout`` for an iterator's first batch); TensorFlow: tf_call
              (``next`` or Keras's ``train_function``), the call that waited
``exit``      pid, t, reason ("steps_reached", "sigterm" or "exit"), exit_code (from sys.exit(n), an
              uncaught exception (1) or SIGTERM (-15); null when not said), error (the exception); memory at exit where readable:
              rss_peak_b (VmHWM), uss_b (private memory), shared_b (shared memory), and with CUDA cuda_mem_peak_b,
              cuda_mem_reserved_peak_b, cuda_mem_total_b
``memory``    pid, t, uss_start_b, shared_start_b: a DataLoader worker's private and shared memory at its start
``batch_parts`` pid, rows of [t_start, samples_s, collate_s, sample_max_s, sample_p50_s, samples]
              (PART_COLUMNS), slow of [t_start, index, seconds]: a map-style DataLoader worker's batches
              with each dataset[i] call timed (its slowest samples named, only the tail)
<<<<<<< HEAD
``pins``      pid, rows of [thread, t_start, t_end, bytes] (PIN_COLUMNS): each batch torch pinned
              (pin_memory=True with an accelerator), timed around the module-level pin_memory() of
              torch.utils.data._utils.pin_memory; thread: the native id of the thread that pinned it (an
              iterator's ``pin_thread``); bytes: the pinned tensors' (measure/inside/pinning.py)
``profile``   pid, interval_s, samples, outside_s, stacks of [site, function, call, cpu_s, samples]: a DataLoader
              worker's CPU by the user's own code since its last flush (measure/inside/profiler.py)
=======
``profile``   pid, interval_s, samples, outside_s, stacks of [site, function, call, cpu_s, samples, wait_s]: a
              DataLoader worker's CPU and waiting by the user's own code since its last flush, with
              wall_interval_s, wait_outside_s, wait_unfiled_s, runqueue_s (measure/inside/profiler.py)
>>>>>>> wait-profile
``shm``       pid, t, path, free_b, total_b, batch_b, tensors, sharing_strategy, worker_id: once per DataLoader
              worker, /dev/shm's free space and size just before its first batch, and that batch's bytes in
              shared memory (its tensors' storages); written at once (measure/inside/shm.py)
``fork_probe`` pid, child_pid, t_fork, t_forked, t_released, steps, minor_faults, default_start_method
              (how a DataLoader without a multiprocessing_context starts workers there): once per run, inside
              the warm-up, the probe forked a child that only waited, from t_forked to t_released,
              while ``steps`` training steps ran (what they paid in copy-on-write page faults is
              the cost of each epoch's fork of non-persistent workers); minor_faults, the training
              process's minor page faults meanwhile (null where not readable)
``tf_pipeline`` pid, loader_id, stages, options, cardinality, tf_name, tf_root, tf_stages: a
              TensorFlow process's tf.data pipeline (its iterator and steps events come from
              TensorFlow's profiler trace, kept in tf-profile/<pid>/)
``tf_profile`` pid, t_start, t_end, path, error: the window the profiler ran in
``tf_steps_seen`` pid, t, steps, batch_size: a TensorFlow process's steps as Python saw them start,
              every 0.25 s while its profiler runs (progress displays; the steps come from the trace)
``samples_unknown``  pid, iter_id, reason: why some batches' samples could not be counted
``warning``   pid, t, message: a problem of gpufeed's own (a loader it stopped measuring)
``offload``   pid, t, batches, by_node, resent, workers_lost, fell_back, latency_ms_p50,
              recent_latency_ms_p50, make_ms_p50, make_cpu_ms_p50, workers: the totals so far of the
              training loader's batches made on Ray (``--offload``), every 64 batches and at the end

Sample lines (``samples.jsonl``)::

    {"t", "cpu_pct": [per core], "iowait_pct", "mem_used_b", "mem_total_b",
     "procs": [[pid, ppid, cpu_pct, threads, status, rss_b], ...],
     "gpus": [{"index", "util_pct", "mem_used_b", "mem_total_b", "procs": {pid: used_b},
               "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "gpm_na",
               "util_na", "mig": [{"uuid", "mem_used_b", "mem_total_b", "util_pct", "util_na"}]}],
     "others": [[pid, name, cores], ...]}   # about every 2 s: the busiest programs outside the command
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 2

META_FILE = "meta.json"
EVENTS_DIR = "events"
SAMPLES_FILE = "samples.jsonl"
STDERR_FILE = "stderr.log"
STDOUT_FILE = "stdout.log"        # only when gpufeed kept the output off the terminal (tune trials)
STACKS_DIR = "stacks"
STALL_MARKER = "stall.json"          # written by the probe when a loader stalls: the runner acts on it
STEPS_REACHED_MARKER = "steps-reached"  # written by the probe when it ended the run after --steps
STOP_MARKER = "stop-requested"  # written by the runner as it asks the command to stop: a TensorFlow
                                # process stuck in an op (no Python signal handler runs) reads its trace on it

# Column names of the row-oriented event kinds, so readers never index by magic number: the reader
# loads them as typed views (``record/rows.py``: ``it.steps.t_request``).
STEP_COLUMNS = ("index", "t_request", "t_deliver", "samples", "cpu_s", "thread_cpu_s")
FETCH_COLUMNS = ("t_start", "t_end", "cpu_s", "samples")
# ``batch_parts`` rows: a map-style worker's batch (its ``fetches`` row has the same t_start): the time in
# its dataset[i] calls, in collate_fn, its slowest and its median sample, and its samples.
PART_COLUMNS = ("t_start", "samples_s", "collate_s", "sample_max_s", "sample_p50_s", "samples")
PIN_COLUMNS = ("thread", "t_start", "t_end", "bytes")  # ``pins`` rows: one batch pinned
SLOW_COLUMNS = ("t_start", "index", "seconds")  # a batch_parts event's ``slow`` rows
PROFILE_STACK_COLUMNS = ("site", "function", "call", "cpu_s", "samples", "wait_s")  # a profile event's ``stacks`` rows
CUDA_COLUMNS = ("index", "gpu_idle_s", "mem_allocated_b", "mem_reserved_b", "mem_peak_b")
H2D_COLUMNS = ("t", "bytes", "host_s", "pinned", "copy_s", "non_blocking", "on_step_stream", "api")
# ``loop`` rows (measure/inside/loop.py): one timed part of a loop's training. part: 0 the model's
# forward (with the loss module), 1 a forward without grad (evaluation), 2 backward, 3 an optimizer
# step, a gradient clipping or a zero_grad; samples: a training forward's batch; optimizer: which optimizer
# stepped (0 the first that did; null for the other parts).
LOOP_COLUMNS = ("part", "t_start", "t_end", "samples", "optimizer")
LOOP_FORWARD, LOOP_EVAL_FORWARD, LOOP_BACKWARD, LOOP_OPTIMIZER = 0, 1, 2, 3  # a loop row's part
# The numeric series of a sample line's GPU (the reader's ``samples.gpus[index]`` arrays). GPM's three
# (Hopper and newer; absent in older records) are over the interval since the previous sample; null is
# N/A, and ``gpm_na`` says why ("not supported", "not permitted", the first sample). ``util_na``: why
# util_pct is null (a MIG-enabled GPU: "not supported"); ``mig``: each MIG instance read on its own.
GPU_SERIES = ("util_pct", "mem_used_b", "mem_total_b", "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct")
PROC_COLUMNS = ("pid", "ppid", "cpu_pct", "threads", "status", "rss_b")  # a sample's ``procs`` rows
OTHER_COLUMNS = ("pid", "name", "cores")  # a sample's ``others`` rows: the busiest programs outside the command

# An iterator's role (``iterator`` events): what its loader feeds. See measure/inside/roles.py.
ROLE_TRAIN = "train"
ROLE_EVAL = "eval"

# How a run ended (RunMeta.end_reason).
END_COMPLETED = "completed"          # the command exited 0 by itself
END_STEPS_REACHED = "steps_reached"  # gpufeed ended it after --steps measured steps
END_FAILED = "failed"                # the command exited non-zero or was killed by a signal
END_INTERRUPTED = "interrupted"      # Ctrl-C
END_STALLED = "stalled"              # no batch for --stall-timeout seconds
END_NOT_STARTED = "not_started"      # the command could not be started
END_TIMED_OUT = "timed_out"          # gpufeed ended it at its time limit (tune and batch-size trials)


@dataclass(frozen=True)
class LoaderConfig:
    """The DataLoader settings that decide how fast it can feed the step."""

    num_workers: int | None          # null for a tf.data pipeline (docs/tensorflow.md)
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool
    batch_size: int | None
    drop_last: bool
    dataset_type: str
    dataset_len: int | None
    iterable: bool
    sampler: str
    batch_sampler: str | None
    multiprocessing_context: str | None
    # A script's own batch_sampler= (batch_size is then None): the sampler it draws from, its batch size.
    inner_sampler: str | None = None
    batch_sampler_size: int | None = None
    loader_class: str | None = None    # DataLoader, or a subclass (module.Class): StatefulDataLoader...
    iterator_class: str | None = None  # the iterator it made: torch's, torchdata's, gpufeed's RayBatches
    site: str | None = None   # file:line of the DataLoader(...) call; gpufeed tune targets it
    user_stack: tuple[str, ...] = ()   # the user's own frames above that call, file:line, innermost first
    user_function: str | None = None   # the function of the first of them (train_dataloader, main...)
    framework: str | None = None       # transformers, lightning, keras, timm, accelerate: built the loader
    origin_site: str | None = None     # the user's own DataLoader(...) call this loader was rebuilt from
    # Settings the call took from the script's command line or config: {"num_workers": {"kind":
    # "argparse", "flags": ["-j", "--workers"], "store_true": false}} or {"kind": "hydra", "key": ...}.
    knobs: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Its batches were made on Ray (--offload), not by num_workers local workers: backend, workers,
    # nodes, address (null: a local Ray started for the run). Absent (None) when not offloaded.
    offload: dict[str, Any] | None = None

    @property
    def user_site(self) -> str | None:
        """The first line of the user's own code on the way to the DataLoader(...) call."""
        return self.user_stack[0] if self.user_stack else None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LoaderConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in d.items() if k in names}
        if "user_stack" in kept:
            kept["user_stack"] = tuple(kept["user_stack"] or ())
        return cls(**kept)


@dataclass
class RunMeta:
    """``meta.json``: written when the run starts and rewritten when it ends."""

    schema_version: int
    gpufeed_version: str
    name: str
    command: list[str]
    cwd: str
    hostname: str
    cpu_count: int                   # CPUs the job may use (affinity, cgroup quota, SLURM): ``cpus.count``
    started_at_unix: float
    clock_offset_s: float            # unix time = monotonic time + clock_offset_s
    t_start: float
    t_end: float | None = None
    exit_code: int | None = None     # negative: killed by that signal
    end_reason: str | None = None    # one of END_*; null while running or after a hard kill
    message: str | None = None       # one sentence on how the run ended
    steps_requested: int | None = None
    warmup_steps: int = 0
    stall: dict[str, Any] | None = None
    sampler: dict[str, Any] = field(default_factory=dict)  # interval_s, cpu_s, samples, gpu_error
    stderr_tail: list[str] = field(default_factory=list)
    # Which CPUs and why (``measure/outside/cpus.py``): count, cores, host_count, quota_cpus, slurm_cpus,
    # limited_by. None in records written before it existed: the whole host.
    cpus: dict[str, Any] | None = None
    stop_signal: str | None = None   # the signal gpufeed received that stopped the run ("SIGINT", "SIGTERM")
    killed_after_grace_s: float | None = None  # the command did not end this long after being asked: killed

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunMeta":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
