"""MNIST the way pytorch/examples trains it (num_workers=0, a per-sample ToTensor + Normalize, a small
step): the loader costs a few percent, and the advice stays in proportion: no Ray cluster, no fix
predicted within the noise (issue 31, point 5)."""
from __future__ import annotations

from tests.real.real_run import diagnose, python


def test_a_small_input_cost_gets_advice_in_proportion(tmp_path):
    diag = diagnose(tmp_path, python("mnist_like.py", "--samples", "2560"))
    out = diag["_stdout"]
    assert "trained on 2560 samples" in out
    assert diag["input_bound"] in ("not", "moderately"), out
    assert "--offload" not in out and "Ray cluster" not in out, out
    for f in diag["findings"]:
        gain = f.get("gain") or {}
        if f.get("fix_settings") and "speedup" in gain:
            # Offered fixes clear the run's noise at their upper end, and say their gain.
            assert gain["high"] >= 1.0 + max(gain.get("noise") or 0.0, 0.03), f
            assert f"predicted {gain['speedup']:.2f}x your samples/s" in out
    if diag["bottleneck"] == "compute":
        assert "Bottleneck: COMPUTE" in out and "not input-bound" in out
