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


@pytest.mark.slow
def test_compile_time_grows_linearly_with_the_node_count():
    """A chain of 40,000 nodes took 107 s against 25 s for 20,000 (keep_on_chip tested membership in a list per
    tensor), then 4.8 s of CPU for 10,000 against 24.9 s for 40,000 (the garbage collector walking the old
    generation again and again): twice the nodes must cost at most 2.3 times the CPU seconds (4, were it
    quadratic). CPU rather than wall seconds: the machine is shared."""
    import time

    from benchmarks.cases import chain

    seconds = {}
    for n in (20_000, 40_000):
        model = chain(n)
        start = time.process_time()
        neuronx_cc_lite.compile(model, cache=False)
        seconds[n] = time.process_time() - start
    assert seconds[40_000] < 2.3 * seconds[20_000], seconds


@pytest.mark.parametrize("case", ["Relu over [1, 2^31]", "Sum of x expanded to [50000, 50000]"])
def test_an_operator_too_large_to_compile_in_bounded_time_is_refused_at_once(case):
    """A Relu over [1, 2^31] fits HBM (16 GiB in and out) but is 524,288 DMA pieces: it compiled for ten minutes."""
    import time

    from neuronx_cc_lite.errors import CompileError

    V = helper.make_tensor_value_info
    if case.startswith("Relu"):
        nodes, x, y, inits = [helper.make_node("Relu", ["x"], ["y"])], [1, 2**31], [1, 2**31], []
    else:
        nodes = [helper.make_node("Expand", ["x", "wide"], ["e"]), helper.make_node("Sum", ["e", "e"], ["y"])]
        x, y = [1, 50_000], [50_000, 50_000]
        inits = [numpy_helper.from_array(np.array(y, np.int64), "wide")]
    graph = helper.make_graph(nodes, "g", [V("x", TensorProto.FLOAT, x)], [V("y", TensorProto.FLOAT, y)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    start = time.process_time()
    with pytest.raises(CompileError, match=r"reads and writes \d+ bytes; an operator may move at most") as e:
        neuronx_cc_lite.compile(model, cache=False)
    assert e.value.code == "NCC_TOO_LARGE" and e.value.op == nodes[-1].op_type
    assert time.process_time() - start < 5


def test_a_gather_counts_the_rows_it_reads_not_its_whole_table():
    """A lookup in a 4 GiB table (a large vocabulary) moves one row per index: not refused as too large."""
    from neuronx_cc_lite.compiler import Options, prepare
    from neuronx_cc_lite.sizes import MAX_OPERATOR_BYTES, check_operator_sizes

    V = helper.make_tensor_value_info
    rows = MAX_OPERATOR_BYTES // (4 * 1024) + 1
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"])], "g",
                              [V("table", TensorProto.FLOAT, [rows, 1024]), V("ids", TensorProto.INT64, [8])],
                              [V("y", TensorProto.FLOAT, [8, 1024])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    check_operator_sizes(prepare(model, Options()))  # raises NCC_TOO_LARGE if the table counted
