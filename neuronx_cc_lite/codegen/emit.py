"""Emission: resolve every operand to its physical place, validate, assign streams, synchronise."""

from __future__ import annotations

from isa.bundle import Stream
from isa.instructions import Instruction
from isa.operand import Engine, stream_names
from isa.validate import problems
from neuronx_cc_lite.codegen.sync import synchronize
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.lower.program import Program


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
        stream = f"DMA{p.queue}" if p.engine is Engine.DMA else p.engine.name
        items.append((index_of[stream], instr))
    synchronize(items, len(names))
    streams: dict[str, Stream] = {}
    for (s, instr), p in zip(items, program.instrs):
        stream = streams.setdefault(names[s], Stream([], []))
        stream.instructions.append(instr)
        stream.nodes.append(p.node)
    return {name: streams[name] for name in names if name in streams}
