"""Sliding windows (Conv, ConvTranspose, pooling): their geometry, the blocks of outputs a tile holds, and the
padded input tiles those blocks read.

Along each spatial axis an output o reads the taps at virtual coordinates o * stride + j * dilation (j < kernel)
of the padded input, in which input element i sits at `offset + i * up`: `offset` is the leading padding, `up` the
zero insertion of a transposed convolution. A block of outputs reads one box of virtual coordinates, its window:
a tile holds it, filled (memset) where it has no input element and loaded by one strided DMA elsewhere. A tap then
reads the tile through an access pattern that steps `stride` along each axis (`window_ap`).

Copies of a window moved by a few taps each (lower/conv.py packs the taps of an image stem onto partition blocks)
would cut every row short by its move and its padding: a 16-wide image in rows of 15 or 16 elements, 64-byte DMA
pieces. Where a block holds whole rows of a 2-D input, the copies instead lie in rows as long as the input's
(`flat_rows`): copy j is the input's rows read as one run starting its move away, so that position p of a row
holds column p + move; the few positions whose column falls outside the row (the padding, and the neighbouring
row's elements the run carried in) are set afterwards (`load_moved_windows`). A single window over short rows
likewise holds them whole, without its padding columns (`flat_window`): a tap along the row then adds only to the
outputs whose column it finds inside the input, the others' padding being zeros (`window_taps`). Rows of 512 bytes
or more keep the padded layout: each is an efficient piece already.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from isa.costs import EFFICIENT_PIECE_BYTES
from isa.dtypes import DType
from isa.functions import AluOp
from isa.operand import Engine
from neuronx_cc_lite.lower.patterns import dma_tile
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Columns, Program, Tile, TileAccess

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class Axis:
    size: int  # input elements
    out: int  # outputs
    kernel: int
    stride: int = 1
    dilation: int = 1
    offset: int = 0  # virtual coordinate of input element 0: the leading padding (negative: a crop)
    pad_end: int = 0  # trailing padding (AveragePool counts it)
    up: int = 1  # virtual coordinates from one input element to the next

    @property
    def extent(self) -> int:
        """Virtual coordinates one output's taps span."""
        return (self.kernel - 1) * self.dilation + 1

    def span(self, count: int) -> int:
        """Virtual coordinates the taps of `count` consecutive outputs span."""
        return (count - 1) * self.stride + self.extent

    def interior(self, o0: int, count: int, shift: int = 0) -> tuple[int, int, int]:
        """(first input element, number of them, its position in the window) of the input elements inside the
        window of outputs o0 .. o0 + count - 1 (moved `shift` virtual coordinates along the axis)."""
        lo = o0 * self.stride + shift
        hi = lo + self.span(count)
        first = max(0, -(-(lo - self.offset) // self.up))
        end = min(self.size, (hi - 1 - self.offset) // self.up + 1)
        return first, max(0, end - first), self.offset + first * self.up - lo


@dataclass(frozen=True)
class Block:
    """Images n0 .. n0 + images - 1 and, along each spatial axis, outputs starts[k] .. starts[k] + counts[k] - 1."""

    n0: int
    images: int
    starts: tuple[int, ...]
    counts: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.images * math.prod(self.counts)


def blocks(batch: int, axes: list[Axis], out_max: int, in_max: int) -> list[Block]:
    """Cut (batch, *outputs) into blocks of at most out_max outputs whose windows hold at most in_max elements
    (at least one output per block). The innermost axis is cut first; an outer axis (and the batch) takes more
    than one element per block only when every inner axis is whole, so that a block is a dense box."""
    counts: list[int] = []
    inner_out, inner_in, whole = 1, 1, True
    for ax in reversed(axes):
        count = 1
        if whole:
            by_in = (in_max // inner_in - ax.extent) // ax.stride + 1
            count = max(1, min(ax.out, out_max // inner_out, by_in))
        whole = whole and count == ax.out
        counts.insert(0, count)
        inner_out, inner_in = inner_out * count, inner_in * ax.span(count)
    images = max(1, min(batch, out_max // inner_out, in_max // inner_in)) if whole else 1
    ranges = [range(0, batch, images)] + [range(0, ax.out, c) for ax, c in zip(axes, counts)]
    return [Block(n0, min(images, batch - n0), tuple(starts),
                  tuple(min(c, ax.out - s) for ax, c, s in zip(axes, counts, starts)))
            for n0, *starts in itertools.product(*ranges)]


def row_phase(ax: Axis, ph: int) -> tuple[Axis, int]:
    """The axis seen through phase ph of its stride s (rows ph, ph + s, ... of the padded input): an axis of
    stride 1 over those rows and its first input element. Output o's tap s * k + ph is the phase's tap k."""
    s = ax.stride
    first = (ph - ax.offset) % s
    return Axis(len(range(first, ax.size, s)), ax.out, -(-ax.kernel // s), 1, 1, (ax.offset + first - ph) // s), first


def window_strides(block: Block, axes: list[Axis], flat: bool = False) -> tuple[tuple[int, ...], int]:
    """(strides of the window tile per spatial axis, elements per image) of a block's windows; `flat`: rows as
    long as the input's (flat_rows)."""
    spans = [ax.span(c) for ax, c in zip(axes, block.counts)]
    if flat:
        spans[-1] = axes[-1].size
    return tuple(math.prod(spans[k + 1:]) for k in range(len(spans))), math.prod(spans)


def needs_fill(block: Block, axes: list[Axis]) -> bool:
    """Whether some of the block's window has no input element (padding, or zeros between inputs)."""
    return any(ax.up != 1 or ax.interior(s, c)[1] != ax.span(c) for ax, s, c in zip(axes, block.starts, block.counts))


def fill_edges(prog: Program, tile: Tile, block: Block, axes: list[Axis], shifts: list[int], value: float,
               phases: list[list[Axis]] | None = None, flat: bool = False) -> None:
    """Fill what no input element of the block's windows covers, for windows moved by each of `shifts` along the
    last axis (all on the tile's partitions), and with `phases`, for the window of each of those axes too (row
    phases of the same spans, lower/conv.py): per axis, the slab before the first input element and the slab
    after the last (over the other axes whole), instead of the whole tile. Only for windows without zero
    insertion (up = 1), where the input elements along an axis are one run. `flat`: rows as long as the input's
    (flat_rows), which have no padding along the last axis to fill."""
    strides, image = window_strides(block, axes, flat)
    spans = [ax.span(c) for ax, c in zip(axes, block.counts)]
    if flat:
        spans[-1] = axes[-1].size
    options = phases or [axes]
    for k, (start, count) in enumerate(zip(block.starts, block.counts)):
        if flat and k == len(axes) - 1:
            break
        runs = [option[k].interior(start, count, sh if k == len(axes) - 1 else 0)
                for option in options for sh in shifts]
        before = max(pos if n else spans[k] for _, n, pos in runs)
        after = min(pos + n if n else 0 for _, n, pos in runs)
        for lo, hi in ((0, before), (after, spans[k])):
            if hi <= lo:
                continue
            dims = [(block.images, image)] + [((hi - lo) if j == k else spans[j], strides[j])
                                              for j in range(len(axes))]
            dims = [d for d in dims if d[0] > 1] or [(1, 1)]
            prog.emit("memset", Engine.POOL, dst=tile.ap(tuple(dims), lo * strides[k]), value=float(value))


def fill_window(prog: Program, tile: Tile, src: HbmView, block: Block, axes: list[Axis], first: int = 0,
                shift: int = 0, flat: bool = False) -> None:
    """Load the input elements of the block's windows into partitions first .. of `tile` (laid out as
    window_strides says), the window moved `shift` virtual coordinates along the last axis; `flat`: the input's
    rows whole (flat_window)."""
    strides, image = window_strides(block, axes, flat)
    shifts = [0] * (len(axes) - 1) + [shift]
    inside = [ax.interior(s, c, sh) for ax, s, c, sh in zip(axes, block.starts, block.counts, shifts)]
    if flat:
        inside[-1] = (0, axes[-1].size, 0)
    if all(n > 0 for _, n, _ in inside):
        box = src.box((0, block.n0, *(f for f, _, _ in inside)),
                      (src.shape[0], block.images, *(n for _, n, _ in inside)))
        offset = sum(pos * st for (_, _, pos), st in zip(inside, strides))
        dma_tile(prog, tile, box, (image, *(ax.up * st for ax, st in zip(axes, strides))), offset, first)


def short_rows(axes: list[Axis], itemsize: int) -> bool:
    """Whether the input's rows (of `itemsize`-byte elements, the larger of what a load reads and writes) are
    shorter than an efficient DMA piece: a window cut from them costs a piece per row, where the rows whole would
    be one run."""
    return axes[-1].size * itemsize < EFFICIENT_PIECE_BYTES


def flat_window(block: Block, axes: list[Axis], src: DType, dtype: DType) -> bool:
    """Whether the block's windows lie in rows as long as the input's (held in `src`, loaded as `dtype`), without
    the padding columns (worth it for short rows): for an axis without zero insertion, the block's outputs whole
    rows, and some tap along the row that every output reads inside the input, so that the matmul of that tap
    writes every output (window_taps)."""
    last = axes[-1]
    return (short_rows(axes, max(src.size, dtype.size)) and last.up == 1 and block.counts[-1] == last.out and
            any(_row_outputs(last, j) == (0, last.out) for j in range(last.kernel)))


def _row_outputs(ax: Axis, tap: int) -> tuple[int, int]:
    """[first, end) of the outputs along the axis whose tap `tap` reads an input element, not padding."""
    at = tap * ax.dilation - ax.offset  # the input element output o reads: o * stride + at
    first = max(0, -(at // ax.stride))  # the least o with o * stride + at >= 0
    end = min(ax.out, (ax.size - 1 - at) // ax.stride + 1) if ax.size - 1 - at >= 0 else 0
    return first, max(first, end)


def window_taps(tile: Tile, strides: tuple[int, ...], block: Block, axes: list[Axis], taps: list[tuple[int, ...]],
                partitions: int, acc: Tile | Columns, flat: bool) -> list[tuple[int, TileAccess, TileAccess]]:
    """(index in taps, what of acc [mt, block.size] it adds to, what it reads of the window) per tap, those that
    write every output first (the first starts the accumulation). In a flat window (flat_window) a tap along the
    row reads only the outputs whose column lies inside the input, as the others would read padding (zeros), and
    a tap that reads none is left out; otherwise every tap reads every output, in order."""
    if not flat:
        return [(t, acc.ap(), window_ap(tile, strides, block, axes, tap, partitions)) for t, tap in enumerate(taps)]
    last, row = axes[-1], strides[-1]
    outer = [(block.images, block.size // block.images)] + \
        [(c, math.prod(block.counts[k + 1:])) for k, c in enumerate(block.counts[:-1])]
    reads = [(block.images, strides[0])] + \
        [(c, ax.stride * st) for c, ax, st in zip(block.counts[:-1], axes, strides[1:-1])]
    found = []
    for t, tap in enumerate(taps):
        first, end = _row_outputs(last, tap[-1])
        if end <= first:
            continue
        # the row holds input element i at position i: output o's tap reads o * stride + tap * dilation - offset
        at = sum(j * ax.dilation * st for j, ax, st in zip(tap[:-1], axes[:-1], strides[1:-1])) + \
            (first * last.stride + tap[-1] * last.dilation - last.offset) * row
        dst = acc.ap(_dims(outer + [(end - first, 1)]), first)
        moving = tile.ap(_dims(reads + [(end - first, last.stride * row)]), at, 0, partitions)
        found.append((end - first < last.out, t, dst, moving))
    found.sort(key=lambda f: f[0])  # (stable: in order otherwise)
    return [(t, dst, moving) for _, t, dst, moving in found]


def tight_window(block: Block, axes: list[Axis]) -> bool:
    """Whether the block's windows may be its input rows as they lie, without padding: a 2-D block of whole rows
    (whole images, or one image's rows), without zero insertion, whose kernel has a tap along the row that reads
    inside the input for every output, and a tap along the column that does for every row of the block
    (tight_taps writes that pair first: it starts the accumulation). Each other tap then adds to the outputs
    whose input lies inside the image only, where the others would read padding (zeros). The window needs no fill,
    and a producer that keeps the input on chip writes it where the matmuls read it (codegen/on_chip.py), with no
    copy into a padded window between them (MobileNetV3's depthwise layers, ResNet's 3x3 convolutions)."""
    if len(axes) != 2 or any(ax.up != 1 for ax in axes):
        return False
    rows, cols = axes
    r0, count = block.starts[0], block.counts[0]
    return block.starts[1] == 0 and block.counts[1] == cols.out and \
        any(_row_outputs(cols, k) == (0, cols.out) for k in range(cols.kernel)) and \
        any(first <= r0 and r0 + count <= end for first, end in (_row_outputs(rows, k) for k in range(rows.kernel)))


def _tight_rows(block: Block, rows: Axis) -> tuple[int, int]:
    """[first, end) of the input rows a tight window holds: those the block's taps read inside the image."""
    r0, count = block.starts[0], block.counts[0]
    first = max(0, r0 * rows.stride - rows.offset)
    end = min(rows.size, (r0 + count - 1) * rows.stride + (rows.kernel - 1) * rows.dilation - rows.offset + 1)
    return first, end


def tight_taps(tile: Tile, block: Block, axes: list[Axis], taps: list[tuple[int, ...]], partitions: int,
               acc: Tile | Columns) -> list[tuple[int, TileAccess, TileAccess]]:
    """window_taps for a tight window (tight_window: the input rows [rows x columns] as they lie): each tap adds to
    the outputs of the block whose input lies inside the image, a rectangle of them, those that add to every
    output first; a tap that reaches none is left out."""
    rows, cols = axes
    r0, count = block.starts[0], block.counts[0]
    first_row, end_row = _tight_rows(block, rows)
    image, outputs = (end_row - first_row) * cols.size, count * cols.out
    found = []
    for t, (kh, kw) in enumerate(taps):
        (a, b), (c0, c1) = _row_outputs(rows, kh), _row_outputs(cols, kw)
        a, b = max(a, r0), min(b, r0 + count)
        if b <= a or c1 <= c0:
            continue
        # output (r, c) reads input (r * stride + k * dilation - offset) along each axis
        at = (a * rows.stride + kh * rows.dilation - rows.offset - first_row) * cols.size + \
            c0 * cols.stride + kw * cols.dilation - cols.offset
        dst = acc.ap(_dims([(block.images, outputs), (b - a, cols.out), (c1 - c0, 1)]), (a - r0) * cols.out + c0)
        moving = tile.ap(_dims([(block.images, image), (b - a, rows.stride * cols.size), (c1 - c0, cols.stride)]),
                         at, 0, partitions)
        found.append(((b - a, c1 - c0) != (count, cols.out), t, dst, moving))
    found.sort(key=lambda f: f[0])  # (stable: in order otherwise)
    return [(t, dst, moving) for _, t, dst, moving in found]


def load_tight(prog: Program, src: HbmView, block: Block, axes: list[Axis], dtype: DType, name: str) -> Tile:
    """A tight window (tight_window): the block's input rows as they lie, [partitions, images x rows x columns]."""
    first, end = _tight_rows(block, axes[0])
    cols = src.shape[3]
    tile = prog.sbuf(src.shape[0], block.images * (end - first) * cols, dtype, name)
    box = src.box((0, block.n0, first, 0), (src.shape[0], block.images, end - first, cols))
    dma_tile(prog, tile, box, ((end - first) * cols, cols, 1), 0, 0)
    return tile


def _dims(dims: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple(d for d in dims if d[0] > 1) or ((1, 1),)


def flat_rows(block: Block, axes: list[Axis], shifts: list[int], src: HbmView, dtype: DType) -> bool:
    """Whether the copies of the block's windows moved by `shifts` along the last axis lie in rows as long as the
    input's. Worth it where the input's rows are shorter than an efficient DMA piece (each copy then one run where
    it was a piece per row; a longer row is a piece of its own, and the selects would only add work); possible for
    a 1-D or 2-D input whose rows are contiguous, without zero insertion, the block's outputs whole rows, and the
    copies covering the kernel's taps along the row, so that every read (output o at position o * stride) stays
    inside its row."""
    last = axes[-1]
    return (short_rows(axes, max(src.dtype.size, dtype.size)) and len(axes) <= 2 and last.up == 1 and
            block.counts[-1] == last.out and len(shifts) >= last.kernel and (last.out - 1) * last.stride < last.size and 0 <= last.offset < last.size and
            shifts[-1] - last.offset < last.size and src.strides[-1] == 1 and
            (len(axes) == 1 or src.strides[-2] == last.size))


def load_moved_windows(prog: Program, views: list[tuple[list[Axis], HbmView]], block: Block, shifts: list[int],
                       dtype: DType, name: str) -> tuple[Tile, tuple[int, ...]]:
    """The block's windows in a tile [copies x partitions, images, *spans], copy (v, j) on partition block
    v * len(shifts) + j: the windows of view v (its axes and its rows, shape (partitions, batch, *inputs)) moved
    shifts[j] virtual coordinates along the last axis. A single view whose block passes flat_rows lies in rows as
    long as the input's: each copy one run of the input's rows, the positions that fall outside a row set to 0
    once the run has landed. Returns the tile and its strides (per image, per spatial axis)."""
    (axes, src), rows = views[0], views[0][1].shape[0]
    flat = len(views) == 1 and flat_rows(block, axes, shifts, src, dtype)
    strides, image = window_strides(block, axes, flat)
    tile = prog.sbuf(len(views) * len(shifts) * rows, block.images * image, dtype, name)
    if not flat:
        fill_edges(prog, tile, block, axes, shifts, 0.0, [v for v, _ in views])  # before any load
        for v, (view_axes, view) in enumerate(views):
            for j, shift in enumerate(shifts):
                fill_window(prog, tile, view, block, view_axes, (v * len(shifts) + j) * rows, shift)
        return tile, (image, *strides)
    last, width = axes[-1], axes[-1].size
    first_row, count, pos = axes[0].interior(block.starts[0], block.counts[0]) if len(axes) == 2 else (0, 1, 0)
    if len(axes) == 2:
        fill_edges(prog, tile, block, axes, [0], 0.0, flat=True)  # the rows of padding, whole
    image_end = width * (src.shape[2] if len(axes) == 2 else 1)
    for j, shift in enumerate(shifts):
        move = shift - last.offset  # position p of the copy's rows holds column p + move
        start = first_row * width + move
        lo, hi = max(start, 0), min(start + count * width, image_end)
        if hi > lo:
            run = HbmView(src.tensor, src.dtype, (rows, block.images, hi - lo), (src.strides[0], src.strides[1], 1),
                          src.offset + block.n0 * src.strides[1] + lo)
            dma_tile(prog, tile, run, (image, 1), pos * width + lo - start, j * rows)
    # Position q of a row is outside it for the copies whose move is under -q (a first few: keep the partitions
    # from theirs on) and position width - 1 - t for those whose move is over t (a last few: keep those before):
    # one select per position over every partition, as the engines start at a quadrant's first partition only.
    moves = [shift - last.offset for shift in shifts]
    dims = tuple(d for d in [(block.images, image), (image // width, width)] if d[0] > 1) or ((1, 1),)
    edges = [(q, -rows * sum(m < -q for m in moves), 1) for q in range(max(0, -moves[0]))]
    edges += [(width - 1 - t, rows * sum(m <= t for m in moves) - 1, -1) for t in range(max(0, moves[-1]))]
    for position, offset, sign in edges:
        at = tile.ap(dims, position, 0, len(shifts) * rows)
        prog.emit("affine_select", Engine.POOL, dst=at, src=at, offset=offset, channel_multiplier=sign,
                  steps=(0,) * len(dims), cmp=AluOp.greater_equal, fill=0.0)
    return tile, (image, *strides)


def load_windows(prog: Program, src: HbmView, block: Block, axes: list[Axis], fill: float, name: str,
                 dtype: DType = DType.fp32, flat: bool = False) -> tuple[Tile, tuple[int, ...]]:
    """The windows of `block` in a tile [partitions, images, *spans] (the DMA casts to `dtype`); `flat`: in the
    input's rows, whole (flat_window). `src` has shape (partitions, batch, *inputs). Returns the tile and its
    strides (per image, per spatial axis)."""
    strides, image = window_strides(block, axes, flat)
    # A flat window takes the padded one's room all the same: measured, MobileNetV3 fp32 (trn1) took 471.2 us with
    # the smaller tiles, where the scheduler's prefetch came to queue its depthwise weights (412 us of DMA per
    # layer) one layer after the other, against 333.8 us before and 336.6 us at the padded size.
    tile = prog.sbuf(src.shape[0], block.images * max(image, window_strides(block, axes)[1]), dtype, name)
    if needs_fill(block, axes[:-1] if flat else axes):
        if all(ax.up == 1 for ax in axes):
            fill_edges(prog, tile, block, axes, [0], fill, flat=flat)
        else:
            prog.emit("memset", Engine.POOL, dst=tile.ap(), value=float(fill))
    fill_window(prog, tile, src, block, axes, flat=flat)
    return tile, (image, *strides)


def window_ap(tile: Tile, strides: tuple[int, ...], block: Block, axes: list[Axis], tap: tuple[int, ...],
              partitions: int) -> TileAccess:
    """What tap `tap` (one kernel index per axis) reads of a window tile for every output of the block, in the
    order (image, *outputs)."""
    dims = [(block.images, strides[0])] + [(c, ax.stride * st) for c, ax, st in zip(block.counts, axes, strides[1:])]
    offset = sum(j * ax.dilation * st for j, ax, st in zip(tap, axes, strides[1:]))
    return tile.ap(tuple(d for d in dims if d[0] > 1) or ((1, 1),), offset, 0, partitions)


def window_axes(attrs: dict[str, Any], sizes: tuple[int, ...], kernel: tuple[int, ...],
                outs: tuple[int, ...], ceil_mode: bool = False) -> list[Axis] | str:
    """The axes of a Conv or pooling node from its strides, dilations, pads / auto_pad (and ceil_mode), checked
    against the output shape shape inference gave; a reason string when they do not fit."""
    rank = len(kernel)
    strides = tuple(attrs.get("strides") or (1,) * rank)
    dilations = tuple(attrs.get("dilations") or (1,) * rank)
    pads = tuple(attrs.get("pads") or (0,) * 2 * rank)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad not in AUTO_PADS:
        return f"auto_pad {auto_pad!r} is not one of {', '.join(AUTO_PADS)}"
    if len(strides) != rank or len(dilations) != rank or len(pads) != 2 * rank:
        return f"strides, dilations and pads must give {rank}, {rank} and {2 * rank} values"
    if min(strides + dilations + kernel) < 1 or min(pads) < 0:
        return "strides, dilations and kernel sizes must be positive and pads non-negative"
    axes = []
    for k, (n, kern, s, d) in enumerate(zip(sizes, kernel, strides, dilations)):
        extent = (kern - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-n // s)
            total = max(0, (out - 1) * s + extent - n)
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            end = total - begin
        else:
            begin, end = (0, 0) if auto_pad == "VALID" else (pads[k], pads[k + rank])
            room = n + begin + end - extent
            if room < 0:
                return f"the window ({extent} elements) is larger than the padded input ({n + begin + end})"
            out = (-(-room // s) if ceil_mode else room // s) + 1
            if ceil_mode and (out - 1) * s >= n + begin:  # the last window must start inside the input
                out -= 1
        axes.append(Axis(n, out, kern, s, d, begin, end))
    if tuple(ax.out for ax in axes) != tuple(outs):
        return f"output shape {list(outs)} does not match the window arithmetic ({[ax.out for ax in axes]})"
    return axes
