"""How long an instruction keeps its engine busy, in nanoseconds.

Compute instructions: the cycle formula of their row in the instruction table (the nki.isa reference's estimates)
plus the fixed cost of starting an SBUF/PSUM access, at the engine's clock. DMA transfers: a launch latency plus
bytes over the bandwidth of one DMA engine. All figures come from the target config.
"""

from __future__ import annotations

from isa.instructions import Instruction
from isa.operand import Engine
from isa.target import Target


def clock_ghz(engine: Engine, target: Target) -> float:
    return {
        Engine.PE: target.pe_ghz,
        Engine.ACT: target.act_ghz,
        Engine.DVE: target.dve_ghz,
        Engine.POOL: target.pool_ghz,
        Engine.SP: target.act_ghz,  # CHIP.md gives no SP clock; it only triggers DMA, timed by the DMA model
    }[engine]


def duration_ns(instr: Instruction, engine: Engine, target: Target) -> float:
    spec = instr.spec
    if spec.cycles is None:
        dst = instr.args["dst"]
        moved = dst.num_partitions * dst.free_size * dst.dtype.size
        return target.dma_launch_ns + moved / target.dma_queue_gbps  # GB/s is bytes per ns
    cycles = spec.cycles(instr, target) + target.access_start_cycles
    return cycles / clock_ghz(engine, target)
