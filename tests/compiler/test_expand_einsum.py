"""The expand-einsum pass: what an Einsum becomes, and the reason given for one it cannot express. (The values are
checked against onnxruntime in the operator suite, tests/compiler/op_cases.py.)"""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import Options, compile_model, prepare
from neuronx_cc_lite.errors import UnsupportedError
from tests.conftest import make_model

F = TensorProto.FLOAT


def _einsum(eq: str, shapes: list[list[int]], out: list[int]):  # type: ignore[no-untyped-def]
    names = [f"x{i}" for i in range(len(shapes))]
    return make_model([helper.make_node("Einsum", names, ["y"], name="es", equation=eq)],
                      {n: (s, F) for n, s in zip(names, shapes)}, {"y": (out, F)})


@pytest.mark.parametrize("eq, shapes, out, ops", [
    ("bij,bjk->bik", [[2, 3, 4], [2, 4, 5]], [2, 3, 5], ["MatMul"]),
    ("ij,kj->ik", [[3, 4], [5, 4]], [3, 5], ["Transpose", "MatMul"]),
    ("ijk,jl->li", [[3, 4, 2], [4, 5]], [5, 3], ["ReduceSum", "MatMul", "Transpose"]),
    ("bi,bi->b", [[3, 4], [3, 4]], [3], ["Mul", "ReduceSum", "Transpose"]),
    ("ijk->kij", [[3, 4, 2]], [2, 3, 4], ["Transpose"]),
])
def test_einsum_becomes_the_ops_it_is_made_of(eq, shapes, out, ops):
    graph = prepare(_einsum(eq, shapes, out), Options(stop_after="expand-einsum"))
    assert [n.op for n in graph.nodes if n.op != "Reshape"] == ops
    assert graph.nodes[-1].outputs == ["y"]


def test_a_diagonal_is_refused_naming_the_node_and_the_term():
    with pytest.raises(UnsupportedError, match="'es' \\(Einsum\\): Einsum term 'ii' repeats a label"):
        compile_model(_einsum("ii->i", [[4, 4]], [4]))
