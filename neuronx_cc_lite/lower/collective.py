"""Collectives between ranks (the partition stage inserts them): AllReduce, AllGather and ReduceScatter of a
tensor, each one CC-engine instruction on replica group `group`, HBM to HBM.

    src: the input as one contiguous HBM buffer (copied into one first when it is a strided view, or when its
         type is not the one the result is exchanged in)
    cc:  all_reduce / all_gather / reduce_scatter  dst <- src  (add for the reductions)
    dst: the result's own HBM tensor; when the result is held in a narrower type (auto-cast: read only by
         matmuls) the collective still runs in the input's type, into a scratch buffer, and a DMA narrows it

The buffers are written as [rows, free] with rows = gcd(size, pmax): the collective sees the elements in order
(partition, then free), which is row-major order of the tensor. Codegen orders the instruction like any other:
its src and dst are HBM operands, so semaphores wait for the DMA that wrote src and make the DMAs that read dst
wait for it.
"""

from __future__ import annotations

import math

from isa.dtypes import DType
from isa.functions import AluOp
from isa.operand import Engine
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.hbm import HbmView
from neuronx_cc_lite.lower.program import HbmAccess
from neuronx_cc_lite.lower.registry import lowering

MNEMONICS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter"}


def _check(node: Node, g: Graph) -> str | None:
    if int(node.attrs.get("group", -1)) < 0:
        return "a collective needs its replica group (attribute group)"
    return None


def _buffer(view: HbmView, pmax: int) -> HbmAccess:
    rows = math.gcd(view.size, pmax)
    free = view.size // rows
    return HbmAccess(view.tensor, view.dtype, rows, free, view.offset, ((free, 1),))


def _contiguous(ctx: LowerCtx, view: HbmView, dtype: DType, name: str) -> HbmView:
    """The view as a dense buffer of type `dtype`: itself when it is one, else a copy."""
    if view.is_contiguous and view.dtype is dtype:
        return view
    tensor = ctx.program.hbm_tensor(name, view.size * dtype.size, "scratch", dtype)
    copy = HbmView.whole(tensor, dtype, view.shape)
    ctx.program.dma(copy, view)
    return copy


@lowering(*MNEMONICS, check=_check)
def lower_collective(ctx: LowerCtx, node: Node) -> None:
    pmax = ctx.program.target.partitions
    src_view = ctx.view(node.inputs[0])
    dtype = src_view.dtype
    src = _contiguous(ctx, src_view, dtype, f"{node.name}/src")
    out = ctx.output(node.outputs[0])
    dst = out if out.dtype is dtype else HbmView.whole(
        ctx.program.hbm_tensor(f"{node.name}/dst", out.size * dtype.size, "scratch", dtype), dtype, out.shape)
    op = MNEMONICS[node.op]
    extra = {"op": AluOp.add} if op != "all_gather" else {}
    ctx.program.emit(op, Engine.CC, dst=_buffer(dst, pmax), src=_buffer(src, pmax), group=int(node.attrs["group"]),
                     **extra)
    if dst is not out:
        ctx.program.dma(out, dst)
