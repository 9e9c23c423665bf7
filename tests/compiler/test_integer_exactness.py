"""Integer operators are onnxruntime's bit for bit over their whole range, or refused (issue 21): the engines
compute in fp32, so the compiler bounds every integer it computes with (neuronx_cc_lite/integer_ranges.py);
where it cannot prove a node exact in fp32, an Add, Sub, Neg, Mul, comparison, Max or Min is computed in limbs
(lower/integer_limbs.py), exact and wrapped as onnxruntime wraps; what remains inexact (integer Div and Mod,
int64 arithmetic whose result may leave the int32 the device holds it in) carries a bound on its inputs in the
bundle that the runtime enforces (NRT_INPUT), and an int64 input is refused past int32 instead of saturating."""

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
COMPARISONS = ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual")
UNARY = ("Neg", "Abs")
N = 16


def _model(op: str, dtype: type, constant: int | None = None):  # type: ignore[no-untyped-def]
    """z = op(x, y) on two run-time inputs, or op(x, constant); z = op(x) for a unary op."""
    t = TYPES[dtype]
    inputs = [helper.make_tensor_value_info("x", t, [N])]
    inits = []
    operands = ["x"] if op in UNARY else ["x", "y"]
    if op in UNARY:
        pass
    elif constant is None:
        inputs.append(helper.make_tensor_value_info("y", t, [N]))
    else:
        inits.append(numpy_helper.from_array(np.full(N, constant, dtype), "y"))
    out = TensorProto.BOOL if op in COMPARISONS else t
    graph = helper.make_graph([helper.make_node(op, operands, ["z"], name="the_node")], "g", inputs,
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
    """The values around the ends of [low, high] (each type's wrap-around), 2^24 and 2^31, and zero, inside
    [low, high]."""
    points = {low, low + 1, high - 1, high, -1, 0, 1}
    for p in (2**8, 2**15, 2**16, 2**24, 2**31):
        points |= {p - 1, p, p + 1, -p - 1, -p, -p + 1}
    return sorted(v for v in points if low <= v <= high)


def _unsupported_by_onnxruntime(op: str, dtype: type) -> bool:
    """onnxruntime (the reference) implements Max/Min for neither int16 nor uint16; ONNX has no unsigned Neg."""
    unsigned = (np.uint8, np.uint16, np.uint32)
    return op in ("Max", "Min") and dtype in (np.int16, np.uint16) or op == "Neg" and dtype in unsigned


CASES = [(op, dtype, c) for op in ("Add", "Sub", "Mul", "Neg", "Abs", "Max", "Min", *COMPARISONS, "Div", "Mod")
         for dtype in TYPES for c in ((None,) if op in UNARY else (None, 100))
         if not _unsupported_by_onnxruntime(op, dtype)]
IDS = [f"{o}-{d.__name__}-{c}" for o, d, c in CASES]


def _check_case(op: str, dtype: type, constant: int | None, data: st.DataObject) -> None:
    model, loaded = _compile(op, dtype, constant)
    if isinstance(loaded, CompileError):  # refused: the node named, the reason its range
        assert loaded.code == "NCC_UNSUPPORTED" and "'the_node'" in str(loaded), loaded
        assert "exact to 2^24" in str(loaded) or "beyond the exact fp32 range" in str(loaded), loaded
        return
    info = np.iinfo(dtype)
    held = np.iinfo(np.int32 if dtype == np.int64 else dtype)
    bounds = loaded.bundle.stats.get("integer_bounds", {})
    names = ["x"] if constant is not None or op in UNARY else ["x", "y"]
    inputs = {}
    for name in names:
        low, high = bounds.get(name, (max(info.min, held.min), min(info.max, held.max)))
        values = st.one_of(st.sampled_from(_edges(low, high)), st.integers(low, high))
        inputs[name] = np.array(data.draw(st.lists(values, min_size=N, max_size=N)), dtype)
    if op in ("Div", "Mod") and "y" in inputs:
        inputs["y"][inputs["y"] == 0] = 1  # onnxruntime's integer division by zero is undefined
    ours = loaded.run(inputs)["z"]
    np.testing.assert_array_equal(ours, onnxruntime_outputs(model, inputs)["z"])
    # past the bound, past int32 for an int64 the device holds as int32 (up to 2^63): refused, never a wrong answer
    name = names[0]
    low, high = bounds.get(name, (held.min, held.max))
    for outside in (high + 1, info.max):
        if high < outside <= info.max:
            with pytest.raises(InputError, match=f"input '{name}' holds {outside}"):
                loaded.run(dict(inputs, **{name: np.full(N, outside, dtype)}))


@settings(max_examples=4, deadline=None, derandomize=True)
@given(data=st.data())
@pytest.mark.parametrize("op, dtype, constant", CASES, ids=IDS)
def test_integer_operators_are_exact_or_refused(op, dtype, constant, data):
    _check_case(op, dtype, constant, data)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("op, dtype, constant", CASES, ids=IDS)
def test_integer_operators_are_exact_or_refused_many_values(op, dtype, constant, data):
    _check_case(op, dtype, constant, data)


def test_the_cases_reach_both_ends():
    """Every case compiles but uint32 Div and Mod; int32 and uint32 arithmetic and comparisons take their whole
    range, in limbs; what fp32 cannot compute exactly keeps a bound the runtime enforces."""
    refused = [key for key in CASES if isinstance(_compile(*key)[1], CompileError)]
    assert refused == [(op, np.uint32, c) for op in ("Div", "Mod") for c in (None, 100)]
    _, add = _compile("Add", np.uint8, None)
    z = add.run({"x": np.full(N, 250, np.uint8), "y": np.full(N, 10, np.uint8)})["z"]  # type: ignore[union-attr]
    assert (z == 4).all()  # wraps as onnxruntime does; the engines alone would saturate at 255
    for op in ("Add", "Sub", "Mul", "Abs", "Max", "Less", "Equal"):
        assert "integer_bounds" not in _compile(op, np.int32, None)[1].bundle.stats, op  # type: ignore[union-attr]
    _, add = _compile("Add", np.int32, None)
    z = add.run({"x": np.full(N, 2**31 - 1, np.int32), "y": np.full(N, 2, np.int32)})["z"]  # type: ignore
    assert (z == -2**31 + 1).all()
    _, mul = _compile("Mul", np.int32, None)
    z = mul.run({"x": np.full(N, 16777217, np.int32), "y": np.full(N, 3, np.int32)})["z"]  # type: ignore
    assert (z == 50331651).all()  # 3 * (2^24 + 1): the fp32 product would round to 50331648
    # int64 arithmetic: exact while the result stays in the int32 the device holds it in
    assert _compile("Add", np.int64, None)[1].bundle.stats["integer_bounds"] == {  # type: ignore[union-attr]
        "x": [-2**29, 2**29], "y": [-2**29, 2**29]}
    assert _compile("Div", np.int32, None)[1].bundle.stats["integer_bounds"]["x"] == [-2**24, 2**24]  # type: ignore


def _chain_model():  # type: ignore[no-untyped-def]
    """Index arithmetic of the kind attention masks and position ids do, on int32: ((x * 65599 + y) - x) < y,
    Max(x, y) - 1, with no bound the inputs could satisfy in fp32."""
    i32 = TensorProto.INT32
    nodes = [helper.make_node("Mul", ["x", "k"], ["m"], name="scale"),
             helper.make_node("Add", ["m", "y"], ["s"], name="shift"),
             helper.make_node("Sub", ["s", "x"], ["d"], name="back"),
             helper.make_node("Less", ["d", "y"], ["lt"], name="below"),
             helper.make_node("Max", ["x", "y"], ["hi"], name="larger"),
             helper.make_node("Sub", ["hi", "one"], ["last"], name="minus_one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, i32, [4, 33]) for n in "xy"],
                              [helper.make_tensor_value_info("d", i32, [4, 33]),
                               helper.make_tensor_value_info("lt", TensorProto.BOOL, [4, 33]),
                               helper.make_tensor_value_info("last", i32, [4, 33])],
                              [numpy_helper.from_array(np.array(65599, np.int32), "k"),
                               numpy_helper.from_array(np.array(1, np.int32), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_chain_of_int32_index_arithmetic_is_exact_over_the_whole_range():
    model = _chain_model()
    loaded = runtime.load(neuronx_cc_lite.compile(model, cache=False))
    assert "integer_bounds" not in loaded.bundle.stats
    rng = np.random.default_rng(7)
    info = np.iinfo(np.int32)
    inputs = {n: rng.integers(info.min, info.max, (4, 33), endpoint=True).astype(np.int32) for n in "xy"}
    inputs["x"][0, :4] = [info.min, info.max, 2**24 + 1, -(2**24) - 1]
    ours, theirs = loaded.run(inputs), onnxruntime_outputs(model, inputs)
    for name in ("d", "lt", "last"):
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


def _edge_values(dtype: type, count: int, seed: int) -> np.ndarray:
    """`count` values of `dtype` as the device holds it (int64 within int32): its edges first, then random ones."""
    held = np.iinfo(np.int32 if dtype == np.int64 else dtype)
    edges = _edges(int(held.min), int(held.max))
    rng = np.random.default_rng(seed)
    drawn = rng.integers(held.min, held.max, count, endpoint=True)
    drawn[:min(count, len(edges))] = edges[:count]
    return drawn.astype(dtype)


CAST_PAIRS = [(a, b) for a in TYPES for b in TYPES if a != b]


@pytest.mark.parametrize("source, target", CAST_PAIRS, ids=[f"{a.__name__}-{b.__name__}" for a, b in CAST_PAIRS])
def test_integer_casts_wrap_as_onnx_does_or_are_refused(source, target):
    """A narrowing integer cast keeps the low bits (int32 -1 to uint8 is 255, 300 to int8 is 44); the one cast the
    device cannot hold, uint32 to int64 (held in int32), is refused naming the node."""
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["z"], name="the_cast", to=TYPES[target])], "g",
                              [helper.make_tensor_value_info("x", TYPES[source], [N * 4])],
                              [helper.make_tensor_value_info("z", TYPES[target], [N * 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if (source, target) == (np.uint32, np.int64):
        with pytest.raises(CompileError, match="'the_cast'.*outside"):
            neuronx_cc_lite.compile(model, cache=False)
        return
    inputs = {"x": _edge_values(source, N * 4, 3)}
    ours = runtime.load(neuronx_cc_lite.compile(model, cache=False)).run(inputs)["z"]
    np.testing.assert_array_equal(ours, onnxruntime_outputs(model, inputs)["z"])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_where_selects_integers_by_their_bits(dtype):
    """Where(c, a + b, b) with a, b over the whole range: the selection copies bits, never values through fp32."""
    t = TYPES[dtype]
    nodes = [helper.make_node("Add", ["a", "b"], ["s"], name="sum") if dtype != np.int64 else
             helper.make_node("Identity", ["a"], ["s"], name="sum"),
             helper.make_node("Where", ["c", "s", "b"], ["z"], name="pick")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [N * 2]),
                                           *(helper.make_tensor_value_info(n, t, [N * 2]) for n in "ab")],
                              [helper.make_tensor_value_info("z", t, [N * 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    loaded = runtime.load(neuronx_cc_lite.compile(model, cache=False))
    assert "integer_bounds" not in loaded.bundle.stats
    inputs = {"c": np.arange(N * 2) % 3 == 0, "a": _edge_values(dtype, N * 2, 4),
              "b": _edge_values(dtype, N * 2, 5)[::-1].copy()}
    np.testing.assert_array_equal(loaded.run(inputs)["z"], onnxruntime_outputs(model, inputs)["z"])


def test_a_gather_from_more_rows_than_fp32_counts_is_refused():
    table = np.zeros(((1 << 23) + 2, 1), np.uint8)
    graph = helper.make_graph([helper.make_node("Gather", ["t", "i"], ["y"], name="lookup")], "g",
                              [helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [3, 1])],
                              [numpy_helper.from_array(table, "t")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(CompileError, match="'lookup' .*row indices exact up to"):
        neuronx_cc_lite.compile(model, cache=False)


@pytest.mark.parametrize("op", COMPARISONS)
@pytest.mark.parametrize("constant", [5, -(2**24 - 1), 2**24 - 1])
def test_a_comparison_with_a_small_constant_is_one_fp32_instruction_exact_over_int32(op, constant):
    """fp32 orders integers as they are ordered and holds a constant under 2^24 exactly, so comparing with one is
    exact whatever the input holds (a sequence-length mask, step < lengths): no limbs, and no bound on the input
    (integer_ranges.small_constant_comparison)."""
    model, compiled = _compile(op, np.int32, constant)
    assert not isinstance(compiled, Exception), compiled
    low, high = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    x = np.array([low, high, constant, constant - 1, constant + 1, 2**24, 2**24 + 1, -(2**24) - 1,
                  2**31 - 2, -(2**31) + 1, 0, 1, -1, 2**25 + 3, constant + 2**24, constant - 2**24], np.int32)
    assert (compiled.run({"x": x})["z"] == onnxruntime_outputs(model, {"x": x})["z"]).all()
    instructions = [i for core in neuronx_cc_lite.compile(model, cache=False).cores for s in core.values()
                    for i in s.instructions if i.op not in ("dma_copy",)]
    assert len(instructions) <= 2, [i.op for i in instructions]


def test_a_mask_of_positions_against_a_run_time_position_is_exact_without_limbs():
    """A causal mask as decoders export it, steps <= position with the position a run-time int64: the steps (here
    an int8 input cast up, so their range is known but not their values) stay under 2^24, so the comparison is
    exact in fp32 whatever the position holds: no limbs, no bound (integer_ranges._small_operand_comparison)."""
    nodes = [helper.make_node("Cast", ["step"], ["steps"], to=TensorProto.INT64),
             helper.make_node("LessOrEqual", ["steps", "position"], ["z"], name="the_node")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("step", TensorProto.INT8, [N]),
                                           helper.make_tensor_value_info("position", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("z", TensorProto.BOOL, [N])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    bundle = neuronx_cc_lite.compile(model, cache=False)
    assert "integer_bounds" not in bundle.stats
    computed = [i.op for core in bundle.cores for s in core.values() for i in s.instructions if i.op != "dma_copy"]
    assert len(computed) <= 3, computed  # limbs take eight or more
    compiled = runtime.load(bundle)
    steps = np.arange(-8, 8, dtype=np.int8)
    for p in (-(2**31), -9, -1, 0, 7, 8, 2**24 + 1, 2**31 - 1):
        x = {"step": steps, "position": np.array([p], np.int64)}
        assert (compiled.run(x)["z"] == onnxruntime_outputs(model, x)["z"]).all(), p


def _alibi_positions():  # type: ignore[no-untyped-def]
    """BLOOM's ALiBi positions as TorchScript exports them: ((cumsum(mask) - 1) * mask), the mask cast first."""
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    nodes = [helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.INT64),
             helper.make_node("CumSum", ["mask", "axis"], ["sums"], name="the_cumsum"),
             helper.make_node("Sub", ["sums", "one"], ["shifted"]),
             helper.make_node("Mul", ["shifted", "mask"], ["positions"]),
             helper.make_node("Cast", ["positions"], ["z"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, 128])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 128])], [one, axis])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_an_input_cast_to_a_wide_integer_is_bounded_for_what_its_readers_compute():
    """A mask cast to int64 (a no-op, as BLOOM's TorchScript export has it) and summed up along the sequence: the
    cast keeps every value of a bounded input, so the input takes the bound that makes the sum exact (it was
    refused: the cast hid the CumSum from the input's bound); values past it are refused at run time."""
    model = _alibi_positions()
    bundle = neuronx_cc_lite.compile(model, cache=False)
    low, high = bundle.stats["integer_bounds"]["attention_mask"]
    assert 128 * high <= 2**24 and high >= 2**8
    compiled = runtime.load(bundle)
    rng = np.random.default_rng(0)
    for mask in (np.ones((1, 128), np.int64), (rng.random((1, 128)) < 0.7).astype(np.int64),
                 rng.integers(low, high + 1, (1, 128)).astype(np.int64)):
        x = {"attention_mask": mask}
        np.testing.assert_array_equal(compiled.run(x)["z"], onnxruntime_outputs(model, x)["z"])
    with pytest.raises(InputError):
        compiled.run({"attention_mask": np.full((1, 128), high + 1, np.int64)})

