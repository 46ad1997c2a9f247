"""Check everything GPU-specific on a real NVIDIA GPU, around positive and negative controls.

CPU machines cannot exercise NVML, GPM, CUDA events, streams, graph capture or pinned copies; this
script does, each control a small training script run under ``gpufeed diagnose``, each asserting a
number and printing PASS/FAIL with it (issue 34). It exits non-zero on any FAIL. About 5-8 minutes on
one GPU. Keep what it prints in ``bench/results/``.

    python bench/gpu_check.py | tee bench/results/gpu_check-$(date +%F).txt
    python bench/gpu_check.py controls          # only the controls (a)-(j)
    python bench/gpu_check.py transfer gpus overhead findings   # the older sections
    python bench/gpu_check.py --dry-run         # no GPU: each control's script tiny on the CPU, and
                                                # each control's judge against a passing and a failing number

The controls:
  (a) sync_every_step   a loop that synchronises every step: GPU idle = the host's wait, within 10%
  (b) host_ahead        an asynchronous loop, the host ahead of the GPU: GPU idle near 0
  (c) other_device      the batch copied to a device that is not the current one: events, memory and the
                        UUID of that device, no context on the current one (needs 2 GPUs, else SKIP)
  (d) side_stream       a prefetcher copying under its own stream: timed on the steps' stream (idle ~0)
  (e) graph_capture     a graph captured around a pinned .cuda(non_blocking=True): captures and replays
  (f) compile_graphs    torch.compile(mode="reduce-overhead") for 50 steps, unharmed
  (g) pinned_64mb       a 64 MB pinned non_blocking copy each step on the compute stream: counted as transfer
  (h) two_ranks         two torchrun ranks on one GPU, rank 1 slowed: named per rank
  (i) gpm               GPM's SM activity read or N/A with the reason, and the cost of a reading
  (j) pin_thread        2 workers, pin_memory=True, 16 MB batches: every batch's ``pins`` row written on the
                        iterator's pin thread (not the training thread), matched to the steps, and the
                        wait split with pinning a number (not N/A): worker + pinning + hand-over = wait

It runs from a checkout without installing gpufeed (a lent GPU machine has its own torch and no
registry): it needs torch with CUDA, psutil, rich, numpy and nvidia-ml-py importable.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # gpufeed from this checkout, for us and for the commands we start
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

LOADER_SCRIPT = textwrap.dedent('''
    import sys, time, torch
    from torch.utils.data import DataLoader, Dataset
    latency, compute_n, pin, batch_elems, steps = (float(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "pin",
                                                   int(sys.argv[4]), int(sys.argv[5]))
    class D(Dataset):
        def __len__(self): return 100000
        def __getitem__(self, i):
            time.sleep(latency)
            return torch.randn(batch_elems), i % 10
    dev = torch.device("cuda")
    w = torch.randn(compute_n, compute_n, device=dev)
    loader = DataLoader(D(), batch_size=32, num_workers=4, pin_memory=pin)
    for step, (x, y) in enumerate(loader):
        x = x.to(dev, non_blocking=pin)
        a = w
        for _ in range(4):
            a = a @ w          # queued on the GPU; the host moves on to ask for the next batch
        if step + 1 >= steps:
            break
    torch.cuda.synchronize()
''')

# The GPU-only findings, each produced by a small real run of this script (one case per finding).
# ``--scale`` shrinks every size and time, so that ``--dry-run`` can run each case on the CPU in a
# second, which checks the script itself where no GPU is at hand.
FINDINGS_SCRIPT = textwrap.dedent('''
    import argparse, time, numpy as np, torch
    from torch.utils.data import DataLoader, Dataset, TensorDataset
    p = argparse.ArgumentParser()
    p.add_argument("cases", nargs="+")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--scale", type=float, default=1.0)
    a = p.parse_args()
    dev, scale = torch.device(a.device), a.scale
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def steps(default):
        return a.steps or default

    class Slow(Dataset):
        """``latency`` seconds to read a sample: with batch_size=1, the loop waits that long a step."""
        def __init__(self, n, latency):
            self.n, self.latency = n, latency
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            time.sleep(self.latency)
            return torch.randn(64), i % 10

    def fluctuating_utilization():
        # ~1 s waiting for data (GPU idle), then ~1 s of matmuls (GPU busy): the nvidia-smi sawtooth,
        # a cycle longer than NVML's averaging window (up to 1 s) so that both ends show.
        n = max(8, int(4096 * scale))
        w = torch.randn(n, n, device=dev)
        for x, y in DataLoader(Slow(steps(12), 1.0 * scale), batch_size=1):
            x = x.to(dev)
            t_end = time.perf_counter() + 1.0 * scale
            while time.perf_counter() < t_end:
                for _ in range(8):
                    z = w @ w
                sync()

    def host_bound():
        # In-memory data (no wait); each step a tiny kernel, then ~10 ms of numpy work on the host
        # and a .item() sync: the GPU idles for the host.
        n = 32 * steps(300)
        data = TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,)))
        w = torch.randn(64, 10, device=dev, requires_grad=True)
        buf = np.random.default_rng(0).standard_normal(max(64, int(200_000 * scale)))
        for x, y in DataLoader(data, batch_size=32):
            loss = torch.nn.functional.cross_entropy(x.to(dev) @ w, y.to(dev))
            loss.backward()
            for _ in range(20):
                buf = np.sort(buf)[::-1].copy()
            loss.item()

    def allocator_cache():
        # A growing temporary each step: no freed block fits the next request, so the caching
        # allocator reserves a new segment every time; live tensors peak at the last one only.
        step_b = max(4096, int(128 * 2**20 * scale))
        for i, (x,) in enumerate(DataLoader(TensorDataset(torch.randn(steps(40), 8)), batch_size=1)):
            t = torch.empty((4 + i) * step_b, dtype=torch.uint8, device=dev)
            t.fill_(1)
            del t
            sync()
            time.sleep(0.02 * scale)

    def batch_too_small():
        # batch_size=8 through a small MLP, the host pausing each step: memory and GPU both idle.
        n = 8 * steps(300)
        data = TensorDataset(torch.randn(n, 256), torch.randint(0, 10, (n,)))
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in DataLoader(data, batch_size=8, shuffle=True):
            loss = torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(0.005 * scale)

    def memory_growth():
        # The classic leak: 4 MiB of CUDA memory kept every step, for longer than the probe's 0.5 s
        # memory readings need to draw a line (20 ms a step, 300 steps: 6 s).
        kept = []
        for (x,) in DataLoader(TensorDataset(torch.randn(steps(300), 8)), batch_size=1):
            kept.append(torch.ones(max(16, int(2**20 * scale)), device=dev))
            sync()
            time.sleep(0.02 * scale)

    for case in a.cases:
        globals()[case]()
''')

# case: (the finding it must produce, what its evidence must show, in words, and as a check)
FINDING_CASES = {
    "fluctuating_utilization": ("fluctuating_utilization", "NVML p95 >= 70% and p5 <= 10%",
                                lambda ev: ev["gpu_util_p95_pct"] >= 70 and ev["gpu_util_p5_pct"] <= 10),
    "host_bound": ("host_bound", "GPU p50 < 50% with little data wait",
                   lambda ev: ev["gpu_util_p50_pct"] < 50 and (ev["data_wait_share"] or 0) < 0.05),
    "allocator_cache": ("allocator_cache", "reserved >= 1.5x the allocated peak",
                        lambda ev: ev["reserved_over_allocated"] >= 1.5),
    "batch_too_small": ("batch_too_small", "reserved < 50% of the GPU, batch_size 8",
                        lambda ev: ev["memory_share"] < 0.5 and ev["batch_size"] == 8),
    "memory_growth": ("memory_growth", "CUDA allocated memory grows ~4 MiB a step",
                      lambda ev: ev["memory"] == "allocated CUDA memory" and 2 * 2**20 <= ev["per_step_b"] <= 8 * 2**20),
}

RESULTS: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str) -> None:
    RESULTS.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)


def diagnose(tmp: Path, args: list[str], name: str) -> dict:
    out = tmp / f"{name}.json"
    cmd = [sys.executable, "-m", "gpufeed", "diagnose", "--out", str(tmp / name), "--json", str(out), "--",
           sys.executable, str(tmp / "loader.py"), *args]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, COLUMNS="200"))
    print(f"      ({name}: exit {proc.returncode}, {time.monotonic() - started:.1f} s)", flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
    diag = json.loads(out.read_text()) if out.exists() else {}
    diag["_stdout"] = proc.stdout
    return diag


def check_transfer_vs_compute(tmp: Path) -> None:
    """Issue 11, point 6: a blocking .to(cuda) waits for the GPU work queued before it; that wait is
    compute. CUDA events around the copy time the copy itself; the GPU's own idle time (events around
    next()) decides whether the GPU waited for data."""
    from gpufeed.record.reader import load_run

    # Fast loader, heavy queued matmuls, small pageable batches: the host spends each step inside
    # .to(cuda) waiting for the matmuls, while the copy itself (128 KiB) takes microseconds.
    d = diagnose(tmp, ["0.0", "8192", "nopin", "1024", "80"], "blocking-copy")
    m, ids = d.get("metrics", {}), {f["id"] for f in d.get("findings", [])}
    h2d = load_run(tmp / "blocking-copy").h2d
    timed = h2d[h2d[:, 4] == h2d[:, 4]] if len(h2d) and h2d.shape[1] > 4 else h2d[:0]
    host_ms = statistics.median(timed[:, 2]) * 1e3 if len(timed) else None
    copy_ms = statistics.median(timed[:, 4]) * 1e3 if len(timed) else None
    check("copies timed by CUDA events (copy_s resolved)", len(timed) >= 0.9 * max(len(h2d), 1) and len(timed) > 0,
          f"{len(timed)} of {len(h2d)} copies resolved")
    if host_ms is not None:
        check("a blocking copy's host time holds the queued compute, copy_s only the copy",
              copy_ms * 10 < host_ms, f"median host {host_ms:.2f} ms in .to(), copy itself {copy_ms:.3f} ms")
    check("no pageable_transfer when the copy itself is short", "pageable_transfer" not in ids
          and (m.get("h2d_pageable_share") or 0) < 0.05,
          f"h2d_pageable_share={m.get('h2d_pageable_share')} findings={sorted(ids)}")
    check("compute-bound, never both compute_bound and transfer-bound",
          d.get("bottleneck") == "compute" and not ({"compute_bound"} <= ids and ids & {"pageable_transfer",
                                                                                     "blocking_transfer"}),
          f"bottleneck={d.get('bottleneck')} costs={d.get('costs')}")

    # Pinned, non-blocking copies and a loader faster than the GPU: the host runs ahead and waits in
    # next(loader) most of its time, but the GPU never idles; that wait is not lost time.
    d = diagnose(tmp, ["0.002", "8192", "pin", "1024", "100"], "host-ahead")
    m, ids = d.get("metrics", {}), {f["id"] for f in d.get("findings", [])}
    check("host waits in next() while the GPU works: GPU idle from events is small",
          (m.get("data_wait_share") or 0) > 0.3 and (m.get("gpu_idle_share") or 1) < 0.05,
          f"host data_wait_share={m.get('data_wait_share')} gpu_idle_share={m.get('gpu_idle_share')}")
    check("host wait while the GPU is busy is not input-bound",
          d.get("bottleneck") == "compute" and not ids & {"too_few_workers", "storage_latency", "cpu_saturated",
                                                         "input_wait"},
          f"bottleneck={d.get('bottleneck')} costs={d.get('costs')} findings={sorted(ids)}")


def check_gpu_named(tmp: Path) -> None:
    """Issue 11, point 8: the numbers come from the GPU the job uses, matched by NVML's process list
    and by the UUID torch reports, and the output names it."""
    from gpufeed.analysis.gpus import TORCH_DEVICE, gpus_used, visible_gpus
    from gpufeed.record.reader import load_run

    d = diagnose(tmp, ["0.002", "2048", "pin", "1024", "80"], "named")
    m = d.get("metrics", {})
    named = bool(m.get("gpu_indices")) and bool((m.get("gpu_names") or [None])[0])
    check("the diagnosis reads the job's GPU and names it",
          named and f"GPU {m['gpu_indices'][0]} ({m['gpu_names'][0]})" in d.get("_stdout", ""),
          f"gpu_indices={m.get('gpu_indices')} gpu_names={m.get('gpu_names')} match={m.get('gpu_match')}")
    record = load_run(tmp / "named")
    devices = record.meta.sampler.get("gpus") or []
    check("the probe recorded torch's device with its UUID", bool(record.cuda_devices)
          and record.cuda_devices[0].get("uuid") is not None,
          f"cuda_device={record.cuda_devices[:1]} nvml={devices[:2]}")
    # Without NVML's process list (as in a container), torch's UUID alone must find the same GPU.
    record.samples.gpu_procs = [{} for _ in record.samples.gpu_procs]
    used, how = gpus_used(record)
    check("torch's UUID matches NVML's", used == m.get("gpu_indices") and how == TORCH_DEVICE,
          f"by UUID: {used} ({how}); by NVML processes: {m.get('gpu_indices')}")
    visible = (devices[0].get("uuid") or "")[:12] if devices else ""
    if visible:
        env_d = _diagnose_env(tmp, ["0.002", "2048", "pin", "1024", "60"], "visible-uuid",
                              {"CUDA_VISIBLE_DEVICES": visible})
        mv = env_d.get("metrics", {})
        check("a UUID prefix in CUDA_VISIBLE_DEVICES names NVML's GPU",
              visible_gpus(devices, visible, None, None) == [devices[0]["index"]], f"{visible} in {devices[:1]}")
        check("the job's GPU under CUDA_VISIBLE_DEVICES=<UUID prefix>", mv.get("gpu_indices") == [devices[0]["index"]],
              f"CUDA_VISIBLE_DEVICES={visible} -> gpu_indices={mv.get('gpu_indices')} ({mv.get('gpu_match')})")


def _diagnose_env(tmp: Path, args: list[str], name: str, env: dict[str, str]) -> dict:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return diagnose(tmp, args, name)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def finding_check(case: str, diag: dict) -> tuple[bool, str]:
    """Did the run of ``case`` produce its finding, with the evidence that proves it?"""
    expected, shows, proves = FINDING_CASES[case]
    found = {f["id"]: f for f in diag.get("findings", [])}
    f = found.get(expected)
    if f is None:
        return False, f"no {expected}; findings={sorted(found)} metrics={_headline(diag)}"
    try:
        ok = bool(proves(f["evidence"]))
    except (KeyError, TypeError) as error:
        ok, shows = False, f"{shows} (evidence lacks {error})"
    return ok, f"{shows}: evidence={f['evidence']}"


def _headline(diag: dict) -> dict:
    m = diag.get("metrics", {})
    return {k: m.get(k) for k in ("data_wait_share", "gpu_util_p5_pct", "gpu_util_p50_pct", "gpu_util_p95_pct",
                                  "cuda_mem_allocated_peak_b", "cuda_mem_reserved_max_b")}


# -- the controls (issue 34) -------------------------------------------------------------------------------
# One script, one case per control; ``--device cpu --scale 0.01`` runs each tiny on the CPU (--dry-run),
# where the CUDA-only parts (streams, capture, graphs) are left out, to check the script itself.
CONTROLS_SCRIPT = textwrap.dedent('''
    import argparse, json, os, sys, time, torch
    from torch.utils.data import DataLoader, Dataset
    p = argparse.ArgumentParser()
    p.add_argument("case")
    p.add_argument("--device", default="cuda")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=None)
    a = p.parse_args()
    gpu = a.device == "cuda"
    scale = a.scale

    class Slow(Dataset):
        def __init__(self, n, latency_s, shape=(256,)):
            self.n, self.latency_s, self.shape = n, latency_s, shape
        def __len__(self): return self.n
        def __getitem__(self, i):
            time.sleep(self.latency_s)
            return torch.randn(*self.shape)

    def steps(n):
        return a.steps or n

    def matmuls(w, k):
        x = w
        for _ in range(k):
            x = x @ w
        return x

    def sync_every_step():
        dev = torch.device(a.device)
        w = torch.randn(int(2048 * scale) + 8, int(2048 * scale) + 8, device=dev)
        for x in DataLoader(Slow(steps(120), 0.006 * scale), batch_size=1):
            x = x.to(dev)
            matmuls(w, 2)
            if gpu:
                torch.cuda.synchronize()   # the user's loop synchronises: GPU idle = host wait

    def host_ahead():
        dev = torch.device(a.device)
        w = torch.randn(int(4096 * scale) + 8, int(4096 * scale) + 8, device=dev)
        for x in DataLoader(Slow(steps(120), 0.001 * scale), batch_size=1, pin_memory=gpu):
            x = x.to(dev, non_blocking=True)
            matmuls(w, 6)                  # queued; the host asks for the next batch at once

    def other_device():
        n = torch.cuda.device_count() if gpu else 1
        dev = torch.device(a.device, n - 1) if gpu else torch.device("cpu")
        w = torch.randn(512, 512, device=dev)
        for x in DataLoader(Slow(steps(80), 0.002 * scale), batch_size=1):
            x = x.to(dev)                  # never torch.cuda.set_device: the current device stays 0
            matmuls(w, 2)
        if gpu:
            torch.cuda.synchronize(dev)

    def side_stream():
        dev = torch.device(a.device)
        w = torch.randn(int(4096 * scale) + 8, int(4096 * scale) + 8, device=dev)
        side = torch.cuda.Stream() if gpu else None
        it = iter(DataLoader(Slow(steps(120), 0.002 * scale), batch_size=1, pin_memory=gpu))
        def fetch():
            if side is None:
                return next(it).to(dev)
            with torch.cuda.stream(side):    # the prefetcher's next() and copy run under its stream
                return next(it).to(dev, non_blocking=True)
        batch = fetch()
        while batch is not None:
            if side is not None:
                torch.cuda.current_stream().wait_stream(side)
            matmuls(w, 6)
            try:
                batch = fetch()
            except StopIteration:
                batch = None

    def graph_capture():
        dev = torch.device(a.device)
        w = torch.randn(256, 256, device=dev)
        for x in DataLoader(Slow(steps(20), 0.0), batch_size=1):
            x.to(dev)                        # the probe is armed: copies patched, events on
        host = torch.randn(256, 256).pin_memory() if gpu else torch.randn(256, 256)
        if not gpu:
            print(json.dumps({"captured": False, "replay_max_err": 0.0}))
            return
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):          # warm-up on a side stream, as torch's docs ask
            y = host.cuda(non_blocking=True) @ w
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = host.cuda(non_blocking=True) @ w
        errs = []
        for _ in range(5):
            host.copy_(torch.randn(256, 256))
            g.replay()
            torch.cuda.synchronize()
            errs.append(float((static_out - host.to(dev) @ w).abs().max()))
        print(json.dumps({"captured": True, "replay_max_err": max(errs)}))

    def compile_graphs():
        dev = torch.device(a.device)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        fwd = torch.compile(model, mode="reduce-overhead") if gpu else model
        done, loss = 0, None
        for x in DataLoader(Slow(steps(50), 0.0), batch_size=32):
            out = fwd(x.to(dev))
            loss = out.float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            done += 1
        print(json.dumps({"steps": done, "loss": float(loss)}))

    def pinned_64mb():
        dev = torch.device(a.device)
        elems = int(16 * 2**20 * scale) + 8            # 64 MB of float32
        class Big(Dataset):
            def __init__(self): self.t = torch.ones(elems)
            def __len__(self): return steps(60)
            def __getitem__(self, i): return self.t
        w = torch.randn(512, 512, device=dev)
        for x in DataLoader(Big(), batch_size=None, pin_memory=gpu):
            x = x.to(dev, non_blocking=True)           # on the compute stream: the kernels after it wait
            matmuls(w, 2)

    def pin_thread():
        dev = torch.device(a.device)
        elems = int(2**20 * scale) + 8                  # 4 MB of float32 a sample, 16 MB a batch of 4
        class Big(Dataset):
            def __len__(self): return steps(120) * 4
            def __getitem__(self, i):
                time.sleep(0.004 * scale)               # the loop outpaces 2 workers: it waits, pinning included
                return torch.ones(elems)
        w = torch.randn(512, 512, device=dev)
        for x in DataLoader(Big(), batch_size=4, num_workers=2, pin_memory=gpu):
            x = x.to(dev, non_blocking=gpu)             # pinned on the iterator's pin thread, then copied
            matmuls(w, 2)

    def two_ranks():
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        dev = torch.device(a.device, 0) if gpu else torch.device("cpu")  # both ranks on one GPU
        w = torch.randn(1024, 1024, device=dev)
        slow = 0.020 * scale if rank == 1 else 0.0
        for x in DataLoader(Slow(steps(80), slow), batch_size=1):
            x = x.to(dev)
            matmuls(w, 2)
            t = torch.ones(1)
            dist.all_reduce(t)                          # a collective each step: rank 0 waits for rank 1
        dist.destroy_process_group()

    globals()[a.case]()
''')


def _diagnose_control(tmp: Path, case: str, launcher: list[str] | None = None, warmup: int = 3) -> tuple[dict, Any]:
    """``gpufeed diagnose`` of one control; its diagnosis (JSON), record and the command's stdout."""
    from gpufeed.record.reader import load_run
    out = tmp / f"{case}.json"
    command = (launcher or [sys.executable]) + [str(tmp / "controls.py"), case]
    cmd = [sys.executable, "-m", "gpufeed", "diagnose", "--warmup", str(warmup), "--out", str(tmp / case),
           "--json", str(out), "--"] + command
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, COLUMNS="200"))
    print(f"      ({case}: exit {proc.returncode}, {time.monotonic() - started:.1f} s)", flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
    diag = json.loads(out.read_text()) if out.exists() else {}
    diag["_stdout"], diag["_stderr"], diag["_exit"] = proc.stdout, proc.stderr, proc.returncode
    try:
        record = load_run(tmp / case)
    except Exception as error:  # a run that wrote nothing fails its control, with why
        print(f"      (no record: {error})")
        record = None
    return diag, record


def _idle_and_wait(record: Any, diag: dict) -> dict:
    """Per training step in the window: the GPU's idle from the events and the host's wait in next()."""
    m = diag.get("metrics", {})
    start, end = m.get("window_start_t"), m.get("window_end_t")
    idle = wait = 0.0
    n = 0
    for it in (record.iterators if record is not None else []):
        waits = {int(r[0]): float(r[2] - r[1]) for r in it.steps
                 if start is None or (start <= r[1] <= (end if end is not None else float("inf")))}
        for row in it.cuda:
            if int(row[0]) in waits and row[1] == row[1]:
                idle += float(row[1])
                wait += waits[int(row[0])]
                n += 1
    return {"gpu_idle_s": idle, "host_wait_s": wait, "steps": n, "gpu_idle_share": m.get("gpu_idle_share"),
            "data_wait_share": m.get("data_wait_share")}


def judge_sync(v: dict) -> tuple[bool, str]:
    ok = v["steps"] >= 20 and v["host_wait_s"] > 0 and abs(v["gpu_idle_s"] - v["host_wait_s"]) <= 0.10 * v["host_wait_s"]
    return ok, (f"GPU idle {v['gpu_idle_s'] * 1e3:.1f} ms vs host wait {v['host_wait_s'] * 1e3:.1f} ms over "
                f"{v['steps']} steps (must agree within 10%)")


def judge_host_ahead(v: dict) -> tuple[bool, str]:
    share, wait = v.get("gpu_idle_share"), v.get("data_wait_share")
    ok = v["steps"] >= 20 and share is not None and share < 0.03 and (wait or 0) > 0.05
    return ok, f"gpu_idle_share={share} (must be < 0.03) while the host waited data_wait_share={wait}"


def judge_other_device(v: dict) -> tuple[bool, str]:
    ok = (v["devices"] == [v["target"]] and v["stream_device"] == v["target"] and v["steps"] >= 20
          and v["contexts_elsewhere"] == 0)
    return ok, (f"copied to cuda:{v['target']}: cuda_device {v['devices']}, events on device {v['stream_device']}, "
                f"{v['steps']} steps timed, processes with memory on other GPUs: {v['contexts_elsewhere']}")


def judge_side_stream(v: dict) -> tuple[bool, str]:
    share, wait = v.get("gpu_idle_share"), v.get("data_wait_share")
    ok = v.get("default_stream") is True and share is not None and share < 0.05 and (wait or 0) > 0.05
    return ok, (f"steps timed on the default stream: {v.get('default_stream')}; gpu_idle_share={share} (< 0.05) "
                f"while next() under the side stream waited data_wait_share={wait}")


def judge_capture(v: dict) -> tuple[bool, str]:
    ok = v.get("exit") == 0 and v.get("captured") is True and (v.get("replay_max_err") or 1.0) < 1e-2
    return ok, f"exit {v.get('exit')}, captured={v.get('captured')}, replay max error {v.get('replay_max_err')}"


def judge_compile(v: dict) -> tuple[bool, str]:
    ok = v.get("exit") == 0 and v.get("steps") == 50 and v.get("measured", 0) >= 45 and not v.get("disabled")
    return ok, (f"exit {v.get('exit')}, {v.get('steps')} compiled steps, {v.get('measured')} measured, "
                f"event timing disabled: {v.get('disabled')}")


def judge_pinned(v: dict) -> tuple[bool, str]:
    ok = ((v.get("copy_ms") or 0) >= 1.0 and (v.get("h2d_stall_share") or 0) >= 0.05
          and (v.get("transfer") or 0) >= 0.05 and v.get("on_step_stream_share", 0) >= 0.9)
    return ok, (f"copy p50 {v.get('copy_ms')} ms of 64 MB, {v.get('on_step_stream_share')} of copies on the steps' "
                f"stream, h2d_stall_share={v.get('h2d_stall_share')}, transfer cost {v.get('transfer')}")


def judge_ranks(v: dict) -> tuple[bool, str]:
    by_rank = v.get("ranks", {})
    slow, fast = by_rank.get(1), by_rank.get(0)
    ok = slow is not None and fast is not None and slow - fast >= 0.2 and v.get("straggler") == 1
    return ok, f"data_wait_share by rank {by_rank}; straggler named: rank {v.get('straggler')}"


def judge_gpm(v: dict) -> tuple[bool, str]:
    value, why, cost = v.get("sm_active_pct"), v.get("gpm_na"), v.get("cost_ms")
    read = value is not None and 0.0 <= value <= 100.0
    ok = (read or bool(why)) and not (read and why) and cost is not None and cost < 5.0
    return ok, f"sm_active_pct={value} gpm_na={why!r}, {cost} ms per GPM reading (budget 5 ms)"


def judge_pin_thread(v: dict) -> tuple[bool, str]:
    parts = [v.get(k) for k in ("worker_share", "pinning_share", "handover_share", "wait_share")]
    split = None if None in parts else parts[0] + parts[1] + parts[2] - parts[3]
    ok = (v.get("pin_thread") not in (None, v.get("pid")) and v.get("pins", 0) >= 20 and v.get("off_thread") == 0
          and v.get("matched", 0) >= 20 and split is not None and parts[1] > 0 and abs(split) <= 1e-6)
    return ok, (f"{v.get('pins')} pins rows on pin thread {v.get('pin_thread')} (training thread {v.get('pid')}), "
                f"{v.get('off_thread')} on another thread, {v.get('matched')} steps matched to their pinning; "
                f"pinning_share={v.get('pinning_share')}, worker + pinning + hand-over - wait = {split}")


def _pin_values(diag: dict, record: Any) -> dict:
    """(j): the pinned loader's pin thread, its ``pins`` rows as written (every thread's, from the events),
    the steps matched to their pinning, and the wait split."""
    from gpufeed.analysis.batches import matched_steps
    its = [it for it in (record.iterators if record is not None else []) if it.worker_pids and it.config.pin_memory]
    if not its:
        return {}
    it = its[0]
    rows = [row for path in (record.run_dir / "events").glob(f"{it.pid}.jsonl")
            for line in path.read_text().splitlines() if '"pins"' in line
            for row in json.loads(line).get("rows", [])]
    b = diag.get("batches") or {}
    return {"pid": it.pid, "pin_thread": it.pin_thread, "pins": len(rows),
            "off_thread": sum(1 for row in rows if row[0] != it.pin_thread),
            "matched": sum(1 for i in its for step in matched_steps(record, i) if step.pin is not None),
            **{k: b.get(k) for k in ("wait_share", "worker_share", "handover_share", "pinning_share")}}


def _control_values(case: str, diag: dict, record: Any) -> dict:
    m = diag.get("metrics", {})
    if case in ("sync_every_step", "host_ahead"):
        return _idle_and_wait(record, diag)
    if case == "other_device":
        import torch
        target = torch.cuda.device_count() - 1
        streams = record.cuda_streams if record is not None else []
        by_pid = {}
        for per_gpu in (record.samples.gpu_procs if record is not None else []):
            for idx, pids in per_gpu.items():
                for pid in pids:
                    by_pid.setdefault(pid, set()).add(idx)
        devices = record.meta.sampler.get("gpus") or [] if record is not None else []
        target_nvml = {d["index"] for d in devices if d.get("uuid") and record.cuda_devices
                       and str(d["uuid"]).lower().endswith(str(record.cuda_devices[0].get("uuid", "")).lower()[-12:])}
        elsewhere = sum(1 for idxs in by_pid.values() if idxs - target_nvml) if target_nvml else -1
        return {"target": target, "devices": sorted({e["index"] for e in (record.cuda_devices if record else [])}),
                "stream_device": streams[0]["device"] if streams else None,
                "steps": _idle_and_wait(record, diag)["steps"], "contexts_elsewhere": elsewhere}
    if case == "side_stream":
        streams = record.cuda_streams if record is not None else []
        return {"default_stream": streams[0]["default"] if streams else None,
                "gpu_idle_share": m.get("gpu_idle_share"), "data_wait_share": m.get("data_wait_share")}
    if case == "graph_capture":
        out = _last_json(diag.get("_stdout", ""))
        return {"exit": diag.get("_exit"), **out}
    if case == "compile_graphs":
        out = _last_json(diag.get("_stdout", ""))
        return {"exit": diag.get("_exit"), "steps": out.get("steps"), "measured": m.get("steps"),
                "disabled": "CUDA event timing disabled" in diag.get("_stderr", "")}
    if case == "pinned_64mb":
        from gpufeed.record import schema
        h2d = record.h2d if record is not None else []
        col = schema.H2D_COLUMNS.index("on_step_stream")
        copies = [float(r[4]) for r in h2d if r[4] == r[4]]
        on_step = [r[col] for r in h2d if r[col] == r[col]]
        return {"copy_ms": round(statistics.median(copies) * 1e3, 2) if copies else None,
                "on_step_stream_share": (sum(on_step) / len(on_step)) if on_step else 0.0,
                "h2d_stall_share": m.get("h2d_stall_share"), "transfer": (diag.get("costs") or {}).get("transfer")}
    if case == "pin_thread":
        return _pin_values(diag, record)
    if case == "two_ranks":
        ranks = {r.get("rank"): r.get("data_wait_share") or 0.0 for r in m.get("ranks") or []}
        straggler = next((f["evidence"].get("straggler_rank") for f in diag.get("findings", [])
                          if f["id"] == "straggler_rank"), None)
        return {"ranks": ranks, "straggler": straggler}
    raise KeyError(case)


def _last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    return {}


# case: (the judge, a passing example, a failing example) -- the examples check the judges in --dry-run
CONTROLS = {
    "sync_every_step": (judge_sync, {"gpu_idle_s": 0.95, "host_wait_s": 1.0, "steps": 100},
                        {"gpu_idle_s": 0.0, "host_wait_s": 1.0, "steps": 100}),
    "host_ahead": (judge_host_ahead, {"steps": 100, "gpu_idle_share": 0.004, "data_wait_share": 0.4},
                   {"steps": 100, "gpu_idle_share": 0.35, "data_wait_share": 0.4}),
    "other_device": (judge_other_device, {"target": 1, "devices": [1], "stream_device": 1, "steps": 70,
                                          "contexts_elsewhere": 0},
                     {"target": 1, "devices": [0, 1], "stream_device": 0, "steps": 70, "contexts_elsewhere": 1}),
    "side_stream": (judge_side_stream, {"default_stream": True, "gpu_idle_share": 0.01, "data_wait_share": 0.3},
                    {"default_stream": False, "gpu_idle_share": 0.3, "data_wait_share": 0.3}),
    "graph_capture": (judge_capture, {"exit": 0, "captured": True, "replay_max_err": 1e-5},
                      {"exit": 1, "captured": None, "replay_max_err": None}),
    "compile_graphs": (judge_compile, {"exit": 0, "steps": 50, "measured": 47, "disabled": False},
                       {"exit": 0, "steps": 50, "measured": 47, "disabled": True}),
    "pinned_64mb": (judge_pinned, {"copy_ms": 2.7, "on_step_stream_share": 1.0, "h2d_stall_share": 0.3,
                                   "transfer": 0.3},
                    {"copy_ms": 2.7, "on_step_stream_share": 1.0, "h2d_stall_share": 0.0, "transfer": 0.0}),
    "two_ranks": (judge_ranks, {"ranks": {0: 0.02, 1: 0.6}, "straggler": 1},
                  {"ranks": {0: 0.3, 1: 0.3}, "straggler": None}),
    "gpm": (judge_gpm, {"sm_active_pct": 41.0, "gpm_na": None, "cost_ms": 0.3},
            {"sm_active_pct": 0.0, "gpm_na": "not supported", "cost_ms": 0.3}),
    # failing: nothing pinned (a CPU-only torch turns pinning off): no pin thread, no rows, pinning N/A
    "pin_thread": (judge_pin_thread, {"pid": 4100, "pin_thread": 4107, "pins": 115, "off_thread": 0, "matched": 110,
                                      "wait_share": 0.42, "worker_share": 0.30, "handover_share": 0.07,
                                      "pinning_share": 0.05},
                   {"pid": 4100, "pin_thread": None, "pins": 0, "off_thread": 0, "matched": 0, "wait_share": 0.42,
                    "worker_share": 0.30, "handover_share": 0.12, "pinning_share": None}),
}


def check_gpm() -> None:
    """(i) GPM read on this GPU, or N/A with the reason; and the cost of a reading, measured."""
    from gpufeed.measure.outside.nvml import Nvml
    nvml = Nvml()
    readings = []
    for _ in range(6):
        readings = nvml.read()
        time.sleep(0.1)
    g = readings[0] if readings else None
    cost = nvml.gpm_s / nvml.gpm_reads * 1e3 if nvml.gpm_reads else None
    values = {"sm_active_pct": None if g is None else g.sm_active_pct,
              "gpm_na": "no NVML reading" if g is None else g.gpm_na, "cost_ms": None if cost is None else round(cost, 3)}
    if g is not None:
        print(f"      (GPM on GPU 0: SM active {g.sm_active_pct}, occupancy {g.sm_occupancy_pct}, "
              f"tensor {g.tensor_active_pct}, N/A: {g.gpm_na})")
    check("(i) GPM metrics read or N/A with the reason, and their cost", *judge_gpm(values))
    nvml.shutdown()


def check_controls(tmp: Path) -> None:
    import torch
    (tmp / "controls.py").write_text(CONTROLS_SCRIPT)
    letters = dict(zip(CONTROLS, "abcdefghij"))
    for case, (judge, _good, _bad) in CONTROLS.items():
        name = f"({letters[case]}) {case}"
        if case == "gpm":
            check_gpm()
            continue
        if case == "other_device" and torch.cuda.device_count() < 2:
            print(f"SKIP  {name}: needs 2 GPUs, this machine has {torch.cuda.device_count()}", flush=True)
            continue
        launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533"]
                    if case == "two_ranks" else None)
        diag, record = _diagnose_control(tmp, case, launcher, warmup=0 if case == "graph_capture" else 3)
        try:
            ok, detail = judge(_control_values(case, diag, record))
        except Exception as error:  # a missing number fails the control, never the script
            ok, detail = False, f"could not read the numbers: {type(error).__name__}: {error}"
        check(name, ok, detail)



def check_gpu_findings(tmp: Path) -> None:
    """Each GPU-only finding from a real run on this GPU (``gpufeed diagnose`` of FINDINGS_SCRIPT)."""
    (tmp / "findings.py").write_text(FINDINGS_SCRIPT)
    for case in FINDING_CASES:
        out = tmp / f"{case}.json"
        cmd = [sys.executable, "-m", "gpufeed", "diagnose", "--warmup", "2", "--out", str(tmp / case),
               "--json", str(out), "--", sys.executable, str(tmp / "findings.py"), case]
        started = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        print(f"      ({case}: exit {proc.returncode}, {time.monotonic() - started:.1f} s)", flush=True)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        diag = json.loads(out.read_text()) if out.exists() else {}
        check(f"{FINDING_CASES[case][0]} from a real run", *finding_check(case, diag))


def dry_run() -> int:
    """What runs without a GPU: each case of FINDINGS_SCRIPT on the CPU, tiny, for one process;
    and the checks against diagnoses that have and lack each finding."""
    with tempfile.TemporaryDirectory() as name:
        script = Path(name) / "findings.py"
        script.write_text(FINDINGS_SCRIPT)
        started = time.monotonic()
        proc = subprocess.run([sys.executable, str(script), *FINDING_CASES, "--device", "cpu", "--steps", "3",
                               "--scale", "0.001"], capture_output=True, text=True, timeout=120)
        check(f"the scripts of {', '.join(FINDING_CASES)} run (CPU, tiny)", proc.returncode == 0,
              f"exit {proc.returncode} in {time.monotonic() - started:.1f} s {proc.stderr[-1500:]}")
    # Evidence as each rule writes it, as a GPU run should show it (see FINDINGS_SCRIPT's comments).
    examples = {"fluctuating_utilization": {"gpu_util_p95_pct": 96.0, "gpu_util_p5_pct": 0.0},
                "host_bound": {"gpu_util_p50_pct": 12.0, "data_wait_share": 0.002},
                "allocator_cache": {"reserved_over_allocated": 11.0},
                "batch_too_small": {"memory_share": 0.01, "batch_size": 8},
                "memory_growth": {"memory": "allocated CUDA memory", "per_step_b": 4 * 2**20}}
    for case, (expected, _shows, _proves) in FINDING_CASES.items():
        ok, _ = finding_check(case, {"findings": []})
        check(f"{case}: a diagnosis without {expected} fails the check", not ok, "")
        ok, detail = finding_check(case, {"findings": [{"id": expected, "evidence": examples[case]}]})
        check(f"{case}: {expected} with its evidence passes the check", ok, detail)
        ok, _ = finding_check(case, {"findings": [{"id": expected, "evidence": {}}]})
        check(f"{case}: {expected} without its evidence fails the check", not ok, "")
    # The controls: each case's script, tiny, on the CPU (CUDA-only parts left out); each judge against
    # a number that must pass it and one that must fail it.
    with tempfile.TemporaryDirectory() as name:
        script = Path(name) / "controls.py"
        script.write_text(CONTROLS_SCRIPT)
        started = time.monotonic()
        errors = []
        for case in CONTROLS:
            if case == "gpm":
                continue  # no script: NVML in this process
            launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                         "--master_port", "29534"] if case == "two_ranks" else [sys.executable])
            proc = subprocess.run(launcher + [str(script), case, "--device", "cpu", "--steps", "3", "--scale", "0.001"],
                                  capture_output=True, text=True, timeout=180)
            if proc.returncode != 0:
                errors.append(f"{case}: exit {proc.returncode} {proc.stderr[-800:]}")
        check("the controls' scripts run (CPU, tiny)", not errors,
              f"{len(CONTROLS) - 1} scripts in {time.monotonic() - started:.1f} s {' | '.join(errors)}")
    for case, (judge, good, bad) in CONTROLS.items():
        ok, detail = judge(good)
        check(f"{case}: a passing number passes its judge", ok, detail)
        ok, detail = judge(bad)
        check(f"{case}: a failing number fails its judge", not ok, detail)
    failed = [n for n, ok, _ in RESULTS if not ok]
    print(f"dry run: {len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def main() -> int:
    if "--dry-run" in sys.argv[1:]:
        return dry_run()
    import torch

    from gpufeed.measure.outside.nvml import Nvml

    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"device {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
    check("torch sees CUDA", torch.cuda.is_available(), f"device_count={torch.cuda.device_count()}")
    if not torch.cuda.is_available():
        print("No CUDA device: nothing else here can be checked on this machine.")
        return 2

    nvml = Nvml()
    readings = nvml.read()
    check("NVML available", nvml.available(), f"error={nvml.error!r}, gpus={len(readings)}")
    if readings:
        g = readings[0]
        check("NVML readings are real values", None not in (g.util_pct, g.mem_used_b, g.mem_total_b),
              f"name={g.name!r} util={g.util_pct}% mem={g.mem_used_b}/{g.mem_total_b} B procs={g.procs}")
        times = []
        for _ in range(50):
            t0 = time.perf_counter()
            nvml.read()
            times.append(time.perf_counter() - t0)
        check("NVML read cost", statistics.median(times) < 0.005,
              f"median {statistics.median(times) * 1e3:.2f} ms per read of all GPUs (budget 5 ms at 10 Hz)")

    # Section names: controls, findings (the default: both, in about 5-8 minutes), transfer, gpus, overhead.
    only = set(sys.argv[1:]) or {"controls", "findings"}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "loader.py").write_text(LOADER_SCRIPT)
        if "controls" in only:
            check_controls(tmp)
        if "findings" in only:
            check_gpu_findings(tmp)
        if "transfer" in only:
            check_transfer_vs_compute(tmp)
        if "gpus" in only:
            check_gpu_named(tmp)
        if "overhead" not in only:
            return _summary()

        # 1. GPU busy with queued kernels while the host waits: GPU idle < host data wait.
        d = diagnose(tmp, ["0.004", "4096", "nopin", "1024", "120"], "queued")
        m = d.get("metrics", {})
        check("CUDA events recorded", bool(m.get("cuda_used")) and m.get("gpu_idle_share") is not None,
              f"gpu_idle_share={m.get('gpu_idle_share')} data_wait_share={m.get('data_wait_share')}")
        if m.get("gpu_idle_share") is not None and m.get("data_wait_share"):
            check("GPU idle <= host wait (events, not host time)",
                  m["gpu_idle_share"] <= m["data_wait_share"] + 0.02,
                  f"{m['gpu_idle_share']:.3f} <= {m['data_wait_share']:.3f}")
        check("NVML utilization in the diagnosis", m.get("gpu_util_p50_pct") is not None,
              f"p5/p50/p95 = {m.get('gpu_util_p5_pct')}/{m.get('gpu_util_p50_pct')}/{m.get('gpu_util_p95_pct')}")
        check("CUDA memory statistics", m.get("cuda_mem_allocated_peak_b") is not None,
              f"allocated peak {m.get('cuda_mem_allocated_peak_b')} B, reserved {m.get('cuda_mem_reserved_max_b')} B")

        # 2. Pageable copies of large batches: pageable_transfer fires; pinned + non_blocking: quiet.
        big = str(3 * 224 * 224)
        d = diagnose(tmp, ["0.0", "256", "nopin", big, "150"], "pageable")
        ids = {f["id"] for f in d.get("findings", [])}
        share = d.get("metrics", {}).get("h2d_pageable_share")
        check("pageable_transfer fires on pageable copies", "pageable_transfer" in ids,
              f"h2d_pageable_share={share} findings={sorted(ids)}")
        d = diagnose(tmp, ["0.0", "256", "pin", big, "150"], "pinned")
        ids = {f["id"] for f in d.get("findings", [])}
        check("pageable_transfer quiet with pin_memory=True", "pageable_transfer" not in ids,
              f"h2d_pageable_share={d.get('metrics', {}).get('h2d_pageable_share')}")

        # 3. Overhead of diagnose on a fast GPU loop (the script's own clock), paired, median of 3.
        workload = [sys.executable, str(ROOT / "tests" / "workloads" / "overhead.py"), "--mode", "fast",
                    "--device", "cuda", "--steps", "3000"]
        ratios = []
        for _ in range(3):
            plain = _sps(workload)
            under = _sps([sys.executable, "-m", "gpufeed", "diagnose", "--out", str(tmp / f"ovh{_}"), "--"]
                         + workload)
            ratios.append(under / plain)
        check("diagnose overhead on a fast CUDA loop", statistics.median(ratios) >= 0.99,
              f"throughput ratio median {statistics.median(ratios):.3f} (runs: "
              + ", ".join(f"{r:.3f}" for r in ratios) + ")")

    return _summary()


def _summary() -> int:
    failed = [n for n, ok, _ in RESULTS if not ok]
    print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _sps(command: list[str]) -> float:
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300).stdout
    return next(json.loads(line) for line in reversed(out.splitlines()) if line.startswith("{"))["samples_per_s"]


if __name__ == "__main__":
    sys.exit(main())
