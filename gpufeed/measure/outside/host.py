"""Reading the host now: its CPUs and memory, a process tree and the GPUs, one reading at a time.

The reader keeps what a reading needs from the previous one (CPU times, for rates; the tree's
processes, with their /proc files open) and nothing else: ``sampler.Sampler`` records its readings
on a thread into the run directory; ``gpufeed watch`` and the runner's stall snapshot read it
directly (the shape of nvitop's ``api/`` objects beside its collector). A reading that could not be
taken is ``None``, never 0.

psutil costs several times the sampler's budget, so on Linux the reads go straight to ``/proc``
through file descriptors kept open between readings; psutil is the fallback elsewhere.
"""
from __future__ import annotations

import math
import os
import sys
import time
from collections import Counter, defaultdict
from typing import Any, Callable, Iterable

import psutil

from gpufeed.measure.outside.nvml import GpuReading, Nvml

# Finding new descendants scans every process on the host, so do it about once a second;
# processes already known are read every reading.
DISCOVER_EVERY_S = 1.0
# Other programs (outside the tree, gpufeed aside) are read about every 2 s: every process's CPU time,
# the busiest few kept, so a finding can name who took the job's cores (a few ms a reading here).
OTHERS_EVERY_S = 2.0
OTHERS_KEPT = 3
OTHERS_MIN_CORES = 0.05
# A stalled loader's processes: each one's state is read this many times, this far apart, and the state
# it held most is said (a process blocked for minutes is woken for microseconds by every signal).
STATE_READS = 5
STATE_READ_GAP_S = 0.01

_LINUX = sys.platform.startswith("linux")
_CLK_TCK = os.sysconf("SC_CLK_TCK") if _LINUX else 100
_PAGE_B = os.sysconf("SC_PAGE_SIZE") if _LINUX else 4096
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)
# /proc state letters -> the names psutil uses, so every path (and snapshot) agrees.
_STATUS = {
    "R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped", "t": "tracing-stop",
    "Z": "zombie", "X": "dead", "x": "dead", "K": "wake-kill", "W": "waking", "I": "idle",
    "P": "parked",
}

# One process at one tick: (ppid, status, cpu_s = user + system, threads, rss_b).
ProcStat = tuple[int, str, float, int, int]
# One core since boot: (idle_s including iowait, iowait_s or None, total_s). Any unit works:
# only ratios of differences are used.
CoreTimes = tuple[float, float | None, float]


# -- Linux /proc readers -------------------------------------------------------------------------

def _open_proc(path: str) -> int | None:
    """A kept-open descriptor; re-read with pread at offset 0 (procfs regenerates the text)."""
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None


def _read_proc(path: str, fd: int | None) -> bytes:
    if fd is not None:
        return os.pread(fd, 65536, 0)
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def _after_comm(stat: bytes) -> list[bytes]:
    # /proc/<pid>/stat fields after "(comm)"; comm may contain spaces and ")".
    return stat[stat.rindex(b")") + 2:].split()


def _parse_pid_stat(stat: bytes) -> ProcStat:
    """Fields of proc(5) /proc/<pid>/stat, counted from the state field (3)."""
    f = _after_comm(stat)
    state = f[0].decode()
    return (int(f[1]), _STATUS.get(state, state),
            (int(f[11]) + int(f[12])) / _CLK_TCK,  # utime + stime, clock ticks
            int(f[17]),                            # num_threads
            int(f[21]) * _PAGE_B)                  # rss, pages


def _parse_cpu_lines(stat: bytes) -> list[CoreTimes]:
    """Per-core lines of /proc/stat: user nice system idle iowait irq softirq steal guest..."""
    cores: list[CoreTimes] = []
    for line in stat.split(b"\n"):
        if not line.startswith(b"cpu") or line.startswith(b"cpu "):
            continue
        ticks = [int(x) for x in line.split()[1:9]]  # guest is already counted in user
        iowait = ticks[4] if len(ticks) > 4 else None
        cores.append((ticks[3] + (iowait or 0), iowait, sum(ticks)))
    return cores


def _parse_meminfo(meminfo: bytes) -> tuple[int, int] | None:
    """(used_b, total_b) from /proc/meminfo; None on kernels without MemAvailable."""
    total_kb = avail_kb = None
    for line in meminfo.split(b"\n"):
        if line.startswith(b"MemTotal:"):
            total_kb = int(line.split()[1])
        elif line.startswith(b"MemAvailable:"):
            avail_kb = int(line.split()[1])
            break
    if total_kb is None or avail_kb is None:
        return None
    return (total_kb - avail_kb) * 1024, total_kb * 1024


def _children_by_ppid() -> dict[int, list[int]]:
    """ppid -> child pids for every process on the host (the costly scan)."""
    kids: dict[int, list[int]] = defaultdict(list)
    if not _LINUX:
        for p in psutil.process_iter(["ppid"]):
            kids[p.info["ppid"]].append(p.pid)
        return kids
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                kids[int(_after_comm(_read_proc(f"/proc/{name}/stat", None))[1])].append(int(name))
            except (OSError, ValueError, IndexError):
                continue  # exited during the scan
    return kids


def _read_wchan(pid: int) -> str | None:
    """The kernel function a process sleeps in ("0" while running); None if unreadable."""
    try:
        with open(f"/proc/{pid}/wchan", encoding="ascii", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


class _Tracked:
    """A process in the tree, how to read it, and its CPU time at the previous tick."""

    __slots__ = ("proc", "fd", "last_cpu_s", "last_t", "newborn")

    def __init__(self, proc: psutil.Process, fd: int | None, newborn: bool = False) -> None:
        self.proc = proc
        # Forked since the previous tick: all of its CPU time was spent in this interval.
        self.newborn = newborn
        # Bound to this process, not the pid: reads fail (ESRCH) once it is reaped, so a
        # reused pid is never mistaken for it.
        self.fd = fd
        self.last_cpu_s: float | None = None
        self.last_t: float | None = None

    def read(self) -> ProcStat:
        if _LINUX:
            return _parse_pid_stat(_read_proc(f"/proc/{self.proc.pid}/stat", self.fd))
        with self.proc.oneshot():
            times = self.proc.cpu_times()
            return (self.proc.ppid(), self.proc.status(), times.user + times.system,
                    self.proc.num_threads(), self.proc.memory_info().rss)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class HostReader:
    """Reads the host, the process tree under ``root_pid`` and the GPUs, one ``read()`` at a time."""

    def __init__(self, root_pid: int, nvml: Nvml | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.root_pid = root_pid
        self.nvml = nvml if nvml is not None else Nvml()
        self._owns_nvml = nvml is None  # shut down only a gateway we started
        self.clock = clock
        # Every pid ever seen in the tree -> its create_time (psutil's), so the runner can kill
        # leftover workers without hitting an unrelated process that reused the pid.
        self.seen: dict[int, float] = {}
        self._tracked: dict[int, _Tracked] = {}
        self._cpu_pct: dict[int, float | None] = {}  # pid -> % of one core at the last reading
        self._last_discover_t = -math.inf
        self._last_procs_t: float | None = None
        self._last_cores: list[CoreTimes] | None = None
        self._stat_fd = _open_proc("/proc/stat") if _LINUX else None
        self._meminfo_fd = _open_proc("/proc/meminfo") if _LINUX else None
        self._others_cpu: dict[int, float] = {}   # pid -> CPU seconds at the last others reading
        self._others_t: float | None = None

    def prime(self) -> None:
        """Baselines, so the first reading already has CPU rates over one interval."""
        self._host_cpu()
        self._procs(self.clock())

    def read(self) -> dict[str, Any]:
        """One reading, in the format of a sample line (``record/schema.py``, "Sample lines")."""
        t = self.clock()
        cpu_pct, iowait_pct = self._host_cpu()
        mem_used_b, mem_total_b = self._host_mem()
        reading = {
            "t": t,
            "cpu_pct": cpu_pct,
            "iowait_pct": iowait_pct,
            "mem_used_b": mem_used_b,
            "mem_total_b": mem_total_b,
            "procs": self._procs(t),
            "gpus": [self._gpu_dict(g) for g in self.nvml.read()],
        }
        if self._others_t is None or t - self._others_t >= OTHERS_EVERY_S:
            others = self._others(t)
            if others is not None:
                reading["others"] = others
        return reading

    def _others(self, t: float) -> list[list[Any]] | None:
        """The busiest programs outside the tree since the last such reading: [[pid, name, cores], ...]
        (None on the first, which only takes the baseline, and off Linux)."""
        if not _LINUX:
            return None
        skip = set(self._tracked) | {os.getpid()}
        now: dict[int, float] = {}
        names: dict[int, str] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in skip:
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
                fields = _after_comm(stat)
                now[int(entry)] = (int(fields[11]) + int(fields[12])) / _CLK_TCK
                names[int(entry)] = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode("utf-8", "replace")
            except (OSError, ValueError, IndexError):
                continue
        before, then = self._others_cpu, self._others_t
        self._others_cpu, self._others_t = now, t
        if then is None or t <= then:
            return None
        # A process born since the last reading counts all its CPU time: it was spent in the interval.
        rows = [[pid, names[pid], round((cpu - before.get(pid, 0.0)) / (t - then), 2)] for pid, cpu in now.items()]
        rows = [r for r in rows if r[2] >= OTHERS_MIN_CORES]
        return sorted(rows, key=lambda r: -r[2])[:OTHERS_KEPT]

    def close(self) -> None:
        """Close the kept /proc files (and the NVML gateway, if this reader started it)."""
        for tr in self._tracked.values():
            tr.close()
        self._tracked.clear()
        for fd in (self._stat_fd, self._meminfo_fd):
            if fd is not None:
                os.close(fd)
        self._stat_fd = self._meminfo_fd = None
        if self._owns_nvml:
            self.nvml.shutdown()

    def _core_times(self) -> list[CoreTimes]:
        # Our own deltas rather than psutil.cpu_times_percent, whose "since the last call"
        # state is module-global and would be shared with any other caller in this process.
        if _LINUX:
            return _parse_cpu_lines(_read_proc("/proc/stat", self._stat_fd))
        cores: list[CoreTimes] = []
        for c in psutil.cpu_times(percpu=True):
            iowait = getattr(c, "iowait", None)
            cores.append((c.idle + (iowait or 0.0), iowait, sum(c)))
        return cores

    def _host_cpu(self) -> tuple[list[float | None], float | None]:
        """Per-core busy % and mean iowait % since the previous call ([] and None at first)."""
        now = self._core_times()
        last, self._last_cores = self._last_cores, now
        if last is None or len(last) != len(now):  # first call, or a core went on/offline
            return [], None
        busy: list[float | None] = []
        iowait: list[float] = []
        for (idle0, wait0, total0), (idle1, wait1, total1) in zip(last, now):
            total = total1 - total0
            if total <= 0:  # no time accounted on this core: no reading
                busy.append(None)
                continue
            busy.append(round(min(100.0, max(0.0, 100.0 * (1 - (idle1 - idle0) / total))), 1))
            if wait0 is not None and wait1 is not None:
                iowait.append(100.0 * (wait1 - wait0) / total)
        return busy, (round(sum(iowait) / len(iowait), 1) if iowait else None)

    def _host_mem(self) -> tuple[int, int]:
        if _LINUX:
            mem = _parse_meminfo(_read_proc("/proc/meminfo", self._meminfo_fd))
            if mem is not None:
                return mem
        vm = psutil.virtual_memory()
        return vm.total - vm.available, vm.total  # used as "what is really taken", not vm.used

    def _discover(self) -> None:
        """Add descendants not yet tracked.

        The root is looked for only the first time; after that the tree grows from the
        processes already tracked, so workers re-parented after their parent died are kept
        and an unrelated process that reuses the root's pid is never adopted.
        """
        first = self._last_discover_t == -math.inf
        seeds = list(self._tracked)
        if first and psutil.pid_exists(self.root_pid):
            seeds.append(self.root_pid)
        kids = _children_by_ppid()
        found: list[int] = []
        todo = list(seeds)
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(kids.get(pid, ()))
        for pid in found:
            self._track(pid)

    def _track(self, pid: int, newborn: bool = False) -> None:
        if pid in self._tracked:
            return
        fd = _open_proc(f"/proc/{pid}/stat") if _LINUX else None
        try:
            proc = psutil.Process(pid)
            create_time = proc.create_time()
        except _GONE:
            if fd is not None:
                os.close(fd)
            return
        self._tracked[pid] = _Tracked(proc, fd, newborn)
        self.seen[pid] = create_time

    def _new_children(self) -> None:
        """Every tick, the children each tracked process forked from its main thread (where
        DataLoader workers come from): cheap on Linux, and it catches workers that live for one
        short epoch, which the once-a-second scan of the whole host would miss. Such a child was
        forked since the previous tick (once the tree has been read once)."""
        if not _LINUX:
            return
        newborn = self._last_procs_t is not None
        for pid in list(self._tracked):
            try:
                with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
                    children = f.read().split()
            except OSError:
                continue
            for child in children:
                self._track(int(child), newborn)

    def _procs(self, t: float) -> list[list[Any]]:
        """Rows of [pid, ppid, cpu_pct, threads, status, rss_b] for the tree, root first."""
        self._new_children()
        if t - self._last_discover_t >= DISCOVER_EVERY_S:
            self._discover()
            self._last_discover_t = t
        rows: list[list[Any]] = []
        cpu_pct: dict[int, float | None] = {}
        for pid, tr in list(self._tracked.items()):
            try:
                ppid, status, used_s, threads, rss_b = tr.read()
            except (OSError, ValueError, IndexError, *_GONE):
                tr.close()
                del self._tracked[pid]  # exited since the last tick: drop it quietly
                continue
            pct: float | None = None
            if tr.last_cpu_s is not None and tr.last_t is not None and t > tr.last_t:
                # % of one core: 250 means two and a half cores busy.
                pct = round(100.0 * (used_s - tr.last_cpu_s) / (t - tr.last_t), 1)
            elif tr.newborn and self._last_procs_t is not None and t > self._last_procs_t:
                # Its whole CPU time so far, over the interval it was born in: a DataLoader worker
                # started again each epoch would otherwise lose its start-up and first batch, and
                # that CPU would read as other programs' (the host's busy cores less the tree's).
                pct = round(100.0 * used_s / (t - self._last_procs_t), 1)
            tr.last_cpu_s, tr.last_t = used_s, t
            cpu_pct[pid] = pct
            rows.append([pid, ppid, pct, threads, status, rss_b])
        self._last_procs_t = t
        self._cpu_pct = cpu_pct  # replaced whole, so snapshot() in another thread sees one tick
        rows.sort(key=lambda r: (r[0] != self.root_pid, r[0]))
        return rows

    @staticmethod
    def _gpu_dict(g: GpuReading) -> dict[str, Any]:
        out = {
            "index": g.index,
            "util_pct": g.util_pct,
            "mem_used_b": g.mem_used_b,
            "mem_total_b": g.mem_total_b,
            "procs": {str(pid): used_b for pid, used_b in g.procs.items()},
            "sm_active_pct": g.sm_active_pct,
            "sm_occupancy_pct": g.sm_occupancy_pct,
            "tensor_active_pct": g.tensor_active_pct,
            "gpm_na": g.gpm_na,
        }
        if g.util_na is not None:
            out["util_na"] = g.util_na
        if g.mig:
            out["mig"] = g.mig
        return out

    # -- on demand ----------------------------------------------------------------------------

    def snapshot(self, pids: Iterable[int]) -> list[dict[str, Any]]:
        """What each process is doing now: for a stalled loader's workers.

        cpu_pct comes from the last reading (None if it has not seen the pid);
        wchan is the kernel function the process sleeps in (psutil does not expose it).
        """
        last_pct = self._cpu_pct
        out: list[dict[str, Any]] = []
        for pid in pids:
            info: dict[str, Any] = {"pid": pid, "name": None, "status": None,
                                    "cpu_pct": last_pct.get(pid), "threads": None, "wchan": None}
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    info["name"] = proc.name()
                    info["threads"] = proc.num_threads()
                info["status"], info["wchan"] = _held_state(proc)
            except _GONE:
                pass
            out.append(info)
        return out


def _held_state(proc: psutil.Process) -> tuple[str | None, str | None]:
    """The state a process held over STATE_READS readings, and the kernel function it slept in.

    One reading is a coin toss for a blocked worker: gpufeed's own wall sampler wakes it for a few
    microseconds each tick (as would any signal), and a reading that lands there says "running".
    """
    readings = []
    for i in range(STATE_READS):
        if i:
            time.sleep(STATE_READ_GAP_S)
        readings.append((proc.status(), _read_wchan(proc.pid)))
    status = Counter(s for s, _ in readings).most_common(1)[0][0]
    return status, Counter(w for s, w in readings if s == status).most_common(1)[0][0]
