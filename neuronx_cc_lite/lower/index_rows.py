"""The table row an index tuple names, computed on chip for the indirect DMAs (dma_gather, dma_scatter) when the
indices are known only at run time.

    row = base + sum_j wrap(index_j) * stride_j        wrap: a negative index counts from the end of its axis
    row += rows  where some wrapped index_j lies outside [0, size_j)

in the fp32 ALU of VectorE: exact while rows stays below 2**23 (the row plus `rows` below 2**24). An index
outside its axis could otherwise land on another row (index (0, 6) of a 4 x 6 table is row 6 = (1, 0)); pushed
past the table, it makes the indirect DMA stop the run naming itself, as onnxruntime refuses the index.
"""

from __future__ import annotations

from isa.dtypes import DType
from isa.functions import AluOp
from isa.operand import MAX_FREE_DIMS, Engine
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.lower.instr import ts, tt
from neuronx_cc_lite.tile.hbm import HbmView, coalesce
from neuronx_cc_lite.tile.program import HbmAccess, Program, TileAccess

MAX_TABLE_ROWS = 1 << 23


def row_access(piece: HbmView, what: str, node: str) -> HbmAccess:
    """The first row of a piece of a table (axis 0: rows) as one partition's access, the indirect DMA's `row`
    operand; NCC_UNSUPPORTED when its axes do not coalesce into MAX_FREE_DIMS dimensions."""
    shape, (strides,) = coalesce([piece], keep_first=True)
    if len(shape) - 1 > MAX_FREE_DIMS:
        raise CompileError("NCC_UNSUPPORTED", f"a {what} row needs {len(shape) - 1} access dimensions "
                           f"(at most {MAX_FREE_DIMS})", node)
    return HbmAccess(piece.tensor, piece.dtype, 1, 0, piece.offset, tuple(zip(shape[1:], strides[1:])))


def table_rows(prog: Program, p: int, columns: list[tuple[TileAccess, int, int]], base: TileAccess | None,
               rows: int) -> TileAccess:
    """The int32 [p, 1] table row of each partition: base + sum_j wrap(index_j) * stride_j over `columns`
    (index_j [p, 1], size_j, stride_j), plus `rows` where some index_j lies outside [0, size_j)."""
    f32 = DType.fp32
    acc, wrapped = prog.sbuf(p, 1, f32, "row_sum").ap(), prog.sbuf(p, 1, f32, "wrapped").ap()
    outside, anywhere = prog.sbuf(p, 1, f32, "outside").ap(), prog.sbuf(p, 1, f32, "outside_any").ap()
    for j, (index, size, stride) in enumerate(columns):
        ts(prog, wrapped, index, AluOp.less, 0.0, AluOp.multiply, float(size))  # negatives count from the end
        tt(prog, wrapped, wrapped, index, AluOp.add)
        middle = (size - 1) / 2  # inside [0, size) <=> |wrapped - middle| <= middle
        ts(prog, outside, wrapped, AluOp.subtract, middle, AluOp.abs_max, 0.0)
        ts(prog, anywhere if j == 0 else outside, outside, AluOp.greater, middle)
        if j:
            tt(prog, anywhere, anywhere, outside, AluOp.maximum)
        previous = base if j == 0 else acc
        if previous is None:
            ts(prog, acc, wrapped, AluOp.multiply, float(stride))
        else:
            prog.emit("scalar_tensor_tensor", Engine.DVE, dst=acc, src=wrapped, op0=AluOp.multiply,
                      scalar=float(stride), op1=AluOp.add, b=previous)
    row = prog.sbuf(p, 1, DType.int32, "row").ap()
    prog.emit("scalar_tensor_tensor", Engine.DVE, dst=row, src=anywhere, op0=AluOp.multiply, scalar=float(rows),
              op1=AluOp.add, b=acc)
    return row
