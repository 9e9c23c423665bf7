"""The independent reference: onnxruntime, and seeded inputs to compare with."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from isa.bundle import Bundle, TensorInfo
from isa.dtypes import DType, numpy_type


def seeded_inputs(infos: list[TensorInfo], seed: int = 0,
                  ranges: Mapping[str, Sequence[int]] | None = None) -> dict[str, np.ndarray]:
    """Inputs for a comparison run: standard normal floats, random booleans, and integers drawn from the input's
    [low, high) in `ranges` (what its consumers accept, as the compiler records it: bundle_inputs), else small
    non-negative ones (valid token ids for any vocabulary of 8 or more); an integer input without a range whose
    name says it is a mask gets 0s and 1s with every row starting with a 1, as attention masks do."""
    rng = np.random.default_rng(seed)
    ranges = ranges or {}
    inputs = {}
    for info in infos:
        dtype = numpy_type(info.dtype)
        if dtype == np.bool_:
            inputs[info.name] = rng.random(info.shape) < 0.5
        elif np.issubdtype(dtype, np.integer) and info.name in ranges:
            low, high = ranges[info.name]
            inputs[info.name] = rng.integers(low, high, info.shape).astype(dtype)
        elif np.issubdtype(dtype, np.integer) and "mask" in info.name.lower():
            mask = rng.random(info.shape) < 0.75
            if mask.ndim:
                mask[..., 0] = True
            inputs[info.name] = mask.astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            inputs[info.name] = rng.integers(0, 8, info.shape).astype(dtype)
        else:
            inputs[info.name] = rng.standard_normal(info.shape).astype(dtype)
    return inputs


def bundle_inputs(bundle: Bundle, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for a compiled model, integers inside the ranges the compiler recorded for them."""
    return seeded_inputs(bundle.inputs, seed, bundle.stats.get("input_ranges"))


def onnxruntime_session(model: onnx.ModelProto, threads: int = 0, optimize: bool = True) -> Any:
    """An onnxruntime session on the CPU, quiet; `threads` 0 lets onnxruntime choose; `optimize` False runs the
    graph as it is (no fusion, no cast elimination)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def onnxruntime_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray],
                        optimize: bool = True) -> dict[str, np.ndarray]:
    """onnxruntime's outputs; a model or inputs it refuses raise CompileError NCC_REFERENCE."""
    from neuronx_cc_lite.errors import CompileError

    try:
        session = onnxruntime_session(model, optimize=optimize)
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, inputs)))
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types (Fail, InvalidGraph, ...) and more
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CompileError("NCC_REFERENCE", f"onnxruntime, the reference, cannot run the model: {first}") from None


def special_mismatches(actual: np.ndarray, expected: np.ndarray) -> int:
    """How many elements are NaN on one side only, or infinite on one side and not the same infinity on the
    other: such positions are compared, not subtracted (inf - inf is NaN, and a NaN is no error size)."""
    if actual.dtype.kind not in "fc" and expected.dtype.kind not in "fc":
        return 0
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    nan = np.isnan(a) != np.isnan(e)
    inf = (np.isinf(a) | np.isinf(e)) & (a != e) & ~np.isnan(a) & ~np.isnan(e)
    return int(np.count_nonzero(nan | inf))


def _finite_both(actual: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The elements finite on both sides, as float64 (the others are compared by `special_mismatches`)."""
    a, e = actual.astype(np.float64).ravel(), expected.astype(np.float64).ravel()
    keep = np.isfinite(a) & np.isfinite(e)
    return a[keep], e[keep]


def compare(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """Max absolute error over the elements finite on both sides, and the same relative to the largest finite
    expected magnitude; inf if some inf or NaN is not matched in position (special_mismatches)."""
    if actual.shape != expected.shape:
        raise ValueError(f"shape {actual.shape}, expected {expected.shape}")
    if special_mismatches(actual, expected):
        return float("inf"), float("inf")
    a, e = _finite_both(actual, expected)
    if a.size == 0:
        return 0.0, 0.0
    worst = float(np.abs(a - e).max())
    scale = float(np.abs(e).max())
    return worst, worst / scale if scale > 0 else worst


def within(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> bool:
    """Every inf and NaN where the reference has it, and the finite elements within rtol and atol; integers and
    booleans exactly (an int64 past 2^53 has no float64 to be close in)."""
    if actual.shape != expected.shape or special_mismatches(actual, expected):
        return False
    if actual.dtype.kind in "biu" and expected.dtype.kind in "biu":
        return bool(np.array_equal(actual, expected))
    a, e = _finite_both(actual, expected)
    return bool(np.allclose(a, e, rtol=rtol, atol=atol))


def error_over_rms(actual: np.ndarray, expected: np.ndarray) -> float:
    """max |actual - expected| over the root-mean-square of expected, both over the elements finite on both sides
    (inf when an inf or NaN is not matched in position): the measure auto-cast bounds are given in."""
    if special_mismatches(actual, expected):
        return float("inf")
    a, e = _finite_both(actual, expected)
    if e.size == 0:
        return 0.0
    rms = float(np.sqrt(np.mean(e * e)))
    worst = float(np.max(np.abs(a - e)))
    return worst / rms if rms > 0 else worst


# The cast's own error (check under auto-cast): onnxruntime with the values auto-cast narrows rounded to the cast
# type, which tells a model that does not take the narrow type from a compiler that computes it badly.
# The operands --auto-cast matmult narrows (neuronx_cc_lite/precision.py), by operator: input positions
MATMULT_OPERANDS = {"MatMul": (0, 1), "Gemm": (0, 1), "Conv": (0, 1), "ConvTranspose": (0, 1)}
# The cast types as ONNX names them, and the opset whose Cast first takes each
_ONNX_TYPES = {"bf16": (onnx.TensorProto.BFLOAT16, 13), "fp16": (onnx.TensorProto.FLOAT16, 6),
               "fp8_e4m3": (onnx.TensorProto.FLOAT8E4M3FN, 19), "fp8_e5m2": (onnx.TensorProto.FLOAT8E5M2, 19)}


def cast_only_model(model: onnx.ModelProto, mode: str, cast_type: str) -> onnx.ModelProto | None:
    """`model` with what `--auto-cast mode` narrows rounded to `cast_type` and back to fp32 (a Cast there and back):
    the float operands of MatMul, Gemm, Conv and ConvTranspose, and with `all` every fp32 value a node of the main
    graph writes that is not a graph output, and the fp32 constants, which saturate to the type's largest finite
    value as auto-cast's do (computed values round as IEEE/OCP conversion does: no saturation). Bodies of If, Loop
    and Scan, recurrent operators' own products and quantized operators are left as they are, and the compiler's
    own rewrites (a batch norm folded into a weight before it is rounded) are not made. None where the model's
    opset has no Cast to the type (bf16 needs 13, fp8 19). Run it unoptimised: onnxruntime's optimiser may drop a
    Cast there and back."""
    import ml_dtypes
    from onnx import helper, numpy_helper

    onnx_type, opset = _ONNX_TYPES[cast_type]
    if next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0) < opset:
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    try:  # the types of the values between nodes
        out = onnx.shape_inference.infer_shapes(out)
    except Exception:  # noqa: BLE001 - onnx raises several types; the values it cannot type stay unrounded
        pass
    g = out.graph
    is_fp32 = {i.name for i in g.initializer if i.data_type == onnx.TensorProto.FLOAT}
    is_fp32 |= {v.name for v in [*g.input, *g.value_info, *g.output]
                if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    saturate = [helper.make_attribute("saturate", 0)] if cast_type.startswith("fp8") else []
    nodes: list[onnx.NodeProto] = []
    made: dict[str, str] = {}  # a value -> its rounded copy (once, however many read it)
    taken = {name for n in g.node for name in [*n.input, *n.output]} | {i.name for i in g.initializer}

    def rounded(name: str) -> str:
        if name not in made:
            narrow, back = (_fresh(f"{name}__{cast_type}{suffix}", taken) for suffix in ("", "_fp32"))
            cast = helper.make_node("Cast", [name], [narrow], to=onnx_type)
            cast.attribute.extend(saturate)
            nodes.extend([cast, helper.make_node("Cast", [narrow], [back], to=onnx.TensorProto.FLOAT)])
            made[name] = back
        return made[name]

    if mode == "all":
        kind = DType[cast_type].np
        largest = float(ml_dtypes.finfo(kind).max)
        for t in g.initializer:
            if t.data_type == onnx.TensorProto.FLOAT:
                values = np.clip(numpy_helper.to_array(t), -largest, largest).astype(kind).astype(np.float32)
                t.CopyFrom(numpy_helper.from_array(values, t.name))
    outputs = {o.name for o in g.output}
    renamed: dict[str, str] = {}  # under all: a value -> its rounded copy, which every later reader takes
    for node in list(g.node):
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
        for i in MATMULT_OPERANDS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ():
            if i < len(node.input) and node.input[i] in is_fp32:
                node.input[i] = rounded(node.input[i])
        nodes.append(node)
        if mode == "all":
            for name in node.output:
                if name and name in is_fp32 and name not in outputs:
                    renamed[name] = rounded(name)
    del g.node[:]
    g.node.extend(nodes)
    return out


def _fresh(name: str, taken: set[str]) -> str:
    """`name`, or with a number after it, not among `taken` (which it joins)."""
    found, n = name, 0
    while found in taken:
        n += 1
        found = f"{name}_{n}"
    taken.add(found)
    return found
