"""Make docs/report.png and docs/watch.png from a real `gpufeed demo` run.

    .venv/bin/python scripts/screenshots.py [--out docs]

The report: `gpufeed demo --report`, opened in headless Chromium. The watch screen: `gpufeed
watch` in tmux beside a running `gpufeed demo`, captured with its colours (capture-pane -e),
drawn by Rich as SVG and photographed by the same Chromium. Needs chromium and tmux
(scripts/test-deps.sh).
"""
from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.text import Text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.browser import Chromium, chromium_path  # noqa: E402

GPUFEED = [sys.executable, "-m", "gpufeed"]


def report_png(work: Path, out: Path, browser: Chromium) -> None:
    subprocess.run([*GPUFEED, "demo", "--out", str(work / "run"), "--report", str(work / "report.html")],
                   cwd=work, check=True, capture_output=True)
    session, page = browser.open(work / "report.html", width=1280, height=900)
    assert not page.errors, page.errors
    browser.screenshot(session, out / "report.png")


def watch_png(work: Path, out: Path, browser: Chromium, cols: int = 112, rows: int = 30) -> None:
    demo = subprocess.Popen([*GPUFEED, "demo", "--out", str(work / "gpufeed-runs" / "demo")], cwd=work,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmux = ["tmux", "-L", f"gpufeed-shots-{demo.pid}"]
    try:
        subprocess.run([*tmux, "new-session", "-d", "-s", "w", "-x", str(cols), "-y", str(rows),
                        f"cd {work} && {sys.executable} -m gpufeed watch --interval 0.5"], check=True)
        screen = ""
        for _ in range(120):  # until the run shows its findings (the demo needs a few seconds)
            time.sleep(0.5)
            screen = subprocess.run([*tmux, "capture-pane", "-p", "-e", "-t", "w"], capture_output=True,
                                    text=True).stdout
            ticks = re.search(r"#(\d+)", screen)
            # Wait for a few findings and some history in the sparklines.
            if "samples/s" in screen and screen.count("storage_latency") + screen.count("worker_restart") >= 1 \
                    and "workers" in screen and ticks and int(ticks.group(1)) >= 24:
                break
        subprocess.run([*tmux, "send-keys", "-t", "w", "q"])
    finally:
        time.sleep(1)
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        demo.wait()
    console = Console(record=True, width=cols, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    console.print(Text.from_ansi(screen.rstrip("\n")), soft_wrap=True)
    svg = work / "watch.svg"
    console.save_svg(str(svg), title="gpufeed watch")
    session, page = browser.open(svg, width=1000, height=200)
    browser.screenshot(session, out / "watch.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufeed-shots-") as tmp, Chromium(chromium_path()) as browser:
        work = Path(tmp)
        report_png(work, args.out, browser)
        watch_png(work, args.out, browser)
    print(f"wrote {args.out / 'report.png'} and {args.out / 'watch.png'}")


if __name__ == "__main__":
    main()
