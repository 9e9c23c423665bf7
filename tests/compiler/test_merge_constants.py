"""merge-constants: copies of one weight (TorchScript's Identity per use of a shared layer, folded) become one
constant, loaded once; constants that differ anywhere stay apart."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import Options, prepare
from tests.conftest import assert_close, make_model, run_both


def _shared_layers(layers: int = 3, perturb: bool = False):  # type: ignore[no-untyped-def]
    """`layers` MatMuls in a row, each reading the one weight through an Identity of its own (as TorchScript exports
    ALBERT's shared layer); with `perturb`, each layer's Identity is instead a weight of its own that differs from
    the first in one element of its middle."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((256, 256)) / 16).astype(np.float32)  # (merged from 65,536 elements)
    weights, nodes, x = {"w": w}, [], "x"
    for k in range(layers):
        if perturb:
            other = w.copy()
            other[128, 128 + k] += 1.0
            weights[f"w{k}"] = other
        else:
            nodes.append(helper.make_node("Identity", ["w"], [f"w{k}"]))
        nodes.append(helper.make_node("MatMul", [x, f"w{k}"], [f"h{k}"]))
        x = f"h{k}"
    nodes[-1].output[0] = "y"
    return make_model(nodes, {"x": ([16, 256], TensorProto.FLOAT)}, {"y": ([16, 256], TensorProto.FLOAT)}, weights)


def test_copies_of_a_shared_weight_are_one_constant(tmp):
    model = _shared_layers()
    g = prepare(model, Options())
    weights = {i for n in g.nodes for i in n.inputs if i and g.tensors[i].is_constant}
    assert len(weights) == 1, weights
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-5)


def test_weights_that_differ_in_their_middle_stay_apart(tmp):
    model = _shared_layers(perturb=True)
    g = prepare(model, Options())
    weights = {i for n in g.nodes for i in n.inputs if i and g.tensors[i].is_constant}
    assert len(weights) == 3, weights
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-5)
