"""MatMul and Gemm on the Tensor engine.

    out[M, N] = func(alpha * A[M, K] @ B[K, N] + addends)       addends: bias rows, residuals, Gemm's beta * C

PE computes psum[m, n] (+)= stationary[k, m].T @ moving[k, n] with the contraction K on partitions: it needs A^T
tiles [kt <= 128, mt <= 128] (stationary) and B tiles [kt, nt <= one PSUM bank] (moving). Each operand is brought
in whichever layout reads it in large contiguous pieces:

    B a weight                 transposed, cast to the matmul type and cut into K tiles at compile time, so that a
                               K tile of a column group is one contiguous block in HBM
    B rows along N             (an activation) loaded as is, K rows on partitions
    B rows along K             (a transposed view, K^T in attention) loaded with N on partitions, turned on PE
    A rows along K             (an activation) loaded as a [mt, K] row block, turned into A^T on PE
    A rows along M             (a transposed view) loaded as A^T directly
    A a weight                 laid out as A^T at compile time

Reuse: the B tiles of a column group are loaded once and kept for every row block when they fit (a weight of
2048 x 2048 in bf16 takes 64 KiB per partition); the A^T tiles of a row block are made once for every column block.
Each (row block, column block) accumulates over the K tiles in one PSUM bank and leaves it in one instruction:
ScalarE applies alpha and the activation when nothing is added; otherwise VectorE adds the first addend as it
evacuates ((psum * alpha) + addend), then the others, and ScalarE applies the activation in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import floats_only
from neuronx_cc_lite.lower.hbm import HbmTensor, HbmView
from neuronx_cc_lite.lower.instr import act, ts, tt
from neuronx_cc_lite.lower.program import Program, Tile, TileAccess
from neuronx_cc_lite.lower.registry import lowering
from neuronx_cc_lite.lower.transpose import Piece, transpose_pieces

# Bytes per partition the operands kept for a whole matmul may take (B's column groups, or the A row block
# loaded whole); beyond it they are streamed. The memory planner sees them as ordinary tiles.
RESIDENT_BYTES = 96 * 1024
ROW_GROUP = 4  # row blocks that share a pass over B's column groups (see matmul_2d)

Operand = HbmView | np.ndarray  # a view of a tensor computed at run time, or a constant's value


@dataclass
class Epilogue:
    alpha: float = 1.0
    addends: list[tuple[HbmView, float]] = field(default_factory=list)  # (view broadcast to out's shape, scale)
    func: ActFunc = ActFunc.copy
    bias: np.ndarray | None = None  # a constant row [N], added by PE as it accumulates (before alpha)


def _bias_rows(ctx: LowerCtx, bias: np.ndarray, key: str) -> Tile:
    """The bias as the moving operand of a matmul against ones: three bf16 rows whose sum is the fp32 bias
    exactly (hi, mid and lo parts of its 24-bit mantissa), so that PE adds it at the bf16 rate; one fp32 row when
    a value does not split (inf, NaN, or beyond bf16's exponent range)."""
    row = np.asarray(bias, dtype=np.float32).reshape(1, -1)
    parts, rest = [], row
    for _ in range(3):
        part = rest.astype(ml_dtypes.bfloat16)
        parts.append(part)
        rest = (rest - part.astype(np.float32)).astype(np.float32)
    exact = np.isfinite(row).all() and np.array_equal(sum(p.astype(np.float64) for p in parts), row)
    dtype, blocks = (DType.bf16, parts) if exact else (DType.fp32, [row])
    weight, _ = _laid_out(ctx, f"{key}/rows", blocks, dtype)
    rows = ctx.program.sbuf(len(blocks), row.shape[1], dtype, f"{key}/rows")
    ctx.program.dma(rows.ap(), HbmView(weight, dtype, (len(blocks), row.shape[1]), (row.shape[1], 1)))
    return rows


def _blocks(size: int, step: int) -> list[tuple[int, int]]:
    return [(start, min(step, size - start)) for start in range(0, size, step)]


def _laid_out(ctx: LowerCtx, key: str, blocks: list[np.ndarray], dtype: DType) -> tuple[HbmTensor, list[int]]:
    """A weight tensor holding `blocks` back to back in `dtype` (cached by key), and each block's element offset."""
    cache = ctx.laid_out
    if key not in cache:
        data = np.concatenate([np.ascontiguousarray(b).ravel() for b in blocks])
        data = ctx.narrowed(data, dtype)
        offsets = list(np.cumsum([0] + [b.size for b in blocks[:-1]]))
        cache[key] = (ctx.program.hbm_tensor(key, data.nbytes, "weight", dtype, data.tobytes()), [int(o) for o in offsets])
    return cache[key]


class _BSource:
    """The moving operand: B tiles [kt, nt] per (K tile, column block)."""

    def __init__(self, ctx: LowerCtx, b: Operand, dtype: DType, k_tiles: list[tuple[int, int]], n_size: int,
                 name: str, key: str | None) -> None:
        self.ctx, self.b, self.dtype, self.k_tiles, self.name = ctx, b, dtype, k_tiles, name
        prog = ctx.program
        width = len(k_tiles) * n_size * dtype.size
        # column groups of one PSUM bank: the first column block needs only its group of every K tile, so the
        # multiplying starts after a fraction of B has arrived; the groups stay for every row block when all fit
        self.group = min(n_size, prog.target.psum_bank_fmax)
        self.groups = _blocks(n_size, self.group)
        self.resident = width <= RESIDENT_BYTES
        self.tiles: dict[tuple[int, int], Tile] = {}
        if isinstance(b, np.ndarray):
            blocks = [b[k0:k0 + kt, g0:g0 + gn] for g0, gn in self.groups for k0, kt in k_tiles]
            self.weight, self.offsets = _laid_out(ctx, f"{key}/KxN{self.group}", blocks, dtype)

    def tile(self, j: int, n0: int, nt: int, m_block: int) -> TileAccess:
        """B for K tile j and columns n0 .. n0 + nt (within one group)."""
        g = n0 // self.group
        g0, gn = self.groups[g]
        key = (j, g) if self.resident else (j, g, m_block)
        if key not in self.tiles:
            self.tiles[key] = self._load(j, g0, gn, g)
        return self.tiles[key].region(n0 - g0, nt)

    def _load(self, j: int, g0: int, gn: int, g: int) -> Tile:
        prog, b = self.ctx.program, self.b
        k0, kt = self.k_tiles[j]
        t = prog.sbuf(kt, gn, self.dtype, f"{self.name}/B")
        if isinstance(b, np.ndarray):
            at = self.offsets[g * len(self.k_tiles) + j]
            prog.dma(t.ap(), HbmView(self.weight, self.dtype, (kt, gn), (gn, 1), at))
        elif b.strides[1] == 1 or b.shape[1] == 1:  # rows along N
            prog.dma(t.ap(), b.box((k0, g0), (kt, gn)))
        elif b.strides[0] == 1:  # rows along K: load B^T [n, K] and turn it
            pieces = []
            for c0, cn in _blocks(gn, prog.target.partitions):
                rows = prog.sbuf(cn, kt, self.dtype, f"{self.name}/B^T")
                prog.dma(rows.ap(), b.box((k0, g0 + c0), (kt, cn)).transpose((1, 0)))
                pieces.append(Piece(rows.ap(), t, c0))
            transpose_pieces(prog, pieces, self.name)
        else:
            prog.dma(t.ap(), b.box((k0, g0), (kt, gn)))  # an access pattern strided both ways: as it comes
        return t


def _a_transposed(ctx: LowerCtx, a: Operand, dtype: DType, m0: int, mt: int, k_tiles: list[tuple[int, int]],
                  name: str, key: str | None) -> Tile:
    """A^T for rows m0 .. m0 + mt: one tile [128, K tiles x mt], K tile j at element j * mt."""
    prog = ctx.program
    kmax = max(kt for _, kt in k_tiles)
    at = prog.sbuf(kmax, len(k_tiles) * mt, dtype, f"{name}/A^T")
    k_size = sum(kt for _, kt in k_tiles)
    if isinstance(a, np.ndarray):
        blocks = [a[m0:m0 + mt, k0:k0 + kt].T for k0, kt in k_tiles]
        weight, offsets = _laid_out(ctx, f"{key}/MxK{m0}", blocks, dtype)
        for j, (k0, kt) in enumerate(k_tiles):
            prog.dma(at.region(j * mt, mt, 0, kt), HbmView(weight, dtype, (kt, mt), (mt, 1), offsets[j]))
    elif a.strides[1] == 1 or a.shape[1] == 1:  # rows along K: load the row block, turn it on PE
        rows = prog.sbuf(mt, k_size, dtype, f"{name}/A")
        prog.dma(rows.ap(), a.box((m0, 0), (mt, k_size)))
        transpose_pieces(prog, [Piece(rows.region(k0, kt), at, j * mt) for j, (k0, kt) in enumerate(k_tiles)],
                         name)
    else:  # rows along M (a transposed view), or strided both ways: A^T tiles as they come
        for j, (k0, kt) in enumerate(k_tiles):
            prog.dma(at.region(j * mt, mt, 0, kt), a.box((m0, k0), (mt, kt)).transpose((1, 0)))
    return at


def matmul_2d(ctx: LowerCtx, a: Operand, b: Operand, out: HbmView, epilogue: Epilogue = Epilogue(),
              keys: tuple[str | None, str | None] = (None, None)) -> None:
    """out = epilogue(a @ b). A constant operand is given as its value and laid out at compile time (`keys` name
    its laid-out weights, so that a weight shared by several matmuls is stored once)."""
    prog, t = ctx.program, ctx.program.target
    (m_size, k_size), n_size = a.shape, b.shape[1]
    assert b.shape[0] == k_size and out.shape == (m_size, n_size), (a.shape, b.shape, out.shape)
    name = prog.node
    dtype = prog.operand_dtype(_dtype(ctx, a, b))
    k_tiles = _blocks(k_size, t.partitions)
    b_source = _BSource(ctx, b, dtype, k_tiles, n_size, name, keys[1])
    bias_tiles: dict[tuple[int, int], Tile] = {}
    bias_rows = _bias_rows(ctx, epilogue.bias, name) if epilogue.bias is not None else None
    m_blocks = _blocks(m_size, t.gemm_stationary_fmax)
    # with B resident, row blocks go in groups, every column block for the group before the next: the first
    # products need one column group of B and a few row blocks of A, not all of B, and PE starts while the rest
    # arrives; without it, each row block takes its own pass over B
    group = ROW_GROUP if b_source.resident else 1
    for g0 in range(0, len(m_blocks), group):
        rows = list(enumerate(m_blocks))[g0:g0 + group]
        a_ts = {mb: _a_transposed(ctx, a, dtype, m0, mt, k_tiles, name, keys[0]) for mb, (m0, mt) in rows}
        for n0, nt in _blocks(n_size, t.psum_bank_fmax):
            nt = min(nt, b_source.group - n0 % b_source.group)
            for mb, (m0, mt) in rows:
                acc = prog.psum(mt, nt, f"{name}/acc")
                for j, (k0, kt) in enumerate(k_tiles):
                    prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=a_ts[mb].region(j * mt, mt, 0, kt),
                              moving=b_source.tile(j, n0, nt, mb), accumulate=j > 0)
                if bias_rows is not None:  # psum[m, n] += sum over rows r of 1 * bias_r[n]
                    r = bias_rows.partitions
                    prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=prog.ones(bias_rows.dtype).region(
                        0, mt, 0, r), moving=bias_rows.region(n0, nt, 0, r), accumulate=True)
                res = prog.sbuf(mt, nt, out.dtype, f"{name}/out")
                _evacuate(ctx, acc, res, epilogue, m0, mt, n0, nt, bias_tiles)
                prog.dma(out.box((m0, n0), (mt, nt)), res.ap())


def _dtype(ctx: LowerCtx, a: Operand, b: Operand) -> DType:
    for x in (a, b):
        if isinstance(x, HbmView):
            return x.dtype
    return ctx.program.operand_dtype(DType.fp32) if ctx.internal_dtype is None else ctx.internal_dtype


def _evacuate(ctx: LowerCtx, acc: Tile, res: Tile, e: Epilogue, m0: int, mt: int, n0: int, nt: int,
              cache: dict[tuple[int, int], Tile]) -> None:
    prog = ctx.program
    if not e.addends:
        act(prog, res.ap(), acc.ap(), e.func, scale=e.alpha)
        return
    for k, (view, scale) in enumerate(e.addends):
        block = _addend(prog, view, scale, m0, mt, n0, nt, cache, k)
        if k == 0:
            prog.emit("scalar_tensor_tensor", Engine.DVE, dst=res.ap(), src=acc.ap(), op0=AluOp.multiply,
                      scalar=float(e.alpha), op1=AluOp.add, b=block)
        else:
            tt(prog, res.ap(), res.ap(), block, AluOp.add)
    if e.func is not ActFunc.copy:
        act(prog, res.ap(), res.ap(), e.func)


def _addend(prog: Program, view: HbmView, scale: float, m0: int, mt: int, n0: int, nt: int,
            cache: dict[tuple[int, int], Tile], k: int) -> TileAccess:
    """The addend's [mt, nt] block, scaled; a row broadcast over M (a bias) is loaded once per column block."""
    row = view.strides[0] == 0
    key = (k, n0)
    if row and key in cache and cache[key].partitions >= mt:
        return cache[key].ap(partitions=mt)
    tile = prog.sbuf(mt, nt, view.dtype if scale == 1.0 else DType.fp32, f"{prog.node}/addend")
    prog.dma(tile.ap(), view.box((m0, n0), (mt, nt)))
    if scale != 1.0:
        ts(prog, tile.ap(), tile.ap(), AluOp.multiply, scale)
    if row:
        cache[key] = tile
    return tile.ap()


def _check_matmul(node: Node, g: Graph) -> str | None:
    shapes = [g.tensors[i].shape for i in node.inputs[:2]]
    if any(len(s) == 0 for s in shapes):
        return "MatMul of a scalar is not defined"
    if any(0 in s for s in shapes):
        return "MatMul of an empty tensor is not supported"
    return floats_only(node, g)


def operand(ctx: LowerCtx, name: str) -> Operand:
    """A matmul input: its value when it is a constant (laid out by the matmul), else its HBM view."""
    t = ctx.graph.tensors[name]
    return t.value.astype(np.float64) if t.is_constant else ctx.view(name)


def _broadcast(x: Operand, shape: tuple[int, ...]) -> Operand:
    return np.broadcast_to(x, shape) if isinstance(x, np.ndarray) else x.broadcast_to(shape)


def _at(x: Operand, index: tuple[int, ...]) -> Operand:
    return x[index] if isinstance(x, np.ndarray) else x.at(index)


def lower_matmul_into(ctx: LowerCtx, node: Node, epilogue: Epilogue) -> None:
    """numpy matmul: vectors are promoted to matrices, leading (batch) axes broadcast. When B has no batch axes
    of its own (a Linear layer on a [batch, rows, features] activation) the batch folds into A's rows: one
    matmul with taller row blocks; else one matmul_2d per batch index. The epilogue's addends are views
    broadcast to the output's shape (fusion gives them only when neither input is a vector)."""
    names = node.inputs[:2]
    a, b = (operand(ctx, n) for n in names)
    if len(a.shape) == 1:
        a = a.reshape(1, -1) if isinstance(a, np.ndarray) else a.split_axis(0, (1, a.shape[0]))
    if len(b.shape) == 1:
        b = b.reshape(-1, 1) if isinstance(b, np.ndarray) else b.split_axis(0, (b.shape[0], 1))
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    m, n = a.shape[-2], b.shape[-1]
    rank, rows = len(ctx.shape(node.outputs[0])), math.prod(batch) * m
    flat_a = a.reshape((rows, a.shape[-1])) if isinstance(a, HbmView) and a.shape[:-2] == batch else None
    flat_addends = [(v.reshape((rows, n)), s) for v, s in epilogue.addends]
    folds = math.prod(b.shape[:-2]) == 1 and flat_a is not None and all(v is not None for v, _ in flat_addends)
    rows_axes = (0, rank - 1) if folds else (rank - 2, rank - 1)  # the batch joins the rows, or each its own
    out = ctx.output(node.outputs[0], rows_axes if rank >= 2 else None, follow_transpose=not folds)
    if out.shape != batch + (m, n):  # a vector operand promoted to a matrix
        out = out.reshape(batch + (m, n))
    assert out is not None
    if folds:
        b2 = b.reshape(b.shape[-2:]) if isinstance(b, np.ndarray) else b.at((0,) * (len(b.shape) - 2))
        key = names[1] if isinstance(b, np.ndarray) else None
        matmul_2d(ctx, flat_a, b2, out.reshape((rows, n)),  # type: ignore[arg-type]
                  Epilogue(epilogue.alpha, flat_addends, epilogue.func, epilogue.bias),  # type: ignore[arg-type]
                  (None, key))
        return
    a_batch, b_batch = a.shape[:-2], b.shape[:-2]
    a = _broadcast(a, batch + a.shape[-2:])
    b = _broadcast(b, batch + b.shape[-2:])
    for index in np.ndindex(*batch):
        keys = tuple(f"{nm}{list(_own_index(index, own))}" if isinstance(x, np.ndarray) else None
                     for nm, x, own in zip(names, (a, b), (a_batch, b_batch)))
        e = Epilogue(epilogue.alpha, [(v.at(index), s) for v, s in epilogue.addends], epilogue.func, epilogue.bias)
        matmul_2d(ctx, _at(a, index), _at(b, index), out.at(index), e, keys)  # type: ignore[arg-type]


def _own_index(index: tuple[int, ...], own: tuple[int, ...]) -> tuple[int, ...]:
    """The index into an operand's own batch axes (right-aligned; broadcast axes of size 1 read index 0), so that
    a constant broadcast over the batch is laid out once."""
    own_index = index[len(index) - len(own):]
    return tuple(i if n > 1 else 0 for i, n in zip(own_index, own))


@lowering("MatMul", check=_check_matmul)
def lower_matmul(ctx: LowerCtx, node: Node) -> None:
    lower_matmul_into(ctx, node, Epilogue())


def gemm_into(ctx: LowerCtx, node: Node, epilogue: Epilogue) -> None:
    """Y = epilogue(A' @ B') with A', B' transposed as transA and transB say."""
    attrs = node.attrs
    a, b = operand(ctx, node.inputs[0]), operand(ctx, node.inputs[1])
    if attrs.get("transA", 0):
        a = a.T if isinstance(a, np.ndarray) else a.transpose((1, 0))
    if attrs.get("transB", 0):
        b = b.T if isinstance(b, np.ndarray) else b.transpose((1, 0))
    out = ctx.output(node.outputs[0], (0, 1))
    keys = tuple(f"{n}{'^T' if attrs.get(t, 0) else ''}" for n, t in zip(node.inputs[:2], ("transA", "transB")))
    matmul_2d(ctx, a, b, out, epilogue, keys)  # type: ignore[arg-type]


@lowering("Gemm", since=7)
def lower_gemm(ctx: LowerCtx, node: Node) -> None:
    addends = []
    if len(node.inputs) > 2 and node.inputs[2]:
        shape = ctx.shape(node.outputs[0])
        addends.append((ctx.view(node.inputs[2]).broadcast_to(shape), float(node.attrs.get("beta", 1.0))))
    gemm_into(ctx, node, Epilogue(float(node.attrs.get("alpha", 1.0)), addends))


EPILOGUE_FUNCS = {"": ActFunc.copy, "Relu": ActFunc.relu, "Gelu/none": ActFunc.gelu,
                  "Gelu/tanh": ActFunc.gelu_apprx_tanh, "Tanh": ActFunc.tanh, "Sigmoid": ActFunc.sigmoid}


@lowering("MatMulEpilogue")
def lower_matmul_epilogue(ctx: LowerCtx, node: Node) -> None:
    """A MatMul or Gemm with what followed it (passes/fuse_epilogues.py): inputs A, B, bias row, residual."""
    a_name, b_name, bias, residual = (node.inputs + ["", ""])[:4]
    addends = [(ctx.view(residual), 1.0)] if residual else []
    epilogue = Epilogue(float(node.attrs.get("alpha", 1.0)), addends, EPILOGUE_FUNCS[node.attrs["activation"]],
                        ctx.graph.tensors[bias].value if bias else None)
    if "transA" in node.attrs:  # from a Gemm
        gemm_into(ctx, node, epilogue)
    else:
        lower_matmul_into(ctx, node, epilogue)
