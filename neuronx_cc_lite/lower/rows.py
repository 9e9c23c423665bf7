"""Row-wise tiling, for ops that work along some axes of every row (reductions, softmax, normalisation).

The axes an op works along are moved to the end of the view (a free transpose of an HBM view); the axes left in
front are the rows. `row_boxes` spreads rows over partitions, pmax at a time, and gives each partition the whole
free part of its row, so that one instruction can reduce or scale it.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator

from neuronx_cc_lite.lower.tiling import chunk_sizes, merged_axes as _merged
from neuronx_cc_lite.tile.hbm import HbmView, coalesce


def move_to_end(view: HbmView, axes: tuple[int, ...]) -> HbmView:
    keep = [a for a in range(len(view.shape)) if a not in axes]
    return view.transpose((*keep, *axes))


def row_boxes(views: list[HbmView], row_rank: int, pmax: int, first: int | None = None
              ) -> Iterator[list[HbmView]]:
    """The views share their first `row_rank` axes (the rows); what follows in each is its free part. Yields, per
    group of at most pmax rows, each view cut to shape (rows, *its free part). With `first`, only row axes
    first .. row_rank - 1 share partitions (as the input's producer laid them out) and each axis before them is a
    loop, when every view walks those axes as one; otherwise all row axes are merged."""
    row_shape = views[0].shape[:row_rank]
    assert all(v.shape[:row_rank] == row_shape for v in views), [v.shape for v in views]
    if math.prod(row_shape) == 0:
        return
    if first is not None:
        merged = [_merged(row_shape[first:], v.strides[first:row_rank]) for v in views]
        if all(m is not None for m in merged):
            rows = math.prod(row_shape[first:])
            for outer in itertools.product(*(range(n) for n in row_shape[:first])):
                for p0 in range(0, rows, pmax):
                    p = min(pmax, rows - p0)
                    yield [HbmView(v.tensor, v.dtype, (p, *v.shape[row_rank:]), (m[1], *v.strides[row_rank:]),
                                   v.offset + sum(i * st for i, st in zip(outer, v.strides)) + p0 * m[1])
                           for v, m in zip(views, merged)]  # type: ignore[index]
            return
    shape, strides = coalesce([(row_shape, v.strides[:row_rank]) for v in views])
    if not shape:
        shape, strides = (1,), [(0,)] * len(views)
    for outer in itertools.product(*(range(n) for n in shape[:-1])):
        for p0 in range(0, shape[-1], pmax):
            p = min(pmax, shape[-1] - p0)
            yield [HbmView(v.tensor, v.dtype, (p, *v.shape[row_rank:]), (st[-1], *v.strides[row_rank:]),
                           v.offset + sum(i * s for i, s in zip(outer, st)) + p0 * st[-1])
                   for v, st in zip(views, strides)]


def segment_boxes(views: list[HbmView], row_rank: int, first: int, pmax: int, segments: int
                  ) -> Iterator[list[HbmView]] | None:
    """Like row_boxes with `first`, with several rows to a partition, side by side in the free dimension, up to
    `segments` of them a box; each view cut to shape (rows, *segment axes, *its free part). Where the producer laid
    them out (codegen/on_chip.py keeps a home of element (a, b, d) at partition b % pmax, element
    ((b // pmax) * A + a) * D + d), so that a box is one run of each partition of the home:
    - rows that fit one block of partitions (row axes first .. row_rank - 1): the axes before them are the
      segments (a batched product's results: Swin's 64 windows x 3 heads of 49 rows), innermost whole first;
    - more rows than partitions, with no axis before them: blocks of pmax rows are the segments (Swin's 3,136
      tokens of 96 features: 25 blocks), the rows of a short last block a box of their own.
    None when a view does not walk the rows as one."""
    row_shape = views[0].shape[:row_rank]
    rows = math.prod(row_shape[first:])
    merged = [_merged(row_shape[first:], v.strides[first:row_rank]) for v in views]
    if any(m is None for m in merged) or math.prod(row_shape) == 0 or not first < row_rank:
        return None
    outer = row_shape[:first]
    if rows > pmax:
        return _block_boxes(views, merged, row_rank, rows, pmax, segments) if math.prod(outer) == 1 else None
    if not first:
        return None
    chunks = chunk_sizes(outer, segments)

    def generate() -> Iterator[list[HbmView]]:
        for starts in itertools.product(*(range(0, n, c) for n, c in zip(outer, chunks))):
            sizes = tuple(min(c, n - s) for n, c, s in zip(outer, chunks, starts))
            yield [HbmView(v.tensor, v.dtype, (rows, *sizes, *v.shape[row_rank:]),
                           (m[1], *v.strides[:first], *v.strides[row_rank:]),  # type: ignore[index]
                           v.offset + sum(i * st for i, st in zip(starts, v.strides)))
                   for v, m in zip(views, merged)]

    return generate()


def _block_boxes(views: list[HbmView], merged: list[tuple[int, int] | None], row_rank: int, rows: int, pmax: int,
                 segments: int) -> Iterator[list[HbmView]]:
    """segment_boxes' boxes of whole blocks of pmax rows, `segments` blocks at most, then the last rows."""
    whole = rows // pmax
    for b0 in range(0, whole, segments):
        g = min(segments, whole - b0)
        yield [HbmView(v.tensor, v.dtype, (pmax, g, *v.shape[row_rank:]),
                       (m[1], pmax * m[1], *v.strides[row_rank:]), v.offset + b0 * pmax * m[1])  # type: ignore[index]
               for v, m in zip(views, merged)]
    if rows % pmax:
        yield [HbmView(v.tensor, v.dtype, (rows % pmax, 1, *v.shape[row_rank:]),
                       (m[1], 0, *v.strides[row_rank:]), v.offset + whole * pmax * m[1])  # type: ignore[index]
               for v, m in zip(views, merged)]


def free_chunks(view: HbmView, budget: int) -> Iterator[tuple[int, HbmView]]:
    """Cut the free part of a (rows, *free) view into pieces of at most `budget` elements per row, innermost axes
    whole first. Yields (element offset of the piece in the row, piece view of shape (rows, *piece free))."""
    free = view.shape[1:]
    chunks = chunk_sizes(free, budget)
    inner = [math.prod(free[k + 1:]) for k in range(len(free))]
    for starts in itertools.product(*(range(0, n, c) for n, c in zip(free, chunks))):
        sizes = tuple(min(c, n - s) for n, c, s in zip(free, chunks, starts))
        position = sum(s * i for s, i in zip(starts, inner))
        yield position, view.box((0, *starts), (view.shape[0], *sizes))
