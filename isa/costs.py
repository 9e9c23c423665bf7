"""The cost model: how long an instruction keeps its engine busy, shared by the runtime's clock and the compiler's
scheduler. Every figure comes from the target config (isa/target.py), which names the source of each.

Compute engines (ACT, DVE, POOL), in engine cycles:
    work   the nki.isa reference's streaming term for the instruction (N, 2N, N/2, 13N/3, ...; N the elements per
           partition), doubled when an SBUF/PSUM operand's innermost stride exceeds fast_stride_bytes (half
           bandwidth); VectorE divides it by its lanes (trn2: 4 elements of a 2-byte type, 2 of any other)
    ACT, DVE:  max(MIN_II, work) + access start          POOL:  GPSIMD_START + work
    + static overhead when the instruction is small (N < min_efficient_elements) or dependent (it reads what the
      instruction before it on the same engine writes, so it waits for that one's results to land)
    + ActReadAccumulator when an activation also returns its row sums
    + a table load (in ns) when ScalarE needs another function's lookup table than the one it holds
TensorE:
    the row's cycles: back-to-back matmuls issue every max(N, 64) cycles while the next stationary loads in the
    background (NKI performance guide); fp32 operands take four passes, fp8 may take half of one (trn2).
DMA, per transfer on one queue (a DMA engine), runtime/simulator.py:
    trigger (its waits met) -> the core's descriptor generator takes it (one transfer every dma_descriptor_ns)
    -> its first byte moves dma_latency_ns after the generator took it, or when the queue's previous transfer
    is done -> engine time: pieces * dma_piece_ns + bytes / dma_queue_gbps
  A queue holds dma_queue_depth transfers at once, so the latency of the next hides behind the data of the one
  moving. `bytes` is the larger of the two sides (a cast on the way does not halve what is read); `pieces` is
  the number of contiguous runs the transfer is cut into, counting a break wherever either side stops being
  contiguous, so an element-strided (transposing) access pays for every element. The `hbm_bytes` of a transfer
  (both sides, when both are in HBM) are drawn from the chip's HBM bandwidth, which the transfers of every core
  share, and a core's transfers together never move more than its DMA engines can (an SP-triggered transfer
  runs on the core's engines too): the simulator slows them down when together they ask for more.
Shared ports: VectorE and GpSimdE cannot access SBUF at the same time, VectorE and ScalarE cannot access PSUM at
the same time; an instruction holds the ports it needs for its whole duration.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Sequence

from isa.functions import TABLELESS, ActFunc
from isa.instructions import Instruction
from isa.operand import Engine, Mem, Operand
from isa.target import Target


class Port(enum.Enum):
    SBUF_DVE_POOL = "SBUF port of VectorE and GpSimdE"
    PSUM_DVE_ACT = "PSUM port of VectorE and ScalarE"


# The engines that share each port, and the memory an instruction must touch on one of them to hold it.
PORT_ENGINES = {Port.SBUF_DVE_POOL: (Mem.SBUF, frozenset({Engine.DVE, Engine.POOL})),
                Port.PSUM_DVE_ACT: (Mem.PSUM, frozenset({Engine.DVE, Engine.ACT}))}


def clock_ghz(engine: Engine, target: Target) -> float:
    return {
        Engine.PE: target.pe_ghz,
        Engine.ACT: target.act_ghz,
        Engine.DVE: target.dve_ghz,
        Engine.POOL: target.pool_ghz,
        Engine.SP: target.act_ghz,  # CHIP.md gives no SP clock; it only triggers DMA, timed by the DMA model
    }[engine]


def strided(instr: Instruction, target: Target) -> bool:
    """Whether an on-chip operand's innermost step is wider than the engines read at full bandwidth."""
    for _, o in instr.operands():
        if o.mem is not Mem.HBM:
            steps = [stride for size, stride in o.dims if size > 1]
            if steps and abs(steps[-1]) * o.dtype.size > target.fast_stride_bytes:
                return True
    return False


def elements(instr: Instruction) -> int:
    """N of the reference's formulas: the elements per partition of the instruction's input (its output for the
    instructions that read no tile)."""
    for name in ("src", "a", "stationary"):
        o = instr.args.get(name)
        if isinstance(o, Operand):
            return o.free_size
    return instr.args["dst"].free_size


def compute_cycles(instr: Instruction, engine: Engine, target: Target, dependent: bool = False) -> int:
    """Engine cycles of a compute instruction, fixed costs included; `dependent` when it reads what the previous
    instruction on its engine writes (module docstring)."""
    spec = instr.spec
    assert spec.cycles is not None, f"{instr.op} is timed by the DMA model"
    work = spec.cycles(instr, target)
    if engine is Engine.PE:
        return work
    if strided(instr, target):
        work *= 2
    if engine is Engine.DVE:
        lanes = target.dve_lanes_16bit if instr.args["dst"].dtype.size == 2 else target.dve_lanes
        work = math.ceil(work / lanes)
    if engine is Engine.POOL:
        cycles = target.gpsimd_start_cycles + work
    else:
        cycles = max(target.min_ii_cycles, work) + target.access_start_cycles
    if dependent or elements(instr) < target.min_efficient_elements:
        cycles += target.static_overhead_cycles
    if instr.op == "activation" and instr.args.get("reduce") is not None:
        cycles += target.act_accumulate_cycles
    return cycles


def table_of(instr: Instruction) -> ActFunc | None:
    """The lookup table an instruction needs ScalarE to hold: an activation's function, unless it needs none."""
    if instr.op != "activation" or instr.args["func"] in TABLELESS:
        return None
    return instr.args["func"]


def reads_what_it_wrote(instr: Instruction, previous: Instruction | None) -> bool:
    """Whether `instr` reads (or rewrites) an on-chip byte `previous` writes: it must wait for those results."""
    if previous is None:
        return False
    written = [o for o in previous.writes() if o.mem is not Mem.HBM]
    return any(_overlap(o, w) for o in (*instr.reads(), *instr.writes()) if o.mem is not Mem.HBM for w in written)


def _overlap(a: Operand, b: Operand) -> bool:
    if a.mem is not b.mem:
        return False
    if a.start_partition >= b.start_partition + b.num_partitions or \
            b.start_partition >= a.start_partition + a.num_partitions:
        return False
    (a0, a1), (b0, b1) = a.partition_span, b.partition_span
    return a0 <= b1 and b0 <= a1


@dataclass(frozen=True)
class DmaCost:
    fixed_ns: float  # engine time that moves no bytes: the pieces
    bytes: int  # what the engine moves: the larger side
    hbm_bytes: int  # what crosses HBM: the sides in HBM

    def engine_ns(self, target: Target) -> float:
        """How long the transfer holds its DMA engine when HBM has bandwidth to spare."""
        return self.fixed_ns + self.bytes / target.dma_queue_gbps  # GB/s is bytes per ns

    def alone_ns(self, target: Target) -> float:
        """From trigger to completion for a transfer alone on its queue, HBM to spare."""
        return target.dma_latency_ns + self.engine_ns(target)


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


# The DMA bandwidth guide: descriptors under 512 bytes are "severely overhead-bound" (CHIP.md, DMA per core).
EFFICIENT_PIECE_BYTES = 512


def small_pieces(instr: Instruction) -> int:
    """The pieces under EFFICIENT_PIECE_BYTES of a copy that moves more than that in each partition: pieces a
    layout chosen differently, or a trip through SBUF, would make whole (a transposing copy's single elements).
    A row shorter than that (a bias, a 64-wide head) is as long as its data allows and is not counted."""
    if instr.op != "dma_copy":
        return 0
    dst, src = instr.args["dst"], instr.args["src"]
    n = dst.num_partitions * dst.free_size
    pieces = dma_pieces(dst, src)
    if n == 0 or pieces == 0:
        return 0
    nbytes = n * max(dst.dtype.size, src.dtype.size)
    per_partition = nbytes / max(1, dst.num_partitions, src.num_partitions)  # (a fan-out's rows: either side's)
    return pieces if nbytes / pieces < min(EFFICIENT_PIECE_BYTES, per_partition) else 0


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
    return DmaCost(pieces * target.dma_piece_ns, max(nbytes for _, nbytes in sides), hbm)


def duration_ns(instr: Instruction, engine: Engine, target: Target, dependent: bool = False,
                loads_table: bool = False) -> float:
    """How long the instruction keeps its engine or queue busy when nothing else contends: a compute
    instruction's cycles (`dependent` on the one before it on its engine; `loads_table` when ScalarE must load
    its function's table first), a transfer's engine time (its latency overlaps other work: module docstring)."""
    if instr.spec.cycles is None:
        return dma_cost(instr, target).engine_ns(target)
    ns = compute_cycles(instr, engine, target, dependent) / clock_ghz(engine, target)
    return ns + (target.act_table_load_ns if loads_table else 0.0)


def stream_durations(instrs: Sequence[Instruction], engine: Engine, target: Target) -> list[float]:
    """Each instruction's duration, in the order one engine runs them: each with what the instruction before it
    leaves (a result it must wait for, the table ScalarE holds)."""
    durations, previous, table = [], None, None
    for instr in instrs:
        if instr.spec.cycles is None or instr.spec.collective:
            durations.append(duration_ns(instr, engine, target) if not instr.spec.collective else 0.0)
            continue
        needed = table_of(instr) if engine is Engine.ACT else None
        durations.append(duration_ns(instr, engine, target, reads_what_it_wrote(instr, previous),
                                     needed is not None and needed != table))
        table = needed or table
        previous = instr
    return durations


def ports(instr: Instruction, engine: Engine) -> tuple[Port, ...]:
    """The shared ports the instruction holds while it runs."""
    if engine not in (Engine.DVE, Engine.POOL, Engine.ACT):
        return ()
    mems = {o.mem for _, o in instr.operands()}
    return tuple(port for port, (mem, engines) in PORT_ENGINES.items() if mem in mems and engine in engines)
