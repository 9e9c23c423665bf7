"""MatMul and Gemm on the Tensor engine.

    out[M, N] = func(alpha * A[M, K] @ B[K, N] + addends)       addends: bias rows, residuals, Gemm's beta * C
    out[M, N] = (A[M, K] @ B[K, N] + bias) * gate               a gated projection (gate: a computed [M, N])

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
evacuates ((psum * alpha) + addend), then the others, and ScalarE applies the activation in place. A gate is
multiplied in as VectorE evacuates the bank, one pass reading PSUM and the gate ((psum + bias) * gate). HardSwish
and HardSigmoid, which ScalarE has no entry for, read the evacuated result in fp32 (lower/activations.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.instructions import pe_rate
from isa.operand import Engine, Mem
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower import batched_matmul as batched
from neuronx_cc_lite.lower.activations import hard_activation
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.instr import act, ts, tt
from neuronx_cc_lite.lower.layout import is_matmul
from neuronx_cc_lite.ops.registry import fused_function, lowering
from neuronx_cc_lite.ops.traits import OpKind
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Program, Tile, TileAccess
from neuronx_cc_lite.lower.operands import BSource, Operand, a_transposed, bias_columns, bias_rows, blocks

ROW_GROUP = 4  # row blocks that share a pass over B's column groups (see matmul_2d)


@dataclass
class Epilogue:
    alpha: float = 1.0
    addends: list[tuple[HbmView, float]] = field(default_factory=list)  # (view broadcast to out's shape, scale)
    func: ActFunc = ActFunc.copy
    bias: np.ndarray | None = None  # a constant row [N], added by PE as it accumulates (before alpha)
    gate: HbmView | None = None  # a computed [M, N] the result is multiplied by, last (alpha 1, no addend, copy)
    # HardSwish or HardSigmoid (func copy), applied to the evacuated result: hard(result, evacuated in fp32)
    hard: Callable[[TileAccess, TileAccess], None] | None = None


def matmul_2d(ctx: LowerCtx, a: Operand, b: Operand, out: HbmView, epilogue: Epilogue = Epilogue(),
              keys: tuple[str | None, str | None] = (None, None)) -> None:
    """out = epilogue(a @ b). A constant operand is given as its value and laid out at compile time (`keys` name
    its laid-out weights, so that a weight shared by several matmuls is stored once)."""
    prog, t = ctx.program, ctx.program.target
    (m_size, k_size), n_size = a.shape, b.shape[1]
    assert b.shape[0] == k_size and out.shape == (m_size, n_size), (a.shape, b.shape, out.shape)
    name = prog.node
    dtype = operand_type(ctx, a, b)
    k_tiles = blocks(k_size, t.partitions)
    b_source = BSource(ctx, b, dtype, k_tiles, n_size, name, keys[1])
    bias_tiles: dict[tuple[int, int], Tile] = {}
    rows_of_bias = bias_rows(ctx, epilogue.bias, name) if epilogue.bias is not None else None
    m_blocks = blocks(m_size, t.gemm_stationary_fmax)
    # with B resident, row blocks go in groups, every column block for the group before the next: the first
    # products need one column group of B and a few row blocks of A, not all of B, and PE starts while the rest
    # arrives; without it, each row block takes its own pass over B
    group = ROW_GROUP if b_source.resident else 1
    for g0 in range(0, len(m_blocks), group):
        rows = list(enumerate(m_blocks))[g0:g0 + group]
        a_ts = {mb: a_transposed(ctx, a, dtype, m0, mt, k_tiles, name, keys[0]) for mb, (m0, mt) in rows}
        for n0, nt in blocks(n_size, b_source.group):  # a bank's width at most, within one column group of B
            for mb, (m0, mt) in rows:
                acc = prog.psum(mt, nt, f"{name}/acc")
                for j, (k0, kt) in enumerate(k_tiles):
                    prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=a_ts[mb][j],
                              moving=b_source.tile(j, n0, nt, mb), accumulate=j > 0)
                if rows_of_bias is not None:  # psum[m, n] += sum over rows r of 1 * bias_r[n]
                    r = rows_of_bias.partitions
                    prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=prog.ones(
                        rows_of_bias.dtype).region(0, mt, 0, r), moving=rows_of_bias.region(n0, nt, 0, r),
                        accumulate=True)
                res = prog.sbuf(mt, nt, out.dtype, f"{name}/out")
                pre = _evacuated(prog, epilogue, res)
                _evacuate(ctx, acc, pre, epilogue, m0, mt, n0, nt, bias_tiles)
                _harden(epilogue, res, pre)
                prog.dma(out.box((m0, n0), (mt, nt)), res.ap())


def matmul_2d_transposed(ctx: LowerCtx, a: Operand, b: Operand, out: HbmView, epilogue: Epilogue,
                         keys: tuple[str | None, str | None] = (None, None), together: bool = False) -> None:
    """out = epilogue(a @ b), computed and stored feature-major, as out^T = B^T A^T: B's columns (the weights)
    stationary, 128 at a time, A^T (the activations, K on partitions) moving, up to a bank's width of rows. The
    result's columns land on partitions, so a bias is a per-partition column ScalarE adds as it evacuates the bank
    (with the activation), and a residual is read in the same layout: as it is when it is feature-major (from its
    home on chip), else by rows turned on PE (a transposing DMA from HBM moves one element per piece). Epilogues:
    a bias, one residual. `together`: a few rows' blocks of outputs in one bank where they fit (_side_by_side),
    whatever PE's pace."""
    prog, t = ctx.program, ctx.program.target
    (m_size, k_size), n_size = a.shape, b.shape[1]
    assert b.shape[0] == k_size and out.shape == (m_size, n_size), (a.shape, b.shape, out.shape)
    assert all(scale == 1.0 for _, scale in epilogue.addends) and len(epilogue.addends) <= 1
    name = prog.node
    dtype = operand_type(ctx, a, b)
    k_tiles = blocks(k_size, t.partitions)
    b_source = BSource(ctx, b, dtype, k_tiles, n_size, name, keys[1])
    columns = bias_columns(ctx, epilogue.bias * epilogue.alpha) if epilogue.bias is not None else None
    n_tiles = blocks(n_size, t.gemm_stationary_fmax)
    bank = min(t.psum_bank_fmax, t.gemm_moving_fmax)
    for mb, (m0, mw) in enumerate(blocks(m_size, t.gemm_moving_fmax)):
        a_t = a_transposed(ctx, a, dtype, m0, mw, k_tiles, name, keys[0])
        if 1 < len(n_tiles) and len(n_tiles) * mw <= bank and not epilogue.addends and epilogue.gate is None and \
                (together or (_outpaces_evacuation(prog, len(k_tiles), mw, dtype) and
                              (epilogue.hard is not None or not _read_by_a_matmul(ctx, out.tensor.name)))):
            _side_by_side(ctx, a_t, b_source, mb, n_tiles, columns, epilogue, out, m0, mw)
            continue
        residual_t = (a_transposed(ctx, epilogue.addends[0][0], epilogue.addends[0][0].dtype, m0, mw, n_tiles,
                                   f"{name}/residual", None) if epilogue.addends else [])
        gate_t = (a_transposed(ctx, epilogue.gate, epilogue.gate.dtype, m0, mw, n_tiles, f"{name}/gate", None)
                  if epilogue.gate is not None else [])
        for nj, (n0, nb) in enumerate(n_tiles):
            acc = prog.psum(nb, mw, f"{name}/acc")
            for j, (k0, kt) in enumerate(k_tiles):
                prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=b_source.tile(j, n0, nb, mb),
                          moving=a_t[j], accumulate=j > 0)
            res = prog.sbuf(nb, mw, out.dtype, f"{name}/out^T")
            pre = _evacuated(prog, epilogue, res)
            column = columns(n0, nb) if columns is not None else None
            if epilogue.gate is not None:  # (psum + bias) * gate, the bias a per-partition scalar
                prog.emit("scalar_tensor_tensor", Engine.DVE, dst=pre.ap(), src=acc.ap(),
                          op0=AluOp.add if column is not None else AluOp.multiply,
                          scalar=column if column is not None else 1.0, op1=AluOp.multiply, b=gate_t[nj])
            elif not epilogue.addends and epilogue.func is ActFunc.copy and column is not None:
                # a bias alone: a tensor_scalar, which ScalarE or VectorE may run (the scheduler picks)
                ts(prog, pre.ap(), acc.ap(), AluOp.multiply, epilogue.alpha, AluOp.add, column, engine=Engine.ACT)
            elif not epilogue.addends:
                act(prog, pre.ap(), acc.ap(), epilogue.func, scale=epilogue.alpha, bias=column)
            else:
                residual = residual_t[nj]
                then = column is not None or epilogue.func is not ActFunc.copy
                total = prog.sbuf(nb, mw, DType.fp32, f"{name}/sum") if then and pre.dtype is not DType.fp32 \
                    else pre  # rounded once to a narrower result
                prog.emit("scalar_tensor_tensor", Engine.DVE, dst=total.ap(), src=acc.ap(), op0=AluOp.multiply,
                          scalar=float(epilogue.alpha), op1=AluOp.add, b=residual)
                if then:
                    act(prog, pre.ap(), total.ap(), epilogue.func, bias=column)
            _harden(epilogue, res, pre)
            prog.dma(out.box((m0, n0), (mw, nb)).transpose((1, 0)), res.ap())


def _read_by_a_matmul(ctx: LowerCtx, name: str) -> bool:
    """Whether a matmul reads the tensor: it contracts over its blocks of features one K tile at a time, and starts
    on the first block evacuated (an MLP's next layer: mlp_wide in models/ 7.5 us with a block evacuated at a time,
    7.9 with its five together)."""
    return any(is_matmul(r.op) for r in ctx.consumers.get(name, []))


def _outpaces_evacuation(prog: Program, k_tiles: int, rows: int, dtype: DType) -> bool:
    """Whether PE computes a block of 128 outputs of `rows` rows (k_tiles matmuls, the weights stationary) faster
    than ScalarE evacuates it, by the cost model: then a feature-major result's blocks share a bank, evacuated at
    once, unless a matmul reads them and the epilogue is one instruction a block (MobileNetV3's hidden classifier
    layer in bf16, a block 0.12 us on PE against 0.19 to evacuate it: 87.8 -> 87.1 us read by a HardSwish node;
    with the HardSwish in the epilogue, three instructions a block, together 85.0 -> 84.6 though the next Gemm
    reads it); otherwise each block's evacuation overlaps the next block's matmuls (in fp32, at a quarter of PE's
    rate, together: 176.1 -> 177.3; with the HardSwish, 166.8 -> 167.2)."""
    pmax = prog.target.partitions
    acc = Tile(Mem.PSUM, pmax, rows, DType.fp32, "acc").ap()
    moving = Tile(Mem.SBUF, pmax, rows, dtype, "rows").ap()
    matmul = prog.cost_ns("nc_matmul", Engine.PE, dst=acc, stationary=Tile(Mem.SBUF, pmax, pmax, dtype, "weights").ap(),
                          moving=moving, accumulate=True)
    evacuation = prog.cost_ns("activation", Engine.ACT, dependent=True,
                              dst=Tile(Mem.SBUF, pmax, rows, DType.fp32, "out").ap(), src=acc, func=ActFunc.copy,
                              scale=1.0)
    return k_tiles * matmul < evacuation


def _side_by_side(ctx: LowerCtx, a_t: list[TileAccess], b_source: BSource, mb: int, n_tiles: list[tuple[int, int]],
                  columns: Callable[[int, int], TileAccess] | None, epilogue: Epilogue, out: HbmView, m0: int,
                  mw: int) -> None:
    """matmul_2d_transposed's products of a few rows (mw, a classifier's or a decode step's) for every block of
    outputs in one bank, side by side in its columns, so that the bias, the activation and the rounding run once
    over them all, not once a block, each paying an instruction's fixed cost for a few columns (the partitions a
    short last block leaves are computed and never stored). The K tiles are the outer loop, in the order the
    weights arrive: where they stream in late (ResNet-18's classifier in fp32, a memory-bound network's last
    weights), PE has one matmul a block left after the last of them, not every matmul of the last blocks. The
    bias is the blocks' columns of the pool, one after the other, each read mw times."""
    prog, pmax, name = ctx.program, ctx.program.target.partitions, ctx.program.node
    width = len(n_tiles) * mw
    acc = prog.psum(pmax, width, f"{name}/acc")
    for j, moving in enumerate(a_t):
        for nj, (n0, nb) in enumerate(n_tiles):
            prog.emit("nc_matmul", Engine.PE, dst=acc.ap(((mw, 1),), nj * mw, 0, nb),
                      stationary=b_source.tile(j, n0, nb, mb), moving=moving, accumulate=j > 0)
    res = prog.sbuf(pmax, width, out.dtype, f"{name}/out^T")
    pre = _evacuated(prog, epilogue, res)
    if columns is not None:
        first = columns(0, pmax)
        biases = replace(first, dims=((len(n_tiles), 1), (mw, 0)))
        total = pre if epilogue.func is ActFunc.copy else prog.sbuf(pmax, width, DType.fp32, f"{name}/sum")
        prog.emit("scalar_tensor_tensor", Engine.DVE, dst=total.ap(), src=acc.ap(), op0=AluOp.multiply,
                  scalar=float(epilogue.alpha), op1=AluOp.add, b=biases)
        if total is not pre:
            act(prog, pre.ap(), total.ap(), epilogue.func)
    else:
        act(prog, pre.ap(), acc.ap(), epilogue.func, scale=epilogue.alpha)
    _harden(epilogue, res, pre)
    for nj, (n0, nb) in enumerate(n_tiles):
        prog.dma(out.box((m0, n0), (mw, nb)).transpose((1, 0)), res.ap(((mw, 1),), nj * mw, 0, nb))


def _evacuated(prog: Program, epilogue: Epilogue, res: Tile) -> Tile:
    """Where a bank's evacuation writes: the result itself, or with a hard activation an fp32 tile the activation
    reads, so that the result (a product only matmuls read is narrowed on chip, codegen/on_chip.py) is rounded
    once, after the activation, as it is unfused."""
    return res if epilogue.hard is None else prog.sbuf(res.partitions, res.free, DType.fp32, f"{prog.node}/pre")


def _harden(epilogue: Epilogue, res: Tile, pre: Tile) -> None:
    if epilogue.hard is not None:
        epilogue.hard(res.ap(), pre.ap())


def operand_type(ctx: LowerCtx, a: Operand, b: Operand) -> DType:
    """The type the Tensor engine reads the operands in."""
    return ctx.program.operand_dtype(_dtype(ctx, a, b))


def _dtype(ctx: LowerCtx, a: Operand, b: Operand) -> DType:
    for x in (a, b):
        if isinstance(x, HbmView):
            return x.dtype
    return ctx.program.operand_dtype(DType.fp32) if ctx.internal_dtype is None else ctx.internal_dtype


def _evacuate(ctx: LowerCtx, acc: Tile, res: Tile, e: Epilogue, m0: int, mt: int, n0: int, nt: int,
              cache: dict[tuple[int, int], Tile]) -> None:
    prog = ctx.program
    if e.gate is not None:  # psum (the bias in it already) * gate, as the bank is read
        gate = prog.sbuf(mt, nt, e.gate.dtype, f"{prog.node}/gate")
        prog.dma(gate.ap(), e.gate.box((m0, n0), (mt, nt)))
        prog.emit("scalar_tensor_tensor", Engine.DVE, dst=res.ap(), src=acc.ap(), op0=AluOp.multiply,
                  scalar=float(e.alpha), op1=AluOp.multiply, b=gate.ap())
        return
    if not e.addends:
        act(prog, res.ap(), acc.ap(), e.func, scale=e.alpha)
        return
    # the sum in fp32 when more is done to it before it is stored narrower: rounded once, as the model would
    total = res if e.func is ActFunc.copy and len(e.addends) == 1 or res.dtype is DType.fp32 else \
        prog.sbuf(mt, nt, DType.fp32, f"{prog.node}/sum")
    for k, (view, scale) in enumerate(e.addends):
        block = _addend(prog, view, scale, m0, mt, n0, nt, cache, k)
        if k == 0:
            prog.emit("scalar_tensor_tensor", Engine.DVE, dst=total.ap(), src=acc.ap(), op0=AluOp.multiply,
                      scalar=float(e.alpha), op1=AluOp.add, b=block)
        else:
            tt(prog, total.ap(), total.ap(), block, AluOp.add)
    if e.func is not ActFunc.copy or total is not res:
        act(prog, res.ap(), total.ap(), e.func)


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
    return None


def operand(ctx: LowerCtx, name: str) -> Operand:
    """A matmul input: its value when it is a constant (laid out by the matmul, which casts it to the matmul type
    piece by piece: no copy of a large weight here), else its HBM view."""
    t = ctx.graph.tensors[name]
    return t.value if t.is_constant else ctx.view(name)


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
    flat_gate = epilogue.gate.reshape((rows, n)) if epilogue.gate is not None else None
    folds = math.prod(b.shape[:-2]) == 1 and flat_a is not None and all(v is not None for v, _ in flat_addends) \
        and (epilogue.gate is None or flat_gate is not None)
    feature_major = folds and _feature_major(ctx, node.outputs[0], epilogue)
    # on partitions: the features, or the rows (the batch joining them, or each batch index its own)
    rows_axes = (rank - 1, rank) if feature_major else (0, rank - 1) if folds else (rank - 2, rank - 1)
    out = ctx.output(node.outputs[0], rows_axes if rank >= 2 else None, follow_transpose=not folds)
    if out.shape != batch + (m, n):  # a vector operand promoted to a matrix
        out = out.reshape(batch + (m, n))
    assert out is not None
    if folds:
        b2 = b.reshape(b.shape[-2:]) if isinstance(b, np.ndarray) else b.at((0,) * (len(b.shape) - 2))
        key = names[1] if isinstance(b, np.ndarray) else None
        product = matmul_2d_transposed if feature_major else matmul_2d
        flat = replace(epilogue, addends=flat_addends, gate=flat_gate)
        product(ctx, flat_a, b2, out.reshape((rows, n)), flat, (None, key))  # type: ignore[arg-type]
        return
    a_batch, b_batch = a.shape[:-2], b.shape[:-2]
    a = _broadcast(a, batch + a.shape[-2:])
    b = _broadcast(b, batch + b.shape[-2:])
    dtype = operand_type(ctx, a, b)
    if batched.fits(ctx, a, b, epilogue, dtype):  # many small products: a group of them a bank
        batched.products(ctx, a, b, out, epilogue, dtype)  # type: ignore[arg-type]
        return
    for index in np.ndindex(*batch):
        keys = tuple(f"{nm}{list(_own_index(index, own))}" if isinstance(x, np.ndarray) else None
                     for nm, x, own in zip(names, (a, b), (a_batch, b_batch)))
        e = replace(epilogue, addends=[(v.at(index), s) for v, s in epilogue.addends],
                    gate=epilogue.gate.at(index) if epilogue.gate is not None else None)
        matmul_2d(ctx, _at(a, index), _at(b, index), out.at(index), e, keys)  # type: ignore[arg-type]


def _feature_major(ctx: LowerCtx, name: str, epilogue: Epilogue) -> bool:
    """Whether to store the result feature-major (lower/layout.py), when its epilogue allows (a bias, at most one
    residual)."""
    return ctx.feature_major(name) and _transposable(epilogue)


def _transposable(epilogue: Epilogue) -> bool:
    """Whether matmul_2d_transposed computes the epilogue: a bias, at most one residual."""
    return len(epilogue.addends) <= 1 and all(scale == 1.0 and all(st for n, st in zip(v.shape, v.strides) if n > 1)
                                              for v, scale in epilogue.addends)


def _weights_stationary(ctx: LowerCtx, name: str, rows: int, b: Operand, epilogue: Epilogue) -> bool:
    """Whether a product of few rows stored as a graph output (a classifier's logits) is computed as out^T, the
    weights stationary (matmul_2d_transposed), every block of 128 outputs in one bank (_side_by_side): PE then
    streams the rows, max(MIN_II, rows) cycles a block, where with the rows stationary it streams the weights, a
    cycle an output. Taken when the weights fit a quarter of SBUF (loaded ahead of the product, not streamed: not a
    decode step's vocabulary projection) and PE saves more than the transposed store costs the DMA engines (a
    piece an output). MobileNetV3's classifier, 1,024 x 1,000 at the end of its chain: 8 K tiles, 11.8 -> 5.9 us of
    PE in fp32; ResNet-18 in bf16 161.0 -> 157.0 us. (Measured slower: ResNet-18 in fp32, 382.7 -> 384.6 us, its
    memory-bound schedule loading the classifier's weights later.)"""
    target = ctx.program.target
    if name not in ctx.graph.outputs or not isinstance(b, np.ndarray) or not _transposable(epilogue) or \
            rows > target.min_ii_cycles or epilogue.gate is not None:
        return False
    (k, n), dtype = b.shape, ctx.program.operand_dtype(DType.fp32)
    k_tiles = -(-k // target.partitions)
    if k_tiles * n * dtype.size > target.sbuf_partition_bytes // 4:
        return False
    saved = k_tiles * (n - -(-n // target.gemm_stationary_fmax) * max(target.min_ii_cycles, rows))
    return saved / pe_rate(dtype, target) / target.pe_ghz > n * rows * target.dma_piece_ns / target.dma_queues


def _own_index(index: tuple[int, ...], own: tuple[int, ...]) -> tuple[int, ...]:
    """The index into an operand's own batch axes (right-aligned; broadcast axes of size 1 read index 0), so that
    a constant broadcast over the batch is laid out once."""
    own_index = index[len(index) - len(own):]
    return tuple(i if n > 1 else 0 for i, n in zip(own_index, own))


@lowering("MatMul", check=_check_matmul, kind=OpKind.MATMUL, floats=True)
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
    feature_major = _feature_major(ctx, node.outputs[0], epilogue)
    transposed = feature_major or _weights_stationary(ctx, node.outputs[0], a.shape[0], b, epilogue)
    out = ctx.output(node.outputs[0], (1, 2) if feature_major else (0, 1))
    keys = tuple(f"{n}{'^T' if attrs.get(t, 0) else ''}" for n, t in zip(node.inputs[:2], ("transA", "transB")))
    if transposed:
        matmul_2d_transposed(ctx, a, b, out, epilogue, keys, together=not feature_major)  # type: ignore[arg-type]
    else:
        matmul_2d(ctx, a, b, out, epilogue, keys)  # type: ignore[arg-type]


@lowering("Gemm", since=7, kind=OpKind.MATMUL)
def lower_gemm(ctx: LowerCtx, node: Node) -> None:
    addends = []
    if len(node.inputs) > 2 and node.inputs[2]:
        shape = ctx.shape(node.outputs[0])
        addends.append((ctx.view(node.inputs[2]).broadcast_to(shape), float(node.attrs.get("beta", 1.0))))
    gemm_into(ctx, node, Epilogue(float(node.attrs.get("alpha", 1.0)), addends))


@lowering("MatMulEpilogue", kind=OpKind.MATMUL)
def lower_matmul_epilogue(ctx: LowerCtx, node: Node) -> None:
    """A MatMul or Gemm with what followed it (passes/fuse_epilogues.py): inputs A, B, bias row, residual, gate."""
    a_name, b_name, bias, residual, gate = (node.inputs + ["", "", ""])[:5]
    addends = [(ctx.view(residual).broadcast_to(ctx.shape(node.outputs[0])), 1.0)] if residual else []
    epilogue = Epilogue(float(node.attrs.get("alpha", 1.0)), addends, fused_function(node.attrs["activation"]),
                        ctx.graph.tensors[bias].value if bias else None, ctx.view(gate) if gate else None,
                        hard_activation(ctx, node))
    if "transA" in node.attrs:  # from a Gemm
        gemm_into(ctx, node, epilogue)
    else:
        lower_matmul_into(ctx, node, epilogue)
