"""Quantized models: QuantizeLinear, DequantizeLinear, the integer matmuls and convolutions, DynamicQuantizeLinear
and Round (expand-quantization and its lowerings), against onnxruntime's integer kernels, and the bound of the
README's "Quantized models" paragraph:

- integer products (MatMulInteger, ConvInteger, inside QLinear*) equal the exact int32 result while
  K * max|a - za| * max|b - zb| < 2**24, and stay within (K - 1) * 2**-24 * sum|a_k * b_k| beyond;
- every quantized output is onnxruntime's or one step from it, given the same inputs.

onnxruntime's x86 u8s8 kernels without VNNI (this machine's) saturate sums of two products at int16, so the
tests that compare with them keep int8 weights within 7 bits (what `reduce_range=True` gives); full 8-bit ranges
are checked against numpy's exact integers.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.utils import Extractor

from neuronx_cc_lite.compiler import Options, prepare
from neuronx_cc_lite.ops.registry import unsupported_nodes
from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.conftest import MODELS_DIR, compile_to_model, make_model

F32, U8, I8 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8
TYPES = {np.dtype(np.uint8): U8, np.dtype(np.int8): I8, np.dtype(np.int16): TensorProto.INT16,
         np.dtype(np.uint16): TensorProto.UINT16, np.dtype(np.float32): F32, np.dtype(np.int32): TensorProto.INT32,
         np.dtype(np.float16): TensorProto.FLOAT16,
         np.dtype(ml_dtypes.float8_e4m3fn): TensorProto.FLOAT8E4M3FN,
         np.dtype(ml_dtypes.float8_e5m2): TensorProto.FLOAT8E5M2}


def node_model(op: str, feeds: dict[str, np.ndarray], weights: dict[str, np.ndarray], out_type: int,
               order: list[str], opset: int, n_out: int = 1, **attrs: object) -> onnx.ModelProto:
    """One node reading `order` ("" for an absent input) from graph inputs `feeds` and initializers `weights`;
    its outputs are typed by shape inference (the first as `out_type`)."""
    outs = ["y", "y_scale", "y_zero_point"][:n_out]
    node = helper.make_node(op, order, outs, **attrs)
    model = make_model([node], {k: (list(v.shape), TYPES[v.dtype]) for k, v in feeds.items()},
                       {outs[0]: (None, out_type)}, weights, opset=opset)
    del model.graph.output[:]
    model.graph.output.extend(onnx.ValueInfoProto(name=o) for o in outs)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def ours_and_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp: str
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    return compile_to_model(model, tmp).run(feeds), onnxruntime_outputs(model, feeds)


def assert_equal(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> None:
    for name in ref:
        assert ours[name].dtype == ref[name].dtype, name
        np.testing.assert_array_equal(ours[name].astype(np.float64), ref[name].astype(np.float64), err_msg=name)


def steps_apart(ours: np.ndarray, ref: np.ndarray) -> int:
    return int(np.max(np.abs(ours.astype(np.int64) - ref.astype(np.int64)), initial=0))


RNG = np.random.default_rng(0)
X = (RNG.standard_normal((2, 4, 6)) * 4).astype(np.float32)
X[0, 0, :] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5]  # ties, in units of the scale 1 below: half to even
X[0, 1, :] = [1e6, -1e6, 300.0, -300.0, 127.5, -128.5]  # saturation


# ---- QuantizeLinear and DequantizeLinear ------------------------------------------------------------------------

QUANTIZE_CASES = [  # (id, opset, attrs, scale, zero point or None, output type when there is no zero point)
    ("opset10_uint8", 10, {}, np.float32(1.0), np.uint8(128), None),
    ("opset10_no_zero_point", 10, {}, np.float32(0.5), None, None),
    ("opset13_int8", 13, {}, np.float32(1.0), np.int8(-3), None),
    ("opset13_axis1", 13, {"axis": 1}, np.asarray([0.5, 1.0, 2.0, 0.25], np.float32),
     np.asarray([0, 10, 250, 128], np.uint8), None),
    ("opset13_axis_last", 13, {"axis": -1}, np.linspace(0.2, 2, 6).astype(np.float32), np.arange(-3, 3).astype(np.int8),
     None),
    ("opset19_int8", 19, {}, np.float32(0.75), np.int8(5), None),
    ("opset21_blocked", 21, {"axis": 2, "block_size": 2}, (RNG.random((2, 4, 3)) + 0.25).astype(np.float32),
     RNG.integers(-20, 20, (2, 4, 3)).astype(np.int8), None),
    ("opset21_blocked_uneven", 21, {"axis": 1, "block_size": 3}, (RNG.random((2, 2, 6)) + 0.25).astype(np.float32),
     RNG.integers(0, 255, (2, 2, 6)).astype(np.uint8), None),
    ("opset21_int16", 21, {}, np.float32(0.01), np.int16(-1000), None),
    ("opset21_uint16", 21, {}, np.float32(0.001), np.uint16(30000), None),
    ("opset21_output_dtype", 21, {"output_dtype": I8}, np.float32(0.5), None, I8),
]


@pytest.mark.parametrize("case", QUANTIZE_CASES, ids=[c[0] for c in QUANTIZE_CASES])
@pytest.mark.parametrize("parameters", ["constant", "input"])
def test_quantize_linear(tmp, case, parameters):
    """Rounding half to even, saturation, per axis and per block, with the scale and zero point given as weights
    or as inputs (as ONNX's node tests give them)."""
    _, opset, attrs, scale, zero, out_type = case
    values = {"s": np.asarray(scale)} | ({"z": np.asarray(zero)} if zero is not None else {})
    feeds = {"x": X} | (values if parameters == "input" else {})
    weights = values if parameters == "constant" else {}
    out = TYPES[np.asarray(zero).dtype] if zero is not None else out_type or U8
    model = node_model("QuantizeLinear", feeds, weights, out, ["x", *values], opset, **attrs)
    assert_equal(*ours_and_ort(model, feeds, tmp))


DEQUANTIZE_CASES = [c for c in QUANTIZE_CASES if "output_dtype" not in c[2]]  # DequantizeLinear's is a float


@pytest.mark.parametrize("case", DEQUANTIZE_CASES, ids=[c[0] for c in DEQUANTIZE_CASES])
def test_dequantize_linear(tmp, case):
    _, opset, attrs, scale, zero, _ = case
    dtype = np.asarray(zero).dtype if zero is not None else np.dtype(np.uint8)
    info = np.iinfo(dtype)
    q = RNG.integers(info.min, int(info.max) + 1, X.shape).astype(dtype)
    values = {"s": np.asarray(scale)} | ({"z": np.asarray(zero)} if zero is not None else {})
    model = node_model("DequantizeLinear", {"q": q}, values, F32, ["q", *values], opset, **attrs)
    ours, ref = ours_and_ort(model, {"q": q}, tmp)
    np.testing.assert_allclose(ours["y"], ref["y"], rtol=1e-6, atol=0)  # one fp32 product: no order to differ in


@pytest.mark.parametrize("fp8", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2], ids=["e4m3fn", "e5m2"])
@pytest.mark.parametrize("saturate", [1, 0])
def test_fp8(tmp, fp8, saturate):
    """fp8 quantization: x / s cast to the fp8 type (nearest even), saturating unless saturate=0; and back. The
    fp8 values leave as floats (onnxruntime's Python API takes and gives no fp8 arrays)."""
    x = np.concatenate([X.reshape(-1), np.asarray([1e5, -1e5, 448.0, 460.0], np.float32)]).reshape(4, 13)
    weights = {"z": np.zeros((), dtype=fp8), "s_back": np.asarray(0.25, np.float32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], saturate=saturate),
             helper.make_node("Cast", ["q"], ["q_value"], to=F32),
             helper.make_node("DequantizeLinear", ["q", "s_back", "z"], ["y"])]
    model = make_model(nodes, {"x": ([4, 13], F32), "s": ([], F32)}, {"q_value": ([4, 13], F32),
                                                                        "y": ([4, 13], F32)}, weights, opset=19)
    assert_equal(*ours_and_ort(model, {"x": x, "s": np.asarray(0.5, np.float32)}, tmp))


def test_dequantize_to_float16(tmp):
    """From opset 19 the scale's type is the output's."""
    feeds = {"q": RNG.integers(-128, 128, (3, 5)).astype(np.int8), "s": np.asarray(0.125, np.float16),
             "z": np.asarray(3, np.int8)}
    model = node_model("DequantizeLinear", feeds, {}, TensorProto.FLOAT16, ["q", "s", "z"], 19)
    assert_equal(*ours_and_ort(model, feeds, tmp))


def test_quantize_float16(tmp):
    """From opset 19 x and its scale may be float16: both convert to fp32 exactly, and the fp32 quotient rounds as
    onnxruntime's does, ties included."""
    x = (RNG.standard_normal((4, 64)) * 100).astype(np.float16)
    x[0, :8] = np.asarray([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 4.5], np.float16) * np.float16(0.375)
    weights = {"s": np.asarray(0.375, np.float16), "z": np.asarray(1, np.int8)}
    model = node_model("QuantizeLinear", {"x": x}, weights, I8, ["x", "s", "z"], 19)
    assert_equal(*ours_and_ort(model, {"x": x}, tmp))


def test_round(tmp):
    """Half to even at every tie, magnitudes where fp32's spacing is 1/2 (2**22) and 1 (2**23), infinities,
    NaN, and -0.4 to -0.0."""
    x = np.asarray([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.4, 2**22 + 0.5, 2**22 + 1.5, -(2**22) - 0.5,
                    2**23 + 1, -(2**23) - 3, 3e38, np.inf, -np.inf, np.nan, 7.7], np.float32)
    feeds = {"x": x.reshape(3, 6)}
    ours, ref = ours_and_ort(node_model("Round", feeds, {}, F32, ["x"], 11), feeds, tmp)
    assert_equal(ours, ref)
    assert np.signbit(ours["y"].reshape(-1)[7])


# ---- integer matmuls and convolutions ---------------------------------------------------------------------------


def _ints(dtype: type, shape: tuple[int, ...], bits: int = 8) -> np.ndarray:
    info = np.iinfo(dtype)
    low, high = (info.min, info.max) if bits == 8 else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    return RNG.integers(low, high + 1, shape).astype(dtype)


@pytest.mark.parametrize("b_type", [np.int8, np.uint8])
@pytest.mark.parametrize("zeros", ["none", "scalar", "per_column"])
def test_matmul_integer(tmp, b_type, zeros):
    bits = 7 if b_type is np.int8 else 8
    a, b = _ints(np.uint8, (2, 5, 40)), _ints(b_type, (40, 7), bits)
    weights = {"b": b} | {"none": {}, "scalar": {"za": np.asarray(131, np.uint8), "zb": np.asarray(3, b_type)},
                          "per_column": {"za": np.asarray(131, np.uint8), "zb": _ints(b_type, (7,), bits)}}[zeros]
    model = node_model("MatMulInteger", {"a": a}, weights, TensorProto.INT32, ["a", *weights], 10)
    assert_equal(*ours_and_ort(model, {"a": a}, tmp))


def test_matmul_integer_per_row_zero_point(tmp):
    """A zero point per row of A, which ONNX allows and onnxruntime refuses: numpy's exact integers."""
    a, b, za = _ints(np.uint8, (5, 40)), _ints(np.int8, (40, 7)), _ints(np.uint8, (5,))
    model = node_model("MatMulInteger", {"a": a}, {"b": b, "za": za}, TensorProto.INT32, ["a", "b", "za"], 10)
    ours = compile_to_model(model, tmp).run({"a": a})["y"]
    np.testing.assert_array_equal(ours, (a.astype(np.int64) - za[:, None]) @ b.astype(np.int64))


@pytest.mark.parametrize("k", [258, 1000])
def test_matmul_integer_bound(tmp, k):
    """Full 8-bit ranges (onnxruntime's u8s8 kernel saturates here: numpy's exact integers are the reference):
    exact while K * 255 * 255 < 2**24 (K <= 258), within (K - 1) * 2**-24 * sum|a_k b_k| beyond."""
    a = np.full((4, k), 255, np.uint8)
    a[1] = _ints(np.uint8, (k,))
    b = np.where(RNG.random((k, 3)) < 0.5, -128, 127).astype(np.int8)
    weights = {"b": b, "za": np.asarray(0, np.uint8)}
    model = node_model("MatMulInteger", {"a": a}, weights, TensorProto.INT32, ["a", "b", "za"], 10)
    ours = compile_to_model(model, tmp).run({"a": a})["y"].astype(np.int64)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    bound = (k - 1) * 2.0**-24 * (np.abs(a.astype(np.int64)) @ np.abs(b.astype(np.int64)))
    if k * 255 * 128 < 2**24:
        np.testing.assert_array_equal(ours, exact)
    assert np.all(np.abs(ours - exact) <= bound)


@pytest.mark.parametrize("cast", ["bf16", "fp16"])
def test_integer_products_exact_under_auto_cast(tmp, cast):
    """Integers of magnitude up to 256 are exact in bf16 and fp16: narrowing the operands changes nothing."""
    a, b = _ints(np.uint8, (6, 200)), _ints(np.int8, (200, 9))
    model = node_model("MatMulInteger", {"a": a}, {"b": b, "za": np.asarray(1, np.uint8)}, TensorProto.INT32,
                       ["a", "b", "za"], 10)
    ours = compile_to_model(model, tmp, Options(auto_cast="matmult", auto_cast_type=cast)).run({"a": a})["y"]
    np.testing.assert_array_equal(ours, (a.astype(np.int64) - 1) @ b.astype(np.int64))


@pytest.mark.parametrize("pads", [[0, 0, 0, 0], [1, 1, 1, 1]], ids=["valid", "padded"])
def test_conv_integer(tmp, pads):
    """Padding is with x's zero point: subtracting it first makes Conv's zero padding exactly that."""
    x, w = _ints(np.uint8, (1, 3, 6, 6)), _ints(np.uint8, (4, 3, 3, 3))
    weights = {"w": w, "zx": np.asarray(100, np.uint8), "zw": np.asarray(7, np.uint8)}
    model = node_model("ConvInteger", {"x": x}, weights, TensorProto.INT32, ["x", "w", "zx", "zw"], 10,
                       pads=pads, strides=[1, 2])
    assert_equal(*ours_and_ort(model, {"x": x}, tmp))


@pytest.mark.parametrize("types", [(np.uint8, np.int8, np.uint8), (np.uint8, np.uint8, np.uint8),
                                   (np.int8, np.int8, np.int8)], ids=["u8s8", "u8u8", "s8s8"])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul(tmp, types, per_column):
    ta, tb, ty = types
    a, b = _ints(ta, (3, 4, 64)), _ints(tb, (64, 10), bits=7 if tb is np.int8 else 8)
    n = 10 if per_column else 1
    weights = {"sa": np.asarray(0.02, np.float32), "za": np.asarray(7, ta), "b": b,
               "sb": np.linspace(0.001, 0.01, n).astype(np.float32).reshape((n,) if per_column else ()),
               "zb": np.zeros((n,) if per_column else (), tb), "sy": np.asarray(0.7, np.float32),
               "zy": np.asarray(1, ty)}
    model = node_model("QLinearMatMul", {"a": a}, weights, TYPES[np.dtype(ty)], ["a", *weights], 10)
    ours, ref = ours_and_ort(model, {"a": a}, tmp)
    assert ours["y"].dtype == ref["y"].dtype and steps_apart(ours["y"], ref["y"]) <= 1


@pytest.mark.parametrize("group", [1, 2])
def test_qlinear_conv(tmp, group):
    """Per-output-channel weight scales, an int32 bias, padding and strides."""
    x, w = _ints(np.uint8, (1, 4, 7, 7)), _ints(np.int8, (6, 4 // group, 3, 3), bits=7)
    weights = {"sx": np.asarray(0.05, np.float32), "zx": np.asarray(120, np.uint8), "w": w,
               "sw": np.linspace(0.002, 0.02, 6).astype(np.float32), "zw": np.zeros(6, np.int8),
               "sy": np.asarray(0.3, np.float32), "zy": np.asarray(128, np.uint8),
               "bias": RNG.integers(-5000, 5000, 6).astype(np.int32)}
    model = node_model("QLinearConv", {"x": x}, weights, U8, ["x", *weights], 10, pads=[1, 1, 1, 1],
                       strides=[2, 1], group=group)
    ours, ref = ours_and_ort(model, {"x": x}, tmp)
    assert steps_apart(ours["y"], ref["y"]) <= 1


DYNAMIC_INPUTS = {"both_signs": X, "positive": X - X.min(), "negative": X - X.max(), "zeros": 0 * X}


@pytest.mark.parametrize("x", DYNAMIC_INPUTS.values(), ids=DYNAMIC_INPUTS.keys())
def test_dynamic_quantize_linear(tmp, x):
    """The scale from the range widened to hold 0 (1 for an all-zero x), the zero point rounded, the values
    quantized: onnxruntime's exactly (the same fp32 operations in the same order)."""
    model = node_model("DynamicQuantizeLinear", {"x": x}, {}, U8, ["x"], 11, n_out=3)
    assert_equal(*ours_and_ort(model, {"x": x}, tmp))


def test_nodes_sharing_a_name(tmp):
    """ONNX does not require unique node names: two expansions under one name keep their values apart."""
    weights = {"s": np.asarray(0.5, np.float32), "z": np.asarray(3, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quant"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="quant")]
    model = make_model(nodes, {"x": ([2, 4, 6], F32)}, {"y": ([2, 4, 6], F32)}, weights, opset=13)
    ours = compile_to_model(model, tmp).run({"x": X})
    model.graph.node[1].name = "dequant"  # onnxruntime insists on unique names
    assert_equal(ours, onnxruntime_outputs(model, {"x": X}))


def test_int4_expands_as_int8_does():
    """int4 is held in a byte: QuantizeLinear to it rounds and saturates to [-8, 7] like any integer type (its
    values: tests/compiler/test_small_types.py)."""
    model = node_model("QuantizeLinear", {"x": X}, {"s": np.asarray(1.0, np.float32)}, TensorProto.INT4,
                       ["x", "s"], 21, output_dtype=TensorProto.INT4)
    graph = prepare(model, Options())
    assert [n.op for n in graph.nodes][-1] == "SaturatingCast"
    assert not unsupported_nodes(graph)


def test_constant_weights_fold():
    """A dequantized constant weight is a compile-time fp32 constant: nothing left that reads only constants."""
    graph = prepare(onnx.load(os.path.join(MODELS_DIR, "cnn_qdq.onnx")), Options())
    assert not [n.op for n in graph.nodes if n.op in ("DequantizeLinear", "QuantizeLinear")]
    assert all(not all(graph.tensors[i].is_constant for i in n.inputs if i) for n in graph.nodes)


# ---- the bundled quantized models, layer by layer ---------------------------------------------------------------

QUANTIZING = ("QuantizeLinear", "DynamicQuantizeLinear", "MatMulInteger")


def _layers(model: onnx.ModelProto) -> list[tuple[list[str], str]]:
    """(inputs, output) of each layer: from the quantized tensors (and model inputs) it reads to the quantized
    tensor it writes (a QuantizeLinear's or DynamicQuantizeLinear's first output, an integer matmul's)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    constants = {i.name for i in model.graph.initializer}
    quantized = {o for n in model.graph.node if n.op_type in QUANTIZING for o in n.output}

    def reads(target: str) -> list[str]:
        found, seen, stack = set(), set(), [i for i in producers[target].input if i]
        while stack:
            name = stack.pop()
            if name in seen or name in constants:
                continue
            seen.add(name)
            if name in quantized or name not in producers:
                found.add(name)
            else:
                stack.extend(i for i in producers[name].input if i)
        return sorted(found)

    return [(reads(n.output[0]), n.output[0]) for n in model.graph.node if n.op_type in QUANTIZING]


@pytest.mark.parametrize("name, steps", [("cnn_qdq", 1), ("attention_int8", 0)])
def test_each_layer_within_one_step(tmp, name, steps):
    """Each quantized tensor, compiled as its own layer and fed the quantized inputs onnxruntime's whole-model run
    gives it, is onnxruntime's (which fuses QDQ layers into its integer kernels, requantizing in fixed point) or one
    step from it; a dynamically quantized layer (DynamicQuantizeLinear, MatMulInteger's exact int32) bit for bit."""
    model = onnx.shape_inference.infer_shapes(onnx.load(os.path.join(MODELS_DIR, f"{name}.onnx")))
    layers = _layers(model)
    assert len(layers) >= 4
    typed = {v.name: v for v in (*model.graph.value_info, *model.graph.input, *model.graph.output)}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    wanted = {r for reads, _ in layers for r in reads} - {v.name for v in (*model.graph.input, *model.graph.output)}
    probe.graph.output.extend(typed[n] for n in sorted(wanted))
    rng = np.random.default_rng(0)
    inputs = {vi.name: rng.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
              for vi in model.graph.input}  # both models take one float tensor
    values = onnxruntime_outputs(probe, inputs) | inputs
    extractor = Extractor(model)
    for reads, writes in layers:
        layer = extractor.extract_model(reads, [writes])
        feeds = {r: values[r] for r in reads}
        ours = compile_to_model(layer, tmp).run(feeds)[writes]
        assert steps_apart(ours, onnxruntime_outputs(layer, feeds)[writes]) <= steps, writes


def test_a_dynamically_quantized_transformer_matches_bit_for_bit(tmp):
    """attention_int8 whole (quantize_dynamic's DynamicQuantizeLinear + MatMulInteger + Cast + Mul by the two
    scales around an fp32 attention): onnxruntime's unoptimised output bit for bit. Each scale is a division and
    each zero point rounds half to even as the spec writes them, and the integer products are exact. What can still
    differ is the fp32 attention MatMuls' rounding (ours sums in float64 and rounds once, onnxruntime's sgemm in
    fp32): quantization absorbs it unless it moves a DynamicQuantizeLinear's range by an ulp (2 of 40 seeded
    inputs here, then one fp32 ulp, 4.8e-7)."""
    import onnxruntime

    model = onnx.load(os.path.join(MODELS_DIR, "attention_int8.onnx"))
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    compiled = compile_to_model(model, tmp)
    for seed in range(3):
        x = {"x": (np.random.default_rng(seed).standard_normal((1, 8, 32)) * (seed + 1)).astype(np.float32)}
        assert_equal(compiled.run(x), dict(zip(["y"], session.run(["y"], x))))
