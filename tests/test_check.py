"""`check` compares inf and NaN by position, not by their differences, and a reference onnxruntime refuses is a coded
NCC_REFERENCE line (issue 21)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.cli import main
from neuronx_cc_lite.reference import compare, error_over_rms, special_mismatches, within

INF, NAN = np.inf, np.nan


@pytest.mark.parametrize("actual, expected, misplaced", [
    ([1.0, INF, -INF, NAN], [1.0, INF, -INF, NAN], 0),
    ([1.0, INF, 2.0, NAN], [1.0, -INF, 2.0, NAN], 1),  # the other infinity
    ([1.0, 5.0, 2.0, NAN], [1.0, INF, 2.0, 3.0], 2),  # a finite value for an inf, a NaN for a finite one
    ([NAN, INF], [INF, NAN], 2),
])
def test_inf_and_nan_are_compared_by_position(actual, expected, misplaced):
    a, e = np.array(actual, np.float32), np.array(expected, np.float32)
    assert special_mismatches(a, e) == misplaced
    assert within(a, e, 1e-3, 1e-4) == (misplaced == 0)
    assert (compare(a, e)[0] == 0.0) == (misplaced == 0)
    assert (error_over_rms(a, e) == 0.0) == (misplaced == 0)


def test_errors_are_measured_over_the_finite_elements():
    a = np.array([1.0, INF, 2.5, NAN, 4.0], np.float32)
    e = np.array([1.0, INF, 2.0, NAN, 4.0], np.float32)
    assert compare(a, e) == (0.5, 0.5 / 4.0)
    assert error_over_rms(a, e) == pytest.approx(0.5 / np.sqrt((1 + 4 + 16) / 3))
    assert not within(a, e, 1e-3, 1e-4) and within(a, e, 0.3, 0.0)


def _write(model: onnx.ModelProto, path: str) -> str:
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_check_passes_where_both_sides_agree_on_inf_and_nan(tmp, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph([helper.make_node("Log", ["x"], ["y"])], "g", [x], [y])
    path = _write(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), f"{tmp}/log.onnx")
    np.savez(f"{tmp}/in.npz", x=np.array([[0, -1, 1, 2], [INF, 3, -INF, NAN]], np.float32))
    assert main(["check", path, "--inputs", f"{tmp}/in.npz", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "MISMATCH" not in out and "has 5 inf or NaN of 8" in out, out


def test_a_model_onnxruntime_refuses_is_a_coded_reference_error(tmp, capsys):
    """onnxruntime has no Max for int16; the compiler has: check cannot compare, and says so on one line."""
    ins = [helper.make_tensor_value_info(n, TensorProto.INT16, [4]) for n in "ab"]
    graph = helper.make_graph([helper.make_node("Max", ["a", "b"], ["y"])], "g", ins,
                              [helper.make_tensor_value_info("y", TensorProto.INT16, [4])])
    path = _write(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), f"{tmp}/max.onnx")
    assert main(["-q", "check", path, "--no-cache"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("neuronx-cc-lite: error: NCC_REFERENCE: onnxruntime, the reference, "
                                               "cannot run the model: "), err


def test_integers_are_compared_exactly():
    big = np.array([2**62, 5], np.int64)
    assert within(big, big.copy(), 1e-3, 1e-4)
    assert not within(big + np.array([1, 0]), big, 1e-3, 1e-4)  # within rtol as floats, but not the same integer


def _two_products(opset: int = 17) -> onnx.ModelProto:
    """y = x @ w1 + x @ w2 and z = x @ w1, w2 close to -w1: y is the small difference of two large products, so
    rounding the products' operands to bf16 alone moves it by several times its own size."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((64, 32)).astype(np.float32)
    w2 = (-w1 * (1 + 1e-3 * rng.standard_normal(w1.shape))).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("MatMul", ["x", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"]), helper.make_node("Identity", ["a"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [8, 32]) for n in "yz"],
                              [onnx.numpy_helper.from_array(w, n) for w, n in ((w1, "w1"), (w2, "w2"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def test_the_cast_only_reference_rounds_what_auto_cast_narrows():
    """cast_only_model rounds each operand of a MatMul to bf16 once (x is read by two), and nothing else under
    matmult: its outputs are numpy's products of the rounded operands; under all the intermediate products are
    rounded too; an opset whose Cast has no bf16 gives none."""
    import ml_dtypes

    from neuronx_cc_lite.reference import cast_only_model, onnxruntime_outputs

    model = _two_products()
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    w1, w2 = (onnx.numpy_helper.to_array(t) for t in model.graph.initializer)

    def bf16(a: np.ndarray) -> np.ndarray:
        return a.astype(ml_dtypes.bfloat16).astype(np.float64)

    a, b = bf16(x) @ bf16(w1), bf16(x) @ bf16(w2)
    got = onnxruntime_outputs(cast_only_model(model, "matmult", "bf16"), {"x": x}, optimize=False)
    np.testing.assert_allclose(got["z"], a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["y"], a + b, rtol=1e-4, atol=1e-4)
    every = onnxruntime_outputs(cast_only_model(model, "all", "bf16"), {"x": x}, optimize=False)
    np.testing.assert_allclose(every["y"], bf16(a.astype(np.float32)) + bf16(b.astype(np.float32)), rtol=1e-4,
                               atol=1e-4)
    assert cast_only_model(_two_products(opset=11), "matmult", "bf16") is None
    assert cast_only_model(_two_products(opset=11), "matmult", "fp16") is not None


def test_check_names_a_mismatch_that_is_the_casts_own(tmp, capsys):
    """Under --auto-cast, check prints onnxruntime's own error with the operands rounded beside the compiled
    model's: an output that misses the bound by that much is still a MISMATCH (exit 1), with a note that the cast,
    not the compiler, makes it; an output within the bound is ok with its column filled in."""
    path = f"{tmp}/two.onnx"
    onnx.save(_two_products(), path)
    assert main(["-q", "check", path, "--no-cache", "--auto-cast", "matmult"]) == 1
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["y"], ["z"])}
    ours, own = float(rows["y"][5]), float(rows["y"][6])  # (the shape takes two words)
    assert rows["y"][7] == "MISMATCH" and own > 0.0625 and ours <= 2 * own, out
    assert rows["z"][7] == "ok" and float(rows["z"][6]) <= 0.0625, out
    assert "note: 'y' misses the bound by about the cast's own error" in out, out
    assert main(["-q", "check", path, "--no-cache"]) == 0  # fp32: no column, no note
    out = capsys.readouterr().out
    assert "cast own" not in out and "note" not in out, out
