"""Reductions of an Expand reduce the tensor before it was expanded (passes/reduce_broadcasts.py): the same answer
as onnxruntime, and x expanded to [50000, 50000] compiles in seconds (it took minutes: 2.5e9 elements read)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import neuronx_cc_lite
import runtime
from neuronx_cc_lite.compiler import Options, prepare
from neuronx_cc_lite.reference import onnxruntime_outputs


def _model(op: str, x_shape: tuple[int, ...], wide: tuple[int, ...], axes: tuple[int, ...] | None, keepdims: int,
           out_shape: tuple[int, ...]):  # type: ignore[no-untyped-def]
    inits = [numpy_helper.from_array(np.array(wide, np.int64), "wide")]
    inputs = ["e"]
    if axes is not None:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        inputs.append("axes")
    graph = helper.make_graph([helper.make_node("Expand", ["x", "wide"], ["e"]),
                               helper.make_node(op, inputs, ["y"], keepdims=keepdims)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def _reduced(wide: tuple[int, ...], axes: tuple[int, ...] | None, keepdims: int) -> tuple[int, ...]:
    every = range(len(wide)) if not axes else [a % len(wide) for a in axes]
    return tuple(1 if a in every else n for a, n in enumerate(wide) if keepdims or a not in every)


CASES = [  # op, x, wide, axes (None: all)
    ("ReduceSum", (1, 40), (30, 40), None),
    ("ReduceSum", (1, 40), (30, 40), (0,)),
    ("ReduceSum", (1, 30, 1), (20, 30, 40), (0,)),  # a repeated axis is kept: the sum is expanded back over it
    ("ReduceSum", (3, 1, 5), (2, 3, 4, 5), (0, 2, 3)),  # rank grows; repeated and real axes reduced together
    ("ReduceMean", (3, 1, 5), (2, 3, 4, 5), (1, -2)),
    ("ReduceMax", (1, 40), (30, 40), (0,)),
    ("ReduceMin", (3, 1, 5), (2, 3, 4, 5), None),
    ("ReduceL1", (1, 40), (30, 40), (0,)),  # the repeated axis alone: still |x|
    ("ReduceSumSquare", (3, 1, 5), (2, 3, 4, 5), (0, 3)),
]


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op, x_shape, wide, axes", CASES)
def test_a_reduction_of_an_expand_matches_onnxruntime(op, x_shape, wide, axes, keepdims):
    model = _model(op, x_shape, wide, axes, keepdims, _reduced(wide, axes, keepdims))
    graph = prepare(model, Options())
    assert not any(i == "e" for n in graph.nodes for i in n.inputs), [n.op for n in graph.nodes]
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    ours = runtime.load(neuronx_cc_lite.compile(model, cache=False)).run({"x": x})["y"]
    ref = onnxruntime_outputs(model, {"x": x})["y"]
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_the_sum_of_x_expanded_to_50000_by_50000_compiles_in_seconds():
    wide = (50_000, 50_000)
    model = _model("ReduceSum", (1, 50_000), wide, None, 0, ())
    start = time.process_time()
    bundle = neuronx_cc_lite.compile(model, cache=False)
    assert time.process_time() - start < 5
    x = np.random.default_rng(0).random((1, 50_000)).astype(np.float32)
    y = runtime.load(bundle).run({"x": x})["y"]
    np.testing.assert_allclose(y, 50_000 * x.astype(np.float64).sum(), rtol=1e-5)
