"""The verifier of the tile program, run between the stages after lowering (codegen/stages.py; tinygrad's spec.py,
MLIR's verify-each): every access stays inside its tile or HBM tensor, every instruction runs on an engine its row
allows and that reaches its memories, no tile is read before anything writes it, and a reordered program keeps
every dependency. A failure names the stage and the ONNX node, so a bug shows at compile time, not as a wrong
answer."""

from __future__ import annotations

from isa.instructions import OPS
from isa.operand import READABLE, WRITABLE, Engine, Mem
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.tile.program import HbmAccess, PendingInstr, Program, TileAccess


# (looked up once: under Python 3.11 an enum member looked up on its class costs ten times a global, and the
# verifier asks for every access after every stage)
_DMA = Engine.DMA


def _fail(stage: str, message: str, node: str) -> None:
    raise CompileError("NCC_VERIFY", f"tile program after {stage}: {message}", node or None)


def _check_access(stage: str, p: PendingInstr, name: str, a: TileAccess | HbmAccess, writes: bool) -> None:
    # (the messages are made only on failure: this runs for every access after every stage)
    span = 1  # elements from the first to one past the last the pattern reaches
    for size, stride in a.dims:
        if size < 1 or stride < 0:
            _fail(stage, f"{p.op} {name}: empty or negative access pattern {a.dims}", p.node)
        span += (size - 1) * stride
    if a.offset < 0 or a.partitions < 1:
        _fail(stage, f"{p.op} {name}: empty or negative access pattern {a.dims}", p.node)
    if isinstance(a, TileAccess):
        t = a.tile
        if a.first < 0 or a.first + a.partitions > t.partitions:
            _fail(stage, f"{p.op} {name}: partitions {a.first}..{a.first + a.partitions - 1} outside tile {t.name} "
                         f"({t.partitions} partitions)", p.node)
        if a.skew and (p.engine is not _DMA or t.mem is not Mem.SBUF):
            _fail(stage, f"{p.op} {name}: only a DMA may skew the rows of an SBUF tile", p.node)
        span += (a.partitions - 1) * a.skew
        if a.offset + span > t.free:
            _fail(stage, f"{p.op} {name}: elements up to {a.offset + span - 1} outside tile {t.name} "
                         f"({t.free} per partition)", p.node)
        if p.engine is not _DMA and t.mem not in (WRITABLE if writes else READABLE)[p.engine]:
            _fail(stage, f"{p.op} {name}: {p.engine.name} cannot {'write' if writes else 'read'} {t.mem.name}",
                  p.node)
    else:
        end = (a.offset + span + (a.partitions - 1) * a.partition_stride) * a.dtype.size
        if end > a.tensor.nbytes:
            _fail(stage, f"{p.op} {name}: bytes up to {end} outside HBM tensor {a.tensor.name} ({a.tensor.nbytes})",
                  p.node)


def verify_program(program: Program, stage: str) -> None:
    written: set[int] = set()
    for p in program.instrs:
        spec = OPS[p.op]
        if p.engine not in spec.engines:
            _fail(stage, f"{p.op} cannot run on {p.engine.name}", p.node)
        reads, writes = [], []
        for f in spec.operand_fields:  # (an indirect DMA's implicit table is in HBM: no tile is read or written there)
            value = p.args[f.name]
            if isinstance(value, (TileAccess, HbmAccess)):
                _check_access(stage, p, f.name, value, f.writes)
                if isinstance(value, TileAccess):
                    (writes if f.writes else reads).append(value.tile)
        for tile in reads:
            if id(tile) not in written:
                _fail(stage, f"{p.op} reads tile {tile.name} before anything writes it", p.node)
        written.update(map(id, writes))


def verify_order(before: list[PendingInstr], after: list[PendingInstr], preds: list[list[int]], stage: str) -> None:
    """`after` holds the instructions of `before`, each after everything it depends on."""
    position = {id(p): k for k, p in enumerate(after)}
    if len(after) != len(before) or len(position) != len(before) or any(id(p) not in position for p in before):
        _fail(stage, "the reordered program does not hold the same instructions", "")
    for i, ps in enumerate(preds):
        for j in ps:
            if position[id(before[j])] > position[id(before[i])]:
                _fail(stage, f"{before[i].op} now runs before the {before[j].op} it depends on "
                             f"(of node {before[j].node!r})", before[i].node)
