"""Where a tensor between operators lives on chip (codegen/on_chip.py gives it a home): a layout cut from its
shape as [A, B, D] (outer axes, partition axes, inner axes),

    element (a, b, d)  ->  partition b % 128,  element ((b // 128) * A + a) * D + d  of that partition

and the access of a home that reads what an access of the tensor in HBM reads. A lowering asks it too, to know
whether what it reads of a tensor will be runs on chip (lower/row_depthwise.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from neuronx_cc_lite.tile.hbm import coalesce
from neuronx_cc_lite.tile.program import HbmAccess, Tile, TileAccess


@dataclass(frozen=True)
class Layout:
    outer: int  # A
    rows: int  # B: on partitions, 128 at a time
    inner: int  # D

    def home_free(self, pmax: int) -> int:
        """Elements per partition of the home tile."""
        return -(-self.rows // pmax) * self.outer * self.inner


def home_access(layout: Layout, access: HbmAccess, home: Tile, pmax: int) -> TileAccess | None:
    """The same elements as `access`, in the home: None when its rows do not land on consecutive partitions or
    its free pattern leaves them. Rows that all lie in one row of the layout (a channel's image rows, its
    channels on partitions) are one partition of the home, walked as the access's rows and their runs: a transfer
    between them and a tile fans a partition's runs out over the tile's partitions, or gathers them in
    (lower/row_depthwise.py)."""
    a_size, b_size, d_size = layout.outer, layout.rows, layout.inner
    if access.partitions > 1 and access.partition_stride != d_size:
        if access.partition_stride <= 0:
            return None
        within = HbmAccess(access.tensor, access.dtype, 1, 0, access.offset,
                           ((access.partitions, access.partition_stride), *access.dims))
        return home_access(layout, within, home, pmax)
    e0 = access.offset
    if e0 >= a_size * b_size * d_size:
        return None
    a0, rest = divmod(e0, b_size * d_size)
    b0, d0 = divmod(rest, d_size)
    if b0 % pmax + access.partitions > pmax or b0 + access.partitions > b_size:
        return None
    dims = []
    d_reach, b_reach, a_reach = d0, b0 + access.partitions, a0
    for size, stride in access.dims:
        if size == 1:
            dims.append((1, 0))
            continue
        a_step, rest = divmod(stride, b_size * d_size)
        b_step, d_step = divmod(rest, d_size)
        if b_step % pmax:  # the step moves to another row: another partition
            return None
        d_reach += (size - 1) * d_step
        b_reach += (size - 1) * b_step
        a_reach += (size - 1) * a_step
        dims.append((size, ((b_step // pmax) * a_size + a_step) * d_size + d_step))
    if d_reach >= d_size or b_reach > b_size or a_reach >= a_size:
        return None
    offset = ((b0 // pmax) * a_size + a0) * d_size + d0
    return TileAccess(home, b0 % pmax, access.partitions, offset, _merged(dims))


def _merged(dims: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The pattern with each pair of axes walked as one merged (a box of several outer rows of the layout, whole
    inner rows each, is one run of the home): its transfers then map as one region."""
    if sum(n > 1 for n, _ in dims) < 2:
        return tuple(dims)
    shape, (strides,) = coalesce([(tuple(n for n, _ in dims), tuple(st for _, st in dims))])
    return tuple(zip(shape, strides))
