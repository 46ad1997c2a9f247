"""``gpufeed watch`` in a real terminal: tmux runs it, send-keys types, capture-pane reads the screen."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import pytest

from gpufeed import cli
from gpufeed.measure.outside.nvml import Nvml
from gpufeed.present.watch import find_running_run, read_run, sparkline
from gpufeed.record import schema
from tests import needs
from tests.synthetic import RankAutotune, RankSpec, Scenario, add_rank_autotune, write_ddp_run, write_run
from tests.integration.test_report import gpufeed


class Tmux:
    """One tmux server of our own (its own socket), so nothing else's sessions are touched."""

    def __init__(self, tmp: Path) -> None:
        self.socket = f"gpufeed-test-{os.getpid()}-{tmp.name}"
        self.tmp = tmp
        self.exit_file = tmp / "watch.exit"

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10).stdout

    def start(self, args: str, width: int = 120, height: int = 40) -> None:
        command = (f"cd {self.tmp} && {sys.executable} -m gpufeed watch {args}; "
                   f"echo $? > {self.exit_file}; sleep 30")
        self.run("new-session", "-d", "-s", "w", "-x", str(width), "-y", str(height), command)

    def screen(self, joined: bool = False) -> str:
        return self.run("capture-pane", "-p", *(["-J"] if joined else []), "-t", "w")

    def wait_for(self, pattern: str, timeout_s: float = 15.0) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while True:
            found = re.search(pattern, self.screen())
            if found or time.monotonic() > deadline:
                assert found, f"{pattern!r} not on the screen:\n{self.screen()}"
                return found
            time.sleep(0.1)

    def exit_code(self, timeout_s: float = 5.0) -> int:
        deadline = time.monotonic() + timeout_s
        while not self.exit_file.exists() or not self.exit_file.read_text().strip():
            assert time.monotonic() < deadline, f"watch did not quit:\n{self.screen()}"
            time.sleep(0.1)
        return int(self.exit_file.read_text())

    def close(self) -> None:
        self.run("kill-server")


@pytest.fixture
def tmux(tmp_path):
    needs.tool("tmux")
    t = Tmux(tmp_path)
    yield t
    t.close()


def test_starts_refreshes_and_quits_on_q(tmux):
    tmux.start("--interval 0.2")
    first = int(tmux.wait_for(r"gpufeed watch .* #(\d+)").group(1))
    later = int(tmux.wait_for(rf"#(?!{first}\b)(\d+)").group(1))
    assert later > first, "the screen refreshes by itself"
    screen = tmux.screen()
    assert re.search(r"CPU\s+\d+% of \d+ cores", screen) and "RAM" in screen and "iowait" in screen
    gpu_error = Nvml().error  # what this machine's NVML says, read the way watch reads it
    if gpu_error is not None:
        assert f"GPU  N/A: {gpu_error}" in screen, "no GPU: N/A and why"
        assert not re.search(r"^ *(GPU *)?\d+ +\d+%", screen, re.MULTILINE), "no GPU: never a 0% GPU line"
    else:
        assert re.search(r"^ *0 +\d+% ", screen, re.MULTILINE), screen
    tmux.run("send-keys", "-t", "w", "q")
    assert tmux.exit_code() == 0
    assert "gpufeed watch" not in tmux.screen(), "the alternate screen is left on exit"


def test_ctrl_c_quits_cleanly(tmux):
    tmux.start("--interval 0.2")
    tmux.wait_for(r"gpufeed watch")
    tmux.run("send-keys", "-t", "w", "C-c")
    assert tmux.exit_code() == 0
    assert "Traceback" not in tmux.screen()


def test_tiny_terminal_gets_the_compact_layout(tmux):
    tmux.start("--interval 0.2", width=36, height=8)
    tmux.wait_for(r"q: quit")
    screen = tmux.screen(joined=True)  # lines tmux wrapped at the pane's width, joined again
    assert "CPU" in screen and "Traceback" not in screen
    assert max(len(line.rstrip()) for line in screen.splitlines()) <= 36, screen
    tmux.run("resize-window", "-t", "w", "-x", "120", "-y", "40")
    tmux.wait_for(r"gpufeed watch .* q to quit")
    tmux.run("send-keys", "-t", "w", "q")
    assert tmux.exit_code() == 0


@pytest.mark.parametrize("gpus", ["two", "none"])
def test_compact_layout_fits_the_width_it_is_given(tmp_path, gpus):
    """A terminal clips what passes its right edge (the next line overwrites it): render into a
    wide console instead, and measure what the 36 columns were given."""
    from rich.console import Console

    from gpufeed.measure.outside.host import HostReader
    from gpufeed.present.watch import Dashboard
    from tests.integration.test_sampler import failing_nvml, fake_nvml

    nvml = Nvml(module=fake_nvml() if gpus == "two" else failing_nvml())
    reader = HostReader(root_pid=os.getpid(), nvml=nvml)
    board = Dashboard(reader, running_run(tmp_path / "run", wait_s=0.02, fetch_cpu_s=0.002), discover=False)
    for t in range(3):
        board.tick(float(t))
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(board.render(36, 8, 1.0))
    lines = console.export_text().rstrip("\n").splitlines()
    reader.close()
    assert lines[0].startswith("GPU") and lines[-1].endswith("q: quit"), lines
    assert any(line.startswith("CPU") for line in lines) and any(line.startswith("run ") for line in lines)
    assert max(len(line.rstrip()) for line in lines) <= 36, lines


def running_run(path: Path, **knobs) -> Path:
    """A synthetic run that looks like one still being written: no end, a fresh sampler file."""
    run = write_run(path, Scenario(**knobs))
    meta = json.loads((run / schema.META_FILE).read_text())
    meta.update(t_end=None, end_reason=None, exit_code=None, message=None)
    (run / schema.META_FILE).write_text(json.dumps(meta))
    return run


def test_finds_the_running_diagnose_by_itself(tmux):
    running_run(tmux.tmp / "gpufeed-runs" / "20261129-120000-old")
    ended = write_run(tmux.tmp / "gpufeed-runs" / "20261129-130000-ended", Scenario())
    os.utime(ended, (time.time() + 5, time.time() + 5))  # newest, but it has ended
    tmux.start("--interval 0.2")
    tmux.wait_for(r"20261129-120000-old\s+running")
    screen = tmux.wait_for(r"samples/s [\d,]+ +data wait \d+%").string
    assert re.search(r"workers( \d+ sleeping \d+%)+", screen), screen
    tmux.run("send-keys", "-t", "w", "q")
    assert tmux.exit_code() == 0


def test_run_dir_given(tmux):
    run = running_run(tmux.tmp / "myrun", wait_s=0.02, fetch_cpu_s=0.002)
    tmux.start(str(run) + " --interval 0.2")
    screen = tmux.wait_for(r"samples/s [\d,]+ +data wait \d+%").string
    assert re.search(r"HIGH +storage_latency", screen) and "running" in screen
    tmux.run("send-keys", "-t", "w", "q")
    assert tmux.exit_code() == 0


def test_autotune_line(tmux):
    """An autotuned run: one line with the settings in force, the switches so far and the last decision."""
    run = running_run(tmux.tmp / "tuned", epochs=3, autotune_pools=3, prefetch_factor=4)
    autotune = [json.loads(line) for line in (run / "events" / "1000.jsonl").read_text().splitlines() if '"autotune"' in line]
    switches = [e for e in autotune if e["action"] == "switch"]
    settled = [e for e in autotune if e["action"] == "settled"]
    assert len(switches) == 6 and len(settled) == 1
    expected = f"autotune {switches[-1]['label']} (6 switches)  last: settled on {settled[-1]['label']}"
    assert read_run(run).autotune.startswith(expected[len("autotune "):])
    tmux.start(str(run) + " --interval 0.2")
    tmux.wait_for(re.escape(expected))
    tmux.run("send-keys", "-t", "w", "q")
    assert tmux.exit_code() == 0
    assert read_run(running_run(tmux.tmp / "plain")).autotune is None
    # several ranks: a line each, its settings and its last switch (the batch, seconds since the run started)
    ranks = add_rank_autotune(write_ddp_run(tmux.tmp / "ranks", [RankSpec(), RankSpec()]),
                              [RankAutotune(switches=[(1.3, 30, 1, 4)]), RankAutotune(switches=[(1.3002, 30, 1, 4)])])
    assert read_run(ranks).autotune_ranks == ["rank 0  w4 p2  last switch: batch 30 at 0.4 s (w1 p2 → w4 p2)",
                                              "rank 1  w4 p2  last switch: batch 30 at 0.4 s (w1 p2 → w4 p2)"]
    tmux.run("kill-session", "-t", "w")   # the first watch's session (it sleeps after watch quits)
    tmux.exit_file.unlink()
    tmux.start(str(ranks) + " --interval 0.2")
    tmux.wait_for(r"rank 1  w4 p2  last switch: batch 30 at 0\.4 s")
    tmux.run("send-keys", "-t", "w", "q")
    assert tmux.exit_code() == 0


def test_missing_run_dir(tmp_path):
    result = gpufeed(["watch", str(tmp_path / "nope")], cwd=tmp_path)
    assert result.returncode == cli.EXIT_BAD_RECORD and "nope is not a directory" in result.stderr


def test_read_run_and_discovery(tmp_path):
    run = running_run(tmp_path / "gpufeed-runs" / "a", wait_s=0.02, fetch_cpu_s=0.002)
    assert find_running_run(tmp_path / "gpufeed-runs") == run
    assert find_running_run(tmp_path / "gpufeed-runs", now=lambda: time.time() + 3600) is None, "a stale run"
    trial = running_run(tmp_path / "gpufeed-runs" / "b-tune" / "trials" / "03-w4-p2")
    os.utime(trial, (time.time() + 5, time.time() + 5))
    assert find_running_run(tmp_path / "gpufeed-runs") == trial, "the trial a tune is running"
    state = read_run(run)
    assert state.running and state.samples_per_s and state.data_wait_share > 0.5
    assert state.workers and all(status == "sleeping" for _, status, _ in state.workers)
    assert "storage_latency" in [f.id for f in state.findings]


def test_sparkline_leaves_a_gap_for_a_missing_reading():
    assert sparkline(deque([0.0, None, 100.0]), 100.0, 10) == "▁ █"


def test_gpus_through_a_fake_nvml(tmp_path):
    """Two GPUs, the sawtooth on GPU 0, a process holding memory; then a reading that fails: N/A."""
    from rich.console import Console

    from gpufeed.measure.outside.host import HostReader
    from gpufeed.present.watch import Dashboard
    from tests.integration.test_sampler import fake_nvml

    def screen(board: Dashboard) -> str:
        console = Console(record=True, width=120, file=io.StringIO())
        console.print(board.render(120, 40, 1.0))
        return console.export_text()

    reader = HostReader(root_pid=os.getpid(), nvml=Nvml(module=fake_nvml()))
    board = Dashboard(reader, None, discover=False)
    for t in range(5):
        board.tick(float(t))
    text = screen(board)
    assert re.search(r"0 +87% +▇▇▇▇▇ +N/A +N/A +N/A +1\.0 GiB / 80\.0 GiB", text), text
    assert "GPU 0 SM activity, occupancy, tensor N/A: not in these NVML bindings" in text, text
    assert re.search(r"1 +5% +▁▁▁▁▁", text), text
    assert re.search(r"GPU processes.*\n.*\n +0 +100 +\S+ +2\.0 GiB", text), text
    reader.nvml = Nvml(module=fake_nvml(util_fails=True))
    board.tick(5.0)
    assert re.search(r"0 +N/A +▇▇▇▇▇  ", screen(board)), "a failed reading is N/A and a gap, not 0"
    reader.close()


def test_an_offloaded_run_shows_its_ray_line(tmux):
    """--offload: one line with the Ray workers, the batches/s between the last two offload records,
    the latency before the last and the resent/lost counts, all from the record."""
    from tests.unit.analysis.test_offload_analysis import OFFLOADED
    run = running_run(tmux.tmp / "myrun", **vars(OFFLOADED))
    *_, before, last = OFFLOADED.offload_events
    rate = (last["batches"] - before["batches"]) / (last["t"] - before["t"])
    tmux.start(str(run) + " --interval 0.2")
    line = tmux.wait_for(r"Ray .*").group(0)
    assert (f"Ray 2 workers on 2 nodes · batches/s {rate:,.1f}   latency p50 {last['recent_latency_ms_p50']:.1f} ms"
            f"   resent/lost {last['resent']}/{last['workers_lost']}") in line, line
    assert re.search(r"HIGH +offload_input_wait", tmux.screen())
    assert not re.search(r"^ +workers ", tmux.screen(), re.M), "no local workers to show"
    tmux.run("send-keys", "-t", "w", "q")
    assert tmux.exit_code() == 0


def test_gpm_beside_utilisation_or_na_with_its_reason():
    """A Hopper GPU's SM activity, occupancy and tensor activity (GPM, from two samples) beside its
    utilisation; an older GPU and one where GPM is not permitted: N/A and why, never 0. The first
    reading has no GPM yet (it needs two samples): N/A, and the reason says so."""
    from rich.console import Console

    from gpufeed.measure.outside.host import HostReader
    from gpufeed.present.watch import Dashboard
    from tests.fake_nvml import FakeGpu, FakeNvml

    def screen(board: Dashboard, width: int = 120, height: int = 40) -> str:
        console = Console(record=True, width=200, file=io.StringIO())
        console.print(board.render(width, height, 1.0))
        return console.export_text()

    fake = FakeNvml([FakeGpu(utils=[90.0], sm_active=[30.0, 70.0]),
                     FakeGpu(name="NVIDIA A10", uuid="GPU-bbbb", utils=[60.0], gpm="unsupported"),
                     FakeGpu(uuid="GPU-cccc", utils=[20.0], gpm="not_permitted")])
    reader = HostReader(root_pid=os.getpid(), nvml=Nvml(module=fake))
    board = Dashboard(reader, None, discover=False)
    board.tick(0.0)
    assert "GPU 0 SM activity, occupancy, tensor N/A: first sample (a GPM reading needs two)" in screen(board)
    board.tick(1.0)
    text = screen(board)
    # The fake's occupancy is half the SM activity, its tensor activity a quarter (tests/fake_nvml.py).
    assert re.search(r"^ 0 +90% +\S+ +30% +15% +8% +\d", text, re.M), text
    assert re.search(r"^ 1 +60% +\S+ +N/A +N/A +N/A +\d", text, re.M), text
    assert "GPU 1 SM activity, occupancy, tensor N/A: not supported (GPM needs a Hopper or newer GPU)" in text
    assert "GPU 2 SM activity, occupancy, tensor N/A: not permitted" in text
    assert "GPU 0 SM activity" not in text, "a GPU that has them says no N/A"
    board.tick(2.0)
    assert re.search(r"^ 0 +90% +\S+ +70% +35% +18% +\d", screen(board), re.M), "each reading its own interval's"
    compact = screen(board, 36, 8).splitlines()
    assert compact[0].startswith("GPU0 90% ") and " SM 70% " in compact[0], compact
    assert " SM N/A " in compact[1], compact
    reader.close()
