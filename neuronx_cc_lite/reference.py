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
    session = onnxruntime_session(model)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs)))


def compare(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """Max absolute error, and max error relative to the largest expected magnitude."""
    if actual.shape != expected.shape:
        raise ValueError(f"shape {actual.shape}, expected {expected.shape}")
    if actual.size == 0:
        return 0.0, 0.0
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(e)
    diff = np.where(both_nan, 0.0, np.abs(a - e))
    diff = np.where(np.isnan(diff), np.inf, diff)
    scale = float(np.nanmax(np.abs(np.where(np.isinf(e), 0.0, e)))) if np.isfinite(e).any() else 0.0
    worst = float(diff.max())
    return worst, worst / scale if scale > 0 else worst


def within(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> bool:
    if actual.shape != expected.shape:
        return False
    return bool(np.allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                            equal_nan=True))


def error_over_rms(actual: np.ndarray, expected: np.ndarray) -> float:
    """max |actual - expected| over the root-mean-square of expected: the measure auto-cast bounds are given in."""
    if expected.size == 0:
        return 0.0
    e = expected.astype(np.float64)
    rms = float(np.sqrt(np.mean(e * e)))
    worst = float(np.max(np.abs(actual.astype(np.float64) - e)))
    return worst / rms if rms > 0 else worst
