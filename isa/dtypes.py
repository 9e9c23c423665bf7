"""Element types an instruction operand may carry, with their numpy equivalents.

The low-precision floats come from ml_dtypes; fp8_e4m3 is the "fn" variant (no infinities, one NaN pattern),
which is what the Neuron docs and ONNX's FLOAT8E4M3FN describe.
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class DType(enum.IntEnum):
    fp32 = 0
    bf16 = 1
    fp16 = 2
    fp8_e4m3 = 3
    fp8_e5m2 = 4
    int8 = 5
    int16 = 6
    int32 = 7
    uint8 = 8
    uint16 = 9
    uint32 = 10

    @property
    def np(self) -> np.dtype:
        return _NUMPY[self]

    @property
    def size(self) -> int:
        return _SIZES[self]  # (a table: asked for every operand the compiler costs, checks or places)

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @classmethod
    def from_numpy(cls, dtype: np.dtype) -> DType:
        dtype = np.dtype(dtype)
        if dtype == np.bool_:
            return cls.uint8
        for member, np_dtype in _NUMPY.items():
            if np_dtype == dtype:
                return member
        raise ValueError(f"no device dtype for numpy dtype {dtype}")


_NUMPY: dict[DType, np.dtype] = {
    DType.fp32: np.dtype(np.float32),
    DType.bf16: np.dtype(ml_dtypes.bfloat16),
    DType.fp16: np.dtype(np.float16),
    DType.fp8_e4m3: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.fp8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
    DType.int8: np.dtype(np.int8),
    DType.int16: np.dtype(np.int16),
    DType.int32: np.dtype(np.int32),
    DType.uint8: np.dtype(np.uint8),
    DType.uint16: np.dtype(np.uint16),
    DType.uint32: np.dtype(np.uint32),
}
_SIZES: dict[DType, int] = {member: np_dtype.itemsize for member, np_dtype in _NUMPY.items()}
_FLOATS = frozenset({DType.fp32, DType.bf16, DType.fp16, DType.fp8_e4m3, DType.fp8_e5m2})


def not_held(values: np.ndarray, held: DType) -> np.ndarray | None:
    """Where a host array's values would not survive being held in `held` (None: everywhere they would). An integer
    outside the held type's range would wrap (an int64 held as int32); a float64 held as fp32 is refused where it is
    finite and nonzero but outside fp32's normal range: past its largest value it would become inf, below its
    smallest normal it would lose its precision (subnormals) or become zero. Other narrowings round, as the device
    computes (float64 values in fp32)."""
    values = np.asarray(values)
    if values.size == 0:
        return None
    if values.dtype.kind in "iu" and held.np.kind in "iu":
        info = np.iinfo(held.np)
        if np.iinfo(values.dtype).min >= info.min and np.iinfo(values.dtype).max <= info.max:
            return None
        outside = (values < info.min) | (values > info.max)
    elif values.dtype == np.float64 and held is DType.fp32:
        magnitude = np.abs(values)
        normal = np.finfo(np.float32)
        outside = ((magnitude > normal.max) & (magnitude < np.inf)) | ((magnitude > 0) & (magnitude < normal.tiny))
    else:
        return None
    return outside if outside.any() else None


def numpy_type(name: str | np.dtype) -> np.dtype:
    """The numpy type a tensor's type name (a bundle's `dtype`) names. ml_dtypes' names come first: to numpy alone
    "int4", "uint4", "int2" and "uint2" are the 4- and 2-byte integers."""
    if not isinstance(name, str):
        return np.dtype(name)
    found = getattr(ml_dtypes, name, None)
    return np.dtype(found) if isinstance(found, type) else np.dtype(name)
