"""The cost model: how long an instruction keeps its engine busy, shared by the runtime's clock and the compiler's
scheduler. Every figure comes from the target config (isa/target.py), which says where each comes from.

Compute engines (ACT, DVE, POOL):
    ns = (cycles of the instruction's row + access start) / clock
  where the row's formula is the nki.isa reference's estimate (CHIP.md) and the access start (60 cycles) is the
  fixed cost of opening an SBUF/PSUM access. VectorE divides the row's cycles by its lanes: on trn2 it handles
  4 elements of a 2-byte type, or 2 of any other, per partition per cycle (512 / 256 elements per cycle).
TensorE:
    ns = cycles of the row / clock
  with no access start: back-to-back matmuls issue every max(N, 64) cycles while the next stationary loads in the
  background (NKI performance guide); fp32 operands take four passes, fp8 may take half of one (trn2).
DMA, per transfer on one queue (one engine, one transfer at a time):
    ns = launch + pieces * piece + bytes / engine bandwidth
  `bytes` is the larger of the two sides (a cast on the way does not halve what is read); `pieces` is the number of
  contiguous runs the transfer is cut into, counting a break wherever either side stops being contiguous, so an
  element-strided (transposing) access pays for every element. The `hbm_bytes` of a transfer (both sides, when
  both are in HBM) are drawn from the chip's HBM bandwidth, which the transfers of every core share: the
  simulator slows the transfers down when together they ask for more.
Shared ports: VectorE and GpSimdE cannot access SBUF at the same time, VectorE and ScalarE cannot access PSUM at
the same time; an instruction holds the ports it needs for its whole duration.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from isa.instructions import Instruction
from isa.operand import Engine, Mem, Operand
from isa.target import Target


class Port(enum.Enum):
    SBUF_DVE_POOL = "SBUF port of VectorE and GpSimdE"
    PSUM_DVE_ACT = "PSUM port of VectorE and ScalarE"


def clock_ghz(engine: Engine, target: Target) -> float:
    return {
        Engine.PE: target.pe_ghz,
        Engine.ACT: target.act_ghz,
        Engine.DVE: target.dve_ghz,
        Engine.POOL: target.pool_ghz,
        Engine.SP: target.act_ghz,  # CHIP.md gives no SP clock; it only triggers DMA, timed by the DMA model
    }[engine]


def compute_cycles(instr: Instruction, engine: Engine, target: Target) -> int:
    """Engine cycles of a compute instruction, fixed costs included."""
    spec = instr.spec
    assert spec.cycles is not None, f"{instr.op} is timed by the DMA model"
    cycles = spec.cycles(instr, target)
    if engine is Engine.PE:
        return cycles
    if engine is Engine.DVE:
        dst = instr.args["dst"]
        lanes = target.dve_lanes_16bit if dst.dtype.size == 2 else target.dve_lanes
        cycles = math.ceil(cycles / lanes)
    return cycles + target.access_start_cycles


@dataclass(frozen=True)
class DmaCost:
    fixed_ns: float  # launch and pieces: time on the engine that moves no bytes
    bytes: int  # what the engine moves: the larger side
    hbm_bytes: int  # what crosses HBM: the sides in HBM

    def alone_ns(self, target: Target) -> float:
        """The transfer's duration when HBM has bandwidth to spare."""
        return self.fixed_ns + self.bytes / target.dma_queue_gbps  # GB/s is bytes per ns


def contiguous_run(o: Operand) -> int:
    """Elements per contiguous run of an access pattern: its innermost axes while each continues the last (HBM:
    the partition axis too; SBUF and PSUM rows are apart)."""
    run = 1
    axes = list(reversed(o.dims))
    if o.mem is Mem.HBM:
        axes.append((o.num_partitions, o.partition_stride))
    for size, stride in axes:
        if size == 1:
            continue
        if stride != run:
            break
        run *= size
    return run


def dma_pieces(a: Operand, b: Operand) -> int:
    """Contiguous pieces of a copy between two patterns of one element order: a break wherever either breaks."""
    n = a.num_partitions * a.free_size
    if n == 0:
        return 0
    ra, rb = min(contiguous_run(a), n), min(contiguous_run(b), n)
    return n // ra + n // rb - n // math.lcm(ra, rb)


# An indirect DMA: (the operand of its rows, one per partition; the table's row 0).
INDIRECT = {"dma_gather": ("dst", "src"), "dma_scatter": ("src", "dst")}


def dma_elements(instr: Instruction) -> int:
    """The elements a DMA moves: an indirect one's rows, whatever the size of its table."""
    moved = instr.args[INDIRECT[instr.op][0]] if instr.op in INDIRECT else instr.args["dst"]
    return moved.num_partitions * moved.free_size


def dma_cost(instr: Instruction, target: Target) -> DmaCost:
    dst, src = instr.args["dst"], instr.args["src"]
    n = dma_elements(instr)
    if instr.op in INDIRECT:  # one table row per partition
        moved, row = (instr.args[name] for name in INDIRECT[instr.op])
        pieces = moved.num_partitions * max(1, moved.free_size // max(1, contiguous_run(row)))
    else:
        pieces = dma_pieces(dst, src)
    sides = ((dst, n * dst.dtype.size), (src, n * src.dtype.size))
    hbm = sum(nbytes for o, nbytes in sides if o.mem is Mem.HBM)
    return DmaCost(target.dma_launch_ns + pieces * target.dma_piece_ns, max(nbytes for _, nbytes in sides), hbm)


def duration_ns(instr: Instruction, engine: Engine, target: Target) -> float:
    """How long the instruction keeps its engine or queue busy when nothing else contends."""
    if instr.spec.cycles is None:
        return dma_cost(instr, target).alone_ns(target)
    return compute_cycles(instr, engine, target) / clock_ghz(engine, target)


def ports(instr: Instruction, engine: Engine) -> tuple[Port, ...]:
    """The shared ports the instruction holds while it runs."""
    if engine not in (Engine.DVE, Engine.POOL, Engine.ACT):
        return ()
    mems = {o.mem for _, o in instr.operands()}
    held = []
    if Mem.SBUF in mems and engine in (Engine.DVE, Engine.POOL):
        held.append(Port.SBUF_DVE_POOL)
    if Mem.PSUM in mems and engine in (Engine.DVE, Engine.ACT):
        held.append(Port.PSUM_DVE_ACT)
    return tuple(held)
