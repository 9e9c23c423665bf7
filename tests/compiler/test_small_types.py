"""ONNX's 4- and 2-bit integers and the small floats no engine writes (float8 e4m3fnuz/e5m2fnuz, float4 e2m1):
held in a byte or in fp16, converted by the runtime at the model's edges, and a Cast to one rounds on the engines.
The reference is ONNX's own (onnx.reference, through ml_dtypes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tests.conftest import compile_to_model, make_model


def _cast(src: int, dst: int, shape: tuple[int, ...], **attrs: object):
    node = helper.make_node("Cast", ["x"], ["y"], to=dst, **attrs)
    return make_model([node], {"x": (list(shape), src)}, {"y": (list(shape), dst)}, opset=25)


def _edge_values() -> np.ndarray:
    """Ties, subnormals, values past the largest, signed zeros, infinities and NaN, and random magnitudes."""
    rng = np.random.default_rng(0)
    special = [0.0, -0.0, 0.25, 0.75, 1.25, 2.5, 5.0, 7.0, -3.5, 1e-7, -1e-7, 0.0009765625, 0.00146484375,
               239.0, 241.0, 248.0, 250.0, 1e4, 57344.0, 61440.0, 1e6, -1e6, np.inf, -np.inf, np.nan]
    random = rng.standard_normal(231) * 10.0 ** rng.integers(-6, 6, 231)
    return np.concatenate([special, random]).astype(np.float32).reshape(16, 16)


@pytest.mark.parametrize("dst, saturate", [(TensorProto.FLOAT8E4M3FNUZ, 1), (TensorProto.FLOAT8E4M3FNUZ, 0),
                                           (TensorProto.FLOAT8E5M2FNUZ, 1), (TensorProto.FLOAT8E5M2FNUZ, 0),
                                           (TensorProto.FLOAT4E2M1, None)])  # float4 always saturates
def test_a_cast_to_a_small_float_rounds_as_onnx_does(tmp, dst, saturate):
    attrs = {} if saturate is None else {"saturate": saturate}
    model = _cast(TensorProto.FLOAT, dst, (16, 16), **attrs)
    x = _edge_values()
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = compile_to_model(model, tmp).run({"x": x})["y"]
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))  # bit for bit, NaN and -0 included


def test_fp16_to_fnuz_rounds_though_both_are_held_in_fp16(tmp):
    model = _cast(TensorProto.FLOAT16, TensorProto.FLOAT8E4M3FNUZ, (16, 16))
    x = _edge_values().astype(np.float16)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = compile_to_model(model, tmp).run({"x": x})["y"]
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("dst", [TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2, TensorProto.UINT2])
def test_float_to_small_integers_truncates_and_zeroes_what_does_not_fit(tmp, dst):
    model = _cast(TensorProto.FLOAT, dst, (4, 8))
    x = np.array([-9.5, -8.0, -7.9, -2.5, -1.0, -0.5, 0.0, 0.9, 1.5, 2.0, 3.99, 4.0, 7.0, 7.5, 8.0, 15.9, 16.0, 100.0,
                  np.nan, np.inf, -np.inf, -3.0, -4.0, -2.0, 1.0, 2.5, 3.0, 0.1, -0.1, 5.5, 6.5, -6.5],
                 np.float32).reshape(4, 8)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = compile_to_model(model, tmp).run({"x": x})["y"]
    assert got.dtype == expected.dtype
    # ONNX leaves a value out of the type's range undefined, and the references differ there: onnx's reference
    # evaluator wraps with ml_dtypes 0.6 and gives 0 with 0.7, onnxruntime rounds first and wraps. In range they
    # truncate alike; out of it the compiler gives 0 (NaN and infinities too)
    info = ml_dtypes.iinfo(expected.dtype)
    truncated = np.trunc(np.nan_to_num(x, nan=0.0, posinf=1e9, neginf=-1e9))
    fits = (truncated >= info.min) & (truncated <= info.max)
    np.testing.assert_array_equal(got.astype(np.int8)[fits], expected.astype(np.int8)[fits])
    assert (got.astype(np.int8)[~fits] == 0).all() and (~fits).sum() >= 6


def test_small_integer_inputs_and_outputs_cross_the_runtime(tmp):
    """An int4 input is held sign-extended in int8, an int4 output comes back as int4."""
    nodes = [helper.make_node("Cast", ["x"], ["wide"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["wide", "two"], ["y_float"]),
             helper.make_node("Cast", ["x"], ["same"], to=TensorProto.INT4),
             helper.make_node("Transpose", ["same"], ["y"], perm=[1, 0])]
    model = make_model(nodes, {"x": ([2, 8], TensorProto.INT4)},
                       {"y_float": ([2, 8], TensorProto.FLOAT), "y": ([8, 2], TensorProto.INT4)},
                       {"two": np.array(2.0, np.float32)}, opset=21)
    x = np.arange(-8, 8).reshape(2, 8).astype(ml_dtypes.int4)
    out = compile_to_model(model, tmp).run({"x": x})
    np.testing.assert_array_equal(out["y_float"], x.astype(np.float32) * 2)
    assert out["y"].dtype == np.dtype(ml_dtypes.int4)
    np.testing.assert_array_equal(out["y"], x.T)


def test_quantize_to_int4_rounds_half_to_even_and_saturates(tmp):
    node = helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["y"], axis=0)
    model = make_model([node], {"x": ([3, 4], TensorProto.FLOAT)}, {"y": ([3, 4], TensorProto.INT4)},
                       {"scale": np.array([2.0, 3.0, 4.0], np.float32),
                        "zero": np.array([1, -1, 0], ml_dtypes.int4)}, opset=21)
    x = np.array([[0.0, 3.0, 5.0, 100.0], [-30.0, -20.0, 4.5, 7.5], [-2.0, 2.0, 6.0, 30.0]], np.float32)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = compile_to_model(model, tmp).run({"x": x})["y"]
    np.testing.assert_array_equal(got.astype(np.int8), expected.astype(np.int8))


def test_a_cast_to_e8m0_is_refused_with_the_reason():
    from neuronx_cc_lite.compiler import compile_model
    from neuronx_cc_lite.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match="float8_e8m0fnu rounds to a power of two"):
        compile_model(_cast(TensorProto.FLOAT, TensorProto.FLOAT8E8M0, (2, 4)))
