"""fuse-epilogues: what joins a matmul keeps its meaning."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.compiler.one_node import check
from tests.conftest import make_model


def test_gemm_bias_then_a_scaling(tmp):
    """(A @ B + C) / s: C joins before the scaling, so it is scaled with the product (QDQ models quantize a
    Gemm's output as a Div by its scale)."""
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((10, 16)).astype(np.float32), "c": rng.standard_normal(10).astype(np.float32),
               "s": np.asarray(4.0, np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["t"], transB=1, alpha=0.5, beta=2.0),
             helper.make_node("Div", ["t", "s"], ["y"])]
    check(make_model(nodes, {"x": ([3, 16], TensorProto.FLOAT)}, {"y": ([3, 10], TensorProto.FLOAT)}, weights), tmp)


def _se_block() -> onnx.ModelProto:
    """MobileNetV3's pattern: a convolution then HardSwish (an expansion), a 1x1 convolution then HardSigmoid
    (squeeze-and-excitation's gate; torch's slope 1/6), the gate read by a Mul so that the fused value is the
    gated one. Weights wide enough that the values cross both clamps of both activations."""
    rng = np.random.default_rng(3)
    weights = {"w": (rng.standard_normal((8, 4, 3, 3)) * 2).astype(np.float32),
               "b": rng.standard_normal(8).astype(np.float32),
               "w2": (rng.standard_normal((8, 8, 1, 1)) * 3).astype(np.float32),
               "b2": rng.standard_normal(8).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["h"]),
             helper.make_node("Conv", ["h", "w2", "b2"], ["c2"]),
             helper.make_node("HardSigmoid", ["c2"], ["g"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["h", "g"], ["y"])]
    return make_model(nodes, {"x": ([1, 4, 6, 7], TensorProto.FLOAT)}, {"y": ([1, 8, 6, 7], TensorProto.FLOAT)},
                      weights)


def test_conv_hard_swish_and_hard_sigmoid_join_the_convolution(tmp):
    """Each hard activation becomes the epilogue of the convolution before it (no node of its own, its slope and
    offset kept) and the result is onnxruntime's."""
    from neuronx_cc_lite.frontend import import_model
    from neuronx_cc_lite.passes import run_pipeline

    model = _se_block()
    g = run_pipeline(import_model(model))
    fused = [(n.op, n.attrs.get("activation"), n.attrs.get("activation_alpha")) for n in g.nodes]
    assert ("ConvEpilogue", "HardSwish", None) in fused
    assert ("ConvEpilogue", "HardSigmoid", pytest.approx(1 / 6)) in fused
    assert not {"HardSwish", "HardSigmoid"} & {n.op for n in g.nodes}
    check(model, tmp)
