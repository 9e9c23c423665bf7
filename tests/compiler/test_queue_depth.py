"""The schedule's estimate of a DMA queue is the simulator's: a queue holds dma_queue_depth transfers (the one
moving and the next being prepared), takes the next when the one depth places before it has ended, and that one's
data moves a DMA latency later. Short transfers one after another on a queue so pay most of a latency each, and
the schedule must not take a queue of them for free (MobileNetV3's stem waited behind a dozen small weight loads
that the estimate had finished in a few hundred ns)."""

from __future__ import annotations

from isa.dtypes import DType
from isa.operand import Engine
from isa.target import get_target
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.codegen.allocate import OnChipMemory
from neuronx_cc_lite.codegen.schedule import schedule
from neuronx_cc_lite.tile.program import HbmAccess, PendingInstr, Program

TARGET = get_target("trn1")


def test_short_loads_on_a_queue_pay_a_latency_every_depth_of_them():
    prog = Program(TARGET)
    per_queue = 6
    count = TARGET.dma_queues * per_queue
    weight = prog.hbm_tensor("w", count * 16, TensorKind.WEIGHT, DType.fp32)
    for k in range(count):  # independent loads of 4 elements: each costs almost nothing but its latency
        tile = prog.sbuf(1, 4, DType.fp32, f"t{k}")
        prog.instrs.append(PendingInstr("dma_copy", Engine.DMA, 0, {
            "dst": tile.ap(), "src": HbmAccess(weight, DType.fp32, 1, 4, 4 * k, ((4, 1),))}, "load"))
    starts, ends = schedule(prog, memory=OnChipMemory(TARGET))
    latency, depth = TARGET.dma_latency_ns, TARGET.dma_queue_depth
    by_queue: dict[int, list[float]] = {}
    for p, start in zip(prog.instrs, starts):
        by_queue.setdefault(p.queue, []).append(start)
    assert len(by_queue) > 1
    for found in by_queue.values():
        found.sort()
        # transfer j starts no earlier than a latency after transfer j - depth (which ended before it was taken)
        assert all(b - a >= latency for a, b in zip(found, found[depth:])), found
    assert max(ends) >= (per_queue // depth) * latency
