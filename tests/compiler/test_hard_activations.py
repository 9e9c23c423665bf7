"""HardSwish (lower/activations.py) over the whole range, both clamps included, compared with onnxruntime: the
exporters' MobileNetV3 runs it on every block."""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.compiler.one_node import F32, one_node, streams
from tests.conftest import assert_close, compile_to_model


def test_hard_swish_matches_onnxruntime_past_both_clamps(tmp):
    """Inputs from -8 to 8 (the gate is 0 below -3 and 1 above 3), the clamp points themselves included."""
    model = one_node("HardSwish", {"x": ([3, 7, 40], F32)})
    x = np.linspace(-8, 8, 3 * 7 * 40, dtype=np.float32)
    x[:4] = [-3.0, 3.0, 0.0, -1.5]
    x = np.random.default_rng(0).permutation(x).reshape(3, 7, 40)
    ours = compile_to_model(model, tmp).run({"x": x})
    assert_close(ours, onnxruntime_outputs(model, {"x": x}), rtol=1e-5, atol=1e-6)


def test_hard_swish_gate_is_on_scalar_engine():
    """The gate's relu on ScalarE, one VectorE instruction for the clamp and the product."""
    found = streams(one_node("HardSwish", {"x": ([4, 256], F32)}))
    assert "activation" in found["ACT"]
    assert found.get("DVE", []).count("scalar_tensor_tensor") + found.get("POOL", []).count("scalar_tensor_tensor") == 1
