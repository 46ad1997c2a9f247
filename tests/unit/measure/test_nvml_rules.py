"""NVML readings on a fake pynvml that keeps NVML's rules (tests/fake_nvml.py; issue 34): per device,
per MIG instance, and GPM's SM activity with N/A and its reason."""
from __future__ import annotations

import pytest

from gpufeed.measure.outside.host import HostReader
from gpufeed.measure.outside.nvml import Nvml
from tests.fake_nvml import FakeGpu, FakeNvml


def test_each_gpu_is_read_from_its_own_handle():
    fake = FakeNvml([FakeGpu(utils=[10.0, 20.0]), FakeGpu(name="NVIDIA A10", uuid="GPU-bbbb", utils=[90.0, 80.0])])
    nvml = Nvml(module=fake)
    first, second = nvml.read(), nvml.read()
    assert [g.util_pct for g in first] == [10.0, 90.0] and [g.util_pct for g in second] == [20.0, 80.0]
    assert [g.name for g in first] == ["NVIDIA H100", "NVIDIA A10"]


def test_mig_instances_per_instance_and_na_where_nvml_gives_nothing():
    fake = FakeNvml([FakeGpu(mig=[1 << 30, 3 << 30], gpm="unsupported")])
    (g,) = Nvml(module=fake).read()
    assert g.util_pct is None and g.util_na == "not supported"
    assert [(m["uuid"], m["mem_used_b"], m["util_pct"], m["util_na"]) for m in g.mig] == [
        ("MIG-00mig", 1 << 30, None, "not supported"), ("MIG-01mig", 3 << 30, None, "not supported")]


def test_gpm_sm_activity_from_two_samples_per_gpu():
    fake = FakeNvml([FakeGpu(sm_active=[30.0, 70.0]), FakeGpu(uuid="GPU-bbbb", sm_active=[5.0])])
    nvml = Nvml(module=fake)
    first = nvml.read()
    assert [g.sm_active_pct for g in first] == [None, None], "one sample is no reading: N/A, not 0"
    assert first[0].gpm_na.startswith("first sample")
    readings = [nvml.read() for _ in range(3)]
    # GPU 0 alternates 30% / 70% per interval (the interval's own counters), GPU 1 stays at 5%.
    assert [r[0].sm_active_pct for r in readings] == pytest.approx([30.0, 70.0, 30.0])
    assert [r[1].sm_active_pct for r in readings] == pytest.approx([5.0] * 3)
    assert readings[0][0].sm_occupancy_pct == pytest.approx(15.0) and readings[0][0].tensor_active_pct == pytest.approx(7.5)
    assert all(r[0].gpm_na is None for r in readings)
    assert nvml.gpm_reads == 8 and nvml.gpm_s > 0, "the cost of the GPM readings is measured"


@pytest.mark.parametrize("mode, why", [("unsupported", "not supported (GPM needs a Hopper or newer GPU)"),
                                       ("not_permitted", "not permitted")])
def test_gpm_na_says_why(mode, why):
    fake = FakeNvml([FakeGpu(gpm=mode)])
    nvml = Nvml(module=fake)
    for _ in range(3):
        (g,) = nvml.read()
        assert (g.sm_active_pct, g.sm_occupancy_pct, g.tensor_active_pct, g.gpm_na) == (None, None, None, why)
    assert g.util_pct == 50.0


def test_the_sample_line_carries_gpm_and_mig(tmp_path):
    fake = FakeNvml([FakeGpu(sm_active=[12.0]), FakeGpu(uuid="GPU-bbbb", mig=[2 << 30], gpm="not_permitted")])
    reader = HostReader(1, nvml=Nvml(module=fake))
    reader.read()
    line = reader.read()
    gpu0, gpu1 = line["gpus"]
    assert gpu0["sm_active_pct"] == pytest.approx(12.0) and gpu0["gpm_na"] is None and "util_na" not in gpu0
    assert gpu1["sm_active_pct"] is None and gpu1["gpm_na"] == "not permitted"
    assert gpu1["util_pct"] is None and gpu1["util_na"] == "not supported" and gpu1["mig"][0]["mem_used_b"] == 2 << 30
