"""merge-common-nodes: a node that repeats an earlier one (the same op and attributes on the same inputs, small
constants compared by value) is dropped and its readers read the earlier result, as TorchScript's per-layer
attention mask becomes one; nodes that differ in a constant's value or an attribute, random ops, and a node whose
result the graph returns stay."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import Options, prepare
from neuronx_cc_lite.frontend import import_model
from neuronx_cc_lite.passes import merge_common_nodes
from tests.conftest import assert_close, make_model, run_both

F = TensorProto.FLOAT


def masked_layers(layers: int = 3, odd_fill: bool = False, odd_axis: bool = False):  # type: ignore[no-untyped-def]
    """`layers` softmaxes in a row, each adding the mask bias Where(mask < 0, -1e4, 0) built from two constants of
    its own (as TorchScript exports each BERT layer's); with `odd_fill` the last layer fills -1e3, with `odd_axis`
    its softmax runs over the other axis."""
    nodes = [helper.make_node("Less", ["mask", "zero"], ["masked"])]
    weights = {"zero": np.zeros(1, np.float32)}
    h = "x"
    for k in range(layers):
        fill = -1e3 if odd_fill and k == layers - 1 else -1e4
        weights[f"fill{k}"] = np.array(fill, np.float32)
        weights[f"keep{k}"] = np.array(0.0, np.float32)
        nodes += [helper.make_node("Where", ["masked", f"fill{k}", f"keep{k}"], [f"bias{k}"]),
                  helper.make_node("Add", [h, f"bias{k}"], [f"s{k}"]),
                  helper.make_node("Softmax", [f"s{k}"], [f"h{k}"],
                                   axis=0 if odd_axis and k == layers - 1 else -1)]
        h = f"h{k}"
    nodes[-1].output[0] = "y"
    return make_model(nodes, {"x": ([8, 16], F), "mask": ([1, 16], F)}, {"y": ([8, 16], F)}, weights)


def _count(model, op: str) -> int:  # type: ignore[no-untyped-def]
    return sum(n.op == op for n in prepare(model, Options()).nodes)


def test_a_mask_computed_in_every_layer_is_computed_once(tmp):
    model = masked_layers()
    assert _count(model, "Where") == 1
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-5)


def test_a_constant_of_another_value_keeps_its_node(tmp):
    model = masked_layers(odd_fill=True)
    assert _count(model, "Where") == 2
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-5)


def test_nodes_that_differ_in_an_attribute_stay():
    # (each Softmax reads another input; two of one input with different axes must stay two)
    nodes = [helper.make_node("Softmax", ["x"], ["a"], axis=0), helper.make_node("Softmax", ["x"], ["b"], axis=1),
             helper.make_node("Softmax", ["x"], ["c"], axis=1), helper.make_node("Add", ["a", "b"], ["ab"]),
             helper.make_node("Add", ["ab", "c"], ["y"])]
    g = merge_common_nodes.run(import_model(make_model(nodes, {"x": ([4, 4], F)}, {"y": ([4, 4], F)})))
    softmaxes = [n for n in g.nodes if n.op == "Softmax"]
    assert [n.attrs["axis"] for n in softmaxes] == [0, 1]
    assert g.nodes[-1].inputs == ["ab", "b"]


def test_random_ops_and_returned_results_stay():
    nodes = [helper.make_node("RandomUniformLike", ["x"], ["r1"]), helper.make_node("RandomUniformLike", ["x"], ["r2"]),
             helper.make_node("Neg", ["x"], ["n1"]), helper.make_node("Neg", ["x"], ["n2"]),
             helper.make_node("Add", ["r1", "r2"], ["y"])]
    model = make_model(nodes, {"x": ([4], F)}, {"y": ([4], F), "n1": ([4], F), "n2": ([4], F)})
    g = merge_common_nodes.run(import_model(model))
    assert sum(n.op == "RandomUniformLike" for n in g.nodes) == 2
    assert sum(n.op == "Neg" for n in g.nodes) == 2
