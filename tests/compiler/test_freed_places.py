"""A tile placed where another was freed starts, in the scheduler's estimate, after that one's last access ends
(codegen/schedule._FreedAt): on the chip a semaphore holds the new tile's first writer until then, and a DMA
queue runs in order, so a load the scheduler thought could start at once held up the transfers queued behind it
(Llama-3-8B's decode over 24 inf2 ranks: a decode layer 463.3 us, 505.7 before)."""

from __future__ import annotations

from isa.dtypes import DType
from isa.operand import Engine
from isa.target import get_target
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.codegen.allocate import OnChipMemory
from neuronx_cc_lite.codegen.schedule import schedule
from neuronx_cc_lite.tile.program import HbmAccess, PendingInstr, Program

TARGET = get_target("trn1")


def _elements(fraction: float) -> int:
    """fp32 elements per partition that take `fraction` of SBUF."""
    return int(TARGET.sbuf_partition_bytes * fraction) // 4


def test_a_load_into_a_freed_place_starts_after_its_last_reader():
    prog, pmax = Program(TARGET), TARGET.partitions
    a = prog.sbuf(pmax, _elements(0.6), DType.fp32, "a")
    b = prog.sbuf(pmax, _elements(0.3), DType.fp32, "b")
    w = prog.sbuf(pmax, _elements(0.5), DType.fp32, "w")
    n_b, n_w = b.free, w.free
    prog.emit("memset", Engine.POOL, dst=a.ap(), value=1.0)
    prog.emit("tensor_copy", Engine.ACT, dst=b.ap(), src=a.region(0, n_b))  # the last reader of a: long
    weight = prog.hbm_tensor("w", pmax * n_w * 4, TensorKind.WEIGHT, DType.fp32)
    half = pmax // 2
    for first in (0, half):  # two loads of w: the second opens no tile, and waits all the same
        prog.instrs.append(PendingInstr("dma_copy", Engine.DMA, 0, {
            "dst": w.ap(first=first, partitions=half),
            "src": HbmAccess(weight, DType.fp32, half, n_w, first * n_w, ((n_w, 1),))}, "load"))
    prog.emit("tensor_copy", Engine.DVE, dst=b.ap(), src=w.region(0, n_b))
    copy, loads = prog.instrs[1], prog.instrs[2:4]
    # a lookahead of 1: the loads are released only once the copy is scheduled and a freed; the queues are idle
    starts, ends = schedule(prog, lookahead=1, memory=OnChipMemory(TARGET))
    at = {id(p): k for k, p in enumerate(prog.instrs)}
    assert w.offset is not None and a.offset is not None
    assert w.offset < a.offset + a.bytes_per_partition and a.offset < w.offset + w.bytes_per_partition  # w over a
    assert all(starts[at[id(load)]] >= ends[at[id(copy)]] for load in loads)
    assert ends[at[id(copy)]] > 5 * TARGET.dma_latency_ns  # the copy is long enough for the check to tell


def test_a_load_into_untouched_memory_starts_at_once():
    prog, pmax = Program(TARGET), TARGET.partitions
    a = prog.sbuf(pmax, _elements(0.3), DType.fp32, "a")
    w = prog.sbuf(pmax, _elements(0.3), DType.fp32, "w")
    prog.emit("memset", Engine.POOL, dst=a.ap(), value=1.0)
    prog.emit("tensor_copy", Engine.ACT, dst=a.ap(), src=a.ap())
    weight = prog.hbm_tensor("w", pmax * w.free * 4, TensorKind.WEIGHT, DType.fp32)
    prog.instrs.append(PendingInstr("dma_copy", Engine.DMA, 0, {
        "dst": w.ap(), "src": HbmAccess(weight, DType.fp32, pmax, w.free, 0, ((w.free, 1),))}, "load"))
    load = prog.instrs[2]
    starts, ends = schedule(prog, lookahead=1, memory=OnChipMemory(TARGET))
    copy_end = max(e for p, e in zip(prog.instrs, ends) if p.op == "tensor_copy")
    assert starts[prog.instrs.index(load)] < copy_end  # nothing to wait for: it overlaps the copy
