"""Elementwise ops with numpy broadcasting: each output box is loaded, computed, stored.

`elementwise` cuts the output into tiles (tiling.py), loads every input through its broadcast HBM view, and
calls a `Compute` that writes the result tile from the input tiles. An input that is a constant holding one value
everywhere is passed as an immediate instead, which saves its load; where the instruction must read a tile (Where's
branches), it is a memset of one element per partition read with stride 0, not a DMA of one element per piece. Functions run on ScalarE (`activation`),
arithmetic on VectorE (`tensor_tensor`, `tensor_scalar`), power on GpSimdE; ops the engines lack a single
instruction for are short sequences of these (activations.py, logic.py).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from isa.functions import ActFunc, AluOp
from isa.operand import MAX_FREE_DIMS, Engine
from neuronx_cc_lite.integer_ranges import integer_ranges, type_range
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower import integer_limbs
from neuronx_cc_lite.lower.instr import act, scratch, ts, tt
from neuronx_cc_lite.lower.relayout import load_transposed
from neuronx_cc_lite.lower.tiling import RowPieces, boxes, free_size, layout_boxes
from neuronx_cc_lite.ops.dtypes import floats_only, is_float
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.ops.traits import FusedActivation, OpKind
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Program, TileAccess

Operand = TileAccess | float
Compute = Callable[[Program, TileAccess, list[Operand]], None]


def tile_free_max(ctx: LowerCtx) -> int:
    """Elements per partition of one elementwise tile: a twelfth of a partition in fp32, so that the inputs and
    output of several boxes are live at once (the allocator's rotation overlaps their loads and stores)."""
    return ctx.program.target.sbuf_partition_bytes // 12 // 4


def single_value(ctx: LowerCtx, name: str) -> float | None:
    """The one value a floating-point constant holds everywhere, or None."""
    t = ctx.graph.tensors[name]
    if not t.is_constant or t.value.size == 0 or not np.issubdtype(t.value.dtype, np.floating):
        return None
    first = t.value.flat[0]
    return float(first) if np.all(t.value == first) else None


def uniform_value(ctx: LowerCtx, name: str) -> float | None:
    """The one value a constant of any numeric type holds everywhere, when a memset (which writes fp32, cast to
    the tile's type) writes it exactly; else None."""
    t = ctx.graph.tensors[name]
    if not t.is_constant or t.value.size == 0 or t.value.dtype.kind not in "biuf":
        return None
    first = t.value.flat[0]
    if not np.all(t.value == first) or float(np.float32(first)) != float(first):
        return None
    return float(first)


def elementwise(ctx: LowerCtx, node: Node, compute: Compute, inputs: list[str] | None = None,
                immediates: bool | tuple[int, ...] = True, free_max: int | None = None) -> None:
    """Tiles follow the partition axes of the first input of the output's shape whose producer said how it laid
    it out, so that the tiles of one operator are the tiles of the next (and both stay on chip); else the output
    is cut by `boxes`. `immediates`: whether `compute` takes a constant scalar input as a float, or which inputs
    it takes so."""
    prog = ctx.program
    names = [n for n in node.inputs if n] if inputs is None else inputs
    shape = ctx.shape(node.outputs[0])
    axes = next((a for n in names if ctx.shape(n) == shape and (a := ctx.partition_axes(n)) is not None), None)
    out = ctx.output(node.outputs[0], axes)
    allowed = range(len(names)) if immediates is True else immediates or ()
    values = [single_value(ctx, n) if i in allowed else None for i, n in enumerate(names)]
    if all(v is not None for v in values):
        values[0] = None  # an instruction needs one tile to read
    loaded = [i for i, v in enumerate(values) if v is None]
    uniform = {i: u for i in loaded if (u := uniform_value(ctx, names[i])) is not None}
    views = [ctx.view(names[i]).broadcast_to(out.shape) for i in loaded]
    pmax, budget = prog.target.partitions, free_max or tile_free_max(ctx)
    cut = layout_boxes([out, *views], axes, pmax, budget) if axes is not None else None
    for box in cut if cut is not None else boxes([out, *views], pmax, budget):
        o, ins = box[0], box[1:]
        assert isinstance(o, HbmView)
        p, f = o.shape[0], free_size(o)
        operands: list[Operand] = list(values)  # type: ignore[arg-type]
        for i, view in zip(loaded, ins):
            if i in uniform:  # a constant scalar the instruction must read from a tile: filled on chip, not loaded
                operands[i] = prog.scalar(uniform[i], ctx.view(names[i]).dtype).ap(((f, 0),), partitions=p)
                continue
            if isinstance(view, HbmView) and (spread := broadcast_load(prog, view, names[i])) is not None:
                operands[i] = spread
                continue
            if isinstance(view, HbmView) and (turned := load_transposed(prog, view, names[i])) is not None:
                operands[i] = turned  # read down its columns: whole rows, turned on PE
                continue
            t = prog.sbuf(p, f, ctx.view(names[i]).dtype, names[i])
            for first, piece in view.pieces if isinstance(view, RowPieces) else ((0, view),):
                prog.dma(t.ap(first=first, partitions=piece.shape[0]), piece)
            operands[i] = t.ap()
        result = prog.sbuf(p, f, o.dtype, node.outputs[0])
        compute(prog, result.ap(), operands)
        prog.dma(o, result.ap())


def broadcast_load(prog: Program, view: HbmView, name: str) -> TileAccess | None:
    """An input repeated along free axes (stride 0: a [rows, 1] mean, a mask row) loaded once per partition, and
    read back with stride 0 along those axes: a DMA of the repeated view would move one element per piece. None
    when the view repeats nothing, or its pattern would need more axes than an access has."""
    free, strides = view.shape[1:], view.strides[1:]
    repeated = [n > 1 and st == 0 for n, st in zip(free, strides)]
    if not any(repeated):
        return None
    kept = tuple(1 if r else n for n, r in zip(free, repeated))
    dims, step = [], 1
    for n, r in reversed(list(zip(free, repeated))):
        dims.append((n, 0 if r else step))
        step *= 1 if r else n
    dims = _merged(list(reversed(dims)))
    if len(dims) > MAX_FREE_DIMS:
        return None
    compact = HbmView(view.tensor, view.dtype, (view.shape[0], *kept), (view.strides[0], *strides), view.offset)
    t = prog.sbuf(view.shape[0], max(1, math.prod(kept)), view.dtype, name)
    prog.dma(t.ap(), compact)
    return t.ap(tuple(dims))


def _merged(dims: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Drop size-1 axes and merge an axis into the one outside it when they walk as one."""
    out: list[tuple[int, int]] = []
    for n, st in dims:
        if n == 1:
            continue
        if out and out[-1][1] == st * n:
            out[-1] = (out[-1][0] * n, st)
        else:
            out.append((n, st))
    return out or [(1, 1)]


def unary(func: ActFunc, scale: float = 1.0) -> Compute:
    def compute(prog: Program, dst: TileAccess, srcs: list[Operand]) -> None:
        act(prog, dst, srcs[0], func, scale)

    return compute


def apply(prog: Program, dst: TileAccess, a: Operand, b: Operand, op: AluOp, engine: Engine = Engine.DVE) -> None:
    """dst = a op b, where either side may be an immediate."""
    if isinstance(a, TileAccess) and isinstance(b, TileAccess):
        tt(prog, dst, a, b, op, engine)
    elif isinstance(a, TileAccess):
        ts(prog, dst, a, op, b, engine=engine)
    else:
        assert isinstance(b, TileAccess)
        ts(prog, dst, b, op, a, reverse0=True, engine=engine)


def fold(op: AluOp, engine: Engine = Engine.DVE, then: Callable[[Program, TileAccess, int], None] | None = None
         ) -> Compute:
    """a op b op c ...: a binary operator, or a variadic one (Sum, Max, Min) folded left to right."""
    def compute(prog: Program, dst: TileAccess, srcs: list[Operand]) -> None:
        if len(srcs) == 1:
            ts(prog, dst, srcs[0], AluOp.add, 0.0, engine=engine)  # type: ignore[arg-type]
        else:
            apply(prog, dst, srcs[0], srcs[1], op, engine)
            for s in srcs[2:]:
                apply(prog, dst, dst, s, op, engine)
        if then is not None:
            then(prog, dst, len(srcs))

    return compute


def _mean(prog: Program, dst: TileAccess, n: int) -> None:
    ts(prog, dst, dst, AluOp.multiply, 1.0 / n)


def small_integers_ok(node: Node, g: Graph) -> str | None:
    """Integer arithmetic runs through the engines' fp32 ALU: exact while magnitudes stay below 2**24, which is
    what int32/int64 index and shape arithmetic needs; 64-bit and 32-bit unsigned ranges are beyond it (but for
    the operators computed in limbs), and so is a node whose integer operands or result the compiler cannot bound
    within 2**24 and the output type (neuronx_cc_lite/integer_ranges.py)."""
    ranges = integer_ranges(g)
    for name in (*node.inputs, *node.outputs):
        dtype = g.tensors[name].dtype if name else None
        if dtype == np.uint64 or dtype == np.uint32 and not ranges.limbed(node):
            return f"{node.op} on {dtype} is not supported (beyond the exact fp32 range)"
    return ranges.why_inexact(node)


UNARY = {
    "Relu": ActFunc.relu, "Sigmoid": ActFunc.sigmoid, "Tanh": ActFunc.tanh, "Exp": ActFunc.exp,
    "Erf": ActFunc.erf, "Sqrt": ActFunc.sqrt, "Reciprocal": ActFunc.reciprocal, "Abs": ActFunc.abs,
    "Sign": ActFunc.sign, "Log": ActFunc.log, "Softplus": ActFunc.softplus, "Sin": ActFunc.sin,
    "Atan": ActFunc.arctan, "Mish": ActFunc.mish, "Cos": ActFunc.cos, "Tan": ActFunc.tan,
    "Silu": ActFunc.silu,  # the compiler's own, x * Sigmoid(x) (passes/canonicalize.py)
}
ARITHMETIC = {"Add": AluOp.add, "Sub": AluOp.subtract, "Mul": AluOp.multiply, "Div": AluOp.divide}
VARIADIC = {"Sum": fold(AluOp.add), "Max": fold(AluOp.maximum), "Min": fold(AluOp.minimum),
            "Mean": fold(AluOp.add, then=_mean)}


def _check_unary(node: Node, g: Graph) -> str | None:
    """Floats only, but for an integer Abs (computed through fp32 where its ranges prove it exact, else in
    limbs)."""
    if node.op == "Abs" and not is_float(g, node.inputs[0]):
        return small_integers_ok(node, g)
    return floats_only(node, g)


# the unary ops a matmul's or a convolution's evacuation applies as the bank leaves PSUM (passes/fuse_epilogues.py)
FUSED_UNARY = {op: FusedActivation(UNARY[op]) for op in ("Relu", "Sigmoid", "Tanh", "Silu")}


@lowering(*UNARY, check=_check_unary, kind=OpKind.ELEMENTWISE, fused=FUSED_UNARY)
def lower_unary(ctx: LowerCtx, node: Node) -> None:
    if node.op == "Abs" and not is_float(ctx.graph, node.inputs[0]):
        if not in_limbs(ctx, node):
            elementwise(ctx, node, lambda prog, dst, s: ts(prog, dst, s[0], AluOp.abs_max, 0.0))
        return
    elementwise(ctx, node, unary(UNARY[node.op]))


def in_limbs(ctx: LowerCtx, node: Node) -> bool:
    """Computes `node` in limbs (lower/integer_limbs.py) if integer_ranges chose them for it: exact over the whole
    integer range, where fp32 is exact to 2^24. The tiles are smaller: a limb computation keeps up to a dozen
    fp32 scratch tiles the size of its output tile live at once (Mul's bytes and columns)."""
    if not integer_ranges(ctx.graph).limbed(node):
        return False
    elementwise(ctx, node, integer_limbs.COMPUTE[node.op], immediates=False, free_max=tile_free_max(ctx) // 4)
    return True


def wrapping(ctx: LowerCtx, node: Node, compute: Compute) -> Compute:
    """`compute`, its result wrapped into the node's integer output type (two's complement, as onnxruntime's
    kernels) where integer_ranges says it may leave it: computed exactly in fp32 (|result| <= 2^24), then
    ((x - low) fmod m + m) fmod m + low, m the type's 2^bits."""
    if not integer_ranges(ctx.graph).wraps(node):
        return compute
    low, high = type_range(ctx.graph.tensors[node.outputs[0]].dtype)
    m = float(high - low + 1)

    def wrapped(prog: Program, dst: TileAccess, srcs: list[Operand]) -> None:
        exact = scratch(prog, dst, f"{node.outputs[0]}/exact")
        compute(prog, exact, srcs)
        ts(prog, exact, exact, AluOp.subtract, float(low), AluOp.mod, m)  # in (-m, m)
        ts(prog, exact, exact, AluOp.add, m, AluOp.mod, m)  # in [0, m)
        ts(prog, dst, exact, AluOp.add, float(low))

    return wrapped


@lowering("Neg", check=small_integers_ok, kind=OpKind.ELEMENTWISE)
def lower_neg(ctx: LowerCtx, node: Node) -> None:
    if not in_limbs(ctx, node):
        elementwise(ctx, node, wrapping(ctx, node, lambda prog, dst, s: ts(prog, dst, s[0], AluOp.multiply, -1.0)))


def truncating_divide(prog: Program, dst: TileAccess, srcs: list[Operand]) -> None:
    """Integer Div rounds toward zero: (a - fmod(a, b)) / b, where a - fmod(a, b) is an exact multiple of b, so
    the fp32 division is exact while magnitudes stay below 2**24 (small_integers_ok)."""
    a, b = srcs
    apply(prog, dst, a, b, AluOp.mod)
    apply(prog, dst, a, dst, AluOp.subtract)
    apply(prog, dst, dst, b, AluOp.divide)


@lowering(*ARITHMETIC, check=small_integers_ok, since=7, kind=OpKind.ELEMENTWISE)
def lower_arithmetic(ctx: LowerCtx, node: Node) -> None:
    if in_limbs(ctx, node):
        return
    integer_div = node.op == "Div" and not is_float(ctx.graph, node.outputs[0])
    elementwise(ctx, node, wrapping(ctx, node, truncating_divide if integer_div else fold(ARITHMETIC[node.op])))


def _check_variadic(node: Node, g: Graph) -> str | None:
    if node.op == "Mean":
        return floats_only(node, g)
    return small_integers_ok(node, g)


@lowering(*VARIADIC, check=_check_variadic, since=8, kind=OpKind.ELEMENTWISE)
def lower_variadic(ctx: LowerCtx, node: Node) -> None:
    if not in_limbs(ctx, node):
        elementwise(ctx, node, wrapping(ctx, node, VARIADIC[node.op]))


def _pow(prog: Program, dst: TileAccess, srcs: list[Operand]) -> None:
    base, exponent = srcs
    if exponent == 2.0:
        act(prog, dst, base, ActFunc.square)  # type: ignore[arg-type]
    elif exponent == 0.5:
        act(prog, dst, base, ActFunc.sqrt)  # type: ignore[arg-type]
    elif exponent == 1.0:
        ts(prog, dst, base, AluOp.multiply, 1.0)  # type: ignore[arg-type]
    else:
        apply(prog, dst, base, exponent, AluOp.power, Engine.POOL)


@lowering("Pow", floats=True, since=7, kind=OpKind.ELEMENTWISE)
def lower_pow(ctx: LowerCtx, node: Node) -> None:
    elementwise(ctx, node, _pow)


def _check_gelu(node: Node, g: Graph) -> str | None:
    if node.attrs.get("approximate", "none") not in ("none", "tanh"):
        return f"approximate={node.attrs['approximate']!r}"
    return None


# (the function as fused: its tanh approximation rides in the fused node's attribute, "Gelu/tanh")
@lowering("Gelu", check=_check_gelu, floats=True, kind=OpKind.ELEMENTWISE,
          fused={"Gelu": FusedActivation(ActFunc.gelu, in_convolutions=False)})
def lower_gelu(ctx: LowerCtx, node: Node) -> None:
    tanh = node.attrs.get("approximate", "none") == "tanh"
    elementwise(ctx, node, unary(ActFunc.gelu_apprx_tanh if tanh else ActFunc.gelu))
