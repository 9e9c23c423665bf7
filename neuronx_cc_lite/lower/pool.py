"""MaxPool, AveragePool, GlobalMaxPool and GlobalAveragePool on VectorE.

Rows (batch x channels) go on partitions, the spatial axes along the free axis; with fewer rows than half the
partitions, blocks of outputs of one shape sit side by side on them (32 channels: four blocks of rows at once, a
quarter of the VectorE passes), where the input's rows are an efficient DMA piece (a block moved to other
partitions is a DMA, a piece per row: ResNet's stem pool, rows of 112 fp32, is not stacked). For each block of
outputs the
padded input window is loaded into a tile filled with -inf (max) or 0 (average) where it has no input element
(windows.py), then reduced separably: one tensor_reduce per spatial axis, innermost first, whose source pattern
(outer, outputs, inner, taps) walks the taps of that axis with the pool's stride and dilation and reduces the
last axis. Max and sum are both separable, so the result is the reduction over the whole window. AveragePool
then divides by the number of taps it counts, a constant per output position (padding counted or not, windows
that ceil_mode lets run past the end); a single divisor is an immediate, several a constant loaded beside.
"""

from __future__ import annotations

import math

import numpy as np

from isa.dtypes import DType
from isa.functions import AluOp
from isa.operand import Engine
from isa.target import Target
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.patterns import contiguous
from neuronx_cc_lite.lower.reduce import Reduction, reduce_rows
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Program, Tile
from neuronx_cc_lite.lower.windows import (Axis, Block, blocks, fill_edges, fill_window, load_windows, needs_fill,
                                           short_rows, window_axes, window_strides)

STACKED_OUTPUTS = 512  # at least this many outputs per block for blocks to share the partitions
_MAX_DTYPES = (np.float16, np.float32, np.float64, np.int8, np.uint8)


def tile_budget(target: Target) -> int:
    """fp32 elements per partition of a window tile (and of each reduced stage): an eighth of a partition."""
    return target.sbuf_partition_bytes // 8 // 4


def _pool_axes(node: Node, g: Graph) -> list[Axis] | str:
    x, y = g.tensors[node.inputs[0]], g.tensors[node.outputs[0]]
    allowed = _MAX_DTYPES if node.op == "MaxPool" else _MAX_DTYPES[:3]
    if x.dtype not in [np.dtype(t) for t in allowed]:
        return f"{node.op} on {x.dtype} tensors is not supported"
    if len(x.shape) < 3:
        return f"{node.op} needs an input of rank 3 or more (batch, channels, spatial axes), got {len(x.shape)}"
    if len(node.outputs) > 1 and node.outputs[1]:
        return "the Indices output of MaxPool is not supported"
    kernel = tuple(node.attrs.get("kernel_shape") or ())
    if len(kernel) != len(x.shape) - 2:
        return f"kernel_shape {list(kernel)} does not give one size per spatial axis"
    return window_axes(node.attrs, x.shape[2:], kernel, y.shape[2:], bool(node.attrs.get("ceil_mode", 0)))


def _check_pool(node: Node, g: Graph) -> str | None:
    axes = _pool_axes(node, g)
    return axes if isinstance(axes, str) else None


def _tap_counts(ax: Axis, include_pad: bool) -> np.ndarray:
    """Per output of the axis, the taps AveragePool divides by: those inside the input, or inside the padded
    input when padding counts (never those past the padding, which ceil_mode can add)."""
    taps = np.arange(ax.out)[:, None] * ax.stride + np.arange(ax.kernel)[None, :] * ax.dilation
    lo, hi = (0, ax.offset + ax.size + ax.pad_end) if include_pad else (ax.offset, ax.offset + ax.size)
    return ((taps >= lo) & (taps < hi)).sum(axis=1)


def _reduce_window(prog: Program, tile: Tile, block: Block, axes: list[Axis], op: AluOp, name: str) -> Tile:
    """Reduce a window tile [p, *spans] axis by axis into [p, *counts]."""
    shape = [ax.span(c) for ax, c in zip(axes, block.counts)]
    for k in reversed(range(len(axes))):
        ax, count = axes[k], block.counts[k]
        if ax.kernel == 1 and ax.stride == 1:
            continue  # the window along this axis is the outputs already
        outer, inner = math.prod(shape[:k]), math.prod(shape[k + 1:])
        dims = [(outer, shape[k] * inner), (count, ax.stride * inner), (inner, 1)]
        src = tuple(d for d in dims if d[0] > 1) + ((ax.kernel, ax.dilation * inner),)
        reduced = prog.sbuf(tile.partitions, outer * count * inner, DType.fp32, name)
        prog.emit("tensor_reduce", Engine.DVE, dst=reduced.ap(), src=tile.ap(src), op=op, axes=1)
        tile, shape[k] = reduced, count
    return tile


def _rows(ctx: LowerCtx, node: Node) -> tuple[HbmView, HbmView]:
    """Input and output as (batch * channels, *spatial)."""
    x = contiguous(ctx.program, ctx.view(node.inputs[0]), node.name)
    out = ctx.output(node.outputs[0], (0, 2))  # (batch, channel) rows on partitions, as the windows read them
    rows = x.shape[0] * x.shape[1]
    xr, outr = x.reshape((rows, *x.shape[2:])), out.reshape((rows, *out.shape[2:]))
    assert xr is not None and outr is not None
    return xr, outr


def _lower_pool(ctx: LowerCtx, node: Node, op: AluOp, fill: float) -> None:
    prog = ctx.program
    axes = _pool_axes(node, ctx.graph)
    if isinstance(axes, str):
        raise CompileError("NCC_UNSUPPORTED", axes, node.name, node.op)
    xr, outr = _rows(ctx, node)
    budget = tile_budget(prog.target)
    plan = blocks(1, axes, budget, budget)
    divisors = None
    if op is AluOp.add:
        include = bool(node.attrs.get("count_include_pad", 0))
        counts = [_tap_counts(ax, include) for ax in axes]
        grid = np.ones((), np.float32)
        for c in counts:
            grid = np.multiply.outer(grid, c.astype(np.float32))
        divisors = float(grid.flat[0]) if np.all(grid == grid.flat[0]) else \
            ctx.view(ctx.constant(f"{node.name}/divisors", grid))
    pmax = prog.target.partitions
    total = math.prod(ax.out for ax in axes)
    # few rows: blocks side by side fill the partitions, each keeping enough outputs that the passes' fixed costs
    # stay small, over rows of an efficient DMA piece (the windows are fp32)
    stack = 1 if isinstance(divisors, HbmView) or short_rows(axes, 4) else \
        max(1, min(pmax // xr.shape[0], total // STACKED_OUTPUTS))
    if stack > 1:
        wanted = -(-len(plan) // stack) * stack
        plan = blocks(1, axes, -(-total // wanted), budget)
    for r0 in range(0, xr.shape[0], pmax):
        p = min(pmax, xr.shape[0] - r0)
        src = xr.slice(0, r0, r0 + p).reshape((p, 1, *xr.shape[1:]))
        assert src is not None
        for group in _stacks(plan, stack):
            block = group[0]
            window = _stacked_windows(prog, src, group, axes, fill, f"{node.name}/x")
            result = _reduce_window(prog, window, block, axes, op, f"{node.name}/r")
            if isinstance(divisors, float):
                prog.emit("tensor_scalar", Engine.DVE, dst=result.ap(), src=result.ap(), op0=AluOp.divide,
                          scalar0=divisors, reverse0=False, reverse1=False)
            elif divisors is not None:
                d = prog.sbuf(p, block.size, DType.fp32, f"{node.name}/divisors")
                prog.dma(d.ap(), divisors.box(block.starts, block.counts).broadcast_to((p, *block.counts)))
                prog.emit("tensor_tensor", Engine.DVE, dst=result.ap(), a=result.ap(), b=d.ap(), op=AluOp.divide)
            for j, member in enumerate(group):
                prog.dma(outr.box((r0, *member.starts), (p, *member.counts)),
                         result.ap(None, 0, j * p, p))


def _stacks(plan: list[Block], stack: int) -> list[list[Block]]:
    """The blocks in groups of at most `stack` of one shape (the same counts: one reduction pattern serves them)."""
    groups: list[list[Block]] = []
    for block in plan:
        if groups and len(groups[-1]) < stack and groups[-1][0].counts == block.counts and \
                groups[-1][0].images == block.images:
            groups[-1].append(block)
        else:
            groups.append([block])
    return groups


def _stacked_windows(prog: Program, src: HbmView, group: list[Block], axes: list[Axis], fill: float,
                     name: str) -> Tile:
    """The windows of a group of same-shaped blocks, block j on partitions j * p ..: every block's padding filled
    over the whole tile first (another block's loads then overwrite what is input for them), then the loads."""
    if len(group) == 1:
        return load_windows(prog, src, group[0], axes, fill, name)[0]
    p = src.shape[0]
    _, image = window_strides(group[0], axes)
    tile = prog.sbuf(len(group) * p, group[0].images * image, DType.fp32, name)
    for block in group:
        if needs_fill(block, axes):
            fill_edges(prog, tile, block, axes, [0], fill)
    for j, block in enumerate(group):
        fill_window(prog, tile, src, block, axes, j * p)
    return tile


@lowering("MaxPool", check=_check_pool)
def lower_max_pool(ctx: LowerCtx, node: Node) -> None:
    _lower_pool(ctx, node, AluOp.maximum, float("-inf"))


@lowering("AveragePool", check=_check_pool)
def lower_average_pool(ctx: LowerCtx, node: Node) -> None:
    _lower_pool(ctx, node, AluOp.add, 0.0)


def _check_global(node: Node, g: Graph) -> str | None:
    x = g.tensors[node.inputs[0]]
    if not np.issubdtype(x.dtype, np.floating):
        return f"{node.op} on {x.dtype} tensors is not supported (floating point only)"
    if len(x.shape) < 3:
        return f"{node.op} needs an input of rank 3 or more (batch, channels, spatial axes), got {len(x.shape)}"
    return None


def _lower_global(ctx: LowerCtx, node: Node, op: AluOp) -> None:
    """Each row reduced over its spatial elements, a tile's worth at a time into a column of partial results; an
    average as ReduceMean's (lower/reduce.py reduce_rows: one ScalarE pass, or pieces of a long row over few
    partitions), where VectorE's sum and division were two dependent instructions (MobileNetV3 from TorchScript
    pools with it: bf16 109.4 -> 100.1 us, fp32 192.9 -> 184.5)."""
    prog = ctx.program
    xr, outr = _rows(ctx, node)
    size = math.prod(xr.shape[1:])
    flat, out = xr.reshape((xr.shape[0], size)), outr.reshape((outr.shape[0], 1))
    assert flat is not None and out is not None
    chunk = tile_budget(prog.target)
    starts = range(0, size, chunk)
    ready = ctx.means.pop(node.outputs[0], None)  # computed by its input's producer (lower/depthwise.py)
    for r0 in range(0, flat.shape[0], prog.target.partitions):
        p = min(prog.target.partitions, flat.shape[0] - r0)
        if op is AluOp.add:
            assert ready is None or ready.partitions == p == flat.shape[0]
            mean = ready if ready is not None else reduce_rows(prog, flat.box((r0, 0), (p, size)), p, size,
                                                               Reduction(AluOp.add, mean=True), node.name, chunk)
            prog.dma(out.slice(0, r0, r0 + p), mean.ap())
            continue
        partial = prog.sbuf(p, len(starts), DType.fp32, f"{node.name}/partial")
        for j, s0 in enumerate(starts):
            n = min(chunk, size - s0)
            t = prog.sbuf(p, n, DType.fp32, f"{node.name}/x")
            prog.dma(t.ap(), flat.box((r0, s0), (p, n)))
            prog.emit("tensor_reduce", Engine.DVE, dst=partial.ap(((1, 1),), j), src=t.ap(), op=op, axes=1)
        result = partial
        if len(starts) > 1:
            result = prog.sbuf(p, 1, DType.fp32, f"{node.name}/r")
            prog.emit("tensor_reduce", Engine.DVE, dst=result.ap(), src=partial.ap(), op=op, axes=1)
        prog.dma(out.slice(0, r0, r0 + p), result.ap())


@lowering("GlobalMaxPool", check=_check_global)
def lower_global_max_pool(ctx: LowerCtx, node: Node) -> None:
    _lower_global(ctx, node, AluOp.maximum)


@lowering("GlobalAveragePool", check=_check_global)
def lower_global_average_pool(ctx: LowerCtx, node: Node) -> None:
    _lower_global(ctx, node, AluOp.add)
