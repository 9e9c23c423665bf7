"""fold-norm-scales: an RMSNorm read only by MatMuls with constant weights gives its scale to their weights' rows
(diag(g) W), and the compiled model still matches onnxruntime on the original; an RMSNorm with another reader, or
whose result the graph returns, keeps its scale."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import Options, prepare
from tests.compiler.one_node import check
from tests.conftest import make_model

F = TensorProto.FLOAT


def rms_then_projections(other_reader: bool = False, returned: bool = False):  # type: ignore[no-untyped-def]
    """x -> RMSNorm (spelled as Llama exports it: Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul by its scale)
    -> two MatMuls by constant weights, summed; with `other_reader` a Neg reads the norm too, with `returned` the
    graph returns it."""
    rng = np.random.default_rng(3)
    weights = {"g": rng.uniform(0.5, 1.5, 32).astype(np.float32), "two": np.array(2.0, np.float32),
               "eps": np.array(1e-6, np.float32), "axes": np.array([-1], np.int64),
               "w1": rng.standard_normal((32, 24)).astype(np.float32),
               "w2": rng.standard_normal((32, 24)).astype(np.float32)}
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "axes"], ["var"], keepdims=1),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["rms"]),
             helper.make_node("Reciprocal", ["rms"], ["inv"]), helper.make_node("Mul", ["x", "inv"], ["xn"]),
             helper.make_node("Mul", ["xn", "g"], ["h"]),
             helper.make_node("MatMul", ["h", "w1"], ["a"]), helper.make_node("MatMul", ["h", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    outputs = {"y": ([2, 8, 24], F)}
    if other_reader:
        nodes.append(helper.make_node("Neg", ["h"], ["z"]))
        outputs["z"] = ([2, 8, 32], F)
    if returned:
        outputs["h"] = ([2, 8, 32], F)
    return make_model(nodes, {"x": ([2, 8, 32], F)}, outputs, weights, opset=18)


def _norm(model):  # type: ignore[no-untyped-def]
    (norm,) = [n for n in prepare(model, Options()).nodes if n.op == "RMSNormalization"]
    return norm


def test_the_scale_goes_to_the_projections_weights(tmp):
    model = rms_then_projections()
    assert _norm(model).inputs[1:] == [""]
    check(model, tmp)


def test_a_norm_with_another_reader_or_returned_keeps_its_scale(tmp):
    for model in (rms_then_projections(other_reader=True), rms_then_projections(returned=True)):
        assert _norm(model).inputs[1] == "g"
        check(model, tmp)


def _row_passes(model) -> int:  # type: ignore[no-untyped-def]
    """The compute instructions of the model's bundle that read or write a whole 4,096-element row."""
    from neuronx_cc_lite.compiler import compile_model

    bundle = compile_model(model)
    return sum(1 for engine in ("ACT", "DVE", "POOL") for i in bundle.cores[0][engine].instructions
               if any(getattr(o, "free_size", 0) == 4096 for _, o in i.operands()))


def test_a_long_rows_norm_takes_two_passes_over_it(tmp):
    """A decode step's norm: one row of 4,096 on one partition, where a pass costs microseconds. The squares and
    their sum are one, the normalisation and the scale one scalar_tensor_tensor writing the output's type (an
    RMSNorm with another reader keeps its scale); a LayerNorm's statistics are bn_stats over pieces, then two
    passes for its centre, scale, rstd and shift."""
    rng = np.random.default_rng(5)
    scale = rng.uniform(0.5, 1.5, 4096).astype(np.float32)
    rms = make_model([helper.make_node("RMSNormalization", ["x", "g"], ["y"], axis=-1)],
                     {"x": ([1, 4096], F)}, {"y": ([1, 4096], F)}, {"g": scale}, opset=23)
    layer = make_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
                       {"x": ([1, 4096], F)}, {"y": ([1, 4096], F)},
                       {"g": rng.uniform(0.5, 1.5, 4096).astype(np.float32),
                        "b": rng.standard_normal(4096).astype(np.float32)}, opset=17)
    assert _row_passes(rms) == 2
    assert _row_passes(layer) == 2
    check(layer, tmp)
