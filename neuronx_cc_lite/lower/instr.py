"""Short forms of the instructions lowerings emit most, so that a sequence of them reads like the math."""

from __future__ import annotations

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from neuronx_cc_lite.tile.program import Program, TileAccess

Scalar = TileAccess | float  # an immediate, or a [P, 1] tile access


def act(prog: Program, dst: TileAccess, src: TileAccess, func: ActFunc, scale: float | TileAccess = 1.0,
        bias: TileAccess | None = None, reduce: TileAccess | None = None) -> None:
    """dst = func(src * scale + bias) on ScalarE, scale a number or a [P, 1] column; `reduce` receives the row sums
    of dst."""
    prog.emit("activation", Engine.ACT, dst=dst, src=src, func=func,
              scale=scale if isinstance(scale, TileAccess) else float(scale), bias=bias, reduce=reduce)


def ts(prog: Program, dst: TileAccess, src: TileAccess, op0: AluOp, s0: Scalar, op1: AluOp | None = None,
       s1: Scalar | None = None, reverse0: bool = False, reverse1: bool = False,
       engine: Engine = Engine.DVE) -> None:
    """dst = (src op0 s0) op1 s1; a reverse flag puts the scalar on the left of its operator."""
    prog.emit("tensor_scalar", engine, dst=dst, src=src, op0=op0,
              scalar0=s0 if isinstance(s0, TileAccess) else float(s0), reverse0=reverse0, op1=op1,
              scalar1=s1 if isinstance(s1, TileAccess) or s1 is None else float(s1), reverse1=reverse1)


def tt(prog: Program, dst: TileAccess, a: TileAccess, b: TileAccess, op: AluOp,
       engine: Engine = Engine.DVE) -> None:
    """dst = a op b, elementwise."""
    prog.emit("tensor_tensor", engine, dst=dst, a=a, b=b, op=op)


def copy(prog: Program, dst: TileAccess, src: TileAccess, engine: Engine = Engine.DVE) -> None:
    prog.emit("tensor_copy", engine, dst=dst, src=src)


def fill(prog: Program, dst: TileAccess, value: float, engine: Engine = Engine.DVE) -> None:
    prog.emit("memset", engine, dst=dst, value=float(value))


def scratch(prog: Program, like: TileAccess, name: str, dtype: DType = DType.fp32) -> TileAccess:
    """A new fp32 tile shaped like the (whole-tile) access `like`, for intermediate values."""
    return prog.sbuf(like.partitions, like.tile.free, dtype, name).ap()


def select(prog: Program, dst: TileAccess, src: TileAccess, predicate: TileAccess) -> None:
    """dst = src where predicate is non-zero; dst keeps its values elsewhere."""
    prog.emit("tensor_copy_predicated", Engine.DVE, dst=dst, src=src, predicate=predicate)
