"""Cutting an index space into tiles.

`boxes` takes views of one shape (an op's output and its inputs broadcast to it), merges the axes all of them
walk alike, and cuts the result into boxes of shape (partitions, *free) that fit a tile: axis 0 across at most
pmax partitions, the other axes within a per-partition element budget. A one-axis space is first folded into
(rows, columns) so that it spreads over the partitions instead of filling one.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator

from neuronx_cc_lite.lower.hbm import HbmView, coalesce


def _spaces(views: list[HbmView], pmax: int) -> list[tuple[tuple[int, ...], list[tuple[int, ...]], list[int]]]:
    """(shape, strides per view, offset per view) of each index space to tile, axis 0 to go on partitions."""
    shape, strides = coalesce(views)
    offsets = [v.offset for v in views]
    if not shape:
        return [((1, 1), [(0, 0)] * len(views), offsets)]
    if len(shape) > 1:
        return [(shape, strides, offsets)]
    total = shape[0]
    cols = -(-total // pmax)
    rows = total // cols
    spaces = [((rows, cols), [(s[0] * cols, s[0]) for s in strides], offsets)]
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
    for shape, strides, offsets in _spaces(views, pmax):
        chunks = [min(shape[0], pmax), *chunk_sizes(shape[1:], free_max)]
        for starts in itertools.product(*(range(0, n, c) for n, c in zip(shape, chunks))):
            sizes = tuple(min(c, n - s) for n, c, s in zip(shape, chunks, starts))
            yield [HbmView(v.tensor, v.dtype, sizes, st, off + sum(a * b for a, b in zip(starts, st)))
                   for v, st, off in zip(views, strides, offsets)]


def free_size(view: HbmView) -> int:
    return math.prod(view.shape[1:])
