"""Values the device holds narrower than ONNX types them (issue 21): int64 is held as int32 and float64 as fp32.
Integers that operators only move (transposes, gathers, concatenations, pads, casts) keep every bit up to each
type's ends, past 2^24 where the engines' fp32 arithmetic would round them, as onnxruntime's do; an int64 that may
leave int32 inside a model is refused naming the node (or the constant), and so is a float64 constant or input
value outside fp32's normal range (it would become inf, lose its precision or become zero)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import neuronx_cc_lite
import runtime
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.reference import onnxruntime_outputs
from runtime.errors import InputError

TYPES = {np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8, np.int16: TensorProto.INT16,
         np.uint16: TensorProto.UINT16, np.int32: TensorProto.INT32, np.uint32: TensorProto.UINT32,
         np.int64: TensorProto.INT64}


def _model(nodes, inputs, outputs, inits=()):  # type: ignore[no-untyped-def]
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _i64(values) -> object:  # type: ignore[no-untyped-def]
    return np.array(values, np.int64)


# Models that only move integers: name -> (builder(dtype) -> model, input shapes)
def _moves(dtype: type) -> dict[str, tuple[object, dict[str, tuple[int, ...]]]]:
    t = TYPES[dtype]
    vi = helper.make_tensor_value_info
    x = vi("x", t, [4, 6])
    return {
        "transpose": (_model([helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0], name="the_node")], [x],
                             [vi("y", t, [6, 4])]), {"x": (4, 6)}),
        "concat": (_model([helper.make_node("Concat", ["x", "z"], ["y"], axis=0, name="the_node")],
                          [x, vi("z", t, [2, 6])], [vi("y", t, [6, 6])]), {"x": (4, 6), "z": (2, 6)}),
        "gather": (_model([helper.make_node("Gather", ["x", "i"], ["y"], axis=1, name="the_node")],
                          [x, vi("i", TensorProto.INT64, [3])], [vi("y", t, [4, 3])]), {"x": (4, 6)}),
        "slice_expand": (_model([helper.make_node("Slice", ["x", "s", "e"], ["m"]),
                                 helper.make_node("Expand", ["m", "shape"], ["y"], name="the_node")], [x],
                                [vi("y", t, [3, 2, 6])],
                                [numpy_helper.from_array(_i64([1]), "s"), numpy_helper.from_array(_i64([3]), "e"),
                                 numpy_helper.from_array(_i64([3, 2, 6]), "shape")]), {"x": (4, 6)}),
        "tile_reshape": (_model([helper.make_node("Tile", ["x", "r"], ["m"]),
                                 helper.make_node("Reshape", ["m", "shape"], ["y"], name="the_node")], [x],
                                [vi("y", t, [96])],
                                [numpy_helper.from_array(_i64([2, 2]), "r"),
                                 numpy_helper.from_array(_i64([96]), "shape")]), {"x": (4, 6)}),
        "pad": (_model([helper.make_node("Pad", ["x", "p"], ["y"], name="the_node")], [x], [vi("y", t, [6, 8])],
                       [numpy_helper.from_array(_i64([1, 1, 1, 1]), "p")]), {"x": (4, 6)}),
        "scatter": (_model([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, name="the_node")],
                           [x, vi("u", t, [4, 2])], [vi("y", t, [4, 6])],
                           [numpy_helper.from_array(np.tile(_i64([5, 0]), (4, 1)), "i")]),
                    {"x": (4, 6), "u": (4, 2)}),
    }


CASES = [(name, dtype) for dtype in TYPES for name in _moves(np.int32)
         if not (name == "pad" and dtype in (np.int16, np.uint16))]  # onnxruntime has no 16-bit Pad
_compiled: dict[tuple, object] = {}


def _compile(name: str, dtype: type):  # type: ignore[no-untyped-def]
    key = (name, dtype)
    if key not in _compiled:
        model, shapes = _moves(dtype)[name]
        _compiled[key] = (model, shapes, runtime.load(neuronx_cc_lite.compile(model, cache=False)))
    return _compiled[key]


def _edges(dtype: type) -> list[int]:
    """The values around the type's ends (its wrap-around), 2^24 and 2^31 inside what the device holds."""
    held = np.iinfo(np.int32 if dtype == np.int64 else dtype)
    points = {held.min, held.min + 1, held.max - 1, held.max, -1, 0, 1}
    for p in (2**24, 2**31):
        points |= {p - 1, p, p + 1, -p - 1, -p, -p + 1}
    return sorted(v for v in points if held.min <= v <= held.max)


@settings(max_examples=8, deadline=None, derandomize=True)
@given(data=st.data())
@pytest.mark.parametrize("name, dtype", CASES, ids=[f"{n}-{d.__name__}" for n, d in CASES])
def test_moved_integers_keep_every_bit(name, dtype, data):
    model, shapes, loaded = _compile(name, dtype)
    edges = _edges(dtype)
    held = np.iinfo(np.int32 if dtype == np.int64 else dtype)
    values = st.one_of(st.sampled_from(edges), st.integers(int(held.min), int(held.max)))
    inputs = {}
    for input_name, shape in shapes.items():
        count = int(np.prod(shape))
        inputs[input_name] = np.array(data.draw(st.lists(values, min_size=count, max_size=count)),
                                      dtype).reshape(shape)
    if name == "gather":
        inputs["i"] = np.array(data.draw(st.lists(st.integers(-6, 5), min_size=3, max_size=3)), np.int64)
    ours = loaded.run(inputs)["y"]
    expected = onnxruntime_outputs(model, inputs)["y"]
    assert ours.dtype == expected.dtype
    np.testing.assert_array_equal(ours, expected)


def _past_int32(node: str) -> object:  # type: ignore[no-untyped-def]
    """A model whose int64 result holds 2^40 (or uint32's top as an int64) beyond the int32 the device holds."""
    vi = helper.make_tensor_value_info
    x = vi("x", TensorProto.INT64, [4])
    big = numpy_helper.from_array(_i64([2**40, -2**33]), "c")
    if node == "Concat":
        return _model([helper.make_node("Concat", ["x", "c"], ["y"], axis=0, name="the_node")], [x],
                      [vi("y", TensorProto.INT64, [6])], [big])
    if node == "Pad":
        return _model([helper.make_node("Pad", ["x", "p", "v"], ["y"], name="the_node")], [x],
                      [vi("y", TensorProto.INT64, [6])],
                      [numpy_helper.from_array(_i64([1, 1]), "p"), numpy_helper.from_array(_i64(2**40), "v")])
    if node == "Gather":
        return _model([helper.make_node("Gather", ["c", "x"], ["y"], name="the_node")], [x],
                      [vi("y", TensorProto.INT64, [4])], [big])
    if node == "Cast":
        return _model([helper.make_node("Cast", ["u"], ["y"], to=TensorProto.INT64, name="the_node")],
                      [vi("u", TensorProto.UINT32, [4])], [vi("y", TensorProto.INT64, [4])])
    assert node == "ConstantOfShape"
    fill = numpy_helper.from_array(np.array([2**24 + 1], np.int32))
    return _model([helper.make_node("ConstantOfShape", ["s"], ["y"], value=fill, name="the_node")], [],
                  [vi("y", TensorProto.INT32, [2048, 4096])],
                  [numpy_helper.from_array(_i64([2048, 4096]), "s")])  # too large to fold: filled on the device


@pytest.mark.parametrize("node", ["Concat", "Pad", "Gather", "Cast", "ConstantOfShape"])
def test_a_result_the_device_cannot_hold_is_refused_naming_the_node(node):
    """These came back wrapped (2^40 as 0, uint32 3e9 as int32's top, 16777217 as 16777216)."""
    with pytest.raises(CompileError) as refused:
        neuronx_cc_lite.compile(_past_int32(node), cache=False)
    assert refused.value.code == "NCC_UNSUPPORTED" and "'the_node'" in str(refused.value)
    assert ("the device holds int64 in 32 bits" in str(refused.value) if node != "ConstantOfShape"
            else "exact to 2^24" in str(refused.value))


def test_a_constant_output_past_int32_is_refused_naming_it():
    vi = helper.make_tensor_value_info
    model = _model([helper.make_node("Identity", ["x"], ["z"])], [vi("x", TensorProto.INT64, [4])],
                   [vi("c", TensorProto.INT64, [2]), vi("z", TensorProto.INT64, [4])],
                   [numpy_helper.from_array(_i64([5, -2**33]), "c")])
    with pytest.raises(CompileError, match=r"NCC_UNSUPPORTED: constant 'c' \(read by 'output c'\) holds -8589934592 "
                                           r"at \[1\], which the device cannot hold in int32"):
        neuronx_cc_lite.compile(model, cache=False)


def test_an_int64_inside_int32_through_casts_is_exact():
    """int64 -> int32 -> int64 and int8 -> int64 keep the value (the same bits on the device)."""
    vi = helper.make_tensor_value_info
    model = _model([helper.make_node("Cast", ["x"], ["a"], to=TensorProto.INT32),
                    helper.make_node("Cast", ["a"], ["y"], to=TensorProto.INT64),
                    helper.make_node("Cast", ["s"], ["z"], to=TensorProto.INT64)],
                   [vi("x", TensorProto.INT64, [6]), vi("s", TensorProto.INT8, [2])],
                   [vi("y", TensorProto.INT64, [6]), vi("z", TensorProto.INT64, [2])])
    loaded = runtime.load(neuronx_cc_lite.compile(model, cache=False))
    inputs = {"x": _i64([2**31 - 1, -2**31, 2**24 + 1, -2**24 - 1, 0, -1]), "s": np.array([-128, 127], np.int8)}
    ours, expected = loaded.run(inputs), onnxruntime_outputs(model, inputs)
    for name in ("y", "z"):
        np.testing.assert_array_equal(ours[name], expected[name])
    with pytest.raises(InputError, match=r"input 'x' holds 2147483648 at \[0\], outside \[-2147483648, 2147483647\]"):
        loaded.run(dict(inputs, x=_i64([2**31, 0, 0, 0, 0, 0])))


def _float64_model(constant: float | None = None):  # type: ignore[no-untyped-def]
    vi = helper.make_tensor_value_info
    x = vi("x", TensorProto.DOUBLE, [4])
    if constant is None:
        return _model([helper.make_node("Relu", ["x"], ["y"])], [x], [vi("y", TensorProto.DOUBLE, [4])])
    return _model([helper.make_node("Add", ["x", "c"], ["y"], name="the_node")], [x],
                  [vi("y", TensorProto.DOUBLE, [4])], [numpy_helper.from_array(np.array([0, 1, constant, 2]), "c")])


@pytest.mark.parametrize("value", [1e-300, -1e-40, 5e-324, 1e39, -1.7e308])
def test_a_float64_value_outside_fp32s_normal_range_is_refused(value):
    """1e-300 became 0 (its log -inf where onnxruntime has -690.8), 1e39 became inf."""
    with pytest.raises(CompileError, match=r"NCC_UNSUPPORTED: constant 'c' \(read by 'the_node'\) holds .* at \[2\], "
                                           "which the device cannot hold in fp32"):
        neuronx_cc_lite.compile(_float64_model(value), cache=False)
    loaded = runtime.load(neuronx_cc_lite.compile(_float64_model(), cache=False))
    with pytest.raises(InputError, match=r"input 'x' holds .* at \[1\], outside fp32's normal range"):
        loaded.run({"x": np.array([1.0, value, 0.0, 2.0])})


def test_float64_values_inside_fp32s_range_and_the_special_ones_run():
    """Zero, the infinities, NaN and values inside fp32's normal range are held (rounded to fp32)."""
    loaded = runtime.load(neuronx_cc_lite.compile(_float64_model(1.1754943508222875e-38), cache=False))
    x = np.array([np.inf, -np.inf, 0.0, 3.4e38])
    y = loaded.run({"x": x})["y"]
    expected = onnxruntime_outputs(_float64_model(1.1754943508222875e-38), {"x": x})["y"]
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    relu = runtime.load(neuronx_cc_lite.compile(_float64_model(), cache=False))
    y = relu.run({"x": np.array([np.nan, -0.0, 2e-38, -3e38])})["y"]
    assert np.isnan(y[0]) and y[1] == 0 and y[2] == np.float32(2e-38) and y[3] == 0
