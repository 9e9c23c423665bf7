"""HBM-to-HBM copies between views of one shape, including the ones that transpose.

A copy whose views walk memory alike is a DMA of long runs (`dma_hbm`). One that transposes (the destination's
contiguous axis is not the source's) would pay a DMA piece per element: a Transpose of [4096, 4096] fp32 that is a
graph output made 16.8 million 4-byte pieces. Such copies go through SBUF instead (`transpose_hbm`): blocks are
loaded with the source's rows on partitions, turned on the Tensor engine (transpose.py), and stored with the
destination's rows on partitions, so that every DMA moves runs of at least RUN_ELEMENTS elements. The bytes
cross a DMA engine twice (in and out) where a direct copy crosses once, which the long runs repay many times.
A load into SBUF that reads its view down the columns (an operand wanted feature-major whose tensor lies token-major
in HBM) goes the same way (`load_transposed`): the rows loaded whole, turned on the Tensor engine.
"""

from __future__ import annotations

import itertools
import math

from isa.dtypes import DType
from isa.operand import MAX_FREE_DIMS, Engine
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.lower.transpose import Piece, transpose_pieces
from neuronx_cc_lite.tile.hbm import HbmView, coalesce
from neuronx_cc_lite.tile.program import HbmAccess, Program, TileAccess

# Elements of one load's run along the source's contiguous axis (2 KiB of fp32): four PE blocks per load.
RUN_ELEMENTS = 512
# Types the Tensor engine moves unchanged through a transpose.
PE_TYPES = frozenset({DType.fp32, DType.bf16, DType.fp16})
# Below these sizes the element-wise DMA is cheaper than the blocks' fixed costs.
MIN_AXIS = 32
MIN_ELEMENTS = 16384
MAX_BLOCKS = 8192  # PE transposes one copy may take; beyond, the instruction count would swamp the listing
# A copy of at least SPREAD_BYTES on few rows is cut into rows of at least SPREAD_ROW_BYTES (`_spread`).
SPREAD_BYTES = 32 * 1024
SPREAD_ROW_BYTES = 2048
LOOP_ROWS = 16  # a copy left on fewer rows is a transfer per index of another axis


def copy_hbm(prog: Program, dst: HbmView, src: HbmView) -> None:
    """Copy `src` into `dst` (views of one shape) the cheapest way: through SBUF when it transposes."""
    assert dst.shape == src.shape, (dst.shape, src.shape)
    if dst.size == 0:
        return
    shape, (d_strides, s_strides) = coalesce([dst, src])
    plan = _transposing_axes(prog, shape, d_strides, s_strides, src.dtype)
    if plan is None:
        dma_hbm(prog, dst, src)
        return
    rows, cols = plan
    transpose_hbm(prog, dst, src, shape, d_strides, s_strides, rows, cols)


def _transposing_axes(prog: Program, shape: tuple[int, ...], d_strides: tuple[int, ...],
                      s_strides: tuple[int, ...], dtype: DType) -> tuple[int, int] | None:
    """(the destination's contiguous axis, the source's) when the copy is a transpose worth turning on PE."""
    if dtype not in PE_TYPES or math.prod(shape) < MIN_ELEMENTS:
        return None
    d_axis = next((a for a, (n, s) in enumerate(zip(shape, d_strides)) if s == 1 and n > 1), None)
    s_axis = next((a for a, (n, s) in enumerate(zip(shape, s_strides)) if s == 1 and n > 1), None)
    if d_axis is None or s_axis is None or d_axis == s_axis:
        return None
    if shape[d_axis] < MIN_AXIS or shape[s_axis] < MIN_AXIS:
        return None
    pmax = prog.target.partitions
    blocks = math.prod(shape) // (min(pmax, shape[d_axis]) * min(pmax, shape[s_axis]))
    return (d_axis, s_axis) if blocks <= MAX_BLOCKS else None


def transpose_hbm(prog: Program, dst: HbmView, src: HbmView, shape: tuple[int, ...], d_strides: tuple[int, ...],
                  s_strides: tuple[int, ...], d_axis: int, s_axis: int) -> None:
    """For every index of the other axes: the destination in stripes of `width` elements along its contiguous
    axis (a PSUM bank of the type), each stripe loaded as [pmax rows of the destination's axis, RUN_ELEMENTS of
    the source's], turned in pmax x pmax blocks and stored as [pmax rows of the source's axis, width]."""
    pmax = prog.target.partitions
    dtype = src.dtype
    width = prog.target.psum_bank_bytes // dtype.size
    rest = [a for a in range(len(shape)) if a not in (d_axis, s_axis)]
    n_dst, n_src = shape[d_axis], shape[s_axis]
    for index in itertools.product(*(range(shape[a]) for a in rest)):
        d_base = dst.offset + sum(i * d_strides[a] for i, a in zip(index, rest))
        s_base = src.offset + sum(i * s_strides[a] for i, a in zip(index, rest))
        for l0 in range(0, n_dst, width):
            w = min(width, n_dst - l0)
            for c0 in range(0, n_src, RUN_ELEMENTS):
                run = min(RUN_ELEMENTS, n_src - c0)
                loaded = []
                for r0 in range(l0, l0 + w, pmax):
                    rows = min(pmax, l0 + w - r0)
                    tile = prog.sbuf(rows, run, dtype, f"{prog.node}/rows")
                    view = HbmView(src.tensor, dtype, (rows, run), (s_strides[d_axis], 1),
                                   s_base + r0 * s_strides[d_axis] + c0)
                    prog.dma(tile.ap(), view)
                    loaded.append((r0 - l0, tile))
                pieces, outs = [], []
                for b0 in range(0, run, pmax):
                    cols = min(pmax, run - b0)
                    out = prog.sbuf(cols, w, dtype, f"{prog.node}/columns")
                    outs.append((c0 + b0, out))
                    pieces += [Piece(tile.region(b0, cols), out, at) for at, tile in loaded]
                transpose_pieces(prog, pieces, prog.node)
                for start, out in outs:  # (the destination's own type: an auto-cast operand is stored narrowed)
                    view = HbmView(dst.tensor, dst.dtype, (out.partitions, w), (d_strides[s_axis], 1),
                                   d_base + start * d_strides[s_axis] + l0)
                    prog.dma(view, out.ap())


def dma_hbm(prog: Program, dst: HbmView, src: HbmView) -> None:
    """HBM to HBM between views of one shape by DMA alone. The axes both views walk alike are merged first; the
    outermost left is spread over up to pmax partitions per dma_copy, so that one instruction moves pmax rows of
    a four-dimensional pattern. When a tensor's producer recorded how it lays it out on partitions, the axis of
    its rows goes on partitions instead: then keep-on-chip can map the copy onto that tensor's home (a Concat of
    slices of a matmul's result along the head axis stays on chip)."""
    rows = _rows_axis(dst, src, prog.target.partitions)
    if rows is not None:
        order = (rows, *(a for a in range(len(dst.shape)) if a != rows))
        dst, src = dst.transpose(order), src.transpose(order)
        shape, (d_strides, s_strides) = coalesce([dst, src], keep_first=True)
    else:
        shape, (d_strides, s_strides) = coalesce([dst, src])
    if len(shape) < 2:  # one row
        shape, d_strides, s_strides = (1, *(shape or (1,))), (0, *(d_strides or (1,))), (0, *(s_strides or (1,)))
    pmax = prog.target.partitions
    if rows is None:
        shape, d_strides, s_strides = _spread(shape, d_strides, s_strides, pmax, dst.dtype.size)
    free, d_free, s_free = shape[1:], d_strides[1:], s_strides[1:]
    outer = max(0, len(free) - MAX_FREE_DIMS)
    if rows is None and shape[0] < LOOP_ROWS and len(free) > 1 and \
            math.prod(shape) * dst.dtype.size >= SPREAD_BYTES:
        # still few rows (a permuting copy's axes are all short: Swin's 8 x 8 windows of 7 x 7): a transfer for
        # each index of the longest other axis, so that the transfers stage spreads more of them over the queues
        k = max(range(len(free) - 1), key=lambda a: free[a])
        order = (k, *(a for a in range(len(free)) if a != k))
        free, d_free, s_free = (tuple(t[a] for a in order) for t in (free, d_free, s_free))
        outer = max(outer, 1)
    for r0 in range(0, shape[0], pmax):
        rows = min(pmax, shape[0] - r0)
        for index in itertools.product(*(range(n) for n in free[:outer])):
            d_off = dst.offset + r0 * d_strides[0] + sum(i * st for i, st in zip(index, d_free))
            s_off = src.offset + r0 * s_strides[0] + sum(i * st for i, st in zip(index, s_free))
            prog.emit("dma_copy", Engine.DMA,
                      dst=HbmAccess(dst.tensor, dst.dtype, rows, d_strides[0], d_off,
                                    tuple(zip(free[outer:], d_free[outer:]))),
                      src=HbmAccess(src.tensor, src.dtype, rows, s_strides[0], s_off,
                                    tuple(zip(free[outer:], s_free[outer:]))))


def _spread(shape: tuple[int, ...], d_strides: tuple[int, ...], s_strides: tuple[int, ...], pmax: int,
            size: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A large copy on fewer rows than the transfers stage would cut it into (codegen/transfers.py spreads a
    transfer's rows over queues; one row moves at one queue's pace): another axis goes on the rows. A slab of a
    tensor (torch.roll's slices, which Swin exports before every shifted window block: 1.1 MiB on one row took
    67 us) has its run cut as (a, n / a), a its largest divisor within pmax that leaves runs of SPREAD_ROW_BYTES;
    a permuting copy (windows partitioned and merged back) takes its largest outer axis instead, whichever gives
    more rows. The old rows become a free axis (a copy may walk its axes in any order)."""
    total = math.prod(shape) * size
    if total < SPREAD_BYTES or shape[0] >= min(pmax, total // (SPREAD_BYTES // 2)):
        return shape, d_strides, s_strides
    n, axes = shape[-1], range(1, len(shape) - 1)
    outer = max(axes, key=lambda k: (min(shape[k], pmax), -k), default=None)
    split = 1
    if d_strides[-1] == 1 and s_strides[-1] == 1:
        split = next((a for a in range(min(pmax, n * size // SPREAD_ROW_BYTES), 1, -1) if n % a == 0), 1)
    by_outer = shape[outer] if outer is not None and shape[outer] <= pmax else 1
    if max(split, by_outer) <= shape[0]:
        return shape, d_strides, s_strides
    keep = [k for k in range(len(shape) - 1) if shape[k] > 1 and (split > by_outer or k != outer)]

    def moved(strides: tuple[int, ...]) -> tuple[int, ...]:
        if split > by_outer:
            return (n // split * strides[-1], *(strides[k] for k in keep), strides[-1])
        return (strides[outer], *(strides[k] for k in keep), strides[-1])  # type: ignore[index]

    rows = split if split > by_outer else by_outer
    last = n // split if split > by_outer else n
    return (rows, *(shape[k] for k in keep), last), moved(d_strides), moved(s_strides)


def _rows_axis(dst: HbmView, src: HbmView, pmax: int) -> int | None:
    """The axis of the views that walks the rows of the source's recorded layout (else the destination's): the one
    whose stride is the layout's row length, when the copy could then map onto that tensor's home: every other axis
    steps within a row or by whole blocks of pmax rows (tile/homes.home_access). Swin's windows (7 tokens of a
    row, the next window 7 tokens on) map onto no home, and a copy on their 7 rows moved at 7 queues' pace. Not
    the axis of a home's features on the partitions (rows one element long) where the other view runs along it:
    the other side would move a piece an element (Swin's windows read from a LayerNorm's home, with no Pad between:
    301,056 pieces of 2 bytes, 637 us); the copy moves runs instead, and keep-on-chip lays that tensor out by rows."""
    for view in (src, dst):
        layout = view.tensor.layout
        if layout is None or layout[1] <= 1:
            continue
        _, rows, row = layout
        other = dst if view is src else src
        for axis, (n, stride) in enumerate(zip(view.shape, view.strides)):
            if n > 1 and stride == row and not (row == 1 and other.strides[axis] == 1):
                others = [st for k, (m, st) in enumerate(zip(view.shape, view.strides)) if k != axis and m > 1]
                if all(st % (rows * row) // row % pmax == 0 for st in others):
                    return axis
    return None


def load_transposed(prog: Program, view: HbmView, name: str) -> TileAccess | None:
    """A tile [P, F] of a view that reads HBM down its columns (partition stride 1, free stride S > 1: a DMA piece
    per element), loaded as the rows of its transpose, [F, P] in blocks of at most pmax rows of P contiguous
    elements, and turned on the Tensor engine (transpose.py). Only where the tensor stays in HBM, read so: an
    input or a weight, or a result its producer laid out by rows (codegen/on_chip.py keeps it on chip in that
    layout only if every access maps onto it, which a column read does not); a result laid out feature-major is
    read down its columns on chip, for free. None when the view is not such a read, or too small for the blocks'
    fixed costs to pay (MIN_AXIS), or of a type a transpose does not carry."""
    free = [(n, st) for n, st in zip(view.shape[1:], view.strides[1:]) if n > 1]
    if len(free) != 1 or view.dtype not in PE_TYPES or view.strides[0] != 1 or free[0][1] in (0, 1):
        return None
    layout = view.tensor.layout
    if view.tensor.kind not in (TensorKind.INPUT, TensorKind.WEIGHT) and (layout is None or layout[2] == 1):
        return None
    (p, f), stride = (view.shape[0], free[0][0]), free[0][1]
    if min(p, f) < MIN_AXIS or p > prog.target.partitions:
        return None
    tile = prog.sbuf(p, f, view.dtype, name)
    pieces = []
    for r0 in range(0, f, prog.target.partitions):
        n = min(prog.target.partitions, f - r0)
        rows = prog.sbuf(n, p, view.dtype, f"{name}/rows")
        prog.dma(rows.ap(), HbmView(view.tensor, view.dtype, (n, p), (stride, 1), view.offset + r0 * stride))
        pieces.append(Piece(rows.ap(), tile, r0))
    transpose_pieces(prog, pieces, name)
    return tile.ap()
