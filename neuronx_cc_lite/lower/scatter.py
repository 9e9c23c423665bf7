"""ScatterND and ScatterElements (and Scatter, ScatterElements' name before opset 11), and TensorScatter (a KV
cache update): a copy of the data with updates written at indices that may be known only at run time.

    out = data                                    one HBM -> HBM copy
    for each block of up to pmax index rows:      (a ScatterND index tuple, a ScatterElements element)
        index  <- the block's indices             DMA, one index row per partition
        row    =  the table row each one names    VectorE, in the fp32 ALU: exact below 2**24
        update <- the block's updates             DMA, one table row per partition
        dma_scatter(update -> out's rows `row`)

The table is the output seen as rows: for ScatterND the slices out[i_0, .., i_{k-1}] (row = sum_j i_j * the
product of shape[j+1:k]); for ScatterElements single elements (row = the element's flat offset: a compile-time
base for its other coordinates plus index * the axis' stride), one element per partition, which suits the small
tensors these ops see and is refused past MAX_INDEX_ROWS index rows; for TensorScatter the cache's rows along
its sequence axis, update row (prefix, s) going to row (prefix, write_indices[batch] + s), modulo the sequence
length in circular mode. The rows are computed as index_rows.py says: negative indices wrapped, an index outside
its axis refused by dma_scatter at run time.

Into device state whose next value the scatter is, and which nothing else reads (a KV cache written at the run's
position: LowerCtx.in_place), the scatter writes in place: no copy, only the rows that change.

A scatter writes its whole table as far as ordering goes (the instruction's implicit write), so the copy, each
block and every reader of the output follow one another: of two equal indices the later one wins, as in
onnxruntime's loop (ONNX leaves duplicates undefined for reduction 'none'). A reduction (add, mul, max, min)
combines each update with what its row holds, one index row after another in index order, so that equal indices
accumulate:

        old <- dma_gather(table row row[p]);  old = old op update[p];  dma_scatter(old -> table row row[p])

which is one read-modify-write per index row: refused past MAX_REDUCED_ROWS.
"""

from __future__ import annotations

import math

import numpy as np

from isa.dtypes import DType
from isa.functions import AluOp
from isa.operand import Engine
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import tile_free_max
from neuronx_cc_lite.lower.index_rows import MAX_TABLE_ROWS, row_access, table_rows
from neuronx_cc_lite.lower.instr import ts, tt
from neuronx_cc_lite.lower.patterns import contiguous
from neuronx_cc_lite.lower.rows import free_chunks
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import TileAccess

MAX_INDEX_ROWS = 1 << 16  # index rows (tuples or elements) per node: at most 512 blocks of 128
MAX_REDUCED_ROWS = 1 << 10  # index rows of a reduction: four DMA or VectorE instructions each, in sequence
REDUCTIONS = {"none": None, "add": AluOp.add, "mul": AluOp.multiply, "max": AluOp.maximum, "min": AluOp.minimum}


def _reduction(node: Node) -> str:
    value = node.attrs.get("reduction", "none")
    return value.decode() if isinstance(value, bytes) else str(value)


def _check_scatter(node: Node, g: Graph) -> str | None:
    data, indices = g.tensors[node.inputs[0]], g.tensors[node.inputs[1]]
    reduction = _reduction(node)
    if reduction not in REDUCTIONS:
        return f"{node.op} with reduction {reduction!r} is not supported"
    if data.size == 0:
        return f"{node.op} into an empty tensor is not supported"
    rows = math.prod(indices.shape[:-1]) if node.op == "ScatterND" else indices.size
    limit = MAX_INDEX_ROWS if reduction == "none" else MAX_REDUCED_ROWS
    if rows > limit:
        return f"{node.op} with {rows} index rows is not supported (at most {limit} with reduction {reduction!r})"
    k = indices.shape[-1] if node.op == "ScatterND" else 0
    rows_of_table = math.prod(data.shape[:k]) if node.op == "ScatterND" else data.size
    if rows_of_table > MAX_TABLE_ROWS:
        return f"{node.op} into {rows_of_table} rows is not supported (row indices exact up to {MAX_TABLE_ROWS})"
    return None


def _scatter_block(ctx: LowerCtx, row: TileAccess, updates: HbmView, table: HbmView, rows: int,
                   op: AluOp | None) -> None:
    """Rows of `updates` (p, *row) to table rows `row`, where `table` (1, *row) is the table's row 0 (its rows
    one row's size apart), cut along the row to fit a tile; with `op`, each combined with what its row holds,
    one after another."""
    prog = ctx.program
    p = updates.shape[0]
    row_stride = math.prod(table.shape[1:])
    budget = tile_free_max(ctx)
    for (_, dst_piece), (_, src_piece) in zip(free_chunks(table, budget), free_chunks(updates, budget)):
        dst = row_access(dst_piece, "scattered", prog.node)
        f = math.prod(src_piece.shape[1:])
        if op is None:
            update = prog.sbuf(p, f, updates.dtype, "update")
            prog.dma(update.ap(), src_piece)
            prog.emit("dma_scatter", Engine.DMA, dst=dst, src=update.ap(), index=row, rows=rows,
                      row_stride=row_stride)
            continue
        for q in range(p):  # DMA reads and writes any partition: each row through partition 0 of small tiles
            at = TileAccess(row.tile, row.first + q, 1, row.offset, row.dims)
            old, update = prog.sbuf(1, f, table.dtype, "old"), prog.sbuf(1, f, updates.dtype, "update")
            prog.emit("dma_gather", Engine.DMA, dst=old.ap(), src=dst, index=at, rows=rows, row_stride=row_stride)
            prog.dma(update.ap(), src_piece.box((q,) + (0,) * (len(src_piece.shape) - 1), (1, *src_piece.shape[1:])))
            tt(prog, old.ap(), old.ap(), update.ap(), op)
            prog.emit("dma_scatter", Engine.DMA, dst=dst, src=old.ap(), index=at, rows=rows, row_stride=row_stride)


def _result(ctx: LowerCtx, node: Node) -> HbmView:
    """Where the scatter writes: the state it updates in place, or a copy of its data."""
    out = ctx.in_place(node)
    if out is None:
        out = ctx.output(node.outputs[0])
        ctx.program.dma(out, ctx.view(node.inputs[0]))
    return out


def _flat(ctx: LowerCtx, name: str, shape: tuple[int, ...]) -> HbmView:
    """Tensor `name` seen with `shape` (its size), copied to a contiguous scratch tensor first when its view is
    strided."""
    view = contiguous(ctx.program, ctx.view(name), name).reshape(shape)
    assert view is not None  # contiguous
    return view


@lowering("ScatterND", check=_check_scatter, since=11)
def lower_scatter_nd(ctx: LowerCtx, node: Node) -> None:
    prog, pmax = ctx.program, ctx.program.target.partitions
    shape = ctx.shape(node.inputs[0])
    idx_shape = ctx.shape(node.inputs[1])
    k, n = idx_shape[-1], math.prod(idx_shape[:-1])
    rows, row_shape = math.prod(shape[:k]), shape[k:]
    out = _result(ctx, node)
    if n == 0:
        return
    table = out.reshape((rows, *row_shape))
    assert table is not None  # a fresh output is contiguous
    indices, updates = _flat(ctx, node.inputs[1], (n, k)), _flat(ctx, node.inputs[2], (n, *row_shape))
    strides = [math.prod(shape[j + 1:k]) for j in range(k)]
    for p0 in range(0, n, pmax):
        p = min(pmax, n - p0)
        index = prog.sbuf(p, k, DType.int32, "index")
        prog.dma(index.ap(), indices.box((p0, 0), (p, k)))
        columns = [(index.region(j, 1), shape[j], strides[j]) for j in range(k)]
        row = table_rows(prog, p, columns, None, rows)
        _scatter_block(ctx, row, updates.box((p0,) + (0,) * len(row_shape), (p, *row_shape)),
                       table.box((0,) * (1 + len(row_shape)), (1, *row_shape)), rows, REDUCTIONS[_reduction(node)])


@lowering("Scatter", check=_check_scatter, since=9)
@lowering("ScatterElements", check=_check_scatter, since=11)
def lower_scatter_elements(ctx: LowerCtx, node: Node) -> None:
    prog, pmax = ctx.program, ctx.program.target.partitions
    shape = ctx.shape(node.inputs[0])
    idx_shape = ctx.shape(node.inputs[1])
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    n, size = math.prod(idx_shape), math.prod(shape)
    out = _result(ctx, node)
    if n == 0:
        return
    table = out.reshape((size, 1))
    assert table is not None  # a fresh output is contiguous
    out_strides = [math.prod(shape[a + 1:]) for a in range(len(shape))]
    coords = np.indices(idx_shape, dtype=np.int64)
    base = sum((c * s for a, (c, s) in enumerate(zip(coords, out_strides)) if a != axis),
               np.zeros(idx_shape, dtype=np.int64))
    bases = ctx.view(ctx.constant(f"{node.name}/base", base.reshape(n, 1).astype(np.int32)))
    indices, updates = _flat(ctx, node.inputs[1], (n, 1)), _flat(ctx, node.inputs[2], (n, 1))
    for p0 in range(0, n, pmax):
        p = min(pmax, n - p0)
        index, start = prog.sbuf(p, 1, DType.int32, "index"), prog.sbuf(p, 1, DType.int32, "base")
        prog.dma(index.ap(), indices.box((p0, 0), (p, 1)))
        prog.dma(start.ap(), bases.box((p0, 0), (p, 1)))
        row = table_rows(prog, p, [(index.ap(), shape[axis], out_strides[axis])], start.ap(), size)
        _scatter_block(ctx, row, updates.box((p0, 0), (p, 1)), table.box((0, 0), (1, 1)), size,
                       REDUCTIONS[_reduction(node)])


def _check_tensor_scatter(node: Node, g: Graph) -> str | None:
    cache, update = g.tensors[node.inputs[0]], g.tensors[node.inputs[1]]
    axis = int(node.attrs.get("axis", -2)) % len(cache.shape)
    if cache.size == 0:
        return "TensorScatter into an empty cache is not supported"
    rows = math.prod(update.shape[:axis + 1])
    if rows > MAX_INDEX_ROWS:
        return f"TensorScatter of {rows} rows is not supported (at most {MAX_INDEX_ROWS})"
    if math.prod(cache.shape[:axis + 1]) > MAX_TABLE_ROWS:
        return f"TensorScatter into more than {MAX_TABLE_ROWS} rows is not supported"
    return None


@lowering("TensorScatter", check=_check_tensor_scatter, since=24)
def lower_tensor_scatter(ctx: LowerCtx, node: Node) -> None:
    """Per block of update rows: each row's write index (its batch's, loaded once per run of rows of one batch)
    plus its sequence position, modulo the length in circular mode, is the column within the row's prefix."""
    prog, pmax = ctx.program, ctx.program.target.partitions
    shape, upd_shape = ctx.shape(node.inputs[0]), ctx.shape(node.inputs[1])
    axis = int(node.attrs.get("axis", -2)) % len(shape)
    length, seq = shape[axis], upd_shape[axis]
    circular = node.attrs.get("mode", "linear") in ("circular", b"circular")
    n, rows, row_shape = math.prod(upd_shape[:axis + 1]), math.prod(shape[:axis + 1]), shape[axis + 1:] or (1,)
    out = _result(ctx, node)
    table = out.reshape((rows, *row_shape))
    assert table is not None  # a fresh output is contiguous
    updates = _flat(ctx, node.inputs[1], (n, *row_shape))
    position = np.arange(n, dtype=np.int64) % seq  # the row's sequence position s
    base = np.arange(n, dtype=np.int64) // seq * length  # where the row's prefix starts in the table
    per_batch = n // upd_shape[0]
    constants = ctx.view(ctx.constant(f"{node.name}/rows", np.stack([position, base], 1).astype(np.int32)))
    writes = _flat(ctx, node.inputs[2], (upd_shape[0], 1)) if len(node.inputs) > 2 and node.inputs[2] else None
    for p0 in range(0, n, pmax):
        p = min(pmax, n - p0)
        known = prog.sbuf(p, 2, DType.int32, "position_base")
        prog.dma(known.ap(), constants.box((p0, 0), (p, 2)))
        column = known.region(0, 1)
        if writes is not None:
            start = prog.sbuf(p, 1, DType.int32, "write_index")
            q = p0
            while q < p0 + p:  # one broadcast load per run of rows of one batch
                batch, run = q // per_batch, min(p0 + p, (q // per_batch + 1) * per_batch) - q
                src = HbmView(writes.tensor, writes.dtype, (run, 1), (0, 1), writes.offset + batch)
                prog.dma(TileAccess(start, q - p0, run, 0, ((1, 1),)), src)
                q += run
            summed = prog.sbuf(p, 1, DType.fp32, "sequence_index").ap()
            tt(prog, summed, start.ap(), column, AluOp.add)
            if circular:
                ts(prog, summed, summed, AluOp.mod, float(length))
            column = summed
        row = table_rows(prog, p, [(column, length, 1)], known.region(1, 1), rows)
        _scatter_block(ctx, row, updates.box((p0,) + (0,) * len(row_shape), (p, *row_shape)),
                       table.box((0,) * (1 + len(row_shape)), (1, *row_shape)), rows, None)
