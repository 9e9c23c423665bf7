"""Elementwise ops with numpy broadcasting: each output box is loaded, computed on one engine, stored.

Unary functions run on ScalarE (`activation`); binary operators on VectorE (`tensor_tensor`), or as
`tensor_scalar` with an immediate when one side is a constant holding a single value, which saves its load.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.program import Program, TileAccess
from neuronx_cc_lite.lower.registry import lowering
from neuronx_cc_lite.lower.tiling import boxes, free_size

Operand = TileAccess | float
Compute = Callable[[Program, TileAccess, list[Operand]], None]


def tile_free_max(ctx: LowerCtx) -> int:
    """Elements per partition of one elementwise tile: a twelfth of a partition in fp32, so that the inputs and
    output of several boxes are live at once (the allocator's rotation overlaps their loads and stores)."""
    return ctx.program.target.sbuf_partition_bytes // 12 // 4


def single_value(ctx: LowerCtx, name: str) -> float | None:
    """The one value a constant holds everywhere, or None."""
    t = ctx.graph.tensors[name]
    if not t.is_constant or t.value.size == 0 or not np.issubdtype(t.value.dtype, np.floating):
        return None
    first = t.value.flat[0]
    return float(first) if np.all(t.value == first) else None


def elementwise(ctx: LowerCtx, node: Node, compute: Compute, inputs: list[str] | None = None) -> None:
    prog = ctx.program
    out = ctx.output(node.outputs[0])
    names = node.inputs if inputs is None else inputs
    immediates = [single_value(ctx, n) for n in names]
    if all(v is not None for v in immediates):
        immediates[0] = None  # an instruction needs one tile to read
    loaded = [i for i, v in enumerate(immediates) if v is None]
    views = [ctx.view(names[i]).broadcast_to(out.shape) for i in loaded]
    for box in boxes([out, *views], prog.target.partitions, tile_free_max(ctx)):
        o, ins = box[0], box[1:]
        p, f = o.shape[0], free_size(o)
        operands: list[Operand] = list(immediates)
        for i, view in zip(loaded, ins):
            t = prog.sbuf(p, f, view.dtype, names[i])
            prog.dma(t.ap(), view)
            operands[i] = t.ap()
        result = prog.sbuf(p, f, o.dtype, node.outputs[0])
        compute(prog, result.ap(), operands)
        prog.dma(o, result.ap())


def unary(func: ActFunc, scale: float = 1.0) -> Compute:
    def compute(prog: Program, dst: TileAccess, srcs: list[Operand]) -> None:
        prog.emit("activation", Engine.ACT, dst=dst, src=srcs[0], func=func, scale=scale)

    return compute


def binary(op: AluOp, engine: Engine = Engine.DVE) -> Compute:
    def compute(prog: Program, dst: TileAccess, srcs: list[Operand]) -> None:
        a, b = srcs
        if isinstance(a, TileAccess) and isinstance(b, TileAccess):
            prog.emit("tensor_tensor", engine, dst=dst, a=a, b=b, op=op)
        elif isinstance(a, TileAccess):
            prog.emit("tensor_scalar", engine, dst=dst, src=a, op0=op, scalar0=b, reverse0=False, reverse1=False)
        else:
            assert isinstance(b, TileAccess)
            prog.emit("tensor_scalar", engine, dst=dst, src=b, op0=op, scalar0=a, reverse0=True, reverse1=False)

    return compute


def _floats_only(node: Node, g: Graph) -> str | None:
    for name in (*node.inputs, *node.outputs):
        if name and not np.issubdtype(g.tensors[name].dtype, np.floating):
            return f"{node.op} on {g.tensors[name].dtype} tensors is not supported (floating point only)"
    return None


UNARY = {"Relu": ActFunc.relu, "Sigmoid": ActFunc.sigmoid, "Tanh": ActFunc.tanh, "Exp": ActFunc.exp}
BINARY = {"Add": AluOp.add, "Sub": AluOp.subtract, "Mul": AluOp.multiply, "Div": AluOp.divide}


@lowering(*UNARY, check=_floats_only)
def lower_unary(ctx: LowerCtx, node: Node) -> None:
    elementwise(ctx, node, unary(UNARY[node.op]))


@lowering(*BINARY, check=_floats_only, since=7)
def lower_binary(ctx: LowerCtx, node: Node) -> None:
    elementwise(ctx, node, binary(BINARY[node.op]))
