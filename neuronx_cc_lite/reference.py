"""The independent reference: onnxruntime, and seeded inputs to compare with."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from isa.bundle import Bundle, TensorInfo
from isa.dtypes import numpy_type


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


def onnxruntime_session(model: onnx.ModelProto, threads: int = 0) -> Any:
    """An onnxruntime session on the CPU, quiet; `threads` 0 lets onnxruntime choose."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def onnxruntime_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime's outputs; a model or inputs it refuses raise CompileError NCC_REFERENCE."""
    from neuronx_cc_lite.errors import CompileError

    try:
        session = onnxruntime_session(model)
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
