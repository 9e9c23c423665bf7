"""The fold-column-scales pass: a constant scale of each output column after a MatMul with constant weights (and its
bias row) becomes a scaling of the weights' columns and the bias (ConvNeXt's layer scale); the folded model matches
onnxruntime on the unfolded one. A computed scale, a second reader of the product, a scale that broadcasts the
product larger, or an activation between stay."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from neuronx_cc_lite.compiler import Options, prepare
from tests.compiler.one_node import F32, check
from tests.conftest import make_model


def scaled_product(bias: bool = True, scale_first: bool = False, scale_shape: tuple[int, ...] = (24,),
                   between: str | None = None, second_reader: bool = False, computed_scale: bool = False):
    rng = np.random.default_rng(4)
    weights = {"w": rng.standard_normal((16, 24)).astype(np.float32),
               "b": rng.standard_normal(24).astype(np.float32),
               "s": rng.standard_normal(scale_shape).astype(np.float32)}
    images = 1 if len(scale_shape) == 3 and scale_shape[0] > 1 else 2
    inputs = {"x": ([images, 10, 16], F32)}
    if computed_scale:
        inputs["s"] = (list(scale_shape), F32)
        del weights["s"]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"])]
    last = "p"
    if bias:
        nodes.append(helper.make_node("Add", ["b", "p"], ["pb"]))
        last = "pb"
    if between:
        nodes.append(helper.make_node(between, [last], ["pa"]))
        last = "pa"
    nodes.append(helper.make_node("Mul", ["s", last] if scale_first else [last, "s"], ["y"]))
    out = [3, 10, 24] if images == 1 else [2, 10, 24]
    outputs = {"y": (out, F32)}
    if second_reader:
        nodes.append(helper.make_node("Neg", [last], ["z"]))
        outputs["z"] = ([2, 10, 24], F32)
    return make_model(nodes, inputs, outputs, weights)


def ops(model) -> list[str]:
    return [n.op for n in prepare(model, Options(stop_after="fold-column-scales")).nodes]


@pytest.mark.parametrize("kwargs, expected", [
    (dict(), ["MatMul", "Add"]),
    (dict(scale_first=True), ["MatMul", "Add"]),  # ConvNeXt's Mul(gamma, x)
    (dict(bias=False, scale_shape=(1, 1, 24)), ["MatMul"]),
    (dict(scale_shape=(1,)), ["MatMul", "Add"]),  # a scalar scale
], ids=["bias", "scale-first", "no-bias-3d-row", "scalar"])
def test_a_column_scale_folds_into_the_weights(tmp, kwargs, expected):
    model = scaled_product(**kwargs)
    assert ops(model) == expected
    check(model, tmp)


@pytest.mark.parametrize("kwargs", [
    dict(computed_scale=True),
    dict(second_reader=True),
    dict(between="Relu"),
    dict(scale_shape=(3, 1, 24), bias=False),  # broadcasts the product to three copies
], ids=["computed-scale", "second-reader", "activation-between", "broadcasting"])
def test_a_scale_that_is_not_a_column_scale_stays(tmp, kwargs):
    model = scaled_product(**kwargs)
    assert "Mul" in ops(model)
    check(model, tmp)
