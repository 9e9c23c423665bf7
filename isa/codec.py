"""Binary encoding of instruction streams, derived from the instruction table.

A stream is a u32 instruction count followed by the instructions. An instruction is: opcode (u8), number of
waits (u8), signalled semaphore (i16, -1 for none), the waits as (semaphore u16, value u32), then each field of
its row in order, encoded by its kind. All little-endian. Immediates are f64 so that any Python float the
compiler writes decodes to the same value; the engines compute with them in fp32.
"""

from __future__ import annotations

import struct
from typing import Any, Callable

from isa.dtypes import DType
from isa.errors import IsaError
from isa.instructions import BY_OPCODE, OPS, Field, Instruction, Kind
from isa.limits import MAX_INSTRUCTIONS_PER_STREAM
from isa.operand import Mem, Operand

_COUNT = struct.Struct("<I")
_HEAD = struct.Struct("<BBh")
_WAIT = struct.Struct("<HI")
_OPERAND = struct.Struct("<BBBBQqB")
_DIM = struct.Struct("<Qq")
_U8 = struct.Struct("<B")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_NONE_ENUM = 0xFF
_SCALAR_NONE, _SCALAR_IMM, _SCALAR_OPERAND = 0, 1, 2


class DecodeError(IsaError):
    code = "NCC_ISA_DECODE"


def _put_operand(out: bytearray, o: Operand) -> None:
    out += _OPERAND.pack(o.mem, o.dtype, o.start_partition, o.num_partitions, o.offset, o.partition_stride,
                         len(o.dims))
    for size, stride in o.dims:
        out += _DIM.pack(size, stride)


def _put_field(out: bytearray, f: Field, value: Any) -> None:
    if f.kind is Kind.OPERAND:
        if f.optional:
            out += _U8.pack(value is not None)
        if value is not None:
            _put_operand(out, value)
    elif f.kind is Kind.SCALAR:
        if value is None:
            out += _U8.pack(_SCALAR_NONE)
        elif isinstance(value, Operand):
            out += _U8.pack(_SCALAR_OPERAND)
            _put_operand(out, value)
        else:
            out += _U8.pack(_SCALAR_IMM) + _F64.pack(value)
    elif f.kind is Kind.ENUM:
        out += _U8.pack(_NONE_ENUM if value is None else int(value))
    elif f.kind is Kind.BOOL:
        out += _U8.pack(bool(value))
    elif f.kind is Kind.INT:
        out += _I64.pack(value)
    elif f.kind is Kind.FLOAT:
        out += _F64.pack(value)
    elif f.kind is Kind.INTS:
        out += _U8.pack(len(value))
        for v in value:
            out += _I64.pack(v)
    else:  # pragma: no cover - every Kind is handled above
        raise AssertionError(f.kind)


def encode_instruction(instr: Instruction, out: bytearray) -> None:
    spec = OPS[instr.op]
    out += _HEAD.pack(spec.opcode, len(instr.waits), -1 if instr.signal is None else instr.signal)
    for sem, value in instr.waits:
        out += _WAIT.pack(sem, value)
    for f in spec.fields:
        _put_field(out, f, instr.args[f.name])


def encode_stream(instrs: list[Instruction]) -> bytes:
    out = bytearray(_COUNT.pack(len(instrs)))
    for instr in instrs:
        try:
            encode_instruction(instr, out)
        except struct.error as e:
            raise IsaError(f"cannot encode {instr.op}: a field is out of range ({e})") from None
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, s: struct.Struct) -> tuple[Any, ...]:
        if self.pos + s.size > len(self.data):
            raise DecodeError(f"stream truncated at byte {self.pos}")
        values = s.unpack_from(self.data, self.pos)
        self.pos += s.size
        return values

    def operand(self) -> Operand:
        mem, dtype, start, count, offset, pstride, ndims = self.take(_OPERAND)
        dims = tuple(self.take(_DIM) for _ in range(ndims))
        return Operand(_enum(Mem, mem), _enum(DType, dtype), start, count, offset, dims, pstride)


def _enum(cls: Callable[[int], Any], value: int) -> Any:
    try:
        return cls(value)
    except ValueError:
        raise DecodeError(f"bad {cls.__name__} code {value}") from None


def _get_field(r: _Reader, f: Field) -> Any:
    if f.kind is Kind.OPERAND:
        if f.optional and not r.take(_U8)[0]:
            return None
        return r.operand()
    if f.kind is Kind.SCALAR:
        tag = r.take(_U8)[0]
        if tag == _SCALAR_NONE:
            return None
        if tag == _SCALAR_IMM:
            return r.take(_F64)[0]
        if tag == _SCALAR_OPERAND:
            return r.operand()
        raise DecodeError(f"bad scalar tag {tag}")
    if f.kind is Kind.ENUM:
        code = r.take(_U8)[0]
        return None if code == _NONE_ENUM and f.optional else _enum(f.enum, code)
    if f.kind is Kind.BOOL:
        return bool(r.take(_U8)[0])
    if f.kind is Kind.INT:
        return r.take(_I64)[0]
    if f.kind is Kind.FLOAT:
        return r.take(_F64)[0]
    if f.kind is Kind.INTS:
        return tuple(r.take(_I64)[0] for _ in range(r.take(_U8)[0]))
    raise AssertionError(f.kind)  # pragma: no cover


def decode_stream(data: bytes) -> list[Instruction]:
    r = _Reader(data)
    (count,) = r.take(_COUNT)
    if count > MAX_INSTRUCTIONS_PER_STREAM:
        raise DecodeError(f"the stream declares {count} instructions; a stream holds at most "
                          f"{MAX_INSTRUCTIONS_PER_STREAM} (isa/limits.py)")
    if count * _HEAD.size > len(data) - r.pos:
        raise DecodeError(f"the stream declares {count} instructions but has {len(data)} bytes")
    instrs = []
    for index in range(count):
        opcode, nwaits, signal = r.take(_HEAD)
        spec = BY_OPCODE.get(opcode)
        if spec is None:
            raise DecodeError(f"instruction {index}: unknown opcode 0x{opcode:02x}")
        waits = tuple(r.take(_WAIT) for _ in range(nwaits))
        args = {f.name: _get_field(r, f) for f in spec.fields}
        instrs.append(Instruction(spec.name, args, waits, None if signal < 0 else signal))
    if r.pos != len(data):
        raise DecodeError(f"{len(data) - r.pos} bytes after the last instruction")
    return instrs
