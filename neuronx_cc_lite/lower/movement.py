"""Data movement: Transpose, Slice, Expand, Tile, DepthToSpace, SpaceToDepth, Dropout, ConstantOfShape, Trilu,
Gather, GatherElements, GatherND.

Most of these only change how a tensor is viewed (HbmView) and emit nothing; a consumer's DMA reads through the
view. Tile and the depth/space shuffles copy one strided view into a contiguous tensor with HBM-to-HBM DMA.
Gather with indices known only at run time uses the indirect DMA (`dma_gather`): the indices are loaded into a
partition column and each partition receives the row it names.
"""

from __future__ import annotations


import numpy as np

from isa.dtypes import DType
from isa.functions import AluOp
from isa.operand import Engine
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import elementwise, tile_free_max
from neuronx_cc_lite.lower.instr import fill, select, ts
from neuronx_cc_lite.lower.operands import blocks
from neuronx_cc_lite.lower.tiling import boxes, free_size
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.ops.traits import OpKind
from neuronx_cc_lite.tile.hbm import HbmView


# Trilu on affine_select for matrices of at least this many rows (measured on inf2, against the mask: 8 matrices of
# 64x64, 6.9 us against 14.3; 4x12 of 128x128, 29.7 against 53.6; 64 of 32x32, 18.0 against 19.4; 64 of 16x16,
# stacked side by side, 15.3 against 11.1)
AFFINE_SELECT_MIN_ROWS = 32
# what affine_select takes: floats, and 8- and 16-bit integers (nki.isa)
AFFINE_SELECT_TYPES = frozenset({DType.fp32, DType.bf16, DType.fp16, DType.fp8_e4m3, DType.fp8_e5m2, DType.int8,
                                 DType.uint8, DType.int16, DType.uint16})


def _constant_input(node: Node, g: Graph, index: int) -> np.ndarray | None:
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    t = g.tensors[node.inputs[index]]
    return t.value if t.is_constant else None


@lowering("Transpose", moves_data=True)
def lower_transpose(ctx: LowerCtx, node: Node) -> None:
    x = ctx.view(node.inputs[0])
    perm = node.attrs.get("perm") or tuple(reversed(range(len(x.shape))))
    ctx.alias(node.outputs[0], x.transpose(tuple(perm)))


@lowering("Expand", since=8, constant_inputs=(1,), moves_data=True)
def lower_expand(ctx: LowerCtx, node: Node) -> None:
    ctx.alias(node.outputs[0], ctx.view(node.inputs[0]).broadcast_to(ctx.shape(node.outputs[0])))


# A slice that walks an axis backwards is copied one reversed index at a time (access patterns only walk
# forwards); beyond this many pieces the DMA queue overhead would dwarf the data, so the node is refused.
MAX_REVERSED_PIECES = 4096


def _slice_params(node: Node, g: Graph) -> list[tuple[int, int, int, int]] | str:
    """(axis, start, stop, step) per sliced axis, clamped as numpy does; a negative step becomes the ascending
    slice of the same elements with its step negated (the lowering reverses that axis)."""
    shape = g.tensors[node.inputs[0]].shape
    if g.opset_of(node) < 10:
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes, steps = node.attrs.get("axes", range(len(starts))), [1] * len(starts)
    else:
        starts, ends = _constant_input(node, g, 1), _constant_input(node, g, 2)
        axes = _constant_input(node, g, 3)
        steps = _constant_input(node, g, 4)
        axes = range(len(starts)) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
    params, pieces = [], 1
    for axis, start, end, step in zip(axes, starts, ends, steps):
        axis = int(axis) + len(shape) if int(axis) < 0 else int(axis)
        if int(step) == 0:
            return "Slice with a zero step"
        start, stop, step = slice(int(start), int(end), int(step)).indices(shape[axis])
        count = len(range(start, stop, step))
        if step < 0 and count > 1:  # the same elements, ascending: lowest first
            lowest = start + (count - 1) * step
            params.append((axis, lowest, start + 1, step))
            pieces *= count
        else:
            params.append((axis, start, start + count * abs(step), abs(step)))
    if pieces > MAX_REVERSED_PIECES:
        return f"Slice with negative steps needs {pieces} reversed pieces (at most {MAX_REVERSED_PIECES})"
    return params


def _reversed_pieces(out: HbmView, src: HbmView, axes: list[int]) -> list[tuple[HbmView, HbmView]]:
    """(piece of `out`, piece of `src`) pairs that copy `src` into `out` with `axes` reversed: one pair per index
    combination of those axes, each a positive-stride view."""
    pairs = [(out, src)]
    for axis in axes:
        n = src.shape[axis]
        pairs = [(o.slice(axis, i, i + 1), s.slice(axis, n - 1 - i, n - i)) for o, s in pairs for i in range(n)]
    return pairs


@lowering("Slice", check=lambda n, g: p if isinstance(p := _slice_params(n, g), str) else None,
          constant_inputs=(1, 2, 3, 4), moves_data=True)
def lower_slice(ctx: LowerCtx, node: Node) -> None:
    """A view; with negative steps, the ascending view copied out with those axes reversed."""
    view = ctx.view(node.inputs[0])
    params = _slice_params(node, ctx.graph)
    assert not isinstance(params, str)
    for axis, start, stop, step in params:
        view = view.slice(axis, start, stop, abs(step))
    backwards = [axis for axis, _, _, step in params if step < 0]
    if not backwards:
        ctx.alias(node.outputs[0], view)
        return
    for dst, src in _reversed_pieces(ctx.output(node.outputs[0]), view, backwards):
        ctx.program.dma(dst, src)


def copy_view(ctx: LowerCtx, name: str, view: HbmView) -> None:
    """Materialise a strided view as the contiguous result `name`."""
    out = ctx.output(name)
    ctx.program.dma(out.reshape(view.shape), view)


@lowering("Tile", since=6, constant_inputs=(1,), moves_data=True)
def lower_tile(ctx: LowerCtx, node: Node) -> None:
    """Tile is a broadcast in disguise: x[a, b] repeated (r, s) times is the view [r, a, s, b] with stride 0 on
    the repeat axes, copied out."""
    x = ctx.view(node.inputs[0])
    repeats = [int(r) for r in _constant_input(node, ctx.graph, 1)]
    shape, strides = [], []
    for n, stride, r in zip(x.shape, x.strides, repeats):
        shape += [r, n]
        strides += [0, stride]
    copy_view(ctx, node.outputs[0], HbmView(x.tensor, x.dtype, tuple(shape), tuple(strides), x.offset))


def _check_depth_space(node: Node, g: Graph) -> str | None:
    return None if len(g.tensors[node.inputs[0]].shape) == 4 else f"{node.op} needs a 4-D input"


@lowering("DepthToSpace", "SpaceToDepth", check=_check_depth_space, moves_data=True)
def lower_depth_space(ctx: LowerCtx, node: Node) -> None:
    x = ctx.view(node.inputs[0])
    n, c, h, w = x.shape
    b = int(node.attrs["blocksize"])
    dcr = node.attrs.get("mode", "DCR") == "DCR"
    if node.op == "SpaceToDepth":  # [n, c, h/b, b, w/b, b] -> [n, b, b, c, h/b, w/b] (DCR) or [n, c, b, b, ...]
        split = x.reshape((n, c, h // b, b, w // b, b))
        view = split.transpose((0, 3, 5, 1, 2, 4) if dcr else (0, 1, 3, 5, 2, 4))
    elif dcr:  # [n, b, b, c/b², h, w] -> [n, c/b², h, b, w, b]
        view = x.reshape((n, b, b, c // (b * b), h, w)).transpose((0, 3, 4, 1, 5, 2))
    else:  # CRD: [n, c/b², b, b, h, w] -> [n, c/b², h, b, w, b]
        view = x.reshape((n, c // (b * b), b, b, h, w)).transpose((0, 1, 4, 2, 5, 3))
    copy_view(ctx, node.outputs[0], view)


def _training(node: Node, g: Graph) -> bool:
    training = _constant_input(node, g, 2)
    return (training is not None and bool(training)) or node.attrs.get("is_test", 1) == 0


def _ratio(node: Node, g: Graph) -> float:
    ratio = _constant_input(node, g, 1)
    return float(ratio.reshape(-1)[0]) if ratio is not None else float(node.attrs.get("ratio", 0.5))


def _check_dropout(node: Node, g: Graph) -> str | None:
    if _training(node, g) and not 0 <= _ratio(node, g) < 1:
        return f"Dropout in training mode with ratio {_ratio(node, g)} (0 <= ratio < 1)"
    if _training(node, g) and g.tensors[node.inputs[0]].dtype.kind != "f":
        return "Dropout in training mode on a float tensor only"
    return None


@lowering("Dropout", check=_check_dropout, constant_inputs=(1, 2), kind=OpKind.ELEMENTWISE)
def lower_dropout(ctx: LowerCtx, node: Node) -> None:
    """Inference: the identity, and a mask of ones when asked for. Training: VectorE's dropout zeroes each element
    with probability `ratio` and the kept ones are scaled by 1 / (1 - ratio); the mask is the same draws applied
    to ones. The draws are the dropout instruction's (keyed by the node's `seed`, else 0, and the tile), so a
    bundle gives the same mask every run, as a seeded framework does."""
    if not _training(node, ctx.graph):
        ctx.alias(node.outputs[0], ctx.view(node.inputs[0]))
        if len(node.outputs) > 1 and node.outputs[1]:
            _fill_output(ctx, node.outputs[1], 1.0)
        return
    prog = ctx.program
    ratio = _ratio(node, ctx.graph)
    seed = int(node.attrs.get("seed", 0))
    x, y = ctx.view(node.inputs[0]), ctx.output(node.outputs[0])
    mask = ctx.output(node.outputs[1]) if len(node.outputs) > 1 and node.outputs[1] else None
    views = [y, x] + ([mask] if mask is not None else [])
    for k, (dst, src, *rest) in enumerate(boxes(views, prog.target.partitions, tile_free_max(ctx))):
        p, f = dst.shape[0], free_size(dst)
        t = prog.sbuf(p, f, x.dtype, node.outputs[0])
        prog.dma(t.ap(), src)
        tile_seed = seed * 1_000_003 + k  # a tile's own draws
        prog.emit("dropout", Engine.DVE, dst=t.ap(), src=t.ap(), prob=ratio, seed=tile_seed)
        ts(prog, t.ap(), t.ap(), AluOp.multiply, 1.0 / (1.0 - ratio))
        prog.dma(dst, t.ap())
        if rest:
            kept = prog.sbuf(p, f, rest[0].dtype, node.outputs[1])
            fill(prog, kept.ap(), 1.0)
            prog.emit("dropout", Engine.DVE, dst=kept.ap(), src=kept.ap(), prob=ratio, seed=tile_seed)
            prog.dma(rest[0], kept.ap())


def _fill_output(ctx: LowerCtx, name: str, value: float) -> None:
    prog = ctx.program
    out = ctx.output(name)
    for (box,) in boxes([out], prog.target.partitions, tile_free_max(ctx)):
        t = prog.sbuf(box.shape[0], free_size(box), box.dtype, name)
        fill(prog, t.ap(), value)
        prog.dma(box, t.ap())


@lowering("ConstantOfShape", since=9, constant_inputs=(0,))
def lower_constant_of_shape(ctx: LowerCtx, node: Node) -> None:
    """Reached only when the result is too large to fold into the bundle: fill it on the device."""
    value = node.attrs.get("value")
    _fill_output(ctx, node.outputs[0], float(np.asarray(value).reshape(-1)[0]) if value is not None else 0.0)


def _range_values(node: Node, g: Graph) -> tuple[float, float, int]:
    start, limit, delta = (float(np.asarray(g.tensors[i].value).reshape(-1)[0]) for i in node.inputs[:3])
    return start, delta, max(int(np.ceil((limit - start) / delta)), 0)


def _check_range(node: Node, g: Graph) -> str | None:
    start, delta, n = _range_values(node, g)
    if n == 0:
        return "an empty Range"
    if g.tensors[node.outputs[0]].dtype.kind in "iu" and max(abs(start), abs(start + delta * (n - 1))) >= 2**24:
        return "an integer Range past 2**24 (computed in fp32)"
    return None


@lowering("Range", check=_check_range, since=11, constant_inputs=(0, 1, 2))
def lower_range(ctx: LowerCtx, node: Node) -> None:
    """start + i * delta, i from GpSimdE's iota, on one partition a tile at a time. (Reached only when the result
    is too large to fold into the bundle: its inputs are constants.)"""
    prog = ctx.program
    start, delta, n = _range_values(node, ctx.graph)
    out = ctx.output(node.outputs[0])
    for c0, w in blocks(n, tile_free_max(ctx)):
        t = prog.sbuf(1, w, DType.fp32, f"{node.name}/i")
        prog.emit("iota", Engine.POOL, dst=t.ap(), base=c0, channel_multiplier=0, steps=(1,))
        values = prog.sbuf(1, w, out.dtype, node.outputs[0])
        ts(prog, values.ap(), t.ap(), AluOp.multiply, delta, AluOp.add, start)
        prog.dma(out.box((c0,), (w,)).split_axis(0, (1, w)), values.ap())


@lowering("Trilu", since=14, constant_inputs=(1,))
def lower_trilu(ctx: LowerCtx, node: Node) -> None:
    """Keep the upper (or lower) triangle. Matrices of at least 32 rows go rows on partitions, and GpSimdE's
    affine_select keeps element (i, j) where j - i - k >= 0 (upper; lower: i + k - j >= 0), the affine expression
    evaluated as it streams, zero elsewhere: one instruction per tile, no mask to load. Smaller matrices (which
    would leave most partitions idle) and the types affine_select does not take (32-bit integers) select against a
    constant mask of the last two axes instead, every partition busy."""
    shape = ctx.shape(node.inputs[0])
    k = _constant_input(node, ctx.graph, 1)
    k = int(k.reshape(-1)[0]) if k is not None else 0
    upper = bool(node.attrs.get("upper", 1))
    rows, cols = shape[-2:]
    x = ctx.view(node.inputs[0])
    if x.dtype in AFFINE_SELECT_TYPES and x.size and rows >= AFFINE_SELECT_MIN_ROWS:
        prog, out = ctx.program, ctx.output(node.outputs[0])
        for index in np.ndindex(*shape[:-2]):
            src, dst = x.at(index), out.at(index)
            for r0, p in blocks(rows, prog.target.partitions):
                for c0, w in blocks(cols, tile_free_max(ctx)):
                    t = prog.sbuf(p, w, x.dtype, f"{node.name}/tile").ap()
                    prog.dma(t, src.box((r0, c0), (p, w)))
                    # the element at partition q, column j of this tile is (r0 + q, c0 + j)
                    offset, per_row, per_col = (c0 - r0 - k, -1, 1) if upper else (r0 + k - c0, 1, -1)
                    prog.emit("affine_select", Engine.POOL, dst=t, src=t, offset=offset,
                              channel_multiplier=per_row, steps=(per_col,), cmp=AluOp.greater_equal, fill=0.0)
                    prog.dma(dst.box((r0, c0), (p, w)), t)
        return
    ones = np.ones(shape[-2:], dtype=np.bool_)
    mask = np.triu(ones, k) if upper else np.tril(ones, k)
    mask_name = ctx.constant(f"{node.name}/mask", mask)

    def compute(prog, dst, s):  # type: ignore[no-untyped-def]
        fill(prog, dst, 0.0)
        select(prog, dst, s[0], s[1])

    elementwise(ctx, node, compute, inputs=[node.inputs[0], mask_name], immediates=False)
