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


def attention_output(same_shape_view: str = "Reshape", returned: bool = False):
    """TorchScript's BERT after the attention's second MatMul: a Reshape to the shape it already has, then the
    heads' Transpose and the Reshape that merges them; with `same_shape_view` another view that changes nothing,
    with `returned` the unchanging view's result a graph output too."""
    if same_shape_view == "Reshape":
        first = helper.make_node("Reshape", ["a", "same"], ["a2"])
    else:
        first = helper.make_node("Transpose", ["a"], ["a2"], perm=[0, 1, 2, 3])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), first,
             helper.make_node("Transpose", ["a2"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "merged"], ["y"])]
    outputs = {"y": ([1, 8, 64], F32)}
    if returned:
        outputs["a2"] = ([1, 4, 8, 16], F32)
    model = make_model(nodes, {"x": ([1, 4, 8, 16], F32)}, outputs)
    model.graph.initializer.extend([_shape("same", [1, 4, 8, 16]), _shape("merged", [1, 8, 64])])
    return model


def test_a_view_that_changes_nothing_is_dropped(tmp):
    for view in ("Reshape", "Transpose"):
        model = attention_output(view)
        graph = prepare(model, Options())
        transpose = next(n for n in graph.nodes if n.op == "Transpose")
        assert transpose.inputs == ["a"], [(n.op, n.inputs) for n in graph.nodes]
        assert not any(n.op == "Transpose" and n.attrs.get("perm") == [0, 1, 2, 3] for n in graph.nodes)
        check(model, tmp)


def test_an_unchanging_view_the_graph_returns_stays(tmp):
    model = attention_output(returned=True)
    graph = prepare(model, Options())
    assert any(n.op == "Reshape" and n.outputs == ["a2"] for n in graph.nodes)
    check(model, tmp)


def arithmetic(op: str, constant: np.ndarray, x_shape: list[int], constant_first: bool = False,
               parameter: bool = False):
    """Relu(x), then `op` with a constant (as the dynamo exporter adds ViT's attention scores to a mask of zeros),
    then Neg. The constant is made by a ConstantOfShape (the graph's structure, as a mask), or with `parameter` is
    an initializer (a model's parameter, which an untrained export holds at zeros or ones)."""
    pair = ["c", "r"] if constant_first else ["r", "c"]
    out = list(np.broadcast_shapes(tuple(x_shape), constant.shape))
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node(op, pair, ["a"]),
             helper.make_node("Neg", ["a"], ["y"])]
    weights = {"c": constant}
    if not parameter and np.all(constant == constant.reshape(-1)[0]):
        fill = numpy_helper.from_array(constant.reshape(-1)[:1])
        nodes.insert(0, helper.make_node("ConstantOfShape", ["c_shape"], ["c"], value=fill))
        weights = {"c_shape": np.array(constant.shape, np.int64)}
    return make_model(nodes, {"x": (x_shape, F32)}, {"y": (out, F32)}, weights)


def test_adding_zeros_or_multiplying_by_ones_is_no_step(tmp):
    zeros, ones = np.zeros((1, 1, 4, 4), np.float32), np.ones((4,), np.float32)
    for model in (arithmetic("Add", zeros, [1, 2, 4, 4]), arithmetic("Add", zeros, [1, 2, 4, 4], constant_first=True),
                  arithmetic("Sub", zeros, [1, 2, 4, 4]), arithmetic("Mul", ones, [2, 4], constant_first=True),
                  arithmetic("Div", ones, [2, 4])):
        assert ops_after(model) == ["Relu", "Neg"], model.graph.node[-2].op_type
        check(model, tmp)


def test_arithmetic_that_changes_its_input_stays(tmp):
    almost = np.zeros((4,), np.float32)
    almost[3] = 1e-3
    for model in (arithmetic("Add", np.zeros((2, 4), np.float32), [4]),  # broadcasts x to [2, 4]
                  arithmetic("Sub", np.zeros((4,), np.float32), [2, 4], constant_first=True),  # 0 - x
                  arithmetic("Div", np.ones((4,), np.float32), [2, 4], constant_first=True),  # 1 / x
                  arithmetic("Add", almost, [2, 4]),
                  # a parameter: an untrained model's zero bias, ones scale
                  arithmetic("Add", np.zeros((4,), np.float32), [2, 4], parameter=True),
                  arithmetic("Mul", np.ones((2, 4), np.float32), [2, 4], parameter=True)):
        assert len(ops_after(model)) == 3, model.graph.node[-2].op_type
        check(model, tmp)
