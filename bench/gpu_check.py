"""Check and time everything GPU-specific, on a real NVIDIA GPU, in one short run.

CPU machines cannot exercise NVML, CUDA events, CUDA memory statistics or pinned copies; this
script does, against small training scripts written to a temporary folder, and prints one line
per check (PASS/FAIL with the numbers). Keep what it prints in ``bench/results/``.

    python bench/gpu_check.py | tee bench/results/gpu_check-$(date +%F).txt

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

RESULTS: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str) -> None:
    RESULTS.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)


def diagnose(tmp: Path, args: list[str], name: str) -> dict:
    out = tmp / f"{name}.json"
    cmd = [sys.executable, "-m", "gpufeed", "diagnose", "--out", str(tmp / name), "--json", str(out), "--",
           sys.executable, str(tmp / "loader.py"), *args]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(f"      ({name}: exit {proc.returncode}, {time.monotonic() - started:.1f} s)", flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
    return json.loads(out.read_text()) if out.exists() else {}


def main() -> int:
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

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "loader.py").write_text(LOADER_SCRIPT)

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

    failed = [n for n, ok, _ in RESULTS if not ok]
    print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _sps(command: list[str]) -> float:
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300).stdout
    return next(json.loads(line) for line in reversed(out.splitlines()) if line.startswith("{"))["samples_per_s"]


if __name__ == "__main__":
    sys.exit(main())
