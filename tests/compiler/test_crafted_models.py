"""Crafted models of issue 21: a graph output that is also a graph input comes back as the input (it was NaN)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import neuronx_cc_lite
import runtime
from neuronx_cc_lite.reference import onnxruntime_outputs


def _model(outputs: list[str], nodes: list, weights: dict[str, np.ndarray] | None = None):  # type: ignore[no-untyped-def]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, [4, 64]) for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in (weights or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


W = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
CASES = {
    "x alone": (["x"], [], None),
    "x and Neg(x)": (["x", "y"], [helper.make_node("Neg", ["x"], ["y"])], None),
    "Neg(x) and x": (["y", "x"], [helper.make_node("Neg", ["x"], ["y"])], None),
    "x, MatMul and Relu": (["x", "y", "h"], [helper.make_node("MatMul", ["x", "w"], ["h"]),
                                             helper.make_node("Relu", ["h"], ["y"])], {"w": W}),
}


# the ranks (tp, dp) matter where a matmul is cut and a batch split
@pytest.mark.parametrize("case, ranks", [(case, (1, 1)) for case in sorted(CASES)] +
                         [("x, MatMul and Relu", (2, 1)), ("x, MatMul and Relu", (1, 2))])
def test_a_graph_input_that_is_also_an_output(case, ranks):
    model = _model(*CASES[case])
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    ours = runtime.load(neuronx_cc_lite.compile(model, cache=False, tp=ranks[0], dp=ranks[1])).run({"x": x})
    ref = onnxruntime_outputs(model, {"x": x})
    assert list(ours) == list(ref)
    np.testing.assert_array_equal(ours["x"], x)
    for name in ref:
        np.testing.assert_allclose(ours[name], ref[name], rtol=1e-5, atol=1e-5)


def test_element_counts_do_not_wrap_around():
    """[2^32, 2^32] has 2^64 elements: np.prod in int64 made it 0, and the HBM check let it through."""
    from neuronx_cc_lite.errors import CompileError

    shape = [2**32, 2**32]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(CompileError, match=f"needs {2**66} bytes") as e:
        neuronx_cc_lite.compile(model, cache=False)
    assert e.value.code == "NCC_HBM_FULL"


def _chain(n: int):  # type: ignore[no-untyped-def]
    nodes = [helper.make_node("Relu" if k % 2 else "Neg", [f"t{k}"], [f"t{k + 1}"]) for k in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [1, 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.slow
def test_compile_time_grows_linearly_with_the_node_count():
    """A chain of 40,000 nodes took 107 s against 25 s for 20,000 (keep_on_chip tested membership in a list per
    tensor): four times the nodes must cost well under eight times the time (sixteen, were it quadratic)."""
    import time

    seconds = {}
    for n in (10_000, 40_000):
        start = time.perf_counter()
        neuronx_cc_lite.compile(_chain(n), cache=False)
        seconds[n] = time.perf_counter() - start
    assert seconds[40_000] < 8 * seconds[10_000], seconds
