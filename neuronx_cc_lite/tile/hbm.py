"""Tensors in HBM and strided views of them.

Every graph tensor the device touches lives in HBM as an `HbmTensor` (laid out by codegen/allocate.py) and is
read through an `HbmView`: an element offset, a shape and element strides, like a numpy view. Reshape (of a
view whose axes allow it), Transpose, Slice, Expand and Squeeze only make new views; data moves when a DMA reads one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from isa.dtypes import DType
from isa.tensor_kind import TensorKind


@dataclass(eq=False)
class HbmTensor:
    name: str
    nbytes: int
    kind: TensorKind
    dtype: DType
    data: bytes | memoryview | None = None  # weights (a memoryview: the bytes of the array laid out, not a copy)
    offset: int | None = None  # bytes, set by the HBM layout
    # (outer, rows, inner) sizes: how its producer lays it out on partitions (codegen/on_chip.py), if known
    layout: tuple[int, int, int] | None = None
    # a weight laid out with zeros (a depthwise convolution's diagonal blocks): the bytes of the model's own data
    # it holds, which is all a program needs to read (the roofline counts these)
    needed: int | None = None

    def __post_init__(self) -> None:  # a plain string would compare equal to its kind but fail every `is` test
        assert isinstance(self.kind, TensorKind), f"HBM tensor {self.name}: kind {self.kind!r} is not a TensorKind"


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


# A strided view reshapes in place only when it reads runs of at least this many bytes: DMA pieces under 512
# bytes are overhead-bound (CHIP.md), and a GRU's gates sliced across time steps would be read 72 bytes a piece
# by each reader where one copy moves whole rows.
MIN_VIEW_RUN_BYTES = 512


def reshaped_strides(shape: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...]
                     ) -> tuple[int, ...] | None:
    """The strides that read a strided view's elements, in the same order, with shape `new`; None when there are
    none (numpy's no-copy reshape). Size-1 axes are dropped; then the old and new axes are cut into runs of equal
    product, and a run of old axes that are laid out one inside the other (stride = next stride x next size)
    becomes its new axes with strides derived from its innermost stride (a broadcast axis keeps stride 0)."""
    if 0 in shape:
        return None
    old = [(n, s) for n, s in zip(shape, strides) if n != 1]
    result = [1] * len(new)
    o = i = 0
    while o < len(old):
        while i < len(new) and new[i] == 1:
            i += 1
        o_end, i_end = o + 1, i + 1
        o_size, i_size = old[o][0], new[i]
        while o_size != i_size:
            if i_size < o_size:
                i_size *= new[i_end]
                i_end += 1
            else:
                o_size *= old[o_end][0]
                o_end += 1
        if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(o, o_end - 1)):
            return None
        step = old[o_end - 1][1]
        for k in reversed(range(i, i_end)):
            result[k] = step
            step *= new[k]
        o, i = o_end, i_end
    return tuple(result)


@dataclass(frozen=True)
class HbmView:
    tensor: HbmTensor
    dtype: DType
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # elements
    offset: int = 0  # elements

    @classmethod
    def whole(cls, tensor: HbmTensor, dtype: DType, shape: tuple[int, ...]) -> HbmView:
        return cls(tensor, dtype, tuple(shape), contiguous_strides(tuple(shape)))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def is_contiguous(self) -> bool:
        return all(s == c for n, s, c in zip(self.shape, self.strides, contiguous_strides(self.shape)) if n > 1)

    def reshape(self, shape: tuple[int, ...]) -> HbmView | None:
        """The view with a new shape, or None when the data must be copied first: a strided view reshapes in place
        when numpy's would (`reshaped_strides`), as a key/value head broadcast to the query heads it serves does."""
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        if self.is_contiguous:
            return HbmView(self.tensor, self.dtype, tuple(shape), contiguous_strides(tuple(shape)), self.offset)
        strides = reshaped_strides(self.shape, self.strides, tuple(shape))
        if strides is None or self.run_bytes() < MIN_VIEW_RUN_BYTES:
            return None  # (copied once in whole rows, rather than read a few bytes a piece by every reader)
        return HbmView(self.tensor, self.dtype, tuple(shape), strides, self.offset)

    def unit_axes_changed(self, shape: tuple[int, ...]) -> HbmView | None:
        """The view with size-1 axes inserted or removed (an Unsqueeze, a Squeeze), or None when `shape` changes
        more than that. Always a view, whatever its runs: its readers read what they would read of this view, so a
        copy would only add one more pass over the same short runs."""
        if [n for n in shape if n != 1] != [n for n in self.shape if n != 1]:
            return None
        strides = reshaped_strides(self.shape, self.strides, tuple(shape))
        return None if strides is None else HbmView(self.tensor, self.dtype, tuple(shape), strides, self.offset)

    def run_bytes(self) -> int:
        """The bytes of the longest contiguous run the view reads at a time (its innermost axes, one inside the
        other)."""
        run = 1
        for n, stride in reversed([(n, st) for n, st in zip(self.shape, self.strides) if n > 1]):
            if stride != run:
                break
            run *= n
        return run * self.dtype.size

    def transpose(self, perm: tuple[int, ...]) -> HbmView:
        return HbmView(self.tensor, self.dtype, tuple(self.shape[p] for p in perm),
                       tuple(self.strides[p] for p in perm), self.offset)

    def broadcast_to(self, shape: tuple[int, ...]) -> HbmView:
        """numpy broadcasting: align on the right, stretch size-1 axes with stride 0."""
        pad = len(shape) - len(self.shape)
        if pad < 0:
            raise ValueError(f"cannot broadcast {self.shape} to {shape}")
        old_shape, old_strides = (1,) * pad + self.shape, (0,) * pad + self.strides
        strides = []
        for n, old_n, s in zip(shape, old_shape, old_strides):
            if old_n == n:
                strides.append(s if n > 1 else 0)
            elif old_n == 1:
                strides.append(0)
            else:
                raise ValueError(f"cannot broadcast {self.shape} to {shape}")
        return HbmView(self.tensor, self.dtype, tuple(shape), tuple(strides), self.offset)

    def at(self, index: tuple[int, ...]) -> HbmView:
        """The sub-view at a fixed index of the leading axes (like numpy's view[i, j])."""
        k = len(index)
        offset = self.offset + sum(i * s for i, s in zip(index, self.strides))
        return HbmView(self.tensor, self.dtype, self.shape[k:], self.strides[k:], offset)

    def box(self, starts: tuple[int, ...], sizes: tuple[int, ...]) -> HbmView:
        """The sub-view [starts, starts + sizes) along every axis."""
        offset = self.offset + sum(a * s for a, s in zip(starts, self.strides))
        return HbmView(self.tensor, self.dtype, tuple(sizes), self.strides, offset)

    def split_axis(self, axis: int, sizes: tuple[int, ...]) -> HbmView:
        """Replace one axis by several of the given sizes (their product is its size): always a view."""
        assert math.prod(sizes) == self.shape[axis], (sizes, self.shape)
        inner = [self.strides[axis] * math.prod(sizes[k + 1:]) for k in range(len(sizes))]
        return HbmView(self.tensor, self.dtype, self.shape[:axis] + tuple(sizes) + self.shape[axis + 1:],
                       self.strides[:axis] + tuple(inner) + self.strides[axis + 1:], self.offset)

    def slice(self, axis: int, start: int, stop: int, step: int = 1) -> HbmView:
        """Elements start, start + step, ... below stop along `axis` (step > 0: access patterns never walk
        backwards)."""
        if step <= 0:
            raise ValueError("slice steps must be positive")
        shape, strides = list(self.shape), list(self.strides)
        offset = self.offset + start * strides[axis]
        shape[axis], strides[axis] = max(0, -(-(stop - start) // step)), strides[axis] * step
        return HbmView(self.tensor, self.dtype, tuple(shape), tuple(strides), offset)


def coalesce(views: list[HbmView] | list[tuple[tuple[int, ...], tuple[int, ...]]],
             keep_first: bool = False) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Merge adjacent axes that every view walks as one (stride[i] == stride[i+1] * size[i+1]) and drop size-1
    axes. Takes views of one shape; returns the common new shape and each view's new strides. With
    `keep_first`, axis 0 (the partition axis) is never merged or dropped."""
    pairs = [(v.shape, v.strides) if isinstance(v, HbmView) else v for v in views]
    shape = pairs[0][0]
    strides = [list(s) for _, s in pairs]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in pairs]
    for axis, n in enumerate(shape):
        first = keep_first and axis == 0
        if n == 1 and not first:
            continue
        if out_shape and not (keep_first and len(out_shape) == 1) and all(
                o[-1] == s[axis] * n for o, s in zip(out_strides, strides)):
            out_shape[-1] *= n
            for o, s in zip(out_strides, strides):
                o[-1] = s[axis]
            continue
        out_shape.append(n)
        for o, s in zip(out_strides, strides):
            o.append(s[axis])
    return tuple(out_shape), [tuple(o) for o in out_strides]
