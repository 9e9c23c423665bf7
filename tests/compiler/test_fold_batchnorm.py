"""The fold-batchnorm pass: an inference BatchNormalization after a Conv, ConvTranspose or Gemm with constant
weights disappears into them; the folded model still matches onnxruntime on the unfolded one."""

from __future__ import annotations

import pytest
from onnx import helper

from neuronx_cc_lite.compiler import Options, prepare
from tests.compiler.one_node import F32, check, rng_weights
from tests.compiler.test_batchnorm import statistics
from tests.conftest import make_model

BN_INPUTS = ["scale", "bias", "mean", "var"]


def producer_then_bn(op: str, bias: bool = True, **attrs: object):
    if op == "Gemm":
        weights = rng_weights(0, w=(7, 6), b=(4, 1))
        x_shape, out_rank, channels = [4, 6], 2, 7
    else:
        group = int(attrs.get("group", 1))  # type: ignore[call-overload]
        w_shape = (6, 3 // group, 3, 3) if op == "Conv" else (3, 6 // group, 3, 3)
        weights = rng_weights(0, w=w_shape, b=(6,))
        x_shape, out_rank, channels = [2, 3, 7, 9], 4, 6
    if not bias:
        del weights["b"]
    nodes = [helper.make_node(op, ["x", "w"] + (["b"] if bias else []), ["h"], **attrs),
             helper.make_node("BatchNormalization", ["h", *BN_INPUTS], ["y"], epsilon=1e-3)]
    return make_model(nodes, {"x": (x_shape, F32)}, {"y": ([f"d{k}" for k in range(out_rank)], F32)},
                      {**weights, **statistics(channels)})


@pytest.mark.parametrize("op, bias, attrs", [
    ("Conv", True, {"pads": [1, 1, 1, 1]}),
    ("Conv", False, {"group": 3}),
    ("ConvTranspose", True, {"strides": [2, 2], "group": 3}),
    ("Gemm", True, {"transB": 1, "beta": 0.5}),
    ("Gemm", False, {"transB": 1}),
], ids=["conv", "conv-grouped-no-bias", "conv-transpose-grouped", "gemm", "gemm-no-bias"])
def test_batchnorm_folds_into_its_producer(tmp, op, bias, attrs):
    model = producer_then_bn(op, bias, **attrs)
    graph = prepare(model, Options(stop_after="fold-batchnorm"))
    assert [n.op for n in graph.nodes] == [op]
    assert graph.nodes[0].outputs == ["y"]
    check(model, tmp)


def test_batchnorm_stays_when_its_input_has_another_reader(tmp):
    model = producer_then_bn("Conv")
    model.graph.node.append(helper.make_node("Relu", ["h"], ["r"]))
    model.graph.output.append(helper.make_tensor_value_info("r", F32, ["a", "b", "c", "d"]))
    assert [n.op for n in prepare(model, Options()).nodes] == ["Conv", "BatchNormalization", "Relu"]
    check(model, tmp)
