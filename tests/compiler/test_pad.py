"""Pad against onnxruntime: constant, reflect, edge and wrap modes, negative pads, the axes input, a pad value
given at run time, and the opset-2 attribute form."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.errors import UnsupportedError
from runtime.profile import small_pieces_by_node
from tests.compiler.one_node import F32, check, one_node, streams
from tests.conftest import make_model


def pad(shape: list[int], pads: list[int], mode: str, value: float | None = None, axes: list[int] | None = None,
        dtype: int = F32):
    weights = {"pads": np.array(pads, np.int64)}
    order = ["x", "pads"]
    if value is not None:
        weights["value"] = np.array(value, np.float32)
    if value is not None or axes is not None:
        order.append("value" if value is not None else "")
    if axes is not None:
        weights["axes"] = np.array(axes, np.int64)
        order.append("axes")
    return one_node("Pad", {"x": (shape, dtype)}, weights, order=order, opset=19, mode=mode)


CASES = {
    "constant": ([2, 3, 7, 9], [0, 0, 1, 2, 0, 0, 3, 1], "constant", 1.5, None),
    "constant-zero-default": ([5, 6], [1, 1, 1, 1], "constant", None, None),
    "constant-negative-pads": ([2, 130, 7], [0, -1, 2, 1, 2, -3], "constant", -2.0, None),
    "reflect": ([2, 3, 7, 9], [0, 0, 1, 2, 0, 0, 3, 1], "reflect", None, None),
    "reflect-axes": ([2, 3, 7, 9], [1, 2, 3, 1], "reflect", None, [2, -1]),
    "edge": ([2, 3, 7, 9], [0, 0, 1, 2, 0, 0, 3, 1], "edge", None, None),
    "edge-1d": ([5], [2, 3], "edge", None, None),
    "wrap": ([2, 3, 7, 9], [0, 0, 1, 2, 0, 0, 3, 1], "wrap", None, None),
    "all-axes": ([2, 3, 4, 5], [1, 1, 1, 1, 1, 1, 1, 1], "constant", 3.0, None),
}


@pytest.mark.parametrize("shape, pads, mode, value, axes", CASES.values(), ids=CASES.keys())
def test_pad(tmp, shape, pads, mode, value, axes):
    check(pad(shape, pads, mode, value, axes), tmp)


def test_pad_value_given_at_run_time(tmp):
    model = one_node("Pad", {"x": ([2, 3, 4], F32), "value": ([], F32)}, {"pads": np.array([0, 1, 2, 1, 0, 1])},
                     order=["x", "pads", "value"], mode="constant")
    check(model, tmp)


def test_pad_in_the_opset_2_form(tmp):
    check(one_node("Pad", {"x": ([3, 4], F32)}, opset=10, pads=[1, 0, 2, 3], value=7.0), tmp)


def test_pad_of_integers(tmp):
    model = one_node("Pad", {"x": ([3, 4], TensorProto.INT32)},
                     {"pads": np.array([1, 0, 2, 3]), "value": np.array(7, np.int32)}, mode="constant")
    check(model, tmp)


def test_pad_copies_on_chip():
    """Reflect: each image's rows loaded whole, the pieces copied into the padded rows on VectorE, stored whole: no
    DMA piece under 512 bytes (a reflection cut one element per piece HBM to HBM). The scheduler spreads the
    copies over the engines that have them."""
    model = pad([2, 3, 30, 40], [0, 0, 1, 2, 0, 0, 3, 1], "reflect")
    engines = streams(model)
    assert "PE" not in engines and {op for name, ops in engines.items() if name != "DMA" for op in ops} == {"tensor_copy"}
    assert small_pieces_by_node(compile_model(model)) == {}


def test_pad_of_nothing_is_a_view(tmp):
    """Swin pads its windows by amounts computed from the image size, zero at 224 x 224: the result is its input,
    read where it is, and the only transfer left is the graph output's copy (one, not a copy into the padded
    tensor and another out of it)."""
    model = pad([1, 56, 56, 96], [0, 0, 0, 0, 0, 0, 0, 0], "constant")
    check(model, tmp)
    bundle = compile_model(model)
    transfers = [i for s in bundle.cores[0].values() for i, node in zip(s.instructions, s.nodes)
                 if i.op == "dma_copy" and not node.startswith("output")]
    assert transfers == []


ON_CHIP = {
    "rows-past-one-tile": ([2, 130, 9, 10], [0, 0, 2, 1, 0, 0, 1, 2], "reflect", None, None),
    "three-free-axes": ([2, 3, 4, 5, 6], [0, 0, 1, 2, 1, 0, 0, 2, 1, 2], "wrap", None, None),
    "fill-and-edge": ([3, 5, 40], [0, 1, 3, 0, 2, 4], "constant", -1.25, None),
}


@pytest.mark.parametrize("shape, pads, mode, value, axes", ON_CHIP.values(), ids=ON_CHIP.keys())
def test_pad_on_chip(tmp, shape, pads, mode, value, axes):
    """More rows than partitions, more free axes than an access pattern walks, fills read with stride 0."""
    check(pad(shape, pads, mode, value, axes), tmp)


@pytest.mark.parametrize("model, message", [
    (make_model([helper.make_node("Pad", ["x", "pads"], ["y"])],
                {"x": ([2, 3], F32), "pads": ([4], TensorProto.INT64)}, {"y": ([3, 5], F32)}),
     "input 1 \\('pads'\\) must be a compile-time constant"),
    (pad([2, 3], [0, -1, 0, 0], "reflect"), "negative pads \\(a crop\\) with mode 'reflect'"),
])
def test_unsupported_pads_say_why(model, message):
    with pytest.raises(UnsupportedError, match=message):
        compile_model(model)
