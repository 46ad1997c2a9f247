"""Where a CPU-only training process's CPU goes beside its DataLoader workers: per thread, per step.

``bench/what_if.py`` found the model too fast on the CPU-bound workloads with few workers (2-4
workers on 2 cores predicted 20-58% faster than measured) and right with 16. This benchmark measures
the cause without gpufeed in the loop: the bench's CPU-bound workload (``tests/workloads/common.py``:
2 ms of FFTs per sample, a tiny model on the CPU), run in a fresh process per setting, reading
each thread of the training process and the workers' CPU with psutil. Each setting runs with the
environment as it is, and with ``OMP_WAIT_POLICY=PASSIVE`` (OpenMP threads sleep at once instead of
spinning after each parallel region): if the two differ, the training process's own threads are
what took the workers' cores.

The columns "in next()" are what gpufeed's probe reads for a batch made inside ``next()``
(``num_workers=0``): the process's CPU (every thread) and the calling thread's own.

    python bench/omp_spin.py [--settings 0,2p,4p,16p] [--repeats 2] [--epochs 8] [--fft-rounds N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "tests" / "workloads"


def child(workers: int, persistent: bool, epochs: int, fft_rounds: int) -> dict:
    """One setting in this process: warm-up epochs, then ``epochs`` measured; per-thread CPU."""
    import psutil
    import torch
    from torch.utils.data import DataLoader
    sys.path.insert(0, str(WORKLOADS))
    import common

    def threads() -> dict[int, float]:
        return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}

    def workers_cpu() -> float:
        total = 0.0
        for p in psutil.Process().children(recursive=True):
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    ds = common.SyntheticDataset(30 * 16, fft_rounds=fft_rounds, seed=0)
    kw: dict = {"batch_size": 16, "shuffle": True, "num_workers": workers}
    if workers:
        kw.update(persistent_workers=persistent, prefetch_factor=2)
    loader = DataLoader(ds, **kw)
    model = common.TinyModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    inside_next = [0.0, 0.0]  # with num_workers=0: process and thread CPU inside next(), as the probe reads them

    def epoch() -> int:
        n = 0
        it = iter(loader)
        while True:
            cpu0, thread0 = time.process_time(), time.thread_time()
            try:
                batch = next(it)
            except StopIteration:
                break
            inside_next[0] += time.process_time() - cpu0
            inside_next[1] += time.thread_time() - thread0
            x, y = common.unpack(batch)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += 1
        return n

    for _ in range(2):
        epoch()
    inside_next[:] = [0.0, 0.0]
    t0, before, w0 = time.perf_counter(), threads(), workers_cpu()
    steps = sum(epoch() for _ in range(epochs))
    wall, after, w1 = time.perf_counter() - t0, threads(), workers_cpu()
    main_tid = __import__("threading").get_native_id()
    per_thread = sorted(((after[t] - before.get(t, 0.0)) / steps for t in after), reverse=True)
    main_thread = (after[main_tid] - before.get(main_tid, 0.0)) / steps
    return {"samples_per_s": steps * 16 / wall, "period_s": wall / steps, "torch_threads": torch.get_num_threads(),
            "main_thread_s": main_thread, "other_threads_s": sum(per_thread) - main_thread,
            "worker_cpu_per_batch_s": (w1 - w0) / steps if workers and persistent else None,
            "next_process_cpu_s": inside_next[0] / steps, "next_thread_cpu_s": inside_next[1] / steps}


def run(setting: str, policy: str | None, args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, __file__, "--child", setting, "--epochs", str(args.epochs),
                          "--fft-rounds", str(args.fft_rounds)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def parse_setting(text: str) -> tuple[int, bool]:
    return int(text.rstrip("p")), text.endswith("p")


def label(setting: str) -> str:
    w, p = parse_setting(setting)
    return f"w{w}" + (" persistent" if p else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="0,2p,4p,16p")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=8, help="measured epochs of 30 batches per run")
    parser.add_argument("--fft-rounds", type=int, help="FFT rounds per sample (default: 2 ms calibrated once)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    if args.child:
        w, p = parse_setting(args.child)
        print(json.dumps(child(w, p, args.epochs, args.fft_rounds)))
        return
    if args.fft_rounds is None:
        sys.path.insert(0, str(WORKLOADS))
        import common
        args.fft_rounds = common.calibrate_fft_rounds(2.0)
    settings = args.settings.split(",")
    runs: dict[tuple[str, str | None], list[dict]] = {}
    for _ in range(args.repeats):  # alternating, so the VM's drift falls on every setting alike
        for s in settings:
            for policy in (None, "PASSIVE"):
                runs.setdefault((s, policy), []).append(run(s, policy, args))

    def med(key, field):
        values = [r[field] for r in runs[key] if r[field] is not None]
        return statistics.median(values) if values else None

    cores = os.cpu_count() or 1  # for the header
    lines = [f"`python bench/omp_spin.py --settings {args.settings} --repeats {args.repeats} --epochs {args.epochs} "
             f"--fft-rounds {args.fft_rounds}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{cores} cores (medians of {args.repeats} runs)", "",
             "| setting | samples/s | with OMP_WAIT_POLICY=PASSIVE | training process CPU a step: main thread "
             "| its other threads | same, PASSIVE | worker CPU a batch | same, PASSIVE | in next(): process CPU, thread CPU |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in settings:
        spin, calm = (s, None), (s, "PASSIVE")
        worker, worker_calm = med(spin, "worker_cpu_per_batch_s"), med(calm, "worker_cpu_per_batch_s")
        lines.append(
            f"| {label(s)} | {med(spin, 'samples_per_s'):,.0f} | {med(calm, 'samples_per_s'):,.0f} "
            f"| {med(spin, 'main_thread_s') * 1e3:.1f} ms | {med(spin, 'other_threads_s') * 1e3:.1f} ms "
            f"| {med(calm, 'main_thread_s') * 1e3:.1f} + {med(calm, 'other_threads_s') * 1e3:.1f} ms "
            f"| {'' if worker is None else f'{worker * 1e3:.1f} ms'} "
            f"| {'' if worker_calm is None else f'{worker_calm * 1e3:.1f} ms'} "
            f"| {med(spin, 'next_process_cpu_s') * 1e3:.1f}, {med(spin, 'next_thread_cpu_s') * 1e3:.1f} ms |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
