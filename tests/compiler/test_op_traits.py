"""Op facts as traits of the op registry (neuronx_cc_lite/ops/traits.py): the passes that reason about ops before
lowering them (partitioning, layout, epilogue fusion) read an op's kind and fused activation from its registry
entry, so a newly registered op gets its treatment from what it says it is."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from isa.functions import ActFunc
from neuronx_cc_lite.ops.registry import fused_activations, fused_function, lowerings, ops_of_kind
from neuronx_cc_lite.ops.traits import OpKind
from neuronx_cc_lite.partition import rules
from tests.conftest import make_model


def test_the_kinds_name_the_ops_they_should():
    assert ops_of_kind(OpKind.VIEW) == {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}
    assert ops_of_kind(OpKind.MATMUL) == {"MatMul", "MatMulEpilogue", "Gemm"}
    assert {"ReduceSum", "ReduceLogSum", "ArgMax", "ArgMin"} <= ops_of_kind(OpKind.REDUCTION)
    assert {"Add", "Relu", "Where", "Identity", "HardSwish"} <= ops_of_kind(OpKind.ELEMENTWISE)
    assert {"Conv", "Transpose", "Softmax"} <= ops_of_kind(OpKind.OTHER)


def test_each_kind_gets_its_partition_rule():
    """Every registered op of a kind flows through the kind's placement rule; the others through their own."""
    by_kind = {OpKind.ELEMENTWISE: rules.elementwise, OpKind.VIEW: rules.reshape, OpKind.MATMUL: rules.matmul,
               OpKind.REDUCTION: rules.reduction}
    for op, entry in lowerings().items():
        assert (rules.rule_for(op) is by_kind[entry.kind]) if entry.kind in by_kind else \
            rules.rule_for(op) not in by_kind.values(), op
    assert rules.rule_for("Transpose") is rules.transpose and rules.rule_for("NoSuchOp") is rules.default


def test_a_fused_activation_is_the_function_its_op_computes():
    """What an evacuation applies for a fused activation is what the op's own lowering computes: ScalarE's
    function of the same name, or nothing on ScalarE for the hard ones (VectorE finishes them)."""
    from neuronx_cc_lite.lower.elementwise import UNARY

    fused = fused_activations()
    assert set(fused) == {"Relu", "Sigmoid", "Tanh", "Silu", "Gelu", "HardSwish", "HardSigmoid", "Clip"}
    for op in ("Relu", "Sigmoid", "Tanh", "Silu"):
        assert fused[op].func is UNARY[op] is fused_function(op)
    assert fused_function("Gelu/none") is ActFunc.gelu and fused_function("Gelu/tanh") is ActFunc.gelu_apprx_tanh
    assert {fused_function(a) for a in ("", "HardSwish", "HardSigmoid", "HardSigmoid/unclamped", "Clip")} == \
        {ActFunc.copy}
    assert set(fused_activations(convolution=True)) == set(fused) - {"Gelu"}


def test_a_floats_only_op_refuses_an_integer_node_whatever_its_own_check_says():
    """The registry's `floats` trait: a floats-only op over int32 (ONNX allows it for these) is refused naming the
    tensor's type, before its own check (MatMul's) is asked; an op floats-only but for some nodes (Abs) says so in
    its check."""
    from neuronx_cc_lite.frontend import import_model
    from neuronx_cc_lite.ops.registry import why_unsupported

    entries = lowerings()
    assert entries["MatMul"].floats and entries["LayerNormalization"].floats and entries["Relu"].check is not None
    assert not entries["Abs"].floats and not entries["Add"].floats and not entries["Conv"].floats
    for op, inputs in (("MatMul", ["x", "y"]), ("Pow", ["x", "y"]), ("PRelu", ["x", "y"])):
        shape = [4, 4]
        model = make_model([helper.make_node(op, inputs, ["z"])],
                           {name: (shape, TensorProto.INT32) for name in inputs}, {"z": (shape, TensorProto.INT32)})
        g = import_model(model)
        assert why_unsupported(g.nodes[0], g) == f"{op} on int32 tensors is not supported (floating point only)"
    abs_model = make_model([helper.make_node("Abs", ["x"], ["z"])], {"x": ([4], TensorProto.INT32)},
                           {"z": ([4], TensorProto.INT32)})
    g = import_model(abs_model)
    assert why_unsupported(g.nodes[0], g) is None  # an integer Abs: computed exactly (lower/elementwise.py)


@pytest.mark.parametrize("producer, activation, joins", [
    ("MatMul", "Gelu", True), ("MatMul", "Relu", True), ("Conv", "Relu", True), ("Conv", "HardSwish", True),
    ("Conv", "Gelu", False), ("MatMul", "Exp", False)])
def test_fusion_follows_the_fused_trait(producer, activation, joins):
    """fuse-epilogues joins an activation to the product before it exactly where the registry says its
    evacuation can apply it (a Conv's cannot apply Gelu; no evacuation applies Exp)."""
    from neuronx_cc_lite.frontend import import_model
    from neuronx_cc_lite.passes import run_pipeline

    rng = np.random.default_rng(0)
    if producer == "MatMul":
        weights = {"w": rng.standard_normal((16, 24)).astype(np.float32)}
        inputs, shape = {"x": ([128, 16], TensorProto.FLOAT)}, [128, 24]
        out = [helper.make_node("MatMul", ["x", "w"], ["p"])]
    else:
        weights = {"w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32)}
        inputs, shape, out = {"x": ([1, 4, 6, 6], TensorProto.FLOAT)}, [1, 8, 6, 6], \
            [helper.make_node("Conv", ["x", "w"], ["p"], pads=[1, 1, 1, 1])]
    nodes = [*out, helper.make_node(activation, ["p"], ["y"])]
    model = make_model(nodes, inputs, {"y": (shape, TensorProto.FLOAT)}, weights, opset=20)  # (Gelu: opset 20)
    ops = [n.op for n in run_pipeline(import_model(model)).nodes]
    assert (activation not in ops) == joins, ops
