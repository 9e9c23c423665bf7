"""After a PSUM deadlock the scheduler opens an accumulation's bank only when all its inputs can be ready
(codegen/schedule.whole_accumulations): BERT-large from the TorchScript exporter deadlocked every try on eight
attention heads' score banks and fell back to the lowering order, 2.6x slower."""

from __future__ import annotations

from isa.dtypes import DType
from isa.operand import Engine, Mem
from isa.target import get_target
from neuronx_cc_lite.codegen.schedule import whole_accumulations
from neuronx_cc_lite.tile.program import PendingInstr, Tile

TARGET = get_target("trn1")


def _load(dst: Tile) -> PendingInstr:
    return PendingInstr("memset", Engine.POOL, 0, {"dst": dst.ap(), "value": 1.0}, "load")


def _matmul(acc: Tile, a: Tile, b: Tile, accumulate: bool) -> PendingInstr:
    return PendingInstr("nc_matmul", Engine.PE, 0, {"dst": acc.ap(), "stationary": a.ap(), "moving": b.ap(),
                                                     "accumulate": accumulate}, "mm")


def test_the_opening_matmul_waits_for_the_later_steps_inputs():
    a0, a1, b = (Tile(Mem.SBUF, 128, 128, DType.bf16, n) for n in ("a0", "a1", "b"))
    acc = Tile(Mem.PSUM, 128, 128, DType.fp32, "acc")
    instrs = [_load(a0), _load(b), _load(a1), _matmul(acc, a0, b, False), _matmul(acc, a1, b, True)]
    preds = [[], [], [], [0, 1], [1, 2, 3]]
    gated = whole_accumulations(instrs, preds)
    assert gated[3] == [0, 1, 2]  # a1's load, which only the second step reads, now comes first
    assert gated[4] == preds[4] and gated[:3] == preds[:3]
