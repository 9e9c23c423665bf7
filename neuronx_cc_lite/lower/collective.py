"""Collectives between ranks (the partition stage inserts them): AllReduce, AllGather and ReduceScatter of a
tensor, each one CC-engine instruction on replica group `group`, lowered HBM to HBM.

    src: the input as one contiguous HBM buffer (copied into one first when it is a strided view, or when its
         type is not the one the result is exchanged in)
    cc:  all_reduce / all_gather / reduce_scatter  dst <- src  (add for the reductions)
    dst: the result's own HBM tensor; when the result is held in a narrower type (auto-cast: read only by
         matmuls) the collective still runs in the input's type, into a scratch buffer, and a DMA narrows it

A collective sees its buffers' elements in order (partition, then free). AllGather and ReduceScatter cut that
order into blocks, so their buffers are [rows, free] with rows = gcd(size, pmax): row-major order of the tensor.
An AllReduce combines element by element, so any order serves that every rank shares: its buffers follow the
layout its input's producer wrote (partition axes, then the rest: codegen/on_chip.py's [A, B, D]), and its result
is given that layout too. Then, when both tensors get a home in SBUF, keep-on-chip moves the collective there
(nki.collectives takes SBUF operands) and no HBM round trip is left between the producer, the exchange and the
consumers. Codegen orders the instruction like any other: semaphores wait for whatever wrote src and make the
readers of dst wait for it.
"""

from __future__ import annotations

import math

from isa.dtypes import DType
from isa.functions import AluOp
from isa.operand import Engine
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import HbmAccess

MNEMONICS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter"}


def _check(node: Node, g: Graph) -> str | None:
    if int(node.attrs.get("group", -1)) < 0:
        return "a collective needs its replica group (attribute group)"
    return None


def _buffer(view: HbmView, pmax: int) -> HbmAccess:
    """The whole of a contiguous view as [rows, free], rows = gcd(size, pmax): row-major order."""
    rows = math.gcd(view.size, pmax)
    free = view.size // rows
    return HbmAccess(view.tensor, view.dtype, rows, free, view.offset, ((free, 1),))


def _in_layout(view: HbmView, layout: tuple[int, int, int], pmax: int) -> HbmAccess | None:
    """The whole of a contiguous view in layout [A, B, D]: partition p holds rows p, p + pmax, ... of B, each
    row's A x D elements after it; None when B is neither at most pmax nor a multiple of it."""
    a, b, d = layout
    if b > pmax and b % pmax:
        return None
    blocks, partitions = -(-b // pmax), min(b, pmax)
    dims = tuple((n, stride) for n, stride in ((blocks, pmax * d), (a, b * d), (d, 1)) if n > 1) or ((1, 1),)
    return HbmAccess(view.tensor, view.dtype, partitions, d, view.offset, dims)


def _contiguous(ctx: LowerCtx, view: HbmView, dtype: DType, name: str) -> HbmView:
    """The view as a dense buffer of type `dtype`: itself when it is one, else a copy."""
    if view.is_contiguous and view.dtype is dtype:
        return view
    tensor = ctx.program.hbm_tensor(name, view.size * dtype.size, TensorKind.SCRATCH, dtype)
    copy = HbmView.whole(tensor, dtype, view.shape)
    ctx.program.dma(copy, view)
    return copy


@lowering(*MNEMONICS, check=_check)
def lower_collective(ctx: LowerCtx, node: Node) -> None:
    pmax = ctx.program.target.partitions
    src_view = ctx.view(node.inputs[0])
    dtype = src_view.dtype
    src = _contiguous(ctx, src_view, dtype, f"{node.name}/src")
    op = MNEMONICS[node.op]
    axes = ctx.partition_axes(node.inputs[0]) if op == "all_reduce" and src is src_view else None
    out = ctx.output(node.outputs[0], partition_axes=axes)
    dst = out if out.dtype is dtype else HbmView.whole(
        ctx.program.hbm_tensor(f"{node.name}/dst", out.size * dtype.size, TensorKind.SCRATCH, dtype), dtype, out.shape)
    # src and dst have the same shape: one layout serves both, or neither
    layout = src.tensor.layout if axes is not None and dst is out else None
    in_layout = layout is not None and _in_layout(src, layout, pmax) is not None
    dst_buffer, src_buffer = (_in_layout(v, layout, pmax) if in_layout else _buffer(v, pmax) for v in (dst, src))
    extra = {"op": AluOp.add} if op != "all_gather" else {}
    ctx.program.emit(op, Engine.CC, dst=dst_buffer, src=src_buffer, group=int(node.attrs["group"]), **extra)
    if dst is not out:
        ctx.program.dma(out, dst)
