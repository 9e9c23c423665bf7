"""The function and operator codes that instructions carry: ScalarE activation functions and ALU operators
(CHIP.md, after the nki.isa reference). Their numpy semantics live in runtime/semantics.py."""

from __future__ import annotations

import enum


class ActFunc(enum.IntEnum):
    copy = 0
    relu = 1
    sigmoid = 2
    tanh = 3
    exp = 4
    erf = 5
    gelu = 6
    gelu_apprx_tanh = 7
    silu = 8
    sqrt = 9
    rsqrt = 10
    square = 11
    reciprocal = 12
    abs = 13
    sign = 14
    log = 15
    softplus = 16
    sin = 17
    arctan = 18
    mish = 19
    cos = 20
    tan = 21


class AluOp(enum.IntEnum):
    add = 0
    subtract = 1
    multiply = 2
    divide = 3
    maximum = 4
    minimum = 5
    equal = 6
    not_equal = 7
    greater = 8
    greater_equal = 9
    less = 10
    less_equal = 11
    power = 12
    abs_max = 13
    abs_min = 14
    logical_and = 15
    logical_or = 16
    logical_xor = 17
    bitwise_and = 18
    bitwise_or = 19
    bitwise_xor = 20
    left_shift = 21
    right_shift = 22
    mod = 23  # remainder with the dividend's sign, as C's fmod (nki.language.fmod)


# ScalarE functions computed without a lookup table (this model's estimate: no public list says which functions
# share a table): running one keeps whatever table ScalarE holds; any other function needs its own table loaded
# when ScalarE holds another (isa/costs.py).
TABLELESS = frozenset({ActFunc.copy, ActFunc.relu, ActFunc.square, ActFunc.abs, ActFunc.sign})

BITVEC_OPS = frozenset(
    {AluOp.bitwise_and, AluOp.bitwise_or, AluOp.bitwise_xor, AluOp.left_shift, AluOp.right_shift}
)
REDUCE_OPS = frozenset({AluOp.add, AluOp.multiply, AluOp.maximum, AluOp.minimum, AluOp.abs_max,
                        AluOp.logical_and, AluOp.logical_or})
