"""A compute instruction that waits for nothing but the program's fills (a ring of depthwise diagonals zeroed from
a zero column, codegen/schedule.py) can run at any time: like a DMA queue, its engine does not start a long one
of them when a more critical instruction becomes ready before half of it would be done, since the engine runs
in order and could not take that one until the fill ends (MobileNetV3: a ring's zeroing ran just before the stem's
epilogue was ready)."""

from __future__ import annotations

from isa.dtypes import DType
from isa.functions import ActFunc
from isa.operand import Engine
from isa.target import get_target
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.codegen.allocate import OnChipMemory
from neuronx_cc_lite.codegen.schedule import schedule
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Program

TARGET = get_target("trn1")


def test_a_long_fill_waits_for_the_chain_that_is_about_to_be_ready():
    prog = Program(TARGET)
    prog.node = "chain"
    x = prog.hbm_tensor("x", 128 * 16 * 4, TensorKind.INPUT, DType.fp32)
    y = prog.hbm_tensor("y", 128 * 16 * 4, TensorKind.OUTPUT, DType.fp32)
    a, b = prog.sbuf(128, 16, DType.fp32, "a"), prog.sbuf(128, 16, DType.fp32, "b")
    prog.dma(a.ap(), HbmView(x, DType.fp32, (128, 16), (16, 1)))
    for _ in range(4):  # the critical chain: ScalarE once the load lands, then more after it
        prog.emit("activation", Engine.ACT, dst=b.ap(), src=a.ap(), func=ActFunc.relu, scale=1.0)
        prog.emit("activation", Engine.ACT, dst=a.ap(), src=b.ap(), func=ActFunc.relu, scale=1.0)
    prog.dma(HbmView(y, DType.fp32, (128, 16), (16, 1)), a.ap())
    prog.node = "later"
    ring = prog.sbuf(128, 8192, DType.fp32, "ring")  # a fill long enough to hold ScalarE past the load's arrival
    zero = prog.scalar(0.0, DType.fp32)
    prog.emit("activation", Engine.ACT, dst=ring.ap(), src=zero.ap(((8192, 0),)), func=ActFunc.copy, scale=1.0)
    fill = len(prog.instrs) - 1
    first = next(i for i, p in enumerate(prog.instrs) if p.engine is Engine.ACT and p.node == "chain")
    chain, filler = prog.instrs[first], prog.instrs[fill]
    starts, ends = schedule(prog, memory=OnChipMemory(TARGET))
    at = {id(p): (s, e) for p, s, e in zip(prog.instrs, starts, ends)}
    load_end = max(e for p, s, e in zip(prog.instrs, starts, ends) if p.engine is Engine.DMA and
                   getattr(p.args["dst"], "tile", None) is a)
    assert at[id(filler)][1] - at[id(filler)][0] > 2 * (load_end + TARGET.semaphore_handoff_ns)  # (long, as meant)
    # the chain's first ScalarE instruction starts as soon as the load hands over, and the fill after the chain's
    assert at[id(chain)][0] <= load_end + TARGET.semaphore_handoff_ns + 1e-6
    assert at[id(filler)][0] >= at[id(chain)][1]
