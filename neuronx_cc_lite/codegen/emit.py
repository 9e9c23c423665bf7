"""Emission: resolve every operand to its physical place, validate, assign streams, synchronise."""

from __future__ import annotations

from isa.bundle import Stream
from isa.costs import PORT_ENGINES, ports
from isa.instructions import Instruction
from isa.operand import Engine
from isa.streams import StreamId, stream_names
from isa.validate import problems
from neuronx_cc_lite.codegen.sync import synchronize
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.tile.program import Program


def emit(program: Program, hbm_size: int) -> dict[str, Stream]:
    """The streams of one core, keyed by stream name, in the fixed order of `stream_names`."""
    target = program.target
    names = stream_names(target.dma_queues)
    if len(names) > target.semaphores:
        raise CompileError("NCC_INTERNAL", f"{len(names)} streams but {target.semaphores} semaphores per core")
    index_of = {name: i for i, name in enumerate(names)}
    items: list[tuple[int, Instruction]] = []
    for p in program.instrs:
        instr = p.instruction()
        found = problems(instr, p.engine, target, hbm_size)
        if found:
            raise CompileError("NCC_INTERNAL", f"the compiler emitted an invalid {p.op}: {'; '.join(found)}",
                               p.node)
        items.append((index_of[StreamId.of(p.engine, p.queue).name], instr))
    synchronize(items, len(names), _port_anchors(program, items, index_of))
    streams: dict[str, Stream] = {}
    for (s, instr), p in zip(items, program.instrs):
        stream = streams.setdefault(names[s], Stream([], []))
        stream.instructions.append(instr)
        stream.nodes.append(p.node)
    return {name: streams[name] for name in names if name in streams}


def _port_anchors(program: Program, items: list[tuple[int, Instruction]], index_of: dict[str, int]) -> dict[int, int]:
    """For each fill (memset) that holds a shared port (isa/costs.py ports): the instruction the schedule placed
    before it on the other engines of that port, which it then waits for. A fill depends on nothing, so without it
    the engine runs every fill of the program back to back as soon as it can, holding the port the other engine's
    dependent chain needs (MobileNetV3: the padding fills of fifteen later convolutions ran at the start and held
    the stem's HardSwish 7 us). Anchored, each runs about when the schedule planned it."""
    engine_of = {index_of[e.name]: e for e in Engine if e.name in index_of}
    last: dict[Engine, int] = {}
    anchors: dict[int, int] = {}
    for position, ((stream, instr), p) in enumerate(zip(items, program.instrs)):
        engine = engine_of.get(stream)
        if engine is None:
            continue
        if p.op == "memset":
            sharers = {e for port in ports(instr, engine) for e in PORT_ENGINES[port][1]} - {engine}
            before = [last[e] for e in sharers if e in last]
            if before:
                anchors[position] = max(before)
        last[engine] = position
    return anchors
