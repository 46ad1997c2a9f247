"""A stuck DataLoader (or tf.data pipeline): no batch for the stall timeout, with where each of its
processes (a TensorFlow process: its Python threads) waited."""
from __future__ import annotations

from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import HIGH, Finding
from gpufeed.units import fmt


def loader_stalled(ctx: Context) -> Finding | None:
    stall = ctx.record.meta.stall or (ctx.record.stalls[0] if ctx.record.stalls else None)
    if not stall:
        return None
    stacks = ctx.record.stacks()
    if stall.get("tf_call"):
        return _tf_stalled(stall, stacks.get(stall.get("pid"), ""))
    workers = []
    for proc in stall.get("processes") or []:
        where = _innermost_frame(stacks.get(proc.get("pid"), ""))
        workers.append({"pid": proc.get("pid"), "status": proc.get("status"), "wchan": proc.get("wchan"),
                        "cpu_pct": proc.get("cpu_pct"), "where": where})
    doing = "; ".join(f"pid {w['pid']} {w['status'] or '?'}" + (f" in {w['where']}" if w["where"] else "")
                      for w in workers[1:]) or "no worker state could be read"
    return Finding(
        id="loader_stalled", severity=HIGH, cost_share=1.0,
        message=(f"The DataLoader delivered no batch for {fmt(stall.get('waited_s', 0), '.0f')} s: it is stuck "
                 f"(workers: {doing})."),
        recommendation=("Read the stacks in the run directory's stacks/ folder to see where each worker waits; "
                        "DataLoader(..., timeout=SECONDS) makes a stuck worker raise instead of hanging."),
        evidence={"waited_s": stall.get("waited_s"), "processes": workers},
    )


def _innermost_frame(stack: str) -> str | None:
    """Where the process's main thread was: the innermost frame of the thread whose stack reaches
    the program's entry (``<module>``, or a DataLoader worker's ``_worker_loop``)."""
    blocks = [block.splitlines() for block in stack.split("\n\n")]
    for block in blocks:
        frames = [line.strip() for line in block if line.strip().startswith("File ")]
        if any(line.endswith((" in <module>", " in _worker_loop")) for line in frames):
            return frames[0].replace("File ", "", 1)
    return None


def _tf_stalled(stall: dict, stack: str) -> Finding:
    """A TensorFlow process: the stuck call, and where Python ran in threads other than the loop's (a
    ``py_function``, ``numpy_function`` or ``from_generator`` runs in tf.data's threads)."""
    waited = fmt(stall.get("waited_s", 0), ".0f")
    where = _side_threads(stack)
    if stall.get("tf_call") == "train_function":
        message = f"Keras's training step had not returned after {waited} s: its tf.data input (or its compute) is stuck"
    else:
        message = f"The tf.data iterator delivered no batch for {waited} s: the pipeline is stuck"
    message += f" (Python in TensorFlow's threads: {'; '.join(where)})." if where else "."
    return Finding(
        id="loader_stalled", severity=HIGH, cost_share=1.0, message=message,
        recommendation=("Read the stacks in the run directory's stacks/ folder to see where each Python thread "
                        "waits (a py_function, numpy_function or from_generator that blocks shows there); a read "
                        "that can hang needs its own timeout."),
        evidence={"waited_s": stall.get("waited_s"), "tf_call": stall.get("tf_call"), "threads": where},
    )


def _side_threads(stack: str) -> list[str]:
    """The innermost frame of each thread that is neither the program's main one nor gpufeed's own."""
    out = []
    for block in stack.split("\n\n"):
        lines = [line.strip() for line in block.splitlines()]
        frames = [line.replace("File ", "", 1) for line in lines if line.startswith("File ")]
        head = lines[0] if lines else ""
        if not frames or head.startswith("Current thread") or frames[-1].endswith(" in <module>") \
                or any("gpufeed" in f or "/threading.py" in f for f in frames[:1]):
            continue
        out.append(frames[0])
    return out
