"""The verifier of the tile program, run between the stages after lowering (tinygrad's spec.py, MLIR's
verify-each): every access stays inside its tile or HBM tensor, every instruction runs on an engine its row
allows and that reaches its memories, no tile is read before anything writes it, and a reordered program keeps
every dependency. A failure names the stage and the ONNX node, so a bug shows at compile time, not as a wrong
answer."""

from __future__ import annotations

from isa.instructions import OPS
from isa.operand import READABLE, WRITABLE, Engine
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.lower.program import HbmAccess, PendingInstr, Program, TileAccess


def _fail(stage: str, message: str, node: str) -> None:
    raise CompileError("NCC_VERIFY", f"tile program after {stage}: {message}", node or None)


def _span(dims: tuple[tuple[int, int], ...]) -> int:
    """Elements from the first to one past the last an access pattern reaches."""
    return sum((size - 1) * stride for size, stride in dims) + 1


def _check_access(stage: str, p: PendingInstr, name: str, a: TileAccess | HbmAccess, writes: bool) -> None:
    where = f"{p.op} {name}"
    if any(size < 1 or stride < 0 for size, stride in a.dims) or a.offset < 0 or a.partitions < 1:
        _fail(stage, f"{where}: empty or negative access pattern {a.dims}", p.node)
    if isinstance(a, TileAccess):
        t = a.tile
        if a.first < 0 or a.first + a.partitions > t.partitions:
            _fail(stage, f"{where}: partitions {a.first}..{a.first + a.partitions - 1} outside tile {t.name} "
                         f"({t.partitions} partitions)", p.node)
        if a.offset + _span(a.dims) > t.free:
            _fail(stage, f"{where}: elements up to {a.offset + _span(a.dims) - 1} outside tile {t.name} "
                         f"({t.free} per partition)", p.node)
        mem = t.mem
    else:
        end = (a.offset + _span(a.dims) + (a.partitions - 1) * a.partition_stride) * a.dtype.size
        if end > a.tensor.nbytes:
            _fail(stage, f"{where}: bytes up to {end} outside HBM tensor {a.tensor.name} ({a.tensor.nbytes})",
                  p.node)
        mem = None
    if mem is not None and p.engine is not Engine.DMA:
        allowed = WRITABLE[p.engine] if writes else READABLE[p.engine]
        if mem not in allowed:
            _fail(stage, f"{where}: {p.engine.name} cannot {'write' if writes else 'read'} {mem.name}", p.node)


def verify_program(program: Program, stage: str) -> None:
    written: set[int] = set()
    for p in program.instrs:
        if p.engine not in OPS[p.op].engines:
            _fail(stage, f"{p.op} cannot run on {p.engine.name}", p.node)
        fields = OPS[p.op].field_index
        for name, value in p.args.items():
            if isinstance(value, (TileAccess, HbmAccess)):
                _check_access(stage, p, name, value, fields[name].writes)
        tiles = [(access.tile, writes) for access, writes in p.accesses() if isinstance(access, TileAccess)]
        for tile, writes in tiles:
            if not writes and id(tile) not in written:
                _fail(stage, f"{p.op} reads tile {tile.name} before anything writes it", p.node)
        written.update(id(tile) for tile, writes in tiles if writes)


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
