"""Integer operators are onnxruntime's bit for bit, or refused (issue 21): the engines compute in fp32, so the
compiler bounds every integer it computes with (neuronx_cc_lite/integer_ranges.py) and refuses what it cannot
bound within 2^24 and the output type; the inputs it computes with carry a bound in the bundle that the runtime
enforces (NRT_INPUT), and an int64 input the device holds as int32 is refused past int32 instead of saturating."""

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
         np.uint16: TensorProto.UINT16, np.int32: TensorProto.INT32, np.int64: TensorProto.INT64}
N = 16


def _model(op: str, dtype: type, constant: int | None = None):  # type: ignore[no-untyped-def]
    """z = op(x, y) on two run-time inputs, or op(x, constant)."""
    t = TYPES[dtype]
    inputs = [helper.make_tensor_value_info("x", t, [N])]
    inits = []
    if constant is None:
        inputs.append(helper.make_tensor_value_info("y", t, [N]))
    else:
        inits.append(numpy_helper.from_array(np.full(N, constant, dtype), "y"))
    out = TensorProto.BOOL if op in ("Less", "Equal") else t
    graph = helper.make_graph([helper.make_node(op, ["x", "y"], ["z"], name="the_node")], "g", inputs,
                              [helper.make_tensor_value_info("z", out, [N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


_compiled: dict[tuple, object] = {}


def _compile(op: str, dtype: type, constant: int | None):  # type: ignore[no-untyped-def]
    """The loaded model, or the CompileError that refused it (once per case)."""
    key = (op, dtype, constant)
    if key not in _compiled:
        model = _model(op, dtype, constant)
        try:
            _compiled[key] = (model, runtime.load(neuronx_cc_lite.compile(model, cache=False)))
        except CompileError as e:
            _compiled[key] = (model, e)
    return _compiled[key]


def _edges(low: int, high: int) -> list[int]:
    """The values around the ends of [low, high], 2^24 and 2^31, and zero, inside [low, high]."""
    points = {low, low + 1, high - 1, high, -1, 0, 1}
    for p in (2**24, 2**31):
        points |= {p - 1, p, p + 1, -p - 1, -p, -p + 1}
    return sorted(v for v in points if low <= v <= high)


CASES = [(op, dtype, c) for op in ("Add", "Sub", "Mul", "Less", "Equal") for dtype in TYPES
         for c in (None, 100)]


@settings(max_examples=10, deadline=None, derandomize=True)
@given(data=st.data())
@pytest.mark.parametrize("op, dtype, constant", CASES, ids=[f"{o}-{d.__name__}-{c}" for o, d, c in CASES])
def test_integer_operators_are_exact_or_refused(op, dtype, constant, data):
    model, loaded = _compile(op, dtype, constant)
    if isinstance(loaded, CompileError):  # refused: the node named, the reason its range
        assert loaded.code == "NCC_UNSUPPORTED" and "'the_node'" in str(loaded), loaded
        assert "exact to 2^24" in str(loaded), loaded
        return
    info = np.iinfo(dtype)
    held = np.iinfo(np.int32 if dtype == np.int64 else dtype)
    bounds = loaded.bundle.stats.get("integer_bounds", {})
    names = ["x"] if constant is not None else ["x", "y"]
    inputs = {}
    for name in names:
        low, high = bounds.get(name, (max(info.min, held.min), min(info.max, held.max)))
        values = st.one_of(st.sampled_from(_edges(low, high)), st.integers(low, high))
        inputs[name] = np.array(data.draw(st.lists(values, min_size=N, max_size=N)), dtype)
    ours = loaded.run(inputs)["z"]
    np.testing.assert_array_equal(ours, onnxruntime_outputs(model, inputs)["z"])
    # past the bound, or past int32 for an int64 the device holds as int32: refused, never a wrong answer
    name = names[0]
    low, high = bounds.get(name, (held.min, held.max))
    if high < info.max:
        outside = dict(inputs, **{name: np.full(N, high + 1, dtype)})
        with pytest.raises(InputError, match=f"input '{name}' holds {high + 1}"):
            loaded.run(outside)


def test_the_cases_reach_both_ends():
    """Most of the cases compile and run (bounded inputs, wrapped results), and the unboundable ones are refused."""
    refused = [key for key in CASES if isinstance(_compile(*key)[1], CompileError)]
    assert refused == [("Mul", np.int16, None), ("Mul", np.uint16, None)]  # a product up to 2^30 or 2^32
    _, add = _compile("Add", np.uint8, None)
    z = add.run({"x": np.full(N, 250, np.uint8), "y": np.full(N, 10, np.uint8)})["z"]  # type: ignore[union-attr]
    assert (z == 4).all()  # wraps as onnxruntime does; the engines alone would saturate at 255
    _, add = _compile("Add", np.int32, None)
    assert add.bundle.stats["integer_bounds"] == {"x": [-2**23, 2**23], "y": [-2**23, 2**23]}  # type: ignore


def test_a_gather_from_more_rows_than_fp32_counts_is_refused():
    table = np.zeros(((1 << 23) + 2, 1), np.uint8)
    graph = helper.make_graph([helper.make_node("Gather", ["t", "i"], ["y"], name="lookup")], "g",
                              [helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [3, 1])],
                              [numpy_helper.from_array(table, "t")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(CompileError, match="'lookup' .*row indices exact up to"):
        neuronx_cc_lite.compile(model, cache=False)
