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
