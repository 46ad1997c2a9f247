"""The training loader's profile, summed over the processes that made its batches (its DataLoader workers;
with ``num_workers=0`` the training process inside ``next()``): each function of the user's code with its
CPU and its waiting (``measure/inside/profiler.py``), and the library calls beneath it. The rule
(``rules/user_code.py``), the report's icicle and the trace read it from here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gpufeed.analysis.metrics import LoaderSummary
from gpufeed.record.reader import RunRecord


def _plus(a: float | None, b: float | None) -> float | None:
    """A sum where None is N/A: N/A only when both are."""
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)


@dataclass
class CallTime:
    call: str | None          # the library call beneath the user's frame (None: its own Python code)
    cpu_s: float
    wait_s: float | None      # None: waits not sampled (N/A)

    @property
    def busy_s(self) -> float:
        return self.cpu_s + (self.wait_s or 0.0)


@dataclass
class FunctionTime:
    site: str                 # file:line
    function: str
    cpu_s: float = 0.0
    wait_s: float | None = None
    samples: int = 0          # CPU samples
    calls: list[CallTime] = field(default_factory=list)   # the most busy first

    @property
    def busy_s(self) -> float:
        """Its time making batches: CPU and waiting (I/O, sleep, locks)."""
        return self.cpu_s + (self.wait_s or 0.0)

    @property
    def wait_share(self) -> float | None:
        return self.wait_s / self.busy_s if self.wait_s is not None and self.busy_s > 0 else None


@dataclass
class LoaderProfile:
    scope: str                # "worker" (DataLoader workers) or "next" (the training process inside next())
    processes: int            # processes profiled
    samples: int              # CPU samples
    functions: list[FunctionTime]   # the most busy first
    outside_s: float          # CPU with no user frame (torch's collate, pickling)
    # The wall-clock sampler's, None where no process had it armed (N/A): waiting with no user frame (a
    # worker between batches), waiting no check placed, and the time runnable but waiting for a core
    wait_outside_s: float | None = None
    wait_unfiled_s: float | None = None
    runqueue_s: float | None = None

    @property
    def waits(self) -> bool:
        """Whether the waiting was sampled (the CPU always is)."""
        return any(f.wait_s is not None for f in self.functions) or self.wait_outside_s is not None

    @property
    def busy_s(self) -> float:
        """The time spent making batches: CPU (in the user's code and outside it) and waiting in the user's
        code. Waiting outside it is a worker between batches (waiting for the next indices), not making one."""
        return sum(f.busy_s for f in self.functions) + self.outside_s

    @property
    def wait_s(self) -> float | None:
        waits = [f.wait_s for f in self.functions if f.wait_s is not None]
        return sum(waits) if waits or self.wait_outside_s is not None else None


def loader_profile(record: RunRecord, training: LoaderSummary) -> LoaderProfile | None:
    """The training loader's profile; None where none of its processes was profiled."""
    pids = training.worker_pids or [training.pid]
    by_function: dict[tuple[str, str], FunctionTime] = {}
    calls: dict[tuple[str, str], dict[str | None, CallTime]] = {}
    profiled = [record.profiles[pid] for pid in pids if record.profiles.get(pid)]
    if not profiled:
        return None
    out = LoaderProfile(scope=profiled[0].get("scope") or "worker", processes=len(pids), samples=0, functions=[],
                        outside_s=0.0)
    for prof in profiled:
        out.samples += prof.get("samples") or 0
        out.outside_s += prof.get("outside_s") or 0.0
        out.wait_outside_s = _plus(out.wait_outside_s, prof.get("wait_outside_s"))
        out.wait_unfiled_s = _plus(out.wait_unfiled_s, prof.get("wait_unfiled_s"))
        out.runqueue_s = _plus(out.runqueue_s, prof.get("runqueue_s"))
        for (site, function, call), (cpu, n, *wait) in prof["stacks"].items():
            wait_s = wait[0] if wait else None
            f = by_function.setdefault((site, function), FunctionTime(site, function))
            f.cpu_s += cpu
            f.samples += n
            f.wait_s = _plus(f.wait_s, wait_s)
            c = calls.setdefault((site, function), {}).setdefault(call, CallTime(call, 0.0, None))
            c.cpu_s += cpu
            c.wait_s = _plus(c.wait_s, wait_s)
    for key, f in by_function.items():
        f.calls = sorted(calls[key].values(), key=lambda c: -c.busy_s)
    out.functions = sorted(by_function.values(), key=lambda f: -f.busy_s)
    return out
