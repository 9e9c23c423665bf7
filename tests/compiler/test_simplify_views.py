"""The simplify-views pass: a chain of views that is one transpose becomes that transpose, one that is a reshape
that reshape; scalar factors of a MatMul's operands move after it. The rewritten models match onnxruntime on the
originals, and nothing another node reads is swallowed."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from neuronx_cc_lite.compiler import Options, prepare
from tests.compiler.one_node import F32, check
from tests.conftest import make_model


def _shape(name: str, values: list[int]):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def ops_after(model) -> list[str]:
    return [n.op for n in prepare(model, Options()).nodes]


def sdpa_keys(extra_reader: bool = False):
    """torch's SDPA export turning the keys: Reshape [B*H, S, D], Transpose, Reshape [B, H, D, S]."""
    nodes = [helper.make_node("Reshape", ["k", "s3"], ["k3"]),
             helper.make_node("Transpose", ["k3"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["kt", "s4"], ["y"])]
    outputs = {"y": ([1, 4, 16, 32], F32)}
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["k3"], ["z"]))
        outputs["z"] = ([4, 32, 16], F32)
    model = make_model(nodes, {"k": ([1, 4, 32, 16], F32)}, outputs)
    model.graph.initializer.extend([_shape("s3", [4, 32, 16]), _shape("s4", [1, 4, 16, 32])])
    return model


def test_the_sdpa_key_chain_is_one_transpose(tmp):
    model = sdpa_keys()
    graph = prepare(model, Options())
    (node,) = graph.nodes
    assert node.op == "Transpose" and node.attrs["perm"] == [0, 1, 3, 2]
    check(model, tmp)


def test_a_chain_whose_middle_another_node_reads_is_left_alone(tmp):
    model = sdpa_keys(extra_reader=True)
    assert ops_after(model).count("Reshape") == 2
    check(model, tmp)


def test_a_chain_that_only_reshapes_becomes_one_reshape(tmp):
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("Transpose", ["t"], ["u"], perm=[1, 0]),
             helper.make_node("Reshape", ["u", "s"], ["y"])]
    model = make_model(nodes, {"x": ([8, 6], F32)}, {"y": ([4, 12], F32)})
    model.graph.initializer.append(_shape("s", [4, 12]))
    assert ops_after(model) == ["Reshape"]
    check(model, tmp)


def test_an_axis_of_size_one_that_moves_is_part_of_the_transpose(tmp):
    nodes = [helper.make_node("Squeeze", ["x", "ax"], ["s"]),
             helper.make_node("Transpose", ["s"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Unsqueeze", ["t", "ax2"], ["y"])]
    model = make_model(nodes, {"x": ([1, 3, 5, 4], F32)}, {"y": ([5, 3, 1, 4], F32)}, opset=17)
    model.graph.initializer.extend([_shape("ax", [0]), _shape("ax2", [2])])
    (node,) = prepare(model, Options()).nodes
    assert node.op == "Transpose" and node.attrs["perm"] == [2, 1, 0, 3]
    check(model, tmp)


def test_an_axis_of_size_one_that_goes_leaves_a_reshape_and_a_transpose(tmp):
    nodes = [helper.make_node("Squeeze", ["x", "ax"], ["s"]),
             helper.make_node("Transpose", ["s"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Transpose", ["t"], ["y"], perm=[0, 2, 1])]
    model = make_model(nodes, {"x": ([1, 3, 5, 4], F32)}, {"y": ([5, 4, 3], F32)}, opset=17)
    model.graph.initializer.append(_shape("ax", [0]))
    assert ops_after(model) == ["Reshape", "Transpose"]
    check(model, tmp)


def test_scalars_of_a_matmuls_operands_move_after_it(tmp):
    """Q * 0.5 and K^T / 4, as the SDPA export scales both by sqrt(scale): one MatMul, then one scale."""
    nodes = [helper.make_node("Mul", ["q", "half"], ["qs"]),
             helper.make_node("Div", ["k", "four"], ["ks"]),
             helper.make_node("MatMul", ["qs", "ks"], ["y"])]
    model = make_model(nodes, {"q": ([2, 16, 8], F32), "k": ([2, 8, 12], F32)}, {"y": ([2, 16, 12], F32)},
                       {"half": np.array(0.5, np.float32), "four": np.array(4.0, np.float32)})
    graph = prepare(model, Options())
    assert [n.op for n in graph.nodes if n.op in ("Mul", "Div")] == []  # the scale went into the matmul's epilogue
    check(model, tmp)


def test_a_scaled_operand_another_node_reads_keeps_its_scale(tmp):
    nodes = [helper.make_node("Mul", ["q", "half"], ["qs"]),
             helper.make_node("MatMul", ["qs", "k"], ["y"]),
             helper.make_node("Relu", ["qs"], ["z"])]
    model = make_model(nodes, {"q": ([16, 8], F32), "k": ([8, 12], F32)},
                       {"y": ([16, 12], F32), "z": ([16, 8], F32)}, {"half": np.array(0.5, np.float32)})
    assert "Mul" in ops_after(model)
    check(model, tmp)


def test_the_whole_sdpa_key_path_splits_then_transposes(tmp):
    """From the key projection [B, S, H*D]: Reshape [B, S, H, D], Transpose to [B, H, S, D], Reshape [B*H, S, D],
    Transpose, Reshape [B, H, D, S] is one split of the last axis and one transpose, the order the layout stage
    follows to make the projection write K^T directly."""
    nodes = [helper.make_node("Reshape", ["k", "s4"], ["v"]),
             helper.make_node("Transpose", ["v"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "s3"], ["k3"]),
             helper.make_node("Transpose", ["k3"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["kt", "s5"], ["y"])]
    model = make_model(nodes, {"k": ([2, 16, 32], F32)}, {"y": ([2, 4, 8, 16], F32)})
    model.graph.initializer.extend([_shape("s4", [2, 16, 4, 8]), _shape("s3", [8, 16, 8]),
                                    _shape("s5", [2, 4, 8, 16])])
    reshape, transpose = prepare(model, Options()).nodes
    assert reshape.op == "Reshape" and transpose.op == "Transpose" and transpose.attrs["perm"] == [0, 2, 3, 1]
    check(model, tmp)

