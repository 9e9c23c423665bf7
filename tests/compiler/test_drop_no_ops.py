"""drop-no-ops: a node whose result is one of its inputs (a view or Cast that keeps its shape and type, an Add of
zeros, a Mul by ones that broadcasts nothing) is dropped and its readers read that input; one that changes its input,
one whose constant is a model's parameter (an untrained export's zero bias, ones scale), and one whose result the
graph returns stay. Each model matches onnxruntime."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from neuronx_cc_lite.compiler import Options, prepare
from tests.compiler.one_node import F32, check
from tests.conftest import make_model


def _shape(name: str, values: list[int]):  # type: ignore[no-untyped-def]
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def ops_after(model) -> list[str]:  # type: ignore[no-untyped-def]
    return [n.op for n in prepare(model, Options()).nodes]


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


def test_casts_to_their_own_type_no_longer_hide_an_rms_norm(tmp):
    """TorchScript's Llama RMSNorm: its input and its normalised row cast to float, as they already are."""
    rng = np.random.default_rng(2)
    weights = {"g": rng.uniform(0.5, 1.5, 32).astype(np.float32), "two": np.array(2.0, np.float32),
               "eps": np.array(1e-6, np.float32), "one": np.array(1.0, np.float32)}
    nodes = [helper.make_node("Cast", ["x"], ["xc"], to=TensorProto.FLOAT),
             helper.make_node("Pow", ["xc", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], keepdims=1),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["rms"]),
             helper.make_node("Div", ["one", "rms"], ["inv"]), helper.make_node("Mul", ["xc", "inv"], ["xn"]),
             helper.make_node("Cast", ["xn"], ["xn32"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["g", "xn32"], ["h"]), helper.make_node("Neg", ["h"], ["y"])]
    model = make_model(nodes, {"x": ([2, 8, 32], F32)}, {"y": ([2, 8, 32], F32)}, weights, opset=17)
    assert ops_after(model) == ["RMSNormalization", "Neg"]
    check(model, tmp)


def test_a_constant_computed_from_a_parameter_is_a_parameter(tmp):
    """Swin's relative position bias: a Gather from a table (all zeros in an untrained export) by constant indices,
    folded at compile time, is still the model's parameter: the Add of it stays."""
    table = np.zeros((5, 4), np.float32)
    nodes = [helper.make_node("Gather", ["table", "idx"], ["bias"], axis=0),
             helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "bias"], ["a"]),
             helper.make_node("Neg", ["a"], ["y"])]
    model = make_model(nodes, {"x": ([3, 4], F32)}, {"y": ([3, 4], F32)},
                       {"table": table, "idx": np.array([4, 0, 2], np.int64)})
    assert len(ops_after(model)) == 3
    check(model, tmp)


def padded(pads: list[int]):  # type: ignore[no-untyped-def]
    """Swin's pad of each stage to whole windows: a Relu, a Pad by `pads` of its [1, 14, 14, 8] result, a Sigmoid."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pad", ["r", "pads"], ["p"]),
             helper.make_node("Sigmoid", ["p"], ["y"])]
    out = [1, 14 + pads[1] + pads[5], 14 + pads[2] + pads[6], 8]
    model = make_model(nodes, {"x": ([1, 14, 14, 8], F32)}, {"y": (out, F32)})
    model.graph.initializer.append(_shape("pads", pads))
    return model


def test_a_pad_of_nothing_is_dropped_and_a_shift_stays(tmp):
    """Zeros on every side: dropped. One row in front and one off the end keeps the shape but moves every row: it
    stays, as does a Pad that adds rows."""
    assert ops_after(padded([0] * 8)) == ["Relu", "Sigmoid"]
    for pads in ([0, 1, 0, 0, 0, -1, 0, 0], [0, 0, 1, 0, 0, 0, 1, 0]):
        assert "Pad" in ops_after(padded(pads)), pads
        check(padded(pads), tmp)
    check(padded([0] * 8), tmp)
