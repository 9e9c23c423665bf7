"""Gather, GatherElements and GatherND.

A constant index that walks an axis with a fixed step is only a view (a slice). Many constant indices into at
most 32 short rows move the rows across partitions with VectorE's stream shuffle; many along an inner axis (with at
most 32 elements after it) gather within each partition on GpSimdE (`local_gather`). Anything else goes through
the indirect DMA, `dma_gather`: up to pmax indices are loaded into a partition column and each partition receives
the table row its index names. For Gather the rows are the slices along the gathered axis and the indices may be
known only at run time (embedding lookups); for GatherElements and GatherND the element offset every output
element comes from is computed (by the compiler for constant indices, on VectorE for GatherElements' run-time
indices) and one-element "rows" are gathered at those offsets; GatherND's run-time index tuples name slices,
whose table rows are computed on VectorE (index_rows.py).
"""

from __future__ import annotations

import math

import numpy as np

from isa.dtypes import DType
from isa.functions import AluOp
from isa.instructions import (GPSIMD_CORE_PARTITIONS, LOCAL_GATHER_MAX_INDICES, LOCAL_GATHER_RUNS, QUADRANT,
                              SHUFFLE_KEEP)
from isa.operand import Engine
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node, Tensor
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import Operand, elementwise, tile_free_max
from neuronx_cc_lite.lower.index_rows import MAX_TABLE_ROWS, row_access, table_rows
from neuronx_cc_lite.lower.instr import scratch, ts, tt
from neuronx_cc_lite.lower.patterns import contiguous
from neuronx_cc_lite.lower.rows import free_chunks, row_boxes
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Program, TileAccess


def _indices(node: Node, g: Graph) -> np.ndarray | None:
    t = g.tensors[node.inputs[1]]
    return np.asarray(t.value, dtype=np.int64) if t.is_constant else None


def _progression(flat: np.ndarray) -> tuple[int, int] | None:
    """(start, step) when the indices walk forward with one step (a single index counts)."""
    if flat.size == 1:
        return int(flat[0]), 1
    steps = np.diff(flat)
    if steps[0] > 0 and np.all(steps == steps[0]):
        return int(flat[0]), int(steps[0])
    return None


def gather_rows(ctx: LowerCtx, table: HbmView, index_view: HbmView, out_rows: HbmView, rows: int,
                row_stride: int, fix_negative: bool) -> None:
    """out_rows[i] = row index[i] of the table, where `table` has shape (1, *row) (its row 0), `index_view` shape
    (n,) and `out_rows` shape (n, *row)."""
    prog = ctx.program
    n = index_view.shape[0]
    budget = tile_free_max(ctx)
    for p0 in range(0, n, prog.target.partitions):
        p = min(prog.target.partitions, n - p0)
        index = prog.sbuf(p, 1, DType.int32, "index")
        prog.dma(index.ap(), index_view.box((p0,), (p,)).split_axis(0, (p, 1)))
        if fix_negative:  # ONNX counts negative indices from the end
            wrap = prog.sbuf(p, 1, DType.fp32, "wrap")
            ts(prog, wrap.ap(), index.ap(), AluOp.less, 0.0, AluOp.multiply, float(rows))
            tt(prog, index.ap(), index.ap(), wrap.ap(), AluOp.add)
        box = out_rows.box((p0,) + (0,) * (len(out_rows.shape) - 1), (p, *out_rows.shape[1:]))
        for (_, src_piece), (_, dst_piece) in zip(free_chunks(table, budget), free_chunks(box, budget)):
            src = row_access(src_piece, "gathered", prog.node)
            f = math.prod(dst_piece.shape[1:])
            t = prog.sbuf(p, f, table.dtype, "gathered")
            prog.emit("dma_gather", Engine.DMA, dst=t.ap(), src=src, index=index.ap(), rows=rows,
                      row_stride=row_stride)
            prog.dma(dst_piece, t.ap())


def _check_gather(node: Node, g: Graph) -> str | None:
    if 0 in g.tensors[node.inputs[0]].shape or 0 in g.tensors[node.inputs[1]].shape:
        return "gathering from or into an empty tensor is not supported"
    if node.op == "Gather" and not g.tensors[node.inputs[1]].is_constant:
        shape = g.tensors[node.inputs[0]].shape
        rows = shape[int(node.attrs.get("axis", 0)) % len(shape)]
        if rows > MAX_TABLE_ROWS:
            return f"Gather with run-time indices into {rows} rows (row indices exact up to {MAX_TABLE_ROWS})"
    return None


@lowering("Gather", check=_check_gather, moves_data=True)
def lower_gather(ctx: LowerCtx, node: Node) -> None:
    data = ctx.view(node.inputs[0])
    rank = len(data.shape)
    axis = int(node.attrs.get("axis", 0)) % rank
    size = data.shape[axis]
    idx_shape = ctx.shape(node.inputs[1])
    constant = _indices(node, ctx.graph)
    if constant is not None:
        flat = np.where(constant < 0, constant + size, constant).reshape(-1)
        if np.any((flat < 0) | (flat >= size)):
            raise CompileError("NCC_INDEX", f"a Gather index is outside [0, {size})", node.name, node.op)
        run = _progression(flat)
        if run is not None:  # a slice: no data moves here
            start, step = run
            view = data.slice(axis, start, start + step * (flat.size - 1) + 1, step)
            ctx.alias(node.outputs[0], view.split_axis(axis, idx_shape))
            return
        if axis > 0 and _local_gather_fits(ctx, math.prod(data.shape[:axis]), size, flat.size,
                                           math.prod(data.shape[axis + 1:])):
            gather_locally(ctx, node, data, axis, flat)
            return
    table = data.transpose((axis, *[a for a in range(rank) if a != axis]))
    out = ctx.output(node.outputs[0], (0, len(idx_shape)) if axis == 0 else None)  # gathered rows on partitions
    n = math.prod(idx_shape)
    outer, inner = data.shape[:axis], data.shape[axis + 1:]
    out_rows = out.reshape((*outer, n, *inner)).transpose((len(outer), *range(len(outer)),
                                                            *range(len(outer) + 1, rank)))
    if constant is not None and _shuffle_fits(ctx, size, flat.size, math.prod(table.shape[1:])):
        gather_by_shuffle(ctx, table, flat, out_rows)
        return
    if constant is not None:
        index_view = ctx.view(ctx.constant(f"{node.name}/indices", flat.astype(np.int32)))
    else:
        index_view = ctx.view(node.inputs[1])
        index_view = contiguous(ctx.program, index_view, node.name).reshape((n,))
    gather_rows(ctx, table.box((0,) * rank, (1, *table.shape[1:])), index_view, out_rows, size,
                table.strides[0], fix_negative=constant is None)


# Where the cost model puts the on-chip gathers ahead of dma_gather (measured on inf2, one-node Gathers): a stream
# shuffle for more than a quadrant of output rows of at most 64 elements from a table of at most 32 rows (128 rows
# of 1..64 elements: 3.7-4.3 us against 4.3-5.3; 8 to 32 rows: 0.3-0.5 us behind); a local gather for at least
# 64 indices or 1024 gathered (row, index) pairs (a [1, 400] row, 99 indices: 2.9 us against 4.3; a [128, 768]
# tensor, 256 indices: 14.7 against 83.8; 5 indices into a [64, 40] one: 3.8 against 3.3).
SHUFFLE_MAX_ROW = 64
LOCAL_GATHER_MIN_INDICES = 64
LOCAL_GATHER_MIN_PAIRS = 1024


def _shuffle_fits(ctx: LowerCtx, size: int, n: int, row: int) -> bool:
    return size <= QUADRANT and QUADRANT < n <= ctx.program.target.partitions and row <= SHUFFLE_MAX_ROW


def gather_by_shuffle(ctx: LowerCtx, table: HbmView, flat: np.ndarray, out_rows: HbmView) -> None:
    """out_rows[i] = table[flat[i]] for a table of at most 32 rows: the rows go on the partitions of one quadrant
    and VectorE's `nc_stream_shuffle` moves them across partitions, one quadrant of the output at a time (the
    mask names each output partition's source row; 255 leaves the rest of a last quadrant alone)."""
    prog = ctx.program
    size, n = table.shape[0], int(flat.size)
    quadrants = -(-n // QUADRANT)
    budget = tile_free_max(ctx)
    for (_, src_piece), (_, dst_piece) in zip(free_chunks(table, budget), free_chunks(out_rows, budget)):
        f = math.prod(src_piece.shape[1:])
        rows = prog.sbuf(QUADRANT, f, table.dtype, "rows")  # a whole quadrant: a shuffle reads whole quadrants
        prog.dma(rows.ap(partitions=size), src_piece)
        moved = prog.sbuf(QUADRANT * quadrants, f, table.dtype, "shuffled")
        for q in range(quadrants):
            take = flat[q * QUADRANT:(q + 1) * QUADRANT]
            mask = tuple(int(i) for i in take) + (SHUFFLE_KEEP,) * (QUADRANT - take.size)
            prog.emit("nc_stream_shuffle", Engine.DVE, dst=moved.ap(first=q * QUADRANT, partitions=QUADRANT),
                      src=rows.ap(), mask=mask)
        prog.dma(dst_piece, moved.ap(partitions=n))


def _local_gather_fits(ctx: LowerCtx, rows: int, size: int, n: int, inner: int) -> bool:
    budget = tile_free_max(ctx)
    fits = (inner in LOCAL_GATHER_RUNS and n <= LOCAL_GATHER_MAX_INDICES and size * inner <= min(budget, 2**16)
            and n * inner <= budget)
    return fits and (n >= LOCAL_GATHER_MIN_INDICES or rows * n >= LOCAL_GATHER_MIN_PAIRS)


def gather_locally(ctx: LowerCtx, node: Node, data: HbmView, axis: int, flat: np.ndarray) -> None:
    """Gather along an inner axis with constant indices, each row of the axes in front on its own partition:
    GpSimdE's `local_gather` copies, within every partition, the `inner` elements (the axes after the gathered
    one, 1 to 32 of them) at each index's offset. The offsets are uint16 and read down a core's 16 partitions
    then along them, the same table in every group of 16."""
    prog = ctx.program
    shape = data.shape
    size, inner, n = shape[axis], math.prod(shape[axis + 1:]), int(flat.size)
    columns = -(-n // GPSIMD_CORE_PARTITIONS)
    offsets = np.zeros(columns * GPSIMD_CORE_PARTITIONS, dtype=np.uint16)
    offsets[:n] = flat * inner
    table = np.tile(offsets.reshape(columns, GPSIMD_CORE_PARTITIONS).T,
                    (prog.target.partitions // GPSIMD_CORE_PARTITIONS, 1))
    rows_total = math.prod(shape[:axis])
    whole = -(-min(rows_total, prog.target.partitions) // GPSIMD_CORE_PARTITIONS) * GPSIMD_CORE_PARTITIONS
    index = prog.sbuf(whole, columns, DType.uint16, f"{node.name}/offsets")
    prog.dma(index.ap(), ctx.view(ctx.constant(f"{node.name}/offsets", table[:whole])))
    out = ctx.output(node.outputs[0]).reshape((*shape[:axis], n * inner))
    assert out is not None  # a fresh output is contiguous
    for row, dst in row_boxes([data, out], axis, prog.target.partitions):
        p = row.shape[0]
        groups = -(-p // GPSIMD_CORE_PARTITIONS) * GPSIMD_CORE_PARTITIONS  # the cores read whole groups of 16
        src = prog.sbuf(groups, size * inner, data.dtype, "rows")
        prog.dma(src.ap(partitions=p), row)
        got = prog.sbuf(groups, n * inner, data.dtype, "gathered")
        prog.emit("local_gather", Engine.POOL, dst=got.ap(), src=src.ap(), index=index.ap(partitions=groups),
                  elems=inner, valid=n)
        prog.dma(dst, got.ap(partitions=p))


def _element_offsets(node: Node, g: Graph, data: HbmView) -> np.ndarray:
    """For GatherElements and GatherND with constant indices: the element offset (from data.offset) that each
    output element comes from, in output order."""
    idx = _indices(node, g)
    shape = data.shape
    strides = np.array(data.strides, dtype=np.int64)
    if node.op == "GatherElements":
        axis = int(node.attrs.get("axis", 0)) % len(shape)
        idx = np.where(idx < 0, idx + shape[axis], idx)
        coords = list(np.indices(idx.shape, dtype=np.int64))
        coords[axis] = idx
        return sum(c * s for c, s in zip(coords, strides)).reshape(-1)
    b = int(node.attrs.get("batch_dims", 0))
    k = idx.shape[-1]
    bounds = np.array(shape[b:b + k], dtype=np.int64)
    idx = np.where(idx < 0, idx + bounds, idx)
    batch = np.indices(idx.shape[:b], dtype=np.int64) if b else np.zeros((0,), dtype=np.int64)
    starts = sum((idx[..., j] * strides[b + j] for j in range(k)), np.zeros(idx.shape[:-1], dtype=np.int64))
    for j in range(b):
        starts = starts + batch[j].reshape(idx.shape[:b] + (1,) * (idx.ndim - 1 - b)) * strides[j]
    inner = shape[b + k:]
    within = sum((c * s for c, s in zip(np.indices(inner, dtype=np.int64), strides[b + k:])),
                 np.zeros(inner, dtype=np.int64))
    return (starts.reshape(starts.shape + (1,) * len(inner)) + within).reshape(-1)


def _runtime_offsets(ctx: LowerCtx, node: Node, data: HbmView) -> HbmView:
    """GatherElements with indices known at run time: each output element's offset in the data, computed on
    VectorE as base + wrap(index) * stride(axis), where the constant `base` is the offset with the axis
    coordinate 0. Exact in the fp32 ALU below 2**24 (the check makes sure)."""
    idx_shape = ctx.shape(node.inputs[1])
    axis = int(node.attrs.get("axis", 0)) % len(data.shape)
    coords = np.indices(idx_shape, dtype=np.int64)
    base = sum((c * s for a, (c, s) in enumerate(zip(coords, data.strides)) if a != axis),
               np.zeros(idx_shape, dtype=np.int64))
    size, stride = data.shape[axis], data.strides[axis]
    name = f"{node.name}/offsets"
    ctx.graph.tensors[name] = Tensor(name, tuple(idx_shape), np.dtype(np.int32))
    base_name = ctx.constant(f"{node.name}/base", base.astype(np.int32))

    def compute(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
        index, start = s
        assert isinstance(index, TileAccess) and isinstance(start, TileAccess)
        wrapped = scratch(prog, dst, "wrapped")
        ts(prog, wrapped, index, AluOp.less, 0.0, AluOp.multiply, float(size))  # negatives count from the end
        tt(prog, wrapped, wrapped, index, AluOp.add)
        ts(prog, wrapped, wrapped, AluOp.multiply, float(stride))
        tt(prog, dst, wrapped, start, AluOp.add)

    elementwise(ctx, Node("GatherElements", node.name, [node.inputs[1], base_name], [name]), compute,
                immediates=False)
    return ctx.view(name).reshape((math.prod(idx_shape),))  # type: ignore[return-value]


def _check_gather_elements(node: Node, g: Graph) -> str | None:
    data = g.tensors[node.inputs[0]]
    if not g.tensors[node.inputs[1]].is_constant and data.size >= 2**24:
        return f"GatherElements with run-time indices into {data.size} elements (offsets exact below 2**24)"
    return _check_gather(node, g)


def _check_gather_nd(node: Node, g: Graph) -> str | None:
    data, indices = g.tensors[node.inputs[0]], g.tensors[node.inputs[1]]
    rows = math.prod(data.shape[:int(node.attrs.get("batch_dims", 0)) + indices.shape[-1]])
    if not indices.is_constant and rows > MAX_TABLE_ROWS:
        return f"GatherND with run-time indices into {rows} rows (row indices exact up to {MAX_TABLE_ROWS})"
    return _check_gather(node, g)


@lowering("GatherND", check=_check_gather_nd, since=11, moves_data=True)
def lower_gather_nd(ctx: LowerCtx, node: Node) -> None:
    """Constant indices: the element offsets, as for GatherElements. Run-time indices: the table row of each
    index tuple computed on chip (index_rows.py), the tuple's batch coordinates giving a compile-time base, then
    the rows (slices data[batch, i_0, .., i_{k-1}]) gathered."""
    if ctx.graph.tensors[node.inputs[1]].is_constant:
        lower_gather_elements(ctx, node)
        return
    prog, pmax = ctx.program, ctx.program.target.partitions
    shape, idx_shape = ctx.shape(node.inputs[0]), ctx.shape(node.inputs[1])
    b, k = int(node.attrs.get("batch_dims", 0)), idx_shape[-1]
    n, rows, inner = math.prod(idx_shape[:-1]), math.prod(shape[:b + k]), shape[b + k:] or (1,)
    data = contiguous(prog, ctx.view(node.inputs[0]), f"{node.name}/data").reshape((rows, *inner))
    indices = contiguous(prog, ctx.view(node.inputs[1]), f"{node.name}/indices").reshape((n, k))
    assert data is not None and indices is not None  # contiguous
    strides = [math.prod(shape[a + 1:b + k]) for a in range(b + k)]
    batch = np.indices(idx_shape[:-1], dtype=np.int64)[:b]
    base = sum((c * s for c, s in zip(batch, strides)), np.zeros(idx_shape[:-1], dtype=np.int64))
    bases = ctx.view(ctx.constant(f"{node.name}/base", base.reshape(n, 1).astype(np.int32))) if b else None
    found = HbmView.whole(prog.hbm_tensor(f"{node.name}/rows", n * 4, TensorKind.SCRATCH, DType.int32),
                          DType.int32, (n, 1))
    for p0 in range(0, n, pmax):
        p = min(pmax, n - p0)
        index = prog.sbuf(p, k, DType.int32, "index")
        prog.dma(index.ap(), indices.box((p0, 0), (p, k)))
        start = None
        if bases is not None:
            start = prog.sbuf(p, 1, DType.int32, "base").ap()
            prog.dma(start, bases.box((p0, 0), (p, 1)))
        columns = [(index.region(j, 1), shape[b + j], strides[b + j]) for j in range(k)]
        prog.dma(found.box((p0, 0), (p, 1)), table_rows(prog, p, columns, start, rows))
    out = ctx.output(node.outputs[0]).reshape((n, *inner))
    assert out is not None  # a fresh output is contiguous
    gather_rows(ctx, data.box((0,) * (1 + len(inner)), (1, *inner)), found.reshape((n,)), out, rows,
                math.prod(inner), fix_negative=False)


@lowering("GatherElements", check=_check_gather_elements, since=11, moves_data=True)
def lower_gather_elements(ctx: LowerCtx, node: Node) -> None:
    data = ctx.view(node.inputs[0])
    extent = sum((n - 1) * s for n, s in zip(data.shape, data.strides)) + 1
    if ctx.graph.tensors[node.inputs[1]].is_constant:
        offsets = _element_offsets(node, ctx.graph, data)
        if np.any((offsets < 0) | (offsets >= extent)):
            raise CompileError("NCC_INDEX", "an index is outside the data", node.name, node.op)
        index_view = ctx.view(ctx.constant(f"{node.name}/offsets", offsets.astype(np.int32)))
    else:  # an index outside the data stops the run: dma_gather checks every index against the extent
        index_view = _runtime_offsets(ctx, node, HbmView(data.tensor, data.dtype, data.shape, data.strides, 0))
    out = ctx.output(node.outputs[0])
    element = HbmView(data.tensor, data.dtype, (1, 1), (0, 1), data.offset)
    gather_rows(ctx, element, index_view, out.reshape((out.size, 1)), int(extent), 1, fix_negative=False)
