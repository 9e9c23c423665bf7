"""Ops that are a Gather or a MatMul by a constant once an input is known (passes/expand_constant_maps.py):
Compress with a compile-time condition (one known only at run time is refused with why), ReverseSequence, DFT
(against numpy's float64 FFT)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.errors import UnsupportedError
from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.conftest import compile_to_model, make_model

X = np.arange(60, dtype=np.float32).reshape(3, 4, 5) - 30


@pytest.mark.parametrize("axis, condition", [(1, [True, False, True, True]), (2, [False, True]),
                                             (-1, [1, 0, 0, 1, 1]), (None, [0, 1, 1, 0, 0, 0, 1] * 3),
                                             (0, [False, False, False])])
def test_a_constant_condition_gathers_the_kept_indices(tmp, axis, condition):
    cond = np.array(condition, dtype=bool)
    attrs = {} if axis is None else {"axis": axis}
    model = make_model([helper.make_node("Compress", ["x", "cond"], ["y"], **attrs)],
                       {"x": ([3, 4, 5], TensorProto.FLOAT)}, {"y": (["n"] if axis is None else ["a", "b", "c"], TensorProto.FLOAT)},
                       {"cond": cond})
    ours = compile_to_model(model, tmp).run({"x": X})["y"]
    expected = onnxruntime_outputs(model, {"x": X})["y"]
    assert ours.shape == expected.shape == np.compress(cond, X, axis=axis).shape
    np.testing.assert_array_equal(ours, expected)


def test_a_run_time_condition_is_refused_naming_why():
    model = make_model([helper.make_node("Compress", ["x", "cond"], ["y"], axis=0)],
                       {"x": ([3, 4], TensorProto.FLOAT), "cond": ([3], TensorProto.BOOL)},
                       {"y": (["n", 4], TensorProto.FLOAT)})
    with pytest.raises(UnsupportedError, match="Compress.*condition is known only at run time"):
        compile_model(model)


@pytest.mark.parametrize("time_axis, batch_axis, lengths", [(0, 1, [4, 1, 3, 2, 4]), (1, 0, [2, 4, 0, 3, 1])])
def test_reverse_sequence_reverses_each_prefix(tmp, time_axis, batch_axis, lengths):
    shape = [4, 5, 3] if time_axis == 0 else [5, 4, 3]
    x = np.arange(60, dtype=np.float32).reshape(shape)
    model = make_model([helper.make_node("ReverseSequence", ["x", "lengths"], ["y"], time_axis=time_axis,
                                         batch_axis=batch_axis)],
                       {"x": (shape, TensorProto.FLOAT)}, {"y": (shape, TensorProto.FLOAT)},
                       {"lengths": np.array(lengths, np.int64)})
    expected = x.copy()
    for b, n in enumerate(lengths):
        index = [slice(None)] * 3
        index[batch_axis], index[time_axis] = b, slice(0, n)
        expected[tuple(index)] = np.flip(x[tuple(index)], axis=0)
    np.testing.assert_array_equal(compile_to_model(model, tmp).run({"x": x})["y"], expected)


def _complex(x: np.ndarray) -> np.ndarray:
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0]


DFT_CASES = {  # id: (input shape, axis, attrs, dft_length, numpy's transform of the complex signal along the axis)
    "real": ([2, 12, 3, 1], 1, {}, None, lambda z, n: np.fft.fft(z, axis=1)),
    "complex_axis2": ([2, 3, 16, 2], 2, {}, None, lambda z, n: np.fft.fft(z, axis=2)),
    "padded": ([1, 5, 4, 1], 1, {}, 8, lambda z, n: np.fft.fft(z, n=8, axis=1)),
    "onesided": ([2, 10, 3, 1], 1, {"onesided": 1}, None, lambda z, n: np.fft.rfft(z, axis=1)),
    "inverse": ([2, 9, 3, 2], 1, {"inverse": 1}, None, lambda z, n: np.fft.ifft(z, axis=1)),
    "irfft": ([1, 6, 4, 2], 1, {"inverse": 1, "onesided": 1}, None, lambda z, n: np.fft.irfft(z, axis=1)),
}


@pytest.mark.parametrize("case", DFT_CASES.values(), ids=DFT_CASES.keys())
def test_dft_is_one_matmul_matching_numpy(tmp, case):
    shape, axis, attrs, length, transform = case
    weights = {"axis": np.array(axis, np.int64)}
    if length is not None:
        weights["length"] = np.array(length, np.int64)
    node = helper.make_node("DFT", ["x", "length" if length is not None else "", "axis"], ["y"], **attrs)
    model = make_model([node], {"x": (shape, TensorProto.FLOAT)}, {"y": (["a", "b", "c", "d"], TensorProto.FLOAT)},
                       weights, opset=20)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = compile_to_model(model, tmp).run({"x": x})["y"]
    y = transform(_complex(x.astype(np.float64)), length)
    expected = y[..., None] if np.isrealobj(y) else np.stack([y.real, y.imag], -1)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
