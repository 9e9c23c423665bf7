"""Models of old opsets whose nodes the chip cannot run as written are converted up (onnx.version_converter)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.errors import UnsupportedError
from tests.conftest import assert_close, make_model, run_both

F = TensorProto.FLOAT


def test_an_opset_7_model_with_upsample_topk_1_and_sum_6(tmp, caplog):
    """Upsample-7 (scales an attribute), TopK-1 (k an attribute) and Sum-6 (no broadcasting): none has a lowering
    in that form; in opset 17 they are Resize, TopK with a k input and Sum."""
    nodes = [helper.make_node("Upsample", ["x"], ["u"], mode="nearest", scales=[1.0, 1.0, 2.0, 2.0]),
             helper.make_node("TopK", ["u"], ["v", "i"], k=3),
             helper.make_node("Sum", ["v", "b", "b"], ["y"])]
    model = make_model(nodes, {"x": ([1, 1, 2, 3], F), "b": ([1, 1, 4, 3], F)},
                       {"y": ([1, 1, 4, 3], F), "i": ([1, 1, 4, 3], TensorProto.INT64)}, opset=7)
    model.ir_version = 3
    with caplog.at_level(logging.INFO, logger="neuronx_cc_lite.compiler"):
        ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-5)
    assert "converted from opset 7 to 17: the chip runs 3 more of its nodes in that form" in caplog.text


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [(2.0, 3.0), (1.5, 2.5)])
def test_an_opset_9_upsample_with_scales_as_an_input(tmp, mode, scales):
    """Upsample samples at x / scale (Resize's asymmetric mode, nearest rounding down), which the converter's
    Resize does not say: the frontend does."""
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode=mode)
    out = [1, 2, int(3 * scales[0]), int(4 * scales[1])]
    model = make_model([node], {"x": ([1, 2, 3, 4], F)}, {"y": (out, F)},
                       {"scales": np.array([1, 1, *scales], np.float32)}, opset=9)
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-5)


def test_what_the_converter_cannot_help_is_refused_as_written():
    model = make_model([helper.make_node("Det", ["x"], ["y"], name="det")], {"x": ([2, 3, 3], F)},
                       {"y": ([2], F)}, opset=11)
    with pytest.raises(UnsupportedError, match="node 'det' \\(Det\\): operator Det is not supported"):
        compile_model(model)
