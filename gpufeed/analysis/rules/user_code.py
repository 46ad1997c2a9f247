"""The user's code: does one function of the dataset's own code hold most of the workers' CPU while the
loop waits for data?

Read from the workers' ``profile`` events (``measure/inside/profiler.py``: CPU samples filed under the
first frame of the user's own files, with the library call beneath it); with ``num_workers=0``, from the
training process's, sampled only while its training thread was inside the loader's ``next()``. The finding names
``file:line function``, its share of the workers' CPU, the library call it spends it in, and a fix that
fits what it is.
"""
from __future__ import annotations

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import Finding, severity_for
from gpufeed.analysis.rules.facts import input_share
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


def _fix(call: str | None) -> str:
    if call is None:
        return _PYTHON
    for marks, fix in _FIXES:
        if any(mark in call for mark in marks):
            return fix
    return "make it cheaper (vectorise, decode less, cache what does not change between epochs)"


def user_code_hotspot(ctx: Context) -> Finding | None:
    t = ctx.training
    if t is None:
        return None
    # num_workers=0: the batches are made in the training process, sampled inside next() only (scope "next")
    in_loop = not t.worker_pids
    pids = t.worker_pids or [t.pid]
    if in_loop and (ctx.record.profiles.get(t.pid) or {}).get("scope") != "next":
        return None
    functions: dict[tuple[str, str], float] = {}
    calls: dict[tuple[str, str], dict[str | None, float]] = {}
    total, samples = 0.0, 0
    for pid in pids:
        prof = ctx.record.profiles.get(pid)
        if not prof:
            continue
        total += prof.get("outside_s") or 0.0
        samples += prof.get("samples") or 0
        for (site, function, call), (cpu, _n) in prof["stacks"].items():
            total += cpu
            functions[(site, function)] = functions.get((site, function), 0.0) + cpu
            per = calls.setdefault((site, function), {})
            per[call] = per.get(call, 0.0) + cpu
    share_in = input_share(ctx.metrics)
    if (not functions or total <= 0 or samples < th.USER_CODE_MIN_SAMPLES or share_in is None
            or share_in < th.DATA_WAIT_SHARE_FLAG):
        return None
    (site, function), cpu = max(functions.items(), key=lambda kv: kv[1])
    share = cpu / total
    if share < th.USER_CODE_HOTSPOT_SHARE:
        return None
    call, call_cpu = max(calls[(site, function)].items(), key=lambda kv: kv[1])
    beneath = (f", {fmt(call_cpu / cpu, '.0%')} of it in {call}" if call is not None else
               ", in its own Python code (no library call beneath it)")
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
        for f in ctx.record.fetches:
            if f.pid in t.worker_pids and len(f.rows):
                wall += float((f.rows.t_end - f.rows.t_start).sum())
                cpu_in += float(f.rows.cpu_s[f.rows.cpu_s == f.rows.cpu_s].sum())
    busy = min(cpu_in / wall, 1.0) if wall > 0 else None
    cost = share_in * share * (busy if busy is not None else 1.0)
    whose = "the training process's CPU inside next(loader) (num_workers=0)" if in_loop else "the DataLoader workers' CPU"
    busy_text = (f" (the {'training thread was' if in_loop else 'workers were'} on a CPU {busy:.0%} of "
                 f"{'its time in next()' if in_loop else 'their fetch time'})" if busy is not None else "")
    return Finding(
        id="user_code_hotspot", severity=severity_for(cost), cost_share=cost,
        message=(f"`{site} {function}` took {share:.0%} of {whose} ({fmt(cpu, '.2f')} s of "
                 f"{fmt(total, '.2f')} s sampled{beneath}){busy_text}, while the loop waited for data "
                 f"{share_in:.0%} of the time: that function is what makes a batch expensive."),
        recommendation=f"In {function}() at {site}: {_fix(call)}.",
        evidence={"site": site, "function": function, "call": call, "cpu_s": cpu, "workers_cpu_s": total,
                  "cpu_share": share, "samples": samples, "worker_cpu_busy_share": busy, "input_share": share_in,
                  "profiled": "next" if in_loop else "workers"},
        thresholds={"cpu_share": th.USER_CODE_HOTSPOT_SHARE, "samples": th.USER_CODE_MIN_SAMPLES,
                    "input_share": th.DATA_WAIT_SHARE_FLAG},
    )
