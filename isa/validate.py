"""The validator: the limits of CHIP.md checked on one instruction.

The compiler runs it on everything it emits; the runtime runs it on everything it loads. Generic checks come from
the instruction's row (engines, which memories each operand may name, operand well-formedness); shape rules come
from the row's hook.
"""

from __future__ import annotations

from typing import Iterator

from isa.errors import IsaError
from isa.instructions import Instruction, Kind
from isa.operand import COMPUTE_ENGINES, MAX_FREE_DIMS, READABLE, WRITABLE, Engine, Mem, Operand
from isa.target import Target


class ValidationError(IsaError):
    code = "NCC_ISA_INVALID"


# (enum members looked up once: on its class, under Python 3.11, a member costs ten times a global, and the
# compiler validates every instruction it emits)
_HBM, _SBUF = Mem.HBM, Mem.SBUF
_DESCRIPTOR_ENGINES = frozenset({Engine.DMA, Engine.SP})  # the DMA engines move their data, a descriptor a row
_OPERAND_KINDS = (Kind.OPERAND, Kind.SCALAR)


def _operand_problems(name: str, o: Operand, writes: bool, engine: Engine, target: Target,
                      hbm_size: int | None) -> Iterator[str]:
    allowed = WRITABLE[engine] if writes else READABLE[engine]
    if o.mem not in allowed:
        verb = "write" if writes else "read"
        yield f"{name}: {engine.name} cannot {verb} {o.mem.name}"
    if not 1 <= o.num_partitions <= target.partitions:
        yield f"{name}: {o.num_partitions} partitions, must be 1..{target.partitions}"
    if len(o.dims) > MAX_FREE_DIMS:
        yield f"{name}: {len(o.dims)} free dimensions, at most {MAX_FREE_DIMS}"
    if any(size < 1 or stride < 0 for size, stride in o.dims) or o.offset < 0 or o.partition_stride < 0:
        yield f"{name}: sizes must be positive, strides and offset non-negative"
        return
    # A written operand repeats no element, so it fits its memory; a read may repeat (a broadcast), but never
    # past what a chip's memory of its kind holds: a zero-stride read of 2**40 elements would make the runtime
    # copy terabytes.
    capacity = _capacity(o.mem, target, hbm_size if writes else None)
    if o.num_partitions * o.free_size * o.dtype.size > capacity:
        yield (f"{name}: names {o.num_partitions} x {o.free_size} elements, more bytes than {o.mem.name} holds "
               f"({capacity})")
        return
    if writes and any(size > 1 and stride == 0 for size, stride in o.dims):
        yield f"{name}: a written operand cannot repeat elements (zero stride)"
    if o.offset % o.dtype.size:
        yield f"{name}: offset {o.offset} is not aligned to {o.dtype.name}"
    if o.mem is _HBM:
        if o.start_partition != 0:
            yield f"{name}: HBM operands start at partition 0 (use the offset)"
        if writes and o.num_partitions > 1 and o.partition_stride == 0:
            yield f"{name}: a written HBM operand needs a partition stride"
        end = o.byte_span()[1]
        limit = target.hbm_bytes if hbm_size is None else hbm_size
        if end > limit:
            yield f"{name}: HBM access ends at byte {end}, past the {limit} bytes of HBM"
        return
    if o.partition_stride and (o.mem is not _SBUF or engine not in _DESCRIPTOR_ENGINES):
        yield (f"{name}: {o.mem.name} partitions are physical; only a DMA's SBUF operand may start each row further "
               f"in (partition_stride), and here it must be 0")
    if o.start_partition + o.num_partitions > target.partitions:
        yield f"{name}: partitions {o.start_partition}..{o.start_partition + o.num_partitions - 1} " \
              f"past {target.partitions}"
    if engine in COMPUTE_ENGINES and o.start_partition not in target.allowed_start_partitions(o.num_partitions):
        yield (f"{name}: a {o.num_partitions}-partition access cannot start at partition {o.start_partition} "
               f"(allowed: {', '.join(map(str, target.allowed_start_partitions(o.num_partitions)))})")
    row = target.sbuf_partition_bytes if o.mem is _SBUF else target.psum_partition_bytes
    last = o.partition_span[1]
    if last >= row:
        yield f"{name}: reaches byte {last} of a {row}-byte {o.mem.name} partition"


def _capacity(mem: Mem, target: Target, hbm_size: int | None) -> int:
    """The bytes of a memory: HBM's `hbm_size` when given (the bundle's), else the chip's; one core's SBUF or PSUM."""
    if mem is _HBM:
        return target.hbm_bytes if hbm_size is None else hbm_size
    row = target.sbuf_partition_bytes if mem is _SBUF else target.psum_partition_bytes
    return target.partitions * row


def problems(instr: Instruction, engine: Engine, target: Target, hbm_size: int | None = None) -> list[str]:
    """Everything wrong with `instr` running on `engine`; empty when it is valid."""
    spec = instr.spec
    found: list[str] = []
    if engine not in spec.engines:
        found.append(f"{instr.op} cannot run on {engine.name}")
    for f in spec.fields:
        value = instr.args.get(f.name)
        if value is None:
            if not f.optional:
                found.append(f"missing field {f.name}")
            continue
        if isinstance(value, Operand):
            if f.kind not in _OPERAND_KINDS:
                found.append(f"{f.name}: an operand where a {f.kind.value} belongs")
                continue
            if value.mem not in f.mems:
                found.append(f"{f.name}: cannot be in {value.mem.name}")
            found.extend(_operand_problems(f.name, value, f.writes, engine, target, hbm_size))
        elif f.kind is Kind.OPERAND:
            found.append(f"{f.name}: needs an operand")
    for sem, _ in instr.waits:
        if not 0 <= sem < target.semaphores:
            found.append(f"waits on semaphore {sem}; the core has {target.semaphores}")
    if instr.signal is not None and not 0 <= instr.signal < target.semaphores:
        found.append(f"signals semaphore {instr.signal}; the core has {target.semaphores}")
    if not found and spec.check is not None:
        found.extend(spec.check(instr, target))
    return found


def check(instr: Instruction, engine: Engine, target: Target, where: str, hbm_size: int | None = None) -> None:
    found = problems(instr, engine, target, hbm_size)
    if found:
        raise ValidationError(f"{where}: {instr.op}: {'; '.join(found)}")
