"""The sink-transposes pass: a Transpose moves below the elementwise ops, Slices and Concats that read it (RoPE
after a projection's head transpose), constants transposed at compile time; the models match onnxruntime, and a
Transpose another reader needs in its order stays where it is."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from neuronx_cc_lite.compiler import Options, prepare
from tests.compiler.one_node import F32, check
from tests.conftest import make_model

S, H, D = 16, 4, 8  # seq, heads, head dim


def _const(name: str, value: np.ndarray):
    return numpy_helper.from_array(value, name)


def rope(extra_reader: bool = False):
    """q [1, S, H, D] -> Transpose [1, H, S, D] -> q*cos + rotate_half(q)*sin -> MatMul with k^T, as transformers'
    Llama exports it (cos, sin [1, 1, S, D])."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Mul", ["qt", "cos"], ["a"]),
             helper.make_node("Slice", ["qt", "zero", "half", "last"], ["x1"]),
             helper.make_node("Slice", ["qt", "half", "end", "last"], ["x2"]),
             helper.make_node("Neg", ["x2"], ["nx2"]),
             helper.make_node("Concat", ["nx2", "x1"], ["rot"], axis=-1),
             helper.make_node("Mul", ["rot", "sin"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["qr"]),
             helper.make_node("MatMul", ["qr", "kt"], ["y"])]
    outputs = {"y": ([1, H, S, S], F32)}
    if extra_reader:
        nodes.append(helper.make_node("Softmax", ["qt"], ["z"], axis=-1))
        outputs["z"] = ([1, H, S, D], F32)
    model = make_model(nodes, {"q": ([1, S, H, D], F32), "kt": ([1, H, D, S], F32)}, outputs)
    angles = rng.standard_normal((1, 1, S, D)).astype(np.float32)
    model.graph.initializer.extend([
        _const("cos", np.cos(angles)), _const("sin", np.sin(angles)),
        _const("zero", np.array([0], np.int64)), _const("half", np.array([D // 2], np.int64)),
        _const("end", np.array([D], np.int64)), _const("last", np.array([-1], np.int64))])
    return model


def test_rope_runs_before_the_head_transpose(tmp):
    model = rope()
    ops = [n.op for n in prepare(model, Options()).nodes]
    assert ops.count("Transpose") == 1 and ops[-2:] == ["Transpose", "MatMul"]  # one transpose, the matmul's
    check(model, tmp)


def test_a_transpose_another_reader_needs_stays(tmp):
    model = rope(extra_reader=True)
    graph = prepare(model, Options())
    first = graph.nodes[0]
    assert first.op == "Transpose" and first.inputs == ["q"]  # Softmax reads it in its order: it did not move
    check(model, tmp)


def test_two_transposes_that_cancel_are_nothing(tmp):
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Mul", ["t", "c"], ["m"]),
             helper.make_node("Transpose", ["m"], ["y"], perm=[1, 0, 2])]
    model = make_model(nodes, {"x": ([3, 5, 4], F32)}, {"y": ([3, 5, 4], F32)})
    model.graph.initializer.append(_const("c", np.arange(20, dtype=np.float32).reshape(5, 1, 4)))
    assert "Transpose" not in [n.op for n in prepare(model, Options()).nodes]
    check(model, tmp)


def test_a_transpose_left_unread_by_a_sinking_is_removed(tmp):
    """Add(T(a), T(b)) with T(a) read by a Softmax too: b's Transpose sinks below the Add (T(Add(a, b))), a's stays;
    b's, read by nothing now, is gone before the passes after (fuse-epilogues counts a value's readers)."""
    back = [0, 2, 1, 3]
    nodes = [helper.make_node("Transpose", ["a"], ["ta"], perm=back),
             helper.make_node("Transpose", ["b"], ["tb"], perm=back),
             helper.make_node("Add", ["ta", "tb"], ["y"]),
             helper.make_node("Softmax", ["ta"], ["z"], axis=-1)]
    shape = [1, H, S, D]
    model = make_model(nodes, {"a": ([1, S, H, D], F32), "b": ([1, S, H, D], F32)},
                       {"y": (shape, F32), "z": (shape, F32)})
    graph = prepare(model, Options(stop_after="sink-transposes"))
    transposes = [n for n in graph.nodes if n.op == "Transpose"]
    assert sorted(n.inputs[0] for n in transposes) == ["a", sorted(i for n in graph.nodes if n.op == "Add"
                                                                   for i in n.outputs)[0]]
    check(model, tmp)
