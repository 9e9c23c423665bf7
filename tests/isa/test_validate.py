"""The validator refuses instructions that break CHIP.md's limits."""

from __future__ import annotations

import pytest

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.instructions import make
from isa.operand import Engine, Mem, Operand
from isa.target import TRN1, get_target
from isa.validate import problems


def sb(p=128, f=128, start=0, offset=0, dtype=DType.fp32):
    return Operand(Mem.SBUF, dtype, start, p, offset, ((f, 1),))


def ps(p=128, f=128, offset=0):
    return Operand(Mem.PSUM, DType.fp32, 0, p, offset, ((f, 1),))


def hbm(p=128, f=128, offset=0, pstride=128):
    return Operand(Mem.HBM, DType.fp32, 0, p, offset, ((f, 1),), pstride)


def matmul(dst=None, stationary=None, moving=None):
    return make("nc_matmul", dst=dst or ps(), stationary=stationary or sb(), moving=moving or sb(),
                accumulate=False)


def test_a_good_matmul_passes():
    assert problems(matmul(), Engine.PE, TRN1) == []


@pytest.mark.parametrize("instr, engine, expected", [
    (matmul(), Engine.DVE, "cannot run on DVE"),
    (matmul(dst=sb()), Engine.PE, "PE cannot write SBUF"),
    (matmul(moving=sb(f=513), dst=ps(f=513)), Engine.PE, "moving free size 513 exceeds 512"),
    (matmul(stationary=sb(f=129), dst=ps(p=129)), Engine.PE, "129 partitions"),
    (matmul(stationary=sb(p=64)), Engine.PE, "contraction mismatch"),
    (matmul(dst=ps(f=128, offset=1664)), Engine.PE, "crosses a 2048-byte bank boundary"),
    (matmul(stationary=sb(dtype=DType.bf16)), Engine.PE, "both inputs in fp32"),
    (make("tensor_tensor", dst=sb(), a=ps(), b=ps(), op=AluOp.add), Engine.DVE, "cannot both be in PSUM"),
    (make("tensor_copy", dst=ps(), src=sb()), Engine.POOL, "POOL cannot write PSUM"),
    (make("tensor_copy", dst=sb(p=64, start=32), src=sb(p=64, start=32)), Engine.DVE,
     "cannot start at partition 32"),
    (make("tensor_copy", dst=sb(p=2, start=1), src=sb(p=2, start=0)), Engine.ACT, "cannot start at partition 1"),
    (make("tensor_copy", dst=sb(offset=196608 - 256), src=sb()), Engine.DVE, "reaches byte"),
    (make("dma_copy", dst=sb(), src=hbm(f=64)), Engine.DMA, "128x64 elements but dst is 128x128"),
    (make("dma_copy", dst=sb(), src=ps()), Engine.DMA, "DMA cannot read PSUM"),
    (make("dma_copy", dst=hbm(pstride=0), src=sb()), Engine.DMA, "needs a partition stride"),
    (make("activation", dst=sb(), src=sb(), func=ActFunc.exp, scale=1.0, bias=sb(f=2)), Engine.ACT,
     "bias must be [128, 1]"),
    (make("memset", dst=Operand(Mem.SBUF, DType.fp32, 0, 4, 0, ((8, 0),)), value=0.0), Engine.DVE,
     "zero stride"),
    (make("memset", dst=sb(offset=2), value=0.0), Engine.DVE, "not aligned"),
    # a skew of each row (a diagonal) is a DMA's alone: the compute engines read every partition alike
    (make("tensor_copy", dst=sb(f=4), src=Operand(Mem.SBUF, DType.fp32, 0, 128, 0, ((4, 1),), 4)), Engine.DVE,
     "only a DMA's SBUF operand may start each row further in"),
    (make("dma_copy", dst=Operand(Mem.SBUF, DType.fp32, 0, 128, 0, ((4, 1),), 400), src=hbm(f=4)), Engine.DMA,
     "reaches byte"),
    (make("tensor_reduce", dst=sb(f=1), src=sb(), op=AluOp.subtract, axes=1), Engine.DVE,
     "not subtract"),
    # a zero-stride read of 2**40 elements: more bytes than any HBM holds, refused before the runtime copies it
    (make("dma_copy", dst=Operand(Mem.SBUF, DType.fp32, 0, 1, 0, ((2**20, 1), (2**20, 0))),
          src=Operand(Mem.HBM, DType.fp32, 0, 1, 0, ((2**20, 0), (2**20, 0)))), Engine.DMA, "more bytes than"),
    (make("tensor_reduce", dst=sb(f=1), src=Operand(Mem.SBUF, DType.fp32, 0, 128, 0, ((2**30, 0),)),
          op=AluOp.add, axes=1), Engine.DVE, "more bytes than SBUF holds"),
])
def test_rejected(instr, engine, expected):
    found = problems(instr, engine, TRN1)
    assert any(expected in p for p in found), found


def test_dma_may_start_at_any_partition():
    """The quadrant rule binds the compute engines, not the DMA queues."""
    instr = make("dma_copy", dst=sb(p=3, start=5), src=hbm(p=3))
    assert problems(instr, Engine.DMA, TRN1) == []


def test_a_dma_may_skew_its_sbuf_rows():
    """Partition p's row starting p * 4 elements further in: the diagonal of [128, 128 x 4], inside a partition."""
    skewed = Operand(Mem.SBUF, DType.fp32, 0, 128, 0, ((4, 1),), 4)
    assert problems(make("dma_copy", dst=skewed, src=hbm(f=4)), Engine.DMA, TRN1) == []


def test_hbm_bounds_come_from_the_bundle():
    instr = make("dma_copy", dst=sb(), src=hbm(offset=4096))
    assert problems(instr, Engine.DMA, TRN1) == []
    assert any("past the" in p for p in problems(instr, Engine.DMA, TRN1, hbm_size=65536))


def test_semaphore_ids_are_bounded_by_the_target():
    instr = make("memset", dst=sb(), value=0.0, waits=((TRN1.semaphores, 1),))
    assert any("semaphore" in p for p in problems(instr, Engine.DVE, TRN1))


def test_unknown_target_is_an_error_not_a_default():
    with pytest.raises(KeyError, match="unknown target"):
        get_target("trn9")


def test_a_dma_may_fan_a_partition_out_over_several():
    """A transfer moves its elements in order: one partition's 56 x 56 run onto 56 partitions of 56, and back;
    only the element counts must agree."""
    one = Operand(Mem.SBUF, DType.fp32, 3, 1, 0, ((3136, 1),))
    rows = Operand(Mem.SBUF, DType.fp32, 0, 56, 8, ((56, 1),))
    assert problems(make("dma_copy", dst=rows, src=one), Engine.DMA, TRN1) == []
    assert problems(make("dma_copy", dst=one, src=rows), Engine.DMA, TRN1) == []
    short = Operand(Mem.SBUF, DType.fp32, 0, 55, 8, ((56, 1),))
    assert any("a transfer moves as many as it reads" in p
               for p in problems(make("dma_copy", dst=short, src=one), Engine.DMA, TRN1))
