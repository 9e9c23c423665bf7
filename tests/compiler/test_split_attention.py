"""Attention split into groups of heads when its scores would not stay on chip (passes/split_attention.py): the
graph it makes, and compiled models against onnxruntime with their scores kept out of HBM."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime
from neuronx_cc_lite.compiler import Options, compile_model, prepare
from neuronx_cc_lite.passes import split_attention
from neuronx_cc_lite.reference import bundle_inputs, onnxruntime_outputs


def _attention(heads: int, seq: int, dim: int, mask_heads: int) -> onnx.ModelProto:
    """softmax(Q K^T / sqrt(dim) + mask) V, then heads merged; the mask has `mask_heads` heads (1: broadcast)."""
    rng = np.random.default_rng(0)
    mask = np.where(rng.random((1, mask_heads, 1, seq)) < 0.2, -1e4, 0.0).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"]),
             helper.make_node("Transpose", ["o"], ["merged"], perm=[0, 2, 1, 3])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, heads, seq, dim]) for n in "qkv"]
    inits = [numpy_helper.from_array(np.array(dim ** -0.5, np.float32), "scale"),
             numpy_helper.from_array(mask, "mask")]
    graph = helper.make_graph(nodes, "attention", inputs,
                              [helper.make_tensor_value_info("merged", TensorProto.FLOAT, [1, seq, heads, dim])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_each_group_of_heads_is_its_own_chain_then_one_concat() -> None:
    g = prepare(_attention(heads=4, seq=64, dim=16, mask_heads=4), Options())
    per_head = 128 * 64 * 4  # 64 rows of scores on partitions take the room of 128
    split_attention.run(g, 2 * per_head)  # two heads a group
    ops = [n.op for n in g.nodes]
    assert ops.count("Softmax") == 2 and ops.count("Concat") == 1
    concat = next(n for n in g.nodes if n.op == "Concat")
    assert concat.attrs["axis"] == 1 and len(concat.inputs) == 2
    # no tensor of every head's scores is left, and each group's chain reads its own slice of the mask
    assert all(g.tensors[o].shape[1] == 2 for n in g.nodes if n.op == "Softmax" for o in n.outputs)
    assert sum(1 for n in g.nodes if n.op == "Slice" and n.inputs[0] == "mask") == 2


def test_scores_within_the_budget_are_left_whole() -> None:
    g = prepare(_attention(heads=4, seq=64, dim=16, mask_heads=1), Options())
    before = [n.op for n in g.nodes]
    split_attention.run(g, 4 * 128 * 64 * 4)
    assert [n.op for n in g.nodes] == before


@pytest.mark.parametrize("mask_heads", [1, 8])
def test_long_attention_matches_onnxruntime_with_its_scores_on_chip(mask_heads: int) -> None:
    """8 heads of 512 x 512 fp32 scores (8 MiB, and as much of probabilities: whole, 16 MiB of them would spill
    to HBM) are over a trn1 budget of 3 MiB: groups of 2 heads, and nothing spills."""
    model = _attention(heads=8, seq=512, dim=32, mask_heads=mask_heads)
    bundle = compile_model(model, Options())
    nodes = {n for stream in bundle.cores[0].values() for n in stream.nodes}
    assert {f"heads{h}-{h + 1}" for h in range(0, 8, 2)} <= {n.rsplit("/", 1)[-1] for n in nodes}
    assert bundle.stats["spill_bytes"] == 0
    inputs = bundle_inputs(bundle)
    got = runtime.load(bundle).run(inputs)["merged"]
    want = onnxruntime_outputs(model, inputs)["merged"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
