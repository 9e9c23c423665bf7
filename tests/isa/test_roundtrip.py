"""encode -> decode and print -> parse are identities, for every row of the instruction table."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isa.codec import decode_stream, encode_stream
from isa.dtypes import DType
from isa.instructions import OPS, Instruction, Kind, make
from isa.listing import format_instruction, parse_instruction
from isa.operand import Mem, Operand

U8, U32 = 255, 2**32 - 1

operands = st.builds(
    Operand,
    mem=st.sampled_from(Mem),
    dtype=st.sampled_from(DType),
    start_partition=st.integers(0, U8),
    num_partitions=st.integers(0, U8),
    offset=st.integers(0, 2**40),
    dims=st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 2**31)), max_size=4).map(tuple),
    partition_stride=st.integers(0, 2**31),
)
floats = st.floats(allow_nan=False)
ints64 = st.integers(-(2**63), 2**63 - 1)


def _value(field):
    kind = field.kind
    if kind is Kind.OPERAND:
        base = operands
    elif kind is Kind.SCALAR:
        base = st.one_of(floats, operands)
    elif kind is Kind.ENUM:
        base = st.sampled_from(field.enum)
    elif kind is Kind.BOOL:
        base = st.booleans()
    elif kind is Kind.INT:
        base = ints64
    elif kind is Kind.FLOAT:
        base = floats
    else:
        base = st.lists(ints64, max_size=4).map(tuple)
    return st.one_of(st.none(), base) if field.optional else base


@st.composite
def instructions(draw, op: str) -> Instruction:
    spec = OPS[op]
    args = {f.name: draw(_value(f)) for f in spec.fields}
    waits = tuple(draw(st.lists(st.tuples(st.integers(0, 2**16 - 1), st.integers(0, U32)), max_size=6)))
    signal = draw(st.one_of(st.none(), st.integers(0, 2**15 - 1)))
    return Instruction(op, args, waits, signal)


@pytest.mark.parametrize("op", sorted(OPS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_encode_decode_is_identity(op, data):
    instrs = [data.draw(instructions(op)) for _ in range(3)]
    assert decode_stream(encode_stream(instrs)) == instrs


@pytest.mark.parametrize("op", sorted(OPS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_print_parse_is_identity(op, data):
    instr = data.draw(instructions(op))
    assert parse_instruction(format_instruction(instr)) == instr


def test_nan_immediates_survive_both_trips():
    o = Operand(Mem.SBUF, DType.fp32, 0, 4, 0, ((8, 1),))
    instr = make("memset", dst=o, value=math.nan)
    (decoded,) = decode_stream(encode_stream([instr]))
    assert math.isnan(decoded.args["value"])
    assert math.isnan(parse_instruction(format_instruction(instr)).args["value"])


def test_golden_encoding_of_a_matmul():
    """The byte layout is a contract with every bundle already written: pin one instruction."""
    sb = Operand(Mem.SBUF, DType.bf16, 0, 128, 256, ((128, 1),))
    ps = Operand(Mem.PSUM, DType.fp32, 0, 128, 0, ((128, 1),))
    instr = make("nc_matmul", dst=ps, stationary=sb, moving=sb, accumulate=True, waits=((5, 2),), signal=0)
    z8 = "00" * 8
    dim = "8000000000000000" "0100000000000000"  # size 128 (u64), stride 1 (i64)
    assert encode_stream([instr]).hex() == (
        "01000000"  # one instruction
        "10" "01" "0000" "0500" "02000000"  # opcode 0x10, one wait, signal s0; the wait: s5 >= 2
        "02" "00" "00" "80" + z8 + z8 + "01" + dim  # dst: PSUM fp32 partitions 0+128, offset 0, one dim
        + "01" "01" "00" "80" "0001000000000000" + z8 + "01" + dim  # stationary: SBUF bf16, offset 256
        + "01" "01" "00" "80" "0001000000000000" + z8 + "01" + dim  # moving
        + "01"  # accumulate
    )
    assert format_instruction(instr) == (
        "nc_matmul dst=fp32 PSUM[0:128]@0 {128:1} stationary=bf16 SBUF[0:128]@256 {128:1} "
        "moving=bf16 SBUF[0:128]@256 {128:1} accumulate=true wait[s5>=2] inc[s0]")


def test_truncated_stream_is_a_decode_error():
    o = Operand(Mem.SBUF, DType.fp32, 0, 4, 0, ((8, 1),))
    data = encode_stream([make("memset", dst=o, value=1.0)])
    from isa.codec import DecodeError

    for cut in (3, 10, len(data) - 1):
        with pytest.raises(DecodeError):
            decode_stream(data[:cut])
    with pytest.raises(DecodeError, match="after the last"):
        decode_stream(data + b"\0")
