"""The device type each ONNX element type is held in, or None for the types the device does not hold: the
registry refuses a node over those (registry.why_unsupported), and the lowerings lay every tensor out in its
device type (lower/context.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from isa.dtypes import DType
from neuronx_cc_lite.ir import Graph, Node

# ONNX element types the device holds, and the device type each is held in. The engines have no 64-bit types:
# float64 is computed in fp32 (as neuronx-cc does) and int64 (indices, shapes) held as int32, the runtime
# converting at the model's inputs and outputs; bool is uint8.
_DEVICE_TYPES = {
    np.dtype(np.float32): DType.fp32,
    np.dtype(np.float64): DType.fp32,
    np.dtype(np.float16): DType.fp16,
    np.dtype(np.int32): DType.int32,
    np.dtype(np.int64): DType.int32,
    np.dtype(np.int16): DType.int16,
    np.dtype(np.int8): DType.int8,
    np.dtype(np.uint8): DType.uint8,
    np.dtype(np.uint16): DType.uint16,
    np.dtype(np.uint32): DType.uint32,
    np.dtype(np.bool_): DType.uint8,
    # ONNX's 4- and 2-bit integers, each held in a byte (sign-extended), as int64 is held in int32
    np.dtype(ml_dtypes.int4): DType.int8,
    np.dtype(ml_dtypes.int2): DType.int8,
    np.dtype(ml_dtypes.uint4): DType.uint8,
    np.dtype(ml_dtypes.uint2): DType.uint8,
    # the floats no engine writes, held in a wider float that holds each of their values exactly: a Cast to one
    # rounds to its grid on the engines (cast.py), the runtime converting at the model's inputs and outputs
    np.dtype(ml_dtypes.float8_e4m3fnuz): DType.fp16,
    np.dtype(ml_dtypes.float8_e5m2fnuz): DType.fp16,
    np.dtype(ml_dtypes.float4_e2m1fn): DType.fp16,
    np.dtype(ml_dtypes.float8_e8m0fnu): DType.fp32,
}


def device_dtype(dtype: np.dtype) -> DType | None:
    dtype = np.dtype(dtype)
    if dtype in _DEVICE_TYPES:
        return _DEVICE_TYPES[dtype]
    try:
        return DType.from_numpy(dtype)  # bf16 and the fp8 types, through ml_dtypes
    except ValueError:
        return None


def is_float(g: Graph, name: str) -> bool:
    held = device_dtype(g.tensors[name].dtype)
    return held is not None and held.is_float


def floats_only(node: Node, g: Graph) -> str | None:
    """Why a node of a floats-only op (its registry entry's `floats`) cannot be lowered: an input or output that
    is not held in a float type."""
    for name in (*node.inputs, *node.outputs):
        if name and not is_float(g, name):
            return f"{node.op} on {g.tensors[name].dtype} tensors is not supported (floating point only)"
    return None
