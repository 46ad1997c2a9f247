"""The sentences the terminal summary and the HTML report both say, in one place: the bottleneck
and what each loss costs, the numbers' lines (``terminal.numbers_table``, which the report shows as
its "Measured" block), and the headings they share.
"""
from __future__ import annotations

from gpufeed.analysis import quiet
from gpufeed.analysis.findings import Diagnosis
from gpufeed.analysis.metrics import Metrics
from gpufeed.analysis.offloaded import Offload
from gpufeed.units import NA, fmt

COMPUTE = "compute"
FINDINGS_BY_TIME = "Findings, ranked by the time they cost"
MEMORY_BY_BYTES = "Memory, ranked by the bytes it holds"


def warmup_sentence(m: Metrics) -> str:
    """"10 warm-up steps", or "10 warm-up steps and 5 more to start on an epoch's boundary"."""
    asked = m.warmup_asked if m.warmup_asked is not None else m.warmup_steps
    if m.warmup_steps > asked:
        more = m.warmup_steps - asked
        return f"{asked} warm-up steps and {more} more to start on an epoch's boundary"
    return f"{m.warmup_steps} warm-up step{'s' if m.warmup_steps != 1 else ''}"


def autotuned_sentence(m: Metrics) -> str:
    """"autotuned from w1 p2 to w8 p4 persistent (6 switches) · ": --autotune changed the loader, and
    the figures after it describe the settings it ended with."""
    a = m.autotuned
    if a is None:
        return ""
    if not a["switches"]:
        return f"autotuned: kept {a['from']} (no switch) · "
    return f"autotuned from {a['from']} to {a['to']} ({a['switches']} switch{'es' if a['switches'] > 1 else ''}) · "


def rank_switches_sentence(m: Metrics) -> str | None:
    """Under several ranks, at which batches --autotune switched (``analysis/rank_switches.py``): said
    once for every rank when they agree, each difference named when they do not (a bug); None with
    one rank or no --autotune."""
    ranks = (m.autotuned or {}).get("ranks")
    return ranks_switched(ranks) if ranks else None


def ranks_switched(ranks: dict) -> str:
    """``rank_switches_sentence`` from ``RankSwitches.to_dict()`` (the report says it too)."""
    if ranks["differ"]:
        return ("THE RANKS DID NOT SWITCH TOGETHER (another batch or other settings), which --autotune never "
                "does: a bug in gpufeed, please report it: " + "; ".join(ranks["differ"]))
    n = len(ranks["ranks"])
    if not ranks["batches"]:
        said = f"no switch on any of the {n} ranks"
    else:
        batches = ", ".join("?" if b is None else str(b) for b in ranks["batches"])
        said = f"every rank ({n}) switched before the same batches, to the same settings: batch {batches}"
    back = [f"{b['rank']} went back to your settings at batch {'?' if b['batch'] is None else b['batch']} ({b['why']})"
            for b in ranks["back"]]
    return "; ".join([said, *back])


def offload_sentence(o: Offload) -> str:
    """The diagnosis's line for an offloaded training loader: who made its batches, how fast they came."""
    per_node = " + ".join(str(n) for n in o.by_node.values()) or NA
    text = (f"{fmt(o.batches, 'd')} batches made by {o.described()} (per node: {per_node}) · latency p50 "
            f"{fmt(o.latency_ms_p50, '.1f', ' ms')} from send to delivery · {fmt(o.make_ms_p50, '.1f', ' ms')} "
            f"({fmt(o.make_cpu_ms_p50, '.1f', ' ms')} CPU) a batch in its worker · {fmt(o.resent, 'd')} sent again, "
            f"{fmt(o.workers_lost, 'd')} workers lost")
    if o.fell_back:
        text += f" · fell back to local workers: {o.fell_back}"
    return text


def gpus_named(m: Metrics) -> str:
    """"GPU 1 (NVIDIA A10) · ": the GPUs the figures come from, by NVML index."""
    if not m.gpu_indices:
        return ""
    names = ", ".join(f"GPU {i}" + (f" ({n})" if n else "") for i, n in zip(m.gpu_indices, m.gpu_names))
    return f"{names} · "


def headline(d: Diagnosis) -> str:
    """"INPUT (45% of the time: highly input-bound); compute takes 55%": the loss that holds the
    accelerator back and what the others cost, or why nothing could be judged."""
    if d.bottleneck is None:
        return f"NOT MEASURED: {d.not_measured or 'nothing was measured'}"
    return d.bottleneck.upper() + costs_sentence(d) + quiet.headline_note(d.quiet_machine)


def costs_sentence(d: Diagnosis) -> str:
    """" (45% of the time: highly input-bound); compute takes 55%": the bottleneck's share and the
    others' (where measured), with the input pipeline's band beside its share."""
    if d.bottleneck is None:
        return f": {d.not_measured}" if d.not_measured else ""

    def band(kind: str) -> str:
        return f": {d.input_bound} input-bound" if kind in ("input", "compute") and d.input_bound else ""

    share = d.costs.get(d.bottleneck)
    head = f" ({share:.0%} of the time{band(d.bottleneck)})" if share is not None else ""
    rest = [f"{kind} {'takes' if kind == 'compute' else 'costs'} {v:.0%}"
            + (f" ({d.input_bound} input-bound)" if kind == "input" and d.input_bound and d.bottleneck != COMPUTE else "")
            for kind, v in d.costs.items() if kind != d.bottleneck and v is not None and round(v, 2) > 0]
    return "; ".join([head] + rest)


def cpus_sentence(m: Metrics) -> str:
    """"2 cores (per core: 95 90)", or for a job limited to fewer CPUs than the host
    "1 core (core 3: 95) · CPU affinity: core 3; the host has 8"."""
    cores = f"{m.cpu_count} core{'s' if m.cpu_count != 1 else ''}"
    values = " ".join(f"{v:.0f}" for v in m.cpu_util_per_core_pct) or NA
    if not m.cpu_limit:
        return f"{cores} (per core: {values})"
    named = " ".join(f"{c}:{v:.0f}" for c, v in zip(m.cpu_cores, m.cpu_util_per_core_pct)) or NA
    label = f"core {named}" if len(m.cpu_cores) == 1 else f"per core {named}"
    return f"{cores} ({label}) · {m.cpu_limit}"
