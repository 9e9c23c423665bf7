"""The fold-linear-convs pass: a 1x1 convolution with nothing after it, read only by another 1x1 convolution, is
folded into it (W2 W1, W2 b1 + b2) where that does no more arithmetic; the folded model matches onnxruntime on
the unfolded one. A bottleneck, a second reader, a strided first convolution or an activation between stay."""

from __future__ import annotations

import pytest
from onnx import helper

from neuronx_cc_lite.compiler import Options, prepare
from tests.compiler.one_node import F32, check, rng_weights
from tests.conftest import make_model


def two_pointwise(c: int, r: int, m: int, first: dict | None = None, second: dict | None = None,
                  between: str | None = None, bias: bool = True):
    weights = rng_weights(1, w1=(r, c, 1, 1), b1=(r,), w2=(m, r, 1, 1), b2=(m,))
    if not bias:
        del weights["b1"]
    nodes = [helper.make_node("Relu", ["x"], ["x1"]),
             helper.make_node("Conv", ["x1", "w1"] + (["b1"] if bias else []), ["h"], **(first or {}))]
    if between:
        nodes.append(helper.make_node(between, ["h"], ["h1"]))
    nodes.append(helper.make_node("Conv", ["h1" if between else "h", "w2", "b2"], ["y"], **(second or {})))
    return make_model(nodes, {"x": ([1, c, 12, 10], F32)}, {"y": (["n", "m", "h", "w"], F32)}, weights)


def convs(model) -> list[str]:
    return [n.op for n in prepare(model, Options(stop_after="fold-linear-convs")).nodes]


@pytest.mark.parametrize("c, r, m, second, bias", [
    (16, 16, 72, {}, True),  # MobileNetV3-Small's first project and second expand
    (8, 24, 8, {}, False),  # an expansion folded away: 8 x 8 < 24 x 16
    (16, 16, 40, {"strides": [2, 2]}, True),  # the second subsamples the folded product as it did the pair's
], ids=["project-expand", "expansion-no-bias", "strided-second"])
def test_pointwise_pair_folds_into_one(tmp, c, r, m, second, bias):
    model = two_pointwise(c, r, m, second=second, bias=bias)
    assert convs(model) == ["Relu", "Conv"]
    check(model, tmp)


@pytest.mark.parametrize("c, r, m, first, between", [
    (64, 8, 64, {}, None),  # a bottleneck: 64 x 64 > 8 x 128
    (16, 16, 16, {"strides": [2, 2]}, None),
    (16, 16, 16, {"pads": [1, 1, 1, 1]}, None),
    (16, 16, 16, {}, "Relu"),
], ids=["bottleneck", "strided-first", "padded-first", "activation-between"])
def test_pointwise_pair_stays(tmp, c, r, m, first, between):
    model = two_pointwise(c, r, m, first=first, between=between)
    assert convs(model).count("Conv") == 2
    check(model, tmp)


def test_pointwise_pair_stays_when_the_first_has_another_reader(tmp):
    model = two_pointwise(16, 16, 16)
    model.graph.node.append(helper.make_node("Relu", ["h"], ["r"]))
    model.graph.output.append(helper.make_tensor_value_info("r", F32, ["a", "b", "c", "d"]))
    assert convs(model).count("Conv") == 2
    check(model, tmp)


def test_pointwise_pair_of_an_fp16_model_stays():
    """An fp16 model rounds the first product to fp16 before the second reads it, as ONNX defines each op: the
    fold, which would skip that rounding, is not taken."""
    from onnx import TensorProto

    weights = {k: v.astype("float16") for k, v in rng_weights(1, w1=(16, 16, 1, 1), w2=(72, 16, 1, 1)).items()}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"]), helper.make_node("Conv", ["h", "w2"], ["y"])]
    model = make_model(nodes, {"x": ([1, 16, 4, 4], TensorProto.FLOAT16)},
                       {"y": (["n", "m", "h", "w"], TensorProto.FLOAT16)}, weights)
    assert convs(model).count("Conv") == 2
