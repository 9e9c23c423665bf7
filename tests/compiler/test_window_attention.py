"""Many small attention products at once (Swin's windows: 64 windows x 3 heads of 49 x 49 scores): the products of
a group share one PSUM bank and one evacuation (lower/batched_matmul.py), the scale-and-bias and the softmax take
many windows' rows an instruction (tiling.layout_boxes, normalize.per_row's segments), each row still normalised
by its own maximum; scores held on 49 partitions count as the 128 they occupy when attention is split
(passes/split_attention.py); a large copy on one row is spread over queues (relayout.dma_hbm)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from isa.target import get_target
from neuronx_cc_lite.compiler import Options, compile_model, prepare
from neuronx_cc_lite.passes import split_attention
from neuronx_cc_lite.reference import bundle_inputs, onnxruntime_outputs
import runtime

WINDOWS, HEADS, TOKENS, DIM = 16, 3, 49, 32


def _window_attention() -> onnx.ModelProto:
    """softmax(Q K^T * scale + bias) V over [windows, heads, 49, 32], the bias per head: one head's scores sit far
    below another's (-1000) and a third's far above (+1000), so that a softmax shifting every row of a partition
    by one maximum would underflow whole rows to zero."""
    rng = np.random.default_rng(0)
    bias = rng.standard_normal((1, HEADS, TOKENS, TOKENS)).astype(np.float32)
    bias += np.array([0.0, -1000.0, 1000.0], np.float32).reshape(1, HEADS, 1, 1)
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "bias"], ["biased"]),
             helper.make_node("Softmax", ["biased"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"])]
    shape = [WINDOWS, HEADS, TOKENS, DIM]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"]
    inits = [numpy_helper.from_array(np.array(DIM ** -0.5, np.float32), "scale"),
             numpy_helper.from_array(bias, "bias")]
    graph = helper.make_graph(nodes, "windows", inputs, [helper.make_tensor_value_info("o", TensorProto.FLOAT, shape)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _count(bundle, node: str, ops: set[str]) -> int:
    return sum(1 for stream in bundle.cores[0].values() for instr, name in zip(stream.instructions, stream.nodes)
               if node in name and instr.op in ops)


def test_window_attention_matches_onnxruntime_in_groups_of_windows() -> None:
    model = _window_attention()
    bundle = compile_model(model, Options())
    inputs = bundle_inputs(bundle)
    got = runtime.load(bundle).run(inputs)["o"]
    want = onnxruntime_outputs(model, inputs)["o"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.sqrt(np.mean(want ** 2))))
    items = WINDOWS * HEADS
    engines = {"activation", "tensor_copy", "tensor_scalar", "tensor_tensor", "tensor_reduce",
               "scalar_tensor_tensor"}
    # a product at a time made, for each window and head, four softmax instructions, an addition of the bias, an
    # evacuation of each product and a copy out of PSUM for each operand turned (three), 48 x 9 in all
    assert _count(bundle, "Softmax", engines) < items
    assert _count(bundle, "Add", engines) < items // 4
    assert _count(bundle, "MatMul", engines) < items, _count(bundle, "MatMul", engines)
    assert _count(bundle, "MatMul", {"nc_matmul"}) == 2 * items  # the products themselves: one each


def test_scores_on_few_partitions_count_the_partitions_they_hold() -> None:
    """[16, 3, 49, 49] fp32 scores are 461 KB of values, but held with their 49 rows on partitions they take the
    room of 128 rows: 1.2 MB. Over a budget between the two, attention is split by heads."""
    g = prepare(_window_attention(), Options())
    values = WINDOWS * HEADS * TOKENS * TOKENS * 4
    split_attention.run(g, 2 * values, partitions=128)
    assert [n.op for n in g.nodes].count("Softmax") == HEADS


def test_a_slab_copied_on_one_row_is_spread_over_queues() -> None:
    """torch.roll's halves, as Swin exports them: a Concat of two slabs of [1, 56, 56, 96] fp32 along H. Each slab
    is contiguous in both tensors (one row of 1.1 MB), which one queue would move at its own pace; cut into rows,
    no transfer holds more than a few KiB a row, and the result is the input's, exactly."""
    shape = [1, 56, 56, 96]
    nodes = [helper.make_node("Slice", ["x", "s0", "e0", "ax"], ["top"]),
             helper.make_node("Slice", ["x", "s1", "e1", "ax"], ["rest"]),
             helper.make_node("Concat", ["rest", "top"], ["y"], axis=1)]
    inits = [numpy_helper.from_array(np.array([v], np.int64), n)
             for n, v in (("s0", 0), ("e0", 3), ("s1", 3), ("e1", 56), ("ax", 1))]
    graph = helper.make_graph(nodes, "roll", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    bundle = compile_model(model, Options())
    row_bytes = []
    for stream in bundle.cores[0].values():
        for instr in stream.instructions:
            if instr.op == "dma_copy":
                dst = instr.args["dst"]
                row_bytes.append(dst.free_size * dst.dtype.size)
    assert row_bytes and max(row_bytes) <= 16 * 1024, max(row_bytes)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(runtime.load(bundle).run({"x": x})["y"], np.roll(x, -3, axis=1))


def _rows_normalized(op: str, rows: int, features: int, bias: bool) -> onnx.ModelProto:
    """A projection, then `op` over its features (and a softmax, which reads the projection by rows: so it is laid
    out): the normalisation reads the rows as the matmul laid them out."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((32, features)).astype(np.float32), "w"),
             numpy_helper.from_array((1 + rng.standard_normal(features)).astype(np.float32), "scale")]
    names = ["h", "scale"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(features).astype(np.float32), "shift"))
        names.append("shift")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Softmax", ["h"], ["p"], axis=-1),  # read by rows, so written by rows
             helper.make_node(op, names, ["y"], axis=-1, epsilon=1e-5)]
    graph = helper.make_graph(nodes, "norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, 32])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, rows, features]) for n in "yp"],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


@pytest.mark.parametrize("op, bias", [("LayerNormalization", True), ("LayerNormalization", False),
                                      ("RMSNormalization", False)])
def test_short_rows_normalised_several_blocks_a_box(op: str, bias: bool) -> None:
    """Swin's first stage: 3,136 tokens of 96 features, 25 blocks of 128 rows each normalised by an instruction
    sequence paying its fixed costs for 96 elements. Here 1,000 rows (seven whole blocks and a short one): the
    rows of a box side by side, each its own mean and variance, matching onnxruntime; fewer instructions than
    one sequence a block."""
    model = _rows_normalized(op, rows=1000, features=96, bias=bias)
    bundle = compile_model(model, Options())
    inputs = bundle_inputs(bundle)
    got = runtime.load(bundle).run(inputs)
    want = onnxruntime_outputs(model, inputs)
    for name in "yp":
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
    computing = {"activation", "tensor_copy", "tensor_scalar", "tensor_tensor", "tensor_reduce", "bn_stats",
                 "bn_aggr", "scalar_tensor_tensor"}
    assert _count(bundle, "Normalization", computing) < 8 * 6  # a block of rows took six or more


def test_windows_partitioned_from_a_laid_out_tensor_spread_over_queues() -> None:
    """Swin's window partition of a projection's [3,136 tokens, 96] result (rows on partitions): 8 x 8 windows of
    7 x 7 tokens. Taken along the layout's rows the copy had 7 of them (a window's 7 tokens of a row), 172 KB each
    on one queue, for a home it could never map onto (the next window is 7 rows on, not a block of 128); spread,
    no transfer holds more than 32 KiB a row, and most queues take a part. The result is numpy's."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((16, 96)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Reshape", ["h", "grid"], ["g"]),
             helper.make_node("Transpose", ["g"], ["t"], perm=[0, 1, 3, 2, 4, 5]),
             helper.make_node("Reshape", ["t", "windows"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([1, 8, 7, 8, 7, 96]), "grid"),
             numpy_helper.from_array(np.array([64, 49, 96]), "windows")]
    graph = helper.make_graph(nodes, "windows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3136, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 49, 96])], inits)
    bundle = compile_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), Options())
    copies = [(name, i.args["dst"].free_size * i.args["dst"].dtype.size) for name, s in bundle.cores[0].items()
              for i, node in zip(s.instructions, s.nodes) if i.op == "dma_copy" and "Reshape" in node]
    assert copies and max(size for _, size in copies) <= 32 * 1024, max(size for _, size in copies)
    assert len({name for name, _ in copies}) >= 12  # queues (7 with the copy on 7 rows)
    x = rng.standard_normal((3136, 16)).astype(np.float32)
    want = (x @ w).reshape(8, 7, 8, 7, 96).transpose(0, 2, 1, 3, 4).reshape(64, 49, 96)
    np.testing.assert_allclose(runtime.load(bundle).run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
