"""Each formula of the cost model (isa/costs.py), pinned to the figures of the target config."""

from __future__ import annotations

import math

import pytest

from isa.costs import Port, dma_cost, duration_ns, ports, reads_what_it_wrote, stream_durations
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


def test_scalar_engine_pays_the_access_start_and_small_ones_the_static_overhead():
    a = make("activation", dst=sb(128, 512), src=ps(128, 512), func=ActFunc.exp, scale=1.0)
    assert duration_ns(a, Engine.ACT, TRN1) == pytest.approx((512 + 60) / TRN1.act_ghz)
    small = make("activation", dst=sb(128, 8), src=sb(128, 8), func=ActFunc.exp, scale=1.0)
    assert duration_ns(small, Engine.ACT, TRN1) == pytest.approx((64 + 60 + 140) / TRN1.act_ghz)


def test_dependent_one_element_activations_take_the_measured_264_cycles():
    """The NKI performance guide's measured example: back-to-back one-element activations, each reading the
    last's output, issue 264 ScalarE cycles apart."""
    chain = [make("activation", dst=sb(128, 1, offset=4 * ((k + 1) % 2)), src=sb(128, 1, offset=4 * (k % 2)),
                  func=ActFunc.copy, scale=1.0) for k in range(4)]
    durations = stream_durations(chain, Engine.ACT, TRN1)
    assert [round(ns * TRN1.act_ghz) for ns in durations] == [264] * 4
    assert reads_what_it_wrote(chain[1], chain[0]) and not reads_what_it_wrote(chain[0], None)


def test_a_dependent_large_instruction_pays_the_static_overhead_once():
    first = make("tensor_scalar", dst=sb(128, 512), src=sb(128, 512, offset=4096), op0=AluOp.add, scalar0=1.0,
                 reverse0=False, reverse1=False)
    then = make("tensor_scalar", dst=sb(128, 512, offset=8192), src=sb(128, 512), op0=AluOp.add, scalar0=1.0,
                reverse0=False, reverse1=False)
    apart = make("tensor_scalar", dst=sb(128, 512, offset=8192), src=sb(128, 512, offset=16384), op0=AluOp.add,
                 scalar0=1.0, reverse0=False, reverse1=False)
    base = (512 + 60) / TRN1.dve_ghz
    assert stream_durations([first, then], Engine.DVE, TRN1) == pytest.approx([base, base + 140 / TRN1.dve_ghz])
    assert stream_durations([first, apart], Engine.DVE, TRN1) == pytest.approx([base, base])


def test_scalar_engine_loads_a_table_when_the_function_changes():
    def act(func: ActFunc, k: int):
        return make("activation", dst=sb(128, 512, offset=2048 * (k + 1)), src=sb(128, 512), func=func, scale=1.0)

    funcs = [ActFunc.exp, ActFunc.exp, ActFunc.copy, ActFunc.exp, ActFunc.tanh, ActFunc.exp]
    durations = stream_durations([act(f, k) for k, f in enumerate(funcs)], Engine.ACT, TRN1)
    base = (512 + 60) / TRN1.act_ghz
    loads = [1, 0, 0, 0, 1, 1]  # copy needs no table and keeps exp's
    assert durations == pytest.approx([base + n * TRN1.act_table_load_ns for n in loads])


def test_activation_reading_back_its_row_sums_pays_the_accumulator():
    a = make("activation", dst=sb(128, 512), src=ps(128, 512), func=ActFunc.exp, scale=1.0, reduce=sb(128, 1))
    assert duration_ns(a, Engine.ACT, TRN1) == pytest.approx((512 + 60 + 64) / TRN1.act_ghz)


@pytest.mark.parametrize("a_mem, dtype, op, n_factor", [
    (Mem.SBUF, DType.fp32, AluOp.add, 2),  # otherwise: 2N
    (Mem.PSUM, DType.fp32, AluOp.add, 1),  # one input in PSUM: N
    (Mem.SBUF, DType.bf16, AluOp.multiply, 1),  # all bf16, add/subtract/multiply: N
    (Mem.SBUF, DType.bf16, AluOp.maximum, 2),  # all bf16 but another operator: 2N
])
def test_tensor_tensor_follows_the_reference_table(a_mem, dtype, op, n_factor):
    a = Operand(a_mem, DType.fp32 if a_mem is Mem.PSUM else dtype, 0, 128, 0, ((512, 1),))
    tt = make("tensor_tensor", dst=sb(128, 512, dtype), a=a, b=sb(128, 512, dtype, 8192), op=op)
    assert duration_ns(tt, Engine.DVE, TRN1) == pytest.approx((n_factor * 512 + 60) / TRN1.dve_ghz)


def test_tensor_reduce_halves_for_bf16_add_and_max():
    def reduce(dtype: DType, op: AluOp):
        return make("tensor_reduce", dst=sb(128, 1, dtype), src=sb(128, 1024, dtype, 64), op=op, axes=1)

    assert duration_ns(reduce(DType.bf16, AluOp.add), Engine.DVE, TRN1) == pytest.approx((512 + 60) / TRN1.dve_ghz)
    assert duration_ns(reduce(DType.fp32, AluOp.add), Engine.DVE, TRN1) == pytest.approx((1024 + 60) / TRN1.dve_ghz)
    assert duration_ns(reduce(DType.bf16, AluOp.minimum), Engine.DVE, TRN1) == \
        pytest.approx((1024 + 60) / TRN1.dve_ghz)


def test_gpsimd_pays_its_start_and_iota_costs_150_plus_n():
    iota = make("iota", dst=Operand(Mem.SBUF, DType.int32, 0, 128, 0, ((512, 1),)), base=0, channel_multiplier=1,
                steps=(1,))
    assert duration_ns(iota, Engine.POOL, TRN1) == pytest.approx((150 + 512) / TRN1.pool_ghz)
    copy = make("tensor_copy", dst=sb(128, 512), src=sb(128, 512, offset=4096))
    assert duration_ns(copy, Engine.POOL, TRN1) == pytest.approx((150 + 512) / TRN1.pool_ghz)


def test_a_stride_over_16_bytes_halves_the_bandwidth():
    dense = make("tensor_copy", dst=sb(128, 512), src=sb(128, 512, offset=4096))
    wide = make("tensor_copy", dst=sb(128, 512), src=Operand(Mem.SBUF, DType.fp32, 0, 128, 4096, ((512, 8),)))
    assert duration_ns(wide, Engine.DVE, TRN1) == pytest.approx((2 * 512 + 60) / TRN1.dve_ghz)
    assert duration_ns(dense, Engine.DVE, TRN1) == pytest.approx((512 + 60) / TRN1.dve_ghz)
    four = make("tensor_copy", dst=sb(128, 512), src=Operand(Mem.SBUF, DType.fp32, 0, 128, 4096, ((512, 4),)))
    assert duration_ns(four, Engine.DVE, TRN1) == duration_ns(dense, Engine.DVE, TRN1)  # 16 bytes: full speed


def test_vector_engine_lanes_per_target():
    def add(dtype: DType):
        return make("tensor_tensor", dst=sb(128, 1024, dtype), a=sb(128, 1024, dtype), b=sb(128, 1024, dtype),
                    op=AluOp.add)

    assert duration_ns(add(DType.fp32), Engine.DVE, TRN1) == pytest.approx((2048 + 60) / TRN1.dve_ghz)
    assert duration_ns(add(DType.bf16), Engine.DVE, TRN1) == pytest.approx((1024 + 60) / TRN1.dve_ghz)
    assert duration_ns(add(DType.fp32), Engine.DVE, TRN2) == pytest.approx((1024 + 60) / TRN2.dve_ghz)  # 256/cycle
    assert duration_ns(add(DType.bf16), Engine.DVE, TRN2) == pytest.approx((256 + 60) / TRN2.dve_ghz)  # 512/cycle


def test_dma_pays_pieces_and_bytes_on_its_engine():
    load = make("dma_copy", dst=sb(128, 1024), src=hb(128, 1024))
    cost = dma_cost(load, TRN1)
    # HBM rows follow each other, so the HBM side is one run; SBUF's 128 rows are 128 pieces
    assert (cost.bytes, cost.hbm_bytes) == (128 * 1024 * 4, 128 * 1024 * 4)
    assert cost.fixed_ns == pytest.approx(128 * TRN1.dma_piece_ns)
    assert duration_ns(load, Engine.DMA, TRN1) == pytest.approx(cost.fixed_ns + cost.bytes / TRN1.dma_queue_gbps)
    assert cost.alone_ns(TRN1) == pytest.approx(TRN1.dma_latency_ns + duration_ns(load, Engine.DMA, TRN1))


def test_a_cast_on_the_way_is_charged_for_the_wider_side():
    cast = dma_cost(make("dma_copy", dst=sb(128, 1024, DType.bf16), src=hb(128, 1024)), TRN1)
    assert cast.bytes == cast.hbm_bytes == 128 * 1024 * 4
    store = dma_cost(make("dma_copy", dst=hb(128, 1024, DType.bf16), src=sb(128, 1024)), TRN1)
    assert (store.bytes, store.hbm_bytes) == (128 * 1024 * 4, 128 * 1024 * 2)


def test_element_strided_dma_pays_for_every_element():
    # a transposing load: column j of a 128 x 64 HBM matrix onto partition j
    transposing = make("dma_copy", dst=sb(64, 128), src=hb(64, 128, row_stride=1, col_stride=64))
    cost = dma_cost(transposing, TRN1)
    assert cost.fixed_ns == pytest.approx(64 * 128 * TRN1.dma_piece_ns)
    plain = dma_cost(make("dma_copy", dst=sb(64, 128), src=hb(64, 128)), TRN1)
    assert cost.engine_ns(TRN1) > 5 * plain.engine_ns(TRN1)


def test_pieces_break_where_either_side_breaks():
    # HBM rows of 96 elements 128 apart, SBUF rows of 96: 64 pieces of 96
    gapped = dma_cost(make("dma_copy", dst=sb(64, 96), src=hb(64, 96, row_stride=128)), TRN1)
    assert gapped.fixed_ns == pytest.approx(64 * TRN1.dma_piece_ns)
    # HBM to HBM, both contiguous: one piece
    whole = dma_cost(make("dma_copy", dst=hb(64, 96), src=hb(64, 96)), TRN1)
    assert whole.fixed_ns == pytest.approx(TRN1.dma_piece_ns)
    assert whole.hbm_bytes == 2 * whole.bytes


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
    assert TRN1.core_dma_gbps == pytest.approx(16 * 17.0)  # the DMA bandwidth guide's measured 272 GB/s
    assert TRN1.pe_tflops("bf16") == pytest.approx(91.75, rel=1e-3)
    assert TRN1.pe_tflops("fp32") == pytest.approx(91.75 / 4, rel=1e-3)
    assert TRN2.pe_tflops("fp8_e4m3") == pytest.approx(2 * TRN2.pe_tflops("bf16"))
    assert math.isclose(TRN2.pe_tflops("bf16"), 78.6, rel_tol=1e-2)


def test_rows_gathered_into_one_partition_are_as_long_as_their_data_allows():
    """Gathering 56 partitions' rows of 56 into one partition's run cuts 56 pieces of 224 bytes: the rows are no
    longer on either side, so none counts as a small piece; an element-strided (transposing) copy still does."""
    from isa.costs import small_pieces

    one = Operand(Mem.SBUF, DType.fp32, 3, 1, 0, ((3136, 1),))
    rows = Operand(Mem.SBUF, DType.fp32, 0, 56, 0, ((56, 1),))
    assert small_pieces(make("dma_copy", dst=one, src=rows)) == 0
    assert small_pieces(make("dma_copy", dst=rows, src=one)) == 0
    hbm = Operand(Mem.HBM, DType.fp32, 0, 56, 0, ((56, 56),), 1)  # a column of the HBM side a partition
    assert small_pieces(make("dma_copy", dst=rows, src=hbm)) == 56 * 56
