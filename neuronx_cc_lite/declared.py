"""Weights declared but not present: a constant with a shape and a type and no values, to compile and time a model
larger than this machine (Llama-3-70B's 140 GB of bf16) from its shapes alone.

An ONNX initializer with dimensions and no data (no raw_data, no typed values, no external data) is imported as a
`Declared` array. It is a read-only numpy array whose every element is one zero (all strides 0), so it costs one
element of memory whatever its shape. Views of it (slices, transposes, reshapes) are views of that element; every
numpy operation that would make a new array from it (a cast, a copy, an elementwise function, a concatenation)
returns a `Declared` of the result's shape and type instead, computed from a one-element stand-in, so that no pass,
partitioning or lowering ever holds a declared weight's bytes. Laying one out in HBM (`tobytes`) gives `Absent`:
its length and no bytes.

The compiler treats a declared weight like any other constant: the program is the one the weights would give, and
only the bytes differ (tests/compiler/test_declared.py holds that the streams are identical). The bundle leaves
those bytes out and says so (flags "weights": "declared"): it can be timed (`info`, `profile`, runtime.profile
`timed_run`), whose timing never depends on values, and the runtime refuses to run it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

DECLARED_FLAG = "declared"  # the bundle's flags["weights"] when some weight bytes are absent


class Absent:
    """The bytes of a declared weight laid out: only their count."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = int(nbytes)

    def __len__(self) -> int:
        return self.nbytes

    def __repr__(self) -> str:
        return f"Absent({self.nbytes})"


def declared(shape: tuple[int, ...], dtype: Any) -> Declared:
    """A declared array of `shape` and `dtype`."""
    one = np.zeros((), np.dtype(dtype))
    view = np.lib.stride_tricks.as_strided(one, tuple(int(n) for n in shape), (0,) * len(shape), writeable=False)
    return view.view(Declared)


def is_declared(value: Any) -> bool:
    return isinstance(value, Declared)


def contiguous(value: Any, dtype: Any = None) -> np.ndarray:
    """np.ascontiguousarray that keeps a declared weight declared (numpy's own would copy out its elements)."""
    if isinstance(value, Declared):
        return declared(value.shape, dtype if dtype is not None else value.dtype)
    return np.ascontiguousarray(value, dtype=dtype)


def no_data(init: Any, raw: bytes | None = None) -> bool:
    """Whether an ONNX initializer (TensorProto) declares elements and carries none of them: no raw_data, no typed
    values, no external data. `raw`: its raw_data when the caller has taken it (each access copies the bytes)."""
    if init.data_location == 1 or math.prod(init.dims) == 0:  # 1: TensorProto.EXTERNAL
        return False
    if init.raw_data if raw is None else raw:
        return False
    fields = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
    return not any(len(getattr(init, f)) for f in fields)


def _plain(x: Any) -> Any:
    """A Declared as the plain zero-stride array it views (nested in lists and tuples too)."""
    if isinstance(x, Declared):
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    return x


def _stand_in(x: Any) -> Any:
    """An argument of an elementwise function as one element of its type: enough to find the result's type."""
    if isinstance(x, np.ndarray):
        return np.zeros((), x.dtype)
    return x


_COPIES = frozenset({np.ascontiguousarray, np.asfortranarray, np.copy, np.array, np.asarray})


def _as_declared(result: Any) -> Any:
    if isinstance(result, np.ndarray) and not isinstance(result, Declared):
        return declared(result.shape, result.dtype)
    if isinstance(result, tuple):
        return tuple(_as_declared(r) for r in result)
    return result


class Declared(np.ndarray):
    """A weight's shape and type without its values (module docstring)."""

    def __array_finalize__(self, obj: Any) -> None:
        return None

    # -- what makes a new array: a Declared of its shape and type, never the elements --------------------------

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if kwargs.get("out") is not None:
            raise TypeError(f"a declared weight has no values to write ({ufunc.__name__} with out=)")
        if method == "__call__":
            shape = np.broadcast_shapes(*(np.shape(x) for x in inputs))
            one = ufunc(*(_stand_in(x) for x in inputs), **kwargs)
            if isinstance(one, tuple):
                return tuple(declared(shape, np.asarray(o).dtype) for o in one)
            return declared(shape, np.asarray(one).dtype)
        # reduce, accumulate, ...: on the zero-stride views (the work of one pass over the shape, no copy of it)
        return _as_declared(getattr(ufunc, method)(*_plain(inputs), **kwargs))

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func in _COPIES:  # the same shape, maybe another type: no need to copy the zero-stride view
            a, dtype = args[0], kwargs.get("dtype", args[1] if len(args) > 1 else None)
            return declared(np.shape(a), dtype if dtype is not None else a.dtype)
        if func in (np.concatenate, np.stack):
            arrays, axis = args[0], kwargs.get("axis", args[1] if len(args) > 1 else 0)
            small = [np.zeros(tuple(min(n, 1) if k != axis % max(1, np.ndim(x)) or func is np.stack else n
                                    for k, n in enumerate(np.shape(x))), np.asarray(x[(0,) * 0]).dtype)
                     for x in arrays]
            like = func(small, axis=axis)
            shape = list(like.shape)
            for k in range(len(shape)):
                if k != axis % len(shape):
                    shape[k] = np.shape(arrays[0])[k if func is np.concatenate or k < axis % len(shape) else k - 1]
            return declared(tuple(shape), like.dtype)
        result = func(*_plain(args), **_plain(kwargs))
        if isinstance(result, np.ndarray) and result.size and all(s == 0 for s in result.strides):
            return result.view(Declared)  # a view of the one element: still declared
        return _as_declared(result)

    def astype(self, dtype: Any, *args: Any, **kwargs: Any) -> Declared:  # type: ignore[override]
        return declared(self.shape, dtype)

    def copy(self, order: str = "C") -> Declared:  # type: ignore[override]
        return declared(self.shape, self.dtype)

    def tobytes(self, order: str = "C") -> Absent:  # type: ignore[override]
        return Absent(math.prod(self.shape) * self.dtype.itemsize)

    def __reduce__(self) -> Any:  # pickled (the compile cache's key, a process pool) as what it is
        return declared, (self.shape, self.dtype)
