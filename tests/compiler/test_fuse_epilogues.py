"""fuse-epilogues: what joins a matmul keeps its meaning."""

from __future__ import annotations

import numpy as np
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
