"""A plain mean over a long row on few partitions (a global pool over few channels, lower/reduce.py reduce_rows)
runs in pieces of MEAN_PIECE on ScalarE, their sums added after, so the chain waits only for the last piece after
its producer's last rows; over a full tile of partitions it stays one instruction. GlobalAveragePool (as the
TorchScript exporter pools) takes the same path as ReduceMean. Against onnxruntime, with its producer (a
convolution writing the row a band of rows at a time) under a random order of the engines too."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.lower.reduce import MEAN_PIECE
from tests.compiler.one_node import check
from tests.conftest import make_model


def _pooled(channels: int, side: int, op: str = "ReduceMean") -> object:
    rng = np.random.default_rng(2)
    weights = {"w": rng.standard_normal((channels, 1, 3, 3)).astype(np.float32)}
    pool = helper.make_node("GlobalAveragePool", ["r"], ["y"])
    if op == "ReduceMean":
        weights["axes"] = np.array([2, 3], np.int64)
        pool = helper.make_node("ReduceMean", ["r", "axes"], ["y"], keepdims=1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=channels, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), pool]
    return make_model(nodes, {"x": ([1, channels, side, side], TensorProto.FLOAT)},
                      {"y": ([1, channels, 1, 1], TensorProto.FLOAT)}, weights, opset=18)


def _means(model) -> int:
    """ScalarE instructions that sum their row as they scale it (the mean's pieces)."""
    act = compile_model(model).cores[0]["ACT"].instructions
    return sum(1 for i in act if i.op == "activation" and i.args.get("reduce") is not None)


@pytest.mark.parametrize("policy", ["clock", "random"])
@pytest.mark.parametrize("op", ["ReduceMean", "GlobalAveragePool"])
def test_a_long_mean_over_few_channels_goes_in_pieces(tmp, op, policy):
    model = _pooled(16, 56, op)
    assert _means(model) == -(-56 * 56 // MEAN_PIECE)
    check(model, tmp, policy=policy)


@pytest.mark.parametrize("op", ["ReduceMean", "GlobalAveragePool"])
def test_a_mean_over_a_full_tile_of_channels_is_one_instruction(tmp, op):
    model = _pooled(128, 56, op)
    assert _means(model) == 1
    check(model, tmp)
