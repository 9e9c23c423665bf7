"""Concat and Split against onnxruntime: every axis, an empty input, channels past one tile, and the three ways
Split gets its sizes (attribute, input, num_outputs)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.compiler.one_node import F32, check, one_node, streams
from tests.conftest import make_model


@pytest.mark.parametrize("shapes, axis", [
    ([[2, 3, 4], [2, 0, 4], [2, 130, 4]], 1),
    ([[2, 3, 4], [5, 3, 4]], 0),
    ([[2, 3, 4], [2, 3, 1], [2, 3, 7]], -1),
    ([[7], [9]], 0),
], ids=["channels", "batch", "last", "1d"])
def test_concat(tmp, shapes, axis):
    inputs = {f"x{k}": (shape, F32) for k, shape in enumerate(shapes)}
    check(one_node("Concat", inputs, axis=axis), tmp)


def _split_model(opset: int, sizes: list[int] | None, **attrs: object):
    """Split of [2, 3, 10] along the last axis; each output goes through Relu, so that consumers read views."""
    weights, inputs = {}, ["x"]
    if sizes is not None and opset >= 13:
        weights["split"] = np.array(sizes, np.int64)
        inputs.append("split")
    elif sizes is not None:
        attrs["split"] = sizes
    count = len(sizes) if sizes is not None else int(attrs.get("num_outputs", 2))  # type: ignore[call-overload]
    parts = [f"p{k}" for k in range(count)]
    nodes = [helper.make_node("Split", inputs, parts, axis=-1, **attrs)]
    nodes += [helper.make_node("Relu", [p], [f"y{k}"]) for k, p in enumerate(parts)]
    outputs = {f"y{k}": (["a", "b", f"c{k}"], F32) for k in range(count)}
    outputs["p0"] = (["a", "b", "c"], F32)  # a graph output that is a view of the input: copied out
    return make_model(nodes, {"x": ([2, 3, 10], F32)}, outputs, weights, opset=opset)


@pytest.mark.parametrize("opset, sizes, attrs", [
    (11, [3, 5, 2], {}),
    (13, [3, 5, 2], {}),
    (13, None, {}),
    (18, None, {"num_outputs": 3}),
], ids=["attribute", "input", "equal", "num-outputs"])
def test_split(tmp, opset, sizes, attrs):
    check(_split_model(opset, sizes, **attrs), tmp)


def test_concat_is_dma_only():
    assert set(streams(one_node("Concat", {"a": ([2, 3], F32), "b": ([2, 5], F32)}, axis=1))) == {"DMA"}


def test_a_concat_read_only_by_a_transpose_is_stored_in_its_order(tmp):
    """Attention's heads after split_attention: each group's output concatenated along the head axis, then
    transposed to [windows, tokens, heads, head size] and merged: the Concat stores its pieces in the Transpose's
    order, so that the Transpose and the Reshape move nothing (Swin-T: an HBM-to-HBM copy of every attention
    output in 64-byte pieces gone, 1,370.7 -> 1,344.8 us in bf16)."""
    from isa.assembly import disassemble
    from neuronx_cc_lite.compiler import compile_model

    nodes = [helper.make_node("Concat", ["h0", "h1", "h2"], ["o"], axis=1),
             helper.make_node("Transpose", ["o"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "shape"], ["m"]),
             helper.make_node("Relu", ["m"], ["y"])]
    inputs = {f"h{k}": ([4, 1, 49, 32], F32) for k in range(3)}
    model = make_model(nodes, inputs, {"y": ([4, 49, 96], F32)}, {"shape": np.array([4, 49, 96], np.int64)})
    listing = disassemble(compile_model(model))
    moved_by = [line.rsplit("; ", 1)[-1] for line in listing.splitlines() if "dma_copy" in line and "; " in line]
    assert not [n for n in moved_by if "Transpose" in n or "Reshape" in n], moved_by
    check(model, tmp)
