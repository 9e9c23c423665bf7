"""Each formula of the cost model (isa/costs.py), pinned to the figures of the target config."""

from __future__ import annotations

import math

import pytest

from isa.costs import Port, dma_cost, duration_ns, ports
from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.instructions import make
from isa.operand import Engine, Mem, Operand
from isa.target import TRN1, TRN2


def sb(rows: int, cols: int, dtype: DType = DType.fp32, offset: int = 0) -> Operand:
    return Operand(Mem.SBUF, dtype, 0, rows, offset, ((cols, 1),))


def ps(rows: int, cols: int) -> Operand:
    return Operand(Mem.PSUM, DType.fp32, 0, rows, 0, ((cols, 1),))


def hb(rows: int, cols: int, dtype: DType = DType.fp32, row_stride: int | None = None,
       col_stride: int = 1) -> Operand:
    return Operand(Mem.HBM, dtype, 0, rows, 0, ((cols, col_stride),), cols if row_stride is None else row_stride)


def matmul(dtype: DType, m: int = 128, n: int = 512):
    return make("nc_matmul", dst=ps(m, n), stationary=sb(128, m, dtype), moving=sb(128, n, dtype), accumulate=False)


@pytest.mark.parametrize("dtype, factor", [(DType.bf16, 1), (DType.fp16, 1), (DType.fp8_e4m3, 1), (DType.fp32, 4)])
def test_matmul_issues_every_max_n_64_cycles_on_trn1(dtype, factor):
    assert duration_ns(matmul(dtype), Engine.PE, TRN1) == pytest.approx(512 * factor / TRN1.pe_ghz)
    assert duration_ns(matmul(dtype, n=8), Engine.PE, TRN1) == pytest.approx(64 * factor / TRN1.pe_ghz)
    assert duration_ns(matmul(dtype, m=16, n=8), Engine.PE, TRN1) == pytest.approx(16 * factor / TRN1.pe_ghz)


def test_fp8_runs_at_twice_the_bf16_rate_on_trn2():
    bf16 = duration_ns(matmul(DType.bf16), Engine.PE, TRN2)
    assert bf16 == pytest.approx(512 / TRN2.pe_ghz)
    assert duration_ns(matmul(DType.fp8_e5m2), Engine.PE, TRN2) == pytest.approx(bf16 / 2)


def test_a_full_matmul_never_beats_the_pe_peak():
    for target in (TRN1, TRN2):
        for dtype in (DType.fp32, DType.bf16, DType.fp8_e4m3):
            flops = 2 * 128 * 128 * 512
            assert flops / duration_ns(matmul(dtype), Engine.PE, target) <= target.pe_tflops(dtype.name) * 1000 + 1e-6


def test_pe_transpose_is_a_matmul_against_the_identity():
    t = make("nc_transpose", dst=ps(64, 128), src=sb(128, 64, DType.bf16))
    assert duration_ns(t, Engine.PE, TRN1) == pytest.approx(128 / TRN1.pe_ghz)
    t32 = make("nc_transpose", dst=ps(64, 128), src=sb(128, 64))
    assert duration_ns(t32, Engine.PE, TRN1) == pytest.approx(4 * 128 / TRN1.pe_ghz)


def test_scalar_engine_pays_the_access_start():
    a = make("activation", dst=sb(128, 512), src=ps(128, 512), func=ActFunc.exp, scale=1.0)
    assert duration_ns(a, Engine.ACT, TRN1) == pytest.approx((512 + 60) / TRN1.act_ghz)
    small = make("activation", dst=sb(128, 8), src=sb(128, 8), func=ActFunc.exp, scale=1.0)
    assert duration_ns(small, Engine.ACT, TRN1) == pytest.approx((64 + 60) / TRN1.act_ghz)


def test_vector_engine_lanes_per_target():
    def add(dtype: DType):
        return make("tensor_tensor", dst=sb(128, 1024, dtype), a=sb(128, 1024, dtype), b=sb(128, 1024, dtype),
                    op=AluOp.add)

    assert duration_ns(add(DType.fp32), Engine.DVE, TRN1) == pytest.approx((2048 + 60) / TRN1.dve_ghz)
    assert duration_ns(add(DType.bf16), Engine.DVE, TRN1) == pytest.approx((1024 + 60) / TRN1.dve_ghz)
    assert duration_ns(add(DType.fp32), Engine.DVE, TRN2) == pytest.approx((1024 + 60) / TRN2.dve_ghz)  # 256/cycle
    assert duration_ns(add(DType.bf16), Engine.DVE, TRN2) == pytest.approx((256 + 60) / TRN2.dve_ghz)  # 512/cycle


def test_dma_pays_launch_pieces_and_bytes():
    load = make("dma_copy", dst=sb(128, 1024), src=hb(128, 1024))
    cost = dma_cost(load, TRN1)
    # HBM rows follow each other, so the HBM side is one run; SBUF's 128 rows are 128 pieces
    assert (cost.bytes, cost.hbm_bytes) == (128 * 1024 * 4, 128 * 1024 * 4)
    assert cost.fixed_ns == pytest.approx(TRN1.dma_launch_ns + 128 * TRN1.dma_piece_ns)
    assert duration_ns(load, Engine.DMA, TRN1) == pytest.approx(cost.fixed_ns + cost.bytes / TRN1.dma_queue_gbps)


def test_a_cast_on_the_way_is_charged_for_the_wider_side():
    cast = dma_cost(make("dma_copy", dst=sb(128, 1024, DType.bf16), src=hb(128, 1024)), TRN1)
    assert cast.bytes == cast.hbm_bytes == 128 * 1024 * 4
    store = dma_cost(make("dma_copy", dst=hb(128, 1024, DType.bf16), src=sb(128, 1024)), TRN1)
    assert (store.bytes, store.hbm_bytes) == (128 * 1024 * 4, 128 * 1024 * 2)


def test_element_strided_dma_pays_for_every_element():
    # a transposing load: column j of a 128 x 64 HBM matrix onto partition j
    transposing = make("dma_copy", dst=sb(64, 128), src=hb(64, 128, row_stride=1, col_stride=64))
    cost = dma_cost(transposing, TRN1)
    assert cost.fixed_ns == pytest.approx(TRN1.dma_launch_ns + 64 * 128 * TRN1.dma_piece_ns)
    plain = dma_cost(make("dma_copy", dst=sb(64, 128), src=hb(64, 128)), TRN1)
    assert cost.alone_ns(TRN1) > 20 * plain.alone_ns(TRN1)


def test_pieces_break_where_either_side_breaks():
    # HBM rows of 96 elements 128 apart, SBUF rows of 96: 64 pieces of 96
    gapped = dma_cost(make("dma_copy", dst=sb(64, 96), src=hb(64, 96, row_stride=128)), TRN1)
    assert gapped.fixed_ns == pytest.approx(TRN1.dma_launch_ns + 64 * TRN1.dma_piece_ns)
    # HBM to HBM, both contiguous: one piece
    whole = dma_cost(make("dma_copy", dst=hb(64, 96), src=hb(64, 96)), TRN1)
    assert whole.fixed_ns == pytest.approx(TRN1.dma_launch_ns + TRN1.dma_piece_ns)
    assert whole.hbm_bytes == 2 * whole.bytes


def test_large_pieces_run_near_the_engine_rate_and_small_ones_do_not():
    def efficiency(piece_bytes: int) -> float:
        n = piece_bytes // 4
        cost = dma_cost(make("dma_copy", dst=sb(128, n), src=hb(128, n, row_stride=2 * n)), TRN1)
        return (cost.bytes / TRN1.dma_queue_gbps) / (cost.alone_ns(TRN1) - TRN1.dma_launch_ns)

    assert efficiency(4096) >= 0.89
    assert efficiency(512) < 0.6
    assert efficiency(32) < 0.1


def test_shared_ports():
    dve_sbuf = make("memset", dst=sb(128, 8), value=0.0)
    assert ports(dve_sbuf, Engine.DVE) == (Port.SBUF_DVE_POOL,)
    assert ports(dve_sbuf, Engine.POOL) == (Port.SBUF_DVE_POOL,)
    evacuate = make("tensor_copy", dst=sb(128, 8), src=ps(128, 8))
    assert set(ports(evacuate, Engine.DVE)) == {Port.SBUF_DVE_POOL, Port.PSUM_DVE_ACT}
    assert ports(evacuate, Engine.ACT) == (Port.PSUM_DVE_ACT,)
    assert ports(make("tensor_copy", dst=sb(128, 8), src=sb(128, 8, offset=64)), Engine.ACT) == ()
    assert ports(matmul(DType.bf16), Engine.PE) == ()


def test_core_dma_bandwidth_and_pe_peak():
    assert TRN1.core_dma_gbps == pytest.approx(16 * 27.0)
    assert TRN1.pe_tflops("bf16") == pytest.approx(91.75, rel=1e-3)
    assert TRN1.pe_tflops("fp32") == pytest.approx(91.75 / 4, rel=1e-3)
    assert TRN2.pe_tflops("fp8_e4m3") == pytest.approx(2 * TRN2.pe_tflops("bf16"))
    assert math.isclose(TRN2.pe_tflops("bf16"), 78.6, rel_tol=1e-2)
