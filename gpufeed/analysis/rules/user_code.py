"""The user's code: does one function of the dataset's own code hold most of the workers' time while the
loop waits for data?

Read from the workers' ``profile`` events (``measure/inside/profiler.py``: CPU samples filed under the
first frame of the user's own files, with the library call beneath it, and the time the worker waited
(I/O, sleep, locks) filed the same way by a wall-clock sampler); with ``num_workers=0``, from the training
process's, sampled only while its training thread was inside the loader's ``next()`` (CPU only). The
finding names ``file:line function``, its share of the workers' busy time (CPU + waiting), how much of it
is CPU and how much waiting, the call it spends it in, and a fix that fits what it is.
"""
from __future__ import annotations

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import Finding, severity_for
from gpufeed.analysis.rules.facts import input_share
from gpufeed.analysis.worker_profile import FunctionTime, loader_profile
from gpufeed.units import fmt

# What the library call beneath the user's frame says about the fix (first match wins).
_FIXES = (
    (("PIL/",), "decode smaller images (PIL's Image.draft() decodes a JPEG at 1/2, 1/4 or 1/8 of its size, "
                "reduce=... in Image.open's thumbnail path) or decode once and cache the decoded samples"),
    (("cv2", "torchvision/transforms", "albumentations", "kornia"),
     "move the augmentation to the GPU, on whole batches (torchvision.transforms.v2 on CUDA tensors, kornia, "
     "NVIDIA DALI), or cache what does not change between epochs"),
    (("pickle", "json", "h5py", "zipfile", "tarfile", "io.py", "_io", "pyarrow", "pandas"),
     "read larger chunks, or cache the decoded samples (in memory, or one preprocessed file)"),
    (("numpy/", "torch/"), "vectorise it over the whole sample or the batch (one numpy/torch call instead of "
                           "many small ones), or do it once in collate_fn on the batch"),
)
_PYTHON = ("vectorise the Python loop (numpy or torch over the whole sample, or over the batch in collate_fn), "
           "or compute it once and cache it")


# Where a function mostly waits: what it waits on, by the call it waits in (first match wins)
_WAIT_FIXES = (
    (("sleep()",), "sleep",
     "it sleeps: remove the time.sleep() (a rate limit, a retry back-off?) or overlap it with more workers "
     "(num_workers) or a deeper prefetch_factor"),
    (("acquire()", "threading.py", "queue.py", "synchronize.py", "wait()", "join()"), "a lock or a queue",
     "it waits on a lock or a queue the workers share: give each worker its own (open handles and clients per "
     "worker, in worker_init_fn), or hold the lock for less"),
    (("read", "open", "recv", "requests/", "urllib", "http/", "socket", "ssl", "boto", "fsspec", "s3fs", "h5py",
      "io.py", "zipfile", "tarfile", "pyarrow", "pandas", "load", "pickle", "lmdb", "mmap", "get("), "storage",
     "read larger chunks (one read a sample or a shard, not many small ones), cache the samples (in memory, or "
     "on a local disk), and overlap the waiting: more workers (num_workers) or a deeper prefetch_factor, since "
     "a worker that waits leaves its core free"),
)
_WAIT = ("it waits, off the CPU: overlap the waiting with more workers (num_workers) or a deeper prefetch_factor, "
         "read larger chunks, or cache what it waits for")


def _wait_fix(call: str | None) -> tuple[str, str]:
    """(what it waits on, the fix) by the call it waits in."""
    for marks, what, fix in _WAIT_FIXES:
        if call is not None and any(mark in call for mark in marks):
            return what, fix
    return "I/O or another process", _WAIT


def _fix(call: str | None) -> str:
    if call is None:
        return _PYTHON
    for marks, fix in _FIXES:
        if any(mark in call for mark in marks):
            return fix
    return "make it cheaper (vectorise, decode less, cache what does not change between epochs)"


def _split(f: FunctionTime) -> str:
    """Its CPU / waiting split ("X% CPU / Y% waiting"; CPU only where the waits were not sampled)."""
    if f.wait_share is None:
        return "CPU only: its waiting was not sampled"
    return f"{1 - f.wait_share:.0%} CPU / {f.wait_share:.0%} waiting"


def user_code_hotspot(ctx: Context) -> Finding | None:
    t = ctx.training
    if t is None:
        return None
    # num_workers=0: the batches are made in the training process, sampled inside next() only (scope "next")
    in_loop = not t.worker_pids
    prof = loader_profile(ctx.record, t)
    if prof is None or (in_loop and prof.scope != "next"):
        return None
    total = prof.busy_s
    share_in = input_share(ctx.metrics)
    if (not prof.functions or total <= 0 or prof.samples < th.USER_CODE_MIN_SAMPLES or share_in is None
            or share_in < th.DATA_WAIT_SHARE_FLAG):
        return None
    f = prof.functions[0]
    share = f.busy_s / total
    if share < th.USER_CODE_HOTSPOT_SHARE:
        return None
    waiting = f.wait_share is not None and f.wait_share > th.USER_CODE_WAITING_SHARE
    # The call it spends the most of what dominates in: its waiting, or its CPU
    top = max(f.calls, key=lambda c: (c.wait_s or 0.0) if waiting else c.cpu_s)
    part = (top.wait_s or 0.0) if waiting else top.cpu_s
    whole = (f.wait_s or 0.0) if waiting else f.cpu_s
    of_it = f"of its {'waiting' if waiting else 'CPU'}"
    beneath = (f", {fmt(part / whole if whole > 0 else None, '.0%')} {of_it} in {top.call}" if top.call is not None
               else f", {of_it} in its own Python code (no library call beneath it)" if not waiting else "")
    if waiting:
        what, fix = _wait_fix(top.call)
    else:
        what, fix = "CPU", _fix(top.call)
    # The workers' CPU over their fetch time: how much of their time this CPU is (the rest they wait);
    # with num_workers=0 the training thread's CPU over its time in next(), for the batches it was read.
    wall = cpu_in = 0.0
    if in_loop:
        for it in ctx.record.iterators:
            if t.owns(it) and len(it.steps):
                s = it.steps
                read = s.thread_cpu_s == s.thread_cpu_s
                wall += float((s.t_deliver - s.t_request)[read].sum())
                cpu_in += float(s.thread_cpu_s[read].sum())
    else:
        for fe in ctx.record.fetches:
            if fe.pid in t.worker_pids and len(fe.rows):
                wall += float((fe.rows.t_end - fe.rows.t_start).sum())
                cpu_in += float(fe.rows.cpu_s[fe.rows.cpu_s == fe.rows.cpu_s].sum())
    busy = min(cpu_in / wall, 1.0) if wall > 0 else None
    # Its share of the time the workers spent making batches; where only CPU was sampled, of their CPU, and
    # that CPU is the busy share of their fetch time
    cost = share_in * share * (busy if busy is not None and not prof.waits else 1.0)
    if in_loop:
        whose = "the training process's CPU inside next(loader) (num_workers=0)"
    elif prof.waits:
        whose = "the DataLoader workers' time making batches (CPU and waiting)"
    else:
        whose = "the DataLoader workers' CPU"
    busy_text = (f" (the {'training thread was' if in_loop else 'workers were'} on a CPU {busy:.0%} of "
                 f"{'its time in next()' if in_loop else 'their fetch time'})" if busy is not None else "")
    core = (f"; the workers also waited {fmt(prof.runqueue_s, '.2f')} s for a core (the machine's, not the "
            f"function's)" if prof.runqueue_s and prof.runqueue_s > 0.05 * total else "")
    return Finding(
        id="user_code_hotspot", severity=severity_for(cost), cost_share=cost,
        message=(f"`{f.site} {f.function}` took {share:.0%} of {whose}, {_split(f)} ({fmt(f.busy_s, '.2f')} s of "
                 f"{fmt(total, '.2f')} s sampled{beneath}){busy_text}{core}, while the loop waited for data "
                 f"{share_in:.0%} of the time: that function is what makes a batch expensive."),
        recommendation=(f"In {f.function}() at {f.site}, mostly "
                        f"{'waiting on ' + what if waiting else 'CPU'}: {fix}."),
        evidence={"site": f.site, "function": f.function, "call": top.call, "cpu_s": f.cpu_s, "wait_s": f.wait_s,
                  "busy_s": f.busy_s, "workers_busy_s": total, "share": share, "wait_share": f.wait_share,
                  "waits_on": what, "workers_cpu_s": sum(g.cpu_s for g in prof.functions) + prof.outside_s,
                  "cpu_share": f.cpu_s / total, "runqueue_s": prof.runqueue_s,
                  "samples": prof.samples, "worker_cpu_busy_share": busy, "input_share": share_in,
                  "profiled": "next" if in_loop else "workers"},
        thresholds={"share": th.USER_CODE_HOTSPOT_SHARE, "samples": th.USER_CODE_MIN_SAMPLES,
                    "input_share": th.DATA_WAIT_SHARE_FLAG, "waiting": th.USER_CODE_WAITING_SHARE},
    )
