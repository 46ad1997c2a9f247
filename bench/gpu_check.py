"""Check and time everything GPU-specific, on a real NVIDIA GPU, in one short run.

CPU machines cannot exercise NVML, CUDA events, CUDA memory statistics or pinned copies; this
script does, against small training scripts written to a temporary folder, and prints one line
per check (PASS/FAIL with the numbers). Keep what it prints in ``bench/results/``.

    python bench/gpu_check.py | tee bench/results/gpu_check-$(date +%F).txt
    python bench/gpu_check.py transfer gpus     # only those sections (issue 11, points 6 and 8)
    python bench/gpu_check.py --dry-run     # no GPU: run each finding's script tiny on the CPU

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

    only = set(sys.argv[1:])  # section names: transfer, gpus; none: everything
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "loader.py").write_text(LOADER_SCRIPT)
        if not only or "transfer" in only:
            check_transfer_vs_compute(tmp)
        if not only or "gpus" in only:
            check_gpu_named(tmp)
        if only:
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

        # 4. The GPU-only findings, each from a real run.
        check_gpu_findings(tmp)

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
