"""MatMul and Gemm on the Tensor engine.

out[M, N] = alpha * A[M, K] @ B[K, N] + beta * C is cut into blocks of at most pmax rows (M) by psum_bank_fmax
columns (N); each block accumulates in one PSUM bank over the contraction in tiles of pmax rows (K):

    psum[m, n] (+)= A^T[k, m].T @ B[k, n]      (nc_matmul: stationary A^T, moving B)

A^T tiles come straight from HBM through a transposing DMA access pattern and stay in SBUF for all the N blocks
of their rows. ScalarE evacuates PSUM to SBUF, applying alpha (and a fused activation, when given); VectorE adds C.
"""

from __future__ import annotations

import numpy as np

from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import floats_only
from neuronx_cc_lite.lower.hbm import HbmView
from neuronx_cc_lite.lower.registry import lowering


def matmul_2d(ctx: LowerCtx, a: HbmView, b: HbmView, out: HbmView, alpha: float = 1.0,
              c: HbmView | None = None, beta: float = 1.0, func: ActFunc = ActFunc.copy) -> None:
    prog, t = ctx.program, ctx.program.target
    (m_size, k_size), n_size = a.shape, b.shape[1]
    assert b.shape[0] == k_size and out.shape == (m_size, n_size), (a.shape, b.shape, out.shape)
    name = prog.node
    for m0 in range(0, m_size, t.gemm_stationary_fmax):
        mt = min(t.gemm_stationary_fmax, m_size - m0)
        a_tiles = []
        for k0 in range(0, k_size, t.partitions):
            kt = min(t.partitions, k_size - k0)
            at = prog.sbuf(kt, mt, prog.operand_dtype(a.dtype), f"{name}/A^T")
            prog.dma(at.ap(), a.box((m0, k0), (mt, kt)).transpose((1, 0)))
            a_tiles.append((k0, kt, at))
        for n0 in range(0, n_size, t.psum_bank_fmax):
            nt = min(t.psum_bank_fmax, n_size - n0)
            acc = prog.psum(mt, nt, f"{name}/acc")
            for i, (k0, kt, at) in enumerate(a_tiles):
                bt = prog.sbuf(kt, nt, prog.operand_dtype(b.dtype), f"{name}/B")
                prog.dma(bt.ap(), b.box((k0, n0), (kt, nt)))
                prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=at.ap(), moving=bt.ap(),
                          accumulate=i > 0)
            res = prog.sbuf(mt, nt, out.dtype, f"{name}/out")
            fused = func if c is None else ActFunc.copy
            prog.emit("activation", Engine.ACT, dst=res.ap(), src=acc.ap(), func=fused, scale=float(alpha))
            if c is not None:
                ct = prog.sbuf(mt, nt, c.dtype, f"{name}/C")
                prog.dma(ct.ap(), c.box((m0, n0), (mt, nt)))
                if beta != 1.0:
                    prog.emit("tensor_scalar", Engine.DVE, dst=ct.ap(), src=ct.ap(), op0=AluOp.multiply,
                              scalar0=float(beta), reverse0=False, reverse1=False)
                prog.emit("tensor_tensor", Engine.DVE, dst=res.ap(), a=res.ap(), b=ct.ap(), op=AluOp.add)
                if func is not ActFunc.copy:
                    prog.emit("activation", Engine.ACT, dst=res.ap(), src=res.ap(), func=func, scale=1.0)
            prog.dma(out.box((m0, n0), (mt, nt)), res.ap())


def _check_matmul(node: Node, g: Graph) -> str | None:
    shapes = [g.tensors[i].shape for i in node.inputs[:2]]
    if any(len(s) == 0 for s in shapes):
        return "MatMul of a scalar is not defined"
    if any(0 in s for s in shapes):
        return "MatMul of an empty tensor is not supported"
    return floats_only(node, g)


@lowering("MatMul", check=_check_matmul)
def lower_matmul(ctx: LowerCtx, node: Node) -> None:
    """numpy matmul: vectors are promoted to matrices, leading (batch) axes broadcast, one matmul_2d per batch
    index."""
    a, b = ctx.view(node.inputs[0]), ctx.view(node.inputs[1])
    if len(a.shape) == 1:
        a = a.split_axis(0, (1, a.shape[0]))
    if len(b.shape) == 1:
        b = b.split_axis(0, (b.shape[0], 1))
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    m, n = a.shape[-2], b.shape[-1]
    a = a.broadcast_to(batch + a.shape[-2:])
    b = b.broadcast_to(batch + b.shape[-2:])
    out = ctx.output(node.outputs[0]).reshape(batch + (m, n))
    assert out is not None
    for index in np.ndindex(*batch):
        matmul_2d(ctx, a.at(index), b.at(index), out.at(index))


@lowering("Gemm", since=7)
def lower_gemm(ctx: LowerCtx, node: Node) -> None:
    attrs = node.attrs
    a, b = ctx.view(node.inputs[0]), ctx.view(node.inputs[1])
    if attrs.get("transA", 0):
        a = a.transpose((1, 0))
    if attrs.get("transB", 0):
        b = b.transpose((1, 0))
    out = ctx.output(node.outputs[0])
    c = None
    if len(node.inputs) > 2 and node.inputs[2]:
        c = ctx.view(node.inputs[2]).broadcast_to(out.shape)
    matmul_2d(ctx, a, b, out, float(attrs.get("alpha", 1.0)), c, float(attrs.get("beta", 1.0)))
