"""Cutting an index space into tiles.

`boxes` takes views of one shape (an op's output and its inputs broadcast to it), merges the axes all of them
walk alike, and cuts the result into boxes of shape (partitions, *free) that fit a tile: axis 0 across at most
pmax partitions, the other axes within a per-partition element budget. A one-axis space is first folded into
(rows, columns) so that it spreads over the partitions instead of filling one; one larger than a tile into
contiguous blocks of a tile each first.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterator

from neuronx_cc_lite.tile.hbm import HbmView, coalesce

ROW_ELEMENTS = 512


def _spaces(views: list[HbmView], pmax: int, free_max: int
            ) -> list[tuple[tuple[int, ...], list[tuple[int, ...]], list[int]]]:
    """(shape, strides per view, offset per view) of each index space to tile, axis 0 to go on partitions."""
    shape, strides = coalesce(views)
    offsets = [v.offset for v in views]
    if not shape:
        return [((1, 1), [(0, 0)] * len(views), offsets)]
    if len(shape) > 1:
        return [(shape, strides, offsets)]
    total = shape[0]
    spaces = []
    block = pmax * free_max
    if total > block:
        # more than one tile: each a contiguous block of pmax rows of free_max, so that no two boxes' byte ranges
        # interleave (rows a whole partition apart would make every box span the tensor, and finding the accesses
        # a new one meets would grow with the number of boxes: quadratic over a Relu of [1, 2^31])
        whole = total // block
        spaces.append(((pmax, whole, free_max), [(s[0] * free_max, s[0] * block, s[0]) for s in strides], offsets))
        offsets = [o + whole * block * s[0] for o, s in zip(offsets, strides)]
        total -= whole * block
        if not total:
            return spaces
    # spread over the partitions, but no narrower than ROW_ELEMENTS per partition while the tensor allows: a DMA
    # pays for every partition row it touches, so a small tensor is better on few partitions than on 128
    cols = max(-(-total // pmax), min(total, ROW_ELEMENTS))
    rows = total // cols
    spaces.append(((rows, cols), [(s[0] * cols, s[0]) for s in strides], offsets))
    tail = total - rows * cols
    if tail:
        spaces.append(((1, tail), [(0, s[0]) for s in strides], [o + rows * cols * s[0] for o, s in
                                                                  zip(offsets, strides)]))
    return spaces


def chunk_sizes(free: tuple[int, ...], budget: int) -> list[int]:
    """How much of each free axis one piece takes, innermost axes whole first, at most `budget` elements."""
    chunks = []
    for n in reversed(free):
        c = min(n, max(1, budget))
        chunks.append(c)
        budget //= c
    return chunks[::-1]


def boxes(views: list[HbmView], pmax: int, free_max: int) -> Iterator[list[HbmView]]:
    """Yield, box by box, the views cut to that box: each of shape (partitions, *free)."""
    assert all(v.shape == views[0].shape for v in views), [v.shape for v in views]
    if views[0].size == 0:
        return
    for shape, strides, offsets in _spaces(views, pmax, free_max):
        chunks = [min(shape[0], pmax), *chunk_sizes(shape[1:], free_max)]
        for starts in itertools.product(*(range(0, n, c) for n, c in zip(shape, chunks))):
            sizes = tuple(min(c, n - s) for n, c, s in zip(shape, chunks, starts))
            yield [HbmView(v.tensor, v.dtype, sizes, st, off + sum(a * b for a, b in zip(starts, st)))
                   for v, st, off in zip(views, strides, offsets)]


def free_size(view: HbmView) -> int:
    return math.prod(view.shape[1:])


def merged_axes(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int] | None:
    """(size, stride) of axes walked as one, or None when they are not."""
    kept = [(n, st) for n, st in zip(shape, strides) if n > 1]
    if not kept:
        return math.prod(shape), 0
    size, stride = kept[-1]
    for n, st in reversed(kept[:-1]):
        if st != stride * size and not (st == 0 and stride == 0):
            return None
        size *= n
    return size, stride


@dataclass(frozen=True)
class RowPieces:
    """A box of a view whose rows are not one stride apart (an input broadcast along some of the partition axes):
    the views that fill it, each (first partition, view of shape (rows, *free))."""

    pieces: tuple[tuple[int, HbmView], ...]


def _row_pieces(v: HbmView, axes_shape: tuple[int, ...], axes_strides: tuple[int, ...], r0: int, rt: int,
                offset: int, free_sizes: tuple[int, ...], free_strides: tuple[int, ...]) -> RowPieces:
    """Rows r0 .. r0 + rt of the partition axes, cut where the innermost partition axis wraps."""
    inner = axes_shape[-1]
    pieces = []
    r = r0
    while r < r0 + rt:
        n = min(inner - r % inner, r0 + rt - r)
        index, rest = [], r
        for size in reversed(axes_shape):
            index.append(rest % size)
            rest //= size
        start = offset + sum(i * st for i, st in zip(reversed(index), axes_strides))
        pieces.append((r - r0, HbmView(v.tensor, v.dtype, (n, *free_sizes), (axes_strides[-1], *free_strides), start)))
        r += n
    return RowPieces(tuple(pieces))


def layout_boxes(views: list[HbmView], partition_axes: tuple[int, int], pmax: int, free_max: int
                 ) -> Iterator[list[HbmView | RowPieces]] | None:
    """Like `boxes`, with the given axes [first, last) of the common shape on partitions (as the producer of the
    first view laid it out). The free dimension is the axes after them, each axis before them a loop; when the
    partition axes are the last ones (a feature-major tensor: its tokens before its features), the axes before
    them are the free dimension instead, as the producer's tile holds them. A view that cannot walk the partition
    axes as one (a broadcast input) is given as RowPieces; None when the first view cannot (it is the output:
    contiguous in the layout)."""
    first, last = partition_axes
    shape = views[0].shape
    merged = [merged_axes(shape[first:last], v.strides[first:last]) for v in views]
    if merged[0] is None or views[0].size == 0 or first == last:
        return None
    rows = math.prod(shape[first:last])
    feature_major = last == len(shape) and first > 0
    # rows within one block of partitions: the axes before them join the free dimension too (a box then spans
    # several of a batched product's results, side by side in the producer's layout: one instruction, not one
    # each for a few dozen columns, Swin's 49 x 49 window scores)
    loops = () if feature_major or rows <= pmax else shape[:first]
    free_axes = tuple(range(first)) if feature_major else \
        tuple(range(len(loops), first)) + tuple(range(last, len(shape)))
    free = tuple(shape[a] for a in free_axes)

    def generate() -> Iterator[list[HbmView | RowPieces]]:
        chunks = chunk_sizes(free, free_max)
        for outer in itertools.product(*(range(n) for n in loops)):
            for r0 in range(0, rows, pmax):
                rt = min(pmax, rows - r0)
                for starts in itertools.product(*(range(0, n, c) for n, c in zip(free, chunks))):
                    sizes = tuple(min(c, n - st) for n, c, st in zip(free, chunks, starts))
                    box: list[HbmView | RowPieces] = []
                    for v, m in zip(views, merged):
                        free_strides = tuple(v.strides[a] for a in free_axes)
                        offset = v.offset + sum(i * st for i, st in zip(outer, v.strides[:len(loops)])) + \
                            sum(a * st for a, st in zip(starts, free_strides))
                        if m is None:
                            box.append(_row_pieces(v, shape[first:last], v.strides[first:last], r0, rt, offset,
                                                   sizes, free_strides))
                        else:
                            box.append(HbmView(v.tensor, v.dtype, (rt, *sizes), (m[1], *free_strides),
                                               offset + r0 * m[1]))
                    yield box

    return generate()
