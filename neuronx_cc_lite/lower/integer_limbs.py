"""Exact integer arithmetic over the whole range of a 32-bit type, in pieces ("limbs") the fp32 ALU holds exactly.

The engines compute in fp32, exact for integers up to 2^24 (integer_ranges.py). Where the ranges cannot prove a
node's values within that, an Add, Sub, Neg, Abs or Mul, a comparison and Max/Min on integers of up to 32 bits
(int64 as the device holds it, in int32, included) are computed here instead. What makes it possible: VectorE's
bit-vector operators (bitwise and/or, shifts; isa/functions.py BITVEC_OPS) read an integer tile's 32 bits exactly
and write results that wrap to the destination's width, so the split into limbs and the final join happen on the
engine, with no new instruction.

    split       x = hi * 2^16 + lo, lo = x & 0xFFFF in [0, 2^16), hi = x >> 16 (arithmetic: signed, |hi| <= 2^15;
                in [0, 2^16) for uint32); both written to fp32 tiles, exact
    Add / Sub   (hi_a +- hi_b, lo_a +- lo_b): each limb exact in fp32 (|lo| < 2^17, |hi| <= 2^16)
    Neg         (-hi, -lo)
    join        carry = lo >> 16 (floor, also for a negative lo), lo &= 0xFFFF, hi += carry, then
                result = (hi << 16) | lo: the shift's 64-bit value wraps to the output width on write, which is
                the two's-complement wrap onnxruntime's kernels give
    Mul         by bytes, so that every partial product stays below 2^16: a = sum a_i 2^8i, b likewise
                (a_i = (a >> 8i) & 0xFF), column k = sum_{i+j=k} a_i b_j < 2^18 for k <= 3 (the higher columns
                vanish mod 2^32); lo = c0 + 2^8 (c1 & 0xFF) < 2^17, hi = c2 + (c1 >> 8) + 2^8 (c3 & 0xFF) < 2^19,
                and a * b = hi * 2^16 + lo (mod 2^32), joined as above
    compare     key = (hi_a - hi_b) * 2^16 + (lo_a - lo_b): the exact a - b is an integer whose sign and zeroness
                fp32 rounding keeps (rounding is monotone and never takes a nonzero integer to 0), so
                `key op 0` is `a op b` exactly
    Max / Min   dst = b copied by its bits (bitwise or 0), then a where a > b (or <), by a predicated copy,
                which moves bits, not values; Abs is Max(a, -a)

Costs: Add/Sub 11 VectorE instructions per tile, Neg 9, Mul 35, a comparison 8, Max/Min 10, Abs 19 (against 1 on
the fp32 path, which the lowering keeps wherever integer_ranges proves it exact).
"""

from __future__ import annotations

from typing import Callable

from isa.dtypes import DType
from isa.functions import AluOp
from isa.operand import Engine
from neuronx_cc_lite.lower.instr import scratch, select, ts, tt
from neuronx_cc_lite.tile.program import Program, TileAccess

LIMB = 1 << 16
BYTE = 1 << 8
Limbs = tuple[TileAccess, TileAccess]  # (hi, lo), fp32 tiles
Compute = Callable[[Program, TileAccess, list], None]


def split(prog: Program, x: TileAccess, like: TileAccess, name: str) -> Limbs:
    """(hi, lo) of an integer tile x: hi = x >> 16 (signed), lo = x & 0xFFFF."""
    hi, lo = scratch(prog, like, f"{name}/hi"), scratch(prog, like, f"{name}/lo")
    ts(prog, hi, x, AluOp.right_shift, 16.0)
    ts(prog, lo, x, AluOp.bitwise_and, float(LIMB - 1))
    return hi, lo


def join(prog: Program, dst: TileAccess, hi: TileAccess, lo: TileAccess) -> None:
    """dst = hi * 2^16 + lo, wrapped to dst's width; hi and lo are exact fp32 integers (lo may lie outside
    [0, 2^16): its carry moves into hi). Clobbers hi and lo."""
    low = scratch(prog, dst, "limbs/low", DType.int32)
    ts(prog, low, lo, AluOp.bitwise_and, float(LIMB - 1))
    ts(prog, lo, lo, AluOp.right_shift, 16.0)  # the carry, floor(lo / 2^16)
    tt(prog, hi, hi, lo, AluOp.add)
    high = scratch(prog, dst, "limbs/high", DType.int32)
    ts(prog, high, hi, AluOp.left_shift, 16.0)  # wraps to 32 bits on write
    tt(prog, dst, high, low, AluOp.bitwise_or)  # wraps to dst's width


def add_sub(op: AluOp) -> Compute:
    """a + b or a - b, wrapped (module docstring)."""
    def compute(prog: Program, dst: TileAccess, srcs: list) -> None:
        (ha, la), (hb, lb) = split(prog, srcs[0], dst, "a"), split(prog, srcs[1], dst, "b")
        tt(prog, ha, ha, hb, op)
        tt(prog, la, la, lb, op)
        join(prog, dst, ha, la)

    return compute


def negate(prog: Program, dst: TileAccess, srcs: list) -> None:
    hi, lo = split(prog, srcs[0], dst, "a")
    ts(prog, hi, hi, AluOp.multiply, -1.0)
    ts(prog, lo, lo, AluOp.multiply, -1.0)
    join(prog, dst, hi, lo)


def _bytes(prog: Program, x: TileAccess, like: TileAccess, name: str) -> list[TileAccess]:
    """x's four bytes, low first, as fp32 tiles: (x >> 8i) & 0xFF."""
    found = []
    for i in range(4):
        b = scratch(prog, like, f"{name}/byte{i}")
        ts(prog, b, x, AluOp.right_shift, float(8 * i), AluOp.bitwise_and, float(BYTE - 1))
        found.append(b)
    return found


def multiply(prog: Program, dst: TileAccess, srcs: list) -> None:
    """a * b mod 2^32 by byte columns (module docstring)."""
    a, b = _bytes(prog, srcs[0], dst, "a"), _bytes(prog, srcs[1], dst, "b")
    product = scratch(prog, dst, "limbs/product")
    columns = []
    for k in range(4):
        column = scratch(prog, dst, f"limbs/column{k}")
        tt(prog, column, a[0], b[k], AluOp.multiply)
        for i in range(1, k + 1):
            tt(prog, product, a[i], b[k - i], AluOp.multiply)
            tt(prog, column, column, product, AluOp.add)
        columns.append(column)
    c0, c1, c2, c3 = columns
    # lo = c0 + 2^8 (c1 & 0xFF); hi = c2 + (c1 >> 8) + 2^8 (c3 & 0xFF)
    ts(prog, product, c1, AluOp.bitwise_and, float(BYTE - 1))
    _multiply_add(prog, c0, product, float(BYTE), c0)
    ts(prog, c1, c1, AluOp.right_shift, 8.0)
    tt(prog, c2, c2, c1, AluOp.add)
    ts(prog, c3, c3, AluOp.bitwise_and, float(BYTE - 1))
    _multiply_add(prog, c2, c3, float(BYTE), c2)
    join(prog, dst, c2, c0)


def _multiply_add(prog: Program, dst: TileAccess, src: TileAccess, scale: float, plus: TileAccess) -> None:
    """dst = src * scale + plus, in one VectorE pass."""
    prog.emit("scalar_tensor_tensor", Engine.DVE, dst=dst, src=src, op0=AluOp.multiply, scalar=scale,
              op1=AluOp.add, b=plus)


def difference(prog: Program, like: TileAccess, a: TileAccess, b: TileAccess) -> TileAccess:
    """A fp32 tile with the sign (and zeroness) of a - b, for integers of up to 32 bits."""
    (ha, la), (hb, lb) = split(prog, a, like, "a"), split(prog, b, like, "b")
    tt(prog, ha, ha, hb, AluOp.subtract)
    tt(prog, la, la, lb, AluOp.subtract)
    _multiply_add(prog, ha, ha, float(LIMB), la)  # rounds, keeping the sign
    return ha


def compare(op: AluOp) -> Compute:
    """a op b for op a comparison: (a - b) op 0, a - b from limbs."""
    def compute(prog: Program, dst: TileAccess, srcs: list) -> None:
        ts(prog, dst, difference(prog, dst, srcs[0], srcs[1]), op, 0.0)

    return compute


def choose(op: AluOp) -> Compute:
    """Max (op greater) or Min (op less) of two or more integer tiles, moving bits, never values through fp32."""
    def compute(prog: Program, dst: TileAccess, srcs: list) -> None:
        ts(prog, dst, srcs[0], AluOp.bitwise_or, 0.0)
        predicate = scratch(prog, dst, "limbs/chosen")
        for s in srcs[1:]:
            ts(prog, predicate, difference(prog, dst, s, dst), op, 0.0)
            select(prog, dst, s, predicate)

    return compute


def absolute(prog: Program, dst: TileAccess, srcs: list) -> None:
    """|a| = Max(a, -a), both in limbs: the most negative value is its own negation, as in onnxruntime's. An
    unsigned a is its own absolute value (copied by its bits)."""
    if dst.tile.dtype.np.kind == "u":
        ts(prog, dst, srcs[0], AluOp.bitwise_or, 0.0)
        return
    negated = scratch(prog, dst, "limbs/negated", dst.tile.dtype)
    negate(prog, negated, srcs)
    choose(AluOp.greater)(prog, dst, [srcs[0], negated])


# The limb computation of each operator integer_ranges.LIMBED names
COMPUTE: dict[str, Compute] = {
    "Add": add_sub(AluOp.add), "Sub": add_sub(AluOp.subtract), "Neg": negate, "Mul": multiply, "Abs": absolute,
    "Equal": compare(AluOp.equal), "Less": compare(AluOp.less), "LessOrEqual": compare(AluOp.less_equal),
    "Greater": compare(AluOp.greater), "GreaterOrEqual": compare(AluOp.greater_equal),
    "Max": choose(AluOp.greater), "Min": choose(AluOp.less),
}
