"""The pinning wrapper (measure/inside/pinning.py) on a stand-in for torch's pin_memory: one row per batch
(its outermost call), the elements' calls passed through, bytes from the pinned tensors."""
from __future__ import annotations

import threading

import torch

from gpufeed.measure.inside import pinning


class _Probe:
    def __init__(self):
        self.pin_rows = []


def test_one_row_per_batch_not_per_element(monkeypatch):
    calls = []

    def original(data, device=None):  # torch's recursion: each element through the module attribute
        calls.append(type(data).__name__)
        if isinstance(data, (tuple, list)):
            return type(data)(wrapper(x, device) for x in data)
        return data.clone()
    wrapper = pinning._make_pin_memory(original)
    probe = _Probe()
    monkeypatch.setattr(pinning, "_probe", probe)
    batch = (torch.zeros(8, 4), torch.zeros(8, dtype=torch.int64))
    out = wrapper(batch, "cuda")
    assert calls == ["tuple", "Tensor", "Tensor"] and len(out) == 2
    assert len(probe.pin_rows) == 1
    thread, t_start, t_end, nbytes = probe.pin_rows[0]
    assert thread == threading.get_native_id() and t_end >= t_start and nbytes == 8 * 4 * 4 + 8 * 8
    wrapper(batch[0])  # the next batch: a row of its own
    assert len(probe.pin_rows) == 2 and probe.pin_rows[1][3] == 128


def test_not_armed_passes_through(monkeypatch):
    wrapper = pinning._make_pin_memory(lambda data, device=None: data)
    monkeypatch.setattr(pinning, "_probe", None)
    assert wrapper(torch.ones(2)).sum() == 2


def test_arm_wraps_the_module_attribute_and_disarm_restores_it():
    from torch.utils.data._utils import pin_memory as module
    before = module.pin_memory
    probe = _Probe()
    pinning.arm(probe)
    try:
        assert module.pin_memory is not before and module.pin_memory._gpufeed_original is before
        pinning.arm(probe)  # idempotent
        assert module.pin_memory._gpufeed_original is before
    finally:
        pinning.disarm()
    assert module.pin_memory is before
