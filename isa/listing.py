"""The text form of instructions: a printer and a lark grammar, both derived from the instruction table.

    nc_matmul dst=fp32 PSUM[0:128]@0 {512:1} stationary=fp32 SBUF[0:128]@0 {128:1} ... accumulate=false wait[s5>=2] inc[s0]

An operand reads `DTYPE MEM[first:end(:partition_stride)]@byte_offset {size:stride, ...}`, strides in elements.
`wait[s5>=2]` holds the instruction until semaphore 5 reaches 2; `inc[s0]` adds one to semaphore 0 on completion.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import lark

from isa.dtypes import DType
from isa.errors import IsaError
from isa.instructions import OPS, Field, Instruction, Kind
from isa.operand import Mem, Operand


class ParseError(IsaError):
    code = "NCC_ISA_PARSE"


# ---- printing ---------------------------------------------------------------------------------------------------


def format_operand(o: Operand) -> str:
    parts = f"{o.start_partition}:{o.start_partition + o.num_partitions}"
    if o.partition_stride:
        parts += f":{o.partition_stride}"
    dims = ", ".join(f"{size}:{stride}" for size, stride in o.dims)
    return f"{o.dtype.name} {o.mem.name}[{parts}]@{o.offset} {{{dims}}}"


def _format_float(v: float) -> str:
    text = repr(float(v))
    return text if not math.isnan(v) else "nan"


def _format_value(f: Field, v: Any) -> str:
    if isinstance(v, Operand):
        return format_operand(v)
    if f.kind is Kind.ENUM:
        return v.name
    if f.kind is Kind.BOOL:
        return "true" if v else "false"
    if f.kind in (Kind.FLOAT, Kind.SCALAR):
        return _format_float(v)
    if f.kind is Kind.INTS:
        return "(" + ", ".join(map(str, v)) + ")"
    return str(v)


def format_instruction(instr: Instruction) -> str:
    spec = instr.spec
    words = [spec.name]
    for f in spec.fields:
        value = instr.args[f.name]
        if value is not None:
            words.append(f"{f.name}={_format_value(f, value)}")
    if instr.waits:
        words.append("wait[" + ", ".join(f"s{sem}>={value}" for sem, value in instr.waits) + "]")
    if instr.signal is not None:
        words.append(f"inc[s{instr.signal}]")
    return " ".join(words)


# ---- parsing ----------------------------------------------------------------------------------------------------

_VALUE_RULE = {
    Kind.OPERAND: "operand",
    Kind.SCALAR: "scalar",
    Kind.ENUM: "NAME",
    Kind.BOOL: "bool",
    Kind.INT: "SIGNED_INT",
    Kind.FLOAT: "number",
    Kind.INTS: "ints",
}

_COMMON = r"""
    ?start: instruction
    instruction: (%s) sync
    sync: ["wait" "[" wait ("," wait)* "]"] ["inc" "[" SEM "]"]
    wait: SEM ">=" INT
    operand: NAME NAME "[" INT ":" INT [":" INT] "]" "@" INT "{" [dim ("," dim)*] "}"
    dim: INT ":" INT
    scalar: operand | number
    number: NUMBER
    bool: TRUE | FALSE
    ints: "(" [SIGNED_INT ("," SIGNED_INT)*] ")"
    TRUE: "true"
    FALSE: "false"
    SEM: /s[0-9]+/
    NUMBER.2: /[-+]?(inf|nan|[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?)/
    %%import common.CNAME -> NAME
    %%import common.INT
    %%import common.SIGNED_INT
    %%import common.WS
    %%ignore WS
"""


def _op_rule(name: str) -> str:
    spec = OPS[name]
    parts = [f'"{name}"']
    for f in spec.fields:
        item = f'"{f.name}" "=" {_VALUE_RULE[f.kind]}'
        parts.append(f"[{item}]" if f.optional else item)
    return f"op_{name}: " + " ".join(parts)


def grammar() -> str:
    """The assembler grammar, generated from the instruction table."""
    alternatives = " | ".join(f"op_{name}" for name in OPS)
    rules = "\n".join(f"    {_op_rule(name)}" for name in OPS)
    return (_COMMON % alternatives) + rules + "\n"


@functools.cache
def _parser() -> lark.Lark:
    return lark.Lark(grammar(), parser="lalr", maybe_placeholders=True)


def _enum_member(cls: Any, name: str, what: str) -> Any:
    try:
        return cls[name]
    except KeyError:
        raise ParseError(f"unknown {what} {name!r}") from None


class _Build(lark.Transformer):
    def operand(self, c: list[Any]) -> Operand:
        dtype, mem, first, end, pstride, offset, *dims = c
        first, end = int(first), int(end)
        return Operand(_enum_member(Mem, str(mem), "memory"), _enum_member(DType, str(dtype), "dtype"), first,
                       end - first, int(offset), tuple(d for d in dims if d is not None),
                       int(pstride) if pstride is not None else 0)

    def dim(self, c: list[Any]) -> tuple[int, int]:
        return int(c[0]), int(c[1])

    def scalar(self, c: list[Any]) -> Any:
        return c[0]

    def number(self, c: list[Any]) -> float:
        return float(c[0])

    def bool(self, c: list[Any]) -> bool:
        return c[0].type == "TRUE"

    def ints(self, c: list[Any]) -> tuple[int, ...]:
        return tuple(int(v) for v in c if v is not None)

    def wait(self, c: list[Any]) -> tuple[int, int]:
        return int(c[0][1:]), int(c[1])

    def sync(self, c: list[Any]) -> tuple[tuple[tuple[int, int], ...], int | None]:
        *waits, inc = c
        return tuple(w for w in waits if w is not None), None if inc is None else int(inc[1:])

    def instruction(self, c: list[Any]) -> Instruction:
        (name, values), (waits, signal) = c
        spec = OPS[name]
        args = {}
        for f, v in zip(spec.fields, values):
            if f.kind is Kind.ENUM and v is not None:
                v = _enum_member(f.enum, str(v), f"{f.name} value")
            elif f.kind is Kind.INT:
                v = int(v)
            args[f.name] = v
        return Instruction(name, args, waits, signal)

    def __default__(self, data: Any, children: list[Any], meta: Any) -> Any:
        if isinstance(data, str) and data.startswith("op_"):
            return data[3:], children
        return super().__default__(data, children, meta)


def parse_instruction(text: str) -> Instruction:
    try:
        return _Build().transform(_parser().parse(text))
    except lark.exceptions.VisitError as e:
        if isinstance(e.orig_exc, ParseError):
            raise e.orig_exc from None
        raise
    except lark.exceptions.LarkError as e:
        first_line = str(e).strip().splitlines()[0]
        raise ParseError(f"cannot parse {text.strip()!r}: {first_line}") from None
