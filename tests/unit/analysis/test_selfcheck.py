"""The self-check (``analysis/selfcheck.py``): diagnoses built to contradict themselves are demoted or
qualified, each change said in ``Diagnosis.checks`` (issue 31, points 5 and 11); a consistent one
passes unchanged."""
from __future__ import annotations

from gpufeed.analysis import selfcheck
from gpufeed.analysis.findings import HIGH, INFO, MEDIUM, Diagnosis, Finding
from gpufeed.analysis.metrics import Metrics


def finding(fid: str, cost: float | None, gain: dict | None = None, group: str = "time",
            severity: str = MEDIUM, **evidence) -> Finding:
    return Finding(id=fid, severity=severity, message=f"{fid} happened", recommendation=f"fix {fid}",
                   evidence=evidence, cost_share=cost, fix_settings={"num_workers": 4} if gain else None,
                   gain=gain, group=group)


def gain(speedup: float, low: float, high: float, noise: float = 0.03) -> dict:
    return {"speedup": speedup, "low": low, "high": high, "samples_per_s": 100 * speedup,
            "setting": "w4 on 2 cores", "noise": noise}


def diagnosis(bottleneck: str, findings: list[Finding], metrics: Metrics | None = None, **run) -> Diagnosis:
    return Diagnosis(bottleneck=bottleneck, findings=findings, metrics=metrics or Metrics(steps=40),
                     loaders=[], run_dir="run", gpu_available=False, gpu_unavailable_reason=None,
                     run={"end_reason": "completed", **run}, costs={"input": 0.04, "compute": 0.96})


def test_a_consistent_diagnosis_passes_unchanged():
    d = diagnosis("input", [finding("too_few_workers", 0.3, gain(1.4, 1.3, 1.5))])
    checked = selfcheck.check(d)
    assert checked.checks == [] and checked.findings == d.findings and checked.bottleneck == "input"


def test_a_fix_predicted_within_the_noise_is_not_offered():
    d = selfcheck.check(diagnosis("input", [finding("too_few_workers", 0.06, gain(1.01, 0.98, 1.02))]))
    f = d.findings[0]
    assert f.severity == "low" and f.fix_settings is None
    assert f.recommendation.startswith("No DataLoader change is offered")
    assert "within this run's noise (±3%)" in f.recommendation
    assert len(d.checks) == 1 and "not offered" in d.checks[0]


def test_a_fix_predicted_within_the_noise_is_not_offered_though_its_range_clears_it():
    """A loaded host (noise 25%): storage_latency's num_workers=32 at 0.99x (0.70-1.30x) was offered
    because only the range's upper end was held against the noise."""
    d = selfcheck.check(diagnosis("input", [finding("storage_latency", 0.2, gain(0.99, 0.70, 1.30, noise=0.25)),
                                            finding("too_few_workers", 0.2, gain(1.40, 1.10, 1.70, noise=0.25))]))
    withheld, offered = (next(f for f in d.findings if f.id == fid) for fid in ("storage_latency", "too_few_workers"))
    assert withheld.fix_settings is None and "within this run's noise (±25%)" in withheld.recommendation
    assert offered.fix_settings == {"num_workers": 4} and offered.recommendation == "fix too_few_workers"
    assert len(d.checks) == 1 and "storage_latency" in d.checks[0]


def test_a_fix_predicted_slower_is_not_offered_and_says_slower():
    d = selfcheck.check(diagnosis("input", [finding("too_many_workers", 0.1, gain(0.6, 0.55, 0.65))]))
    assert "slower than your settings" in d.findings[0].recommendation


def test_compute_headline_with_a_clear_gain_is_qualified_and_compute_bound_dropped():
    """The short-epochs workload: COMPUTE 55% while a loader fix gives 3.2x."""
    d = selfcheck.check(diagnosis("compute", [finding("worker_restart", 0.04, gain(1.5, 1.3, 1.7)),
                                              finding("compute_bound", None, severity=INFO)]))
    assert d.bottleneck == "input"
    assert "compute_bound" not in [f.id for f in d.findings]
    assert any("fix of worker_restart is predicted to gain 1.50x" in c for c in d.checks)
    assert any("compute_bound" in c for c in d.checks)


def test_compute_headline_with_a_gain_inside_the_noise_stays():
    d = selfcheck.check(diagnosis("compute", [finding("worker_restart", 0.04, gain(1.08, 1.04, 1.12))]))
    assert d.bottleneck == "compute"


def test_memory_findings_rank_by_bytes_after_every_time_finding():
    small, big = (finding(f"mem{i}", None, group="memory", severity=HIGH, bytes=b) for i, b in ((1, 10), (2, 900)))
    d = selfcheck.check(diagnosis("input", [small, finding("storage_latency", 0.02), big,
                                            finding("cpu_saturated", 0.2)]))
    assert [f.id for f in d.findings] == ["cpu_saturated", "storage_latency", "mem2", "mem1"]


def test_a_cost_over_the_whole_run_is_capped():
    d = selfcheck.check(diagnosis("input", [finding("input_wait", 1.3)]))
    assert d.findings[0].cost_share == 1.0 and "capped" in d.checks[0]


def test_steps_asked_and_measured_are_said_to_differ_with_the_reason():
    m = Metrics(steps=30, warmup_steps=15, warmup_asked=10)
    d = selfcheck.check(diagnosis("input", [], m, end_reason="steps_reached", steps_requested=40))
    assert d.checks == ["--steps 40 counted the steps after the 10 warm-up steps; the diagnosis measures 30 of "
                        "them (5 more warm-up steps so that the window starts on an epoch's boundary: see "
                        "docs/run-record.md)"]
    same = selfcheck.check(diagnosis("input", [], Metrics(steps=40, warmup_steps=10, warmup_asked=10),
                                     end_reason="steps_reached", steps_requested=40))
    assert same.checks == []
