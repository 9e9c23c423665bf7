"""Each instruction against numpy, through a hand-written bundle: load, compute on an engine, store."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isa.bundle import Bundle, Stream, TensorInfo
from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.instructions import OPS, make
from runtime.collectives import COLLECTIVE_HANDLERS
from runtime.semantics import ACTIVATIONS, ALU, HANDLERS
import runtime
from tests.runtime.helpers import HBM_SIZE, hbm, model, psum, sbuf

X, Y, OUT = 0, 262144, 524288  # HBM offsets


def test_every_opcode_has_a_handler_and_every_function_and_operator_semantics():
    """One handler per mnemonic: a rank's own for the rest, the whole group's for a collective."""
    assert set(COLLECTIVE_HANDLERS) == {name for name, spec in OPS.items() if spec.collective}
    assert set(HANDLERS) == set(OPS) - set(COLLECTIVE_HANDLERS)
    assert set(ACTIVATIONS) == set(ActFunc)
    assert set(ALU) == set(AluOp)


def _run_unary(instr, engine, x):
    """Load x [4, 8] into SBUF at 0, run `instr` (which writes SBUF at 4096), store that."""
    instr.waits, instr.signal = ((5, 1),), 0
    m = model({
        "DMA0": [make("dma_copy", dst=sbuf(4, 8), src=hbm(X, 4, 8), signal=5),
                 make("dma_copy", dst=hbm(OUT, 4, 8), src=sbuf(4, 8, 4096), waits=((0, 1),))],
        engine: [instr],
    }, {"x": (X, (4, 8))}, {"y": (OUT, (4, 8))})
    return m.run({"x": x})["y"]


def _erf(v):
    return np.vectorize(math.erf)(v.astype(np.float64))


REFERENCE = {
    ActFunc.copy: lambda x: x,
    ActFunc.relu: lambda x: np.maximum(x, 0),
    ActFunc.sigmoid: lambda x: 1 / (1 + np.exp(-x.astype(np.float64))),
    ActFunc.tanh: np.tanh,
    ActFunc.exp: np.exp,
    ActFunc.erf: _erf,
    ActFunc.gelu: lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))),
    ActFunc.gelu_apprx_tanh: lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    ActFunc.silu: lambda x: x / (1 + np.exp(-x.astype(np.float64))),
    ActFunc.sqrt: lambda x: np.sqrt(np.abs(x)),
    ActFunc.rsqrt: lambda x: 1 / np.sqrt(np.abs(x)),
    ActFunc.square: np.square,
    ActFunc.reciprocal: lambda x: 1 / x,
    ActFunc.abs: np.abs,
    ActFunc.sign: np.sign,
    ActFunc.log: lambda x: np.log(np.abs(x)),
    ActFunc.softplus: lambda x: np.log1p(np.exp(x.astype(np.float64))),
    ActFunc.sin: np.sin,
    ActFunc.arctan: np.arctan,
    ActFunc.mish: lambda x: x * np.tanh(np.log1p(np.exp(x.astype(np.float64)))),
    ActFunc.cos: np.cos,
    ActFunc.tan: np.tan,
}


@pytest.mark.parametrize("func", list(ActFunc), ids=lambda f: f.name)
def test_activation_functions(func):
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32) * 3
    if func in (ActFunc.sqrt, ActFunc.rsqrt, ActFunc.log):
        x = np.abs(x) + 0.1
    instr = make("activation", dst=sbuf(4, 8, 4096), src=sbuf(4, 8), func=func, scale=1.0)
    y = _run_unary(instr, "ACT", x)
    np.testing.assert_allclose(y, REFERENCE[func](x), rtol=2e-6, atol=2e-6)


def test_activation_scale_bias_and_sum():
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    bias = np.arange(4, dtype=np.float32).reshape(4, 1)
    # bias lives in columns 8.. of the same input tile; the sum goes to column 0 of a second output tile
    m = model({
        "DMA0": [make("dma_copy", dst=sbuf(4, 9), src=hbm(X, 4, 9), signal=5),
                 make("dma_copy", dst=hbm(OUT, 4, 9), src=sbuf(4, 9, 4096), waits=((1, 1),))],
        "ACT": [make("activation", dst=sbuf(4, 8, 4096), src=sbuf(4, 8), bias=sbuf(4, 1, 32), func=ActFunc.exp,
                     scale=0.5, reduce=sbuf(4, 1, 4096 + 32), waits=((5, 1),), signal=1)],
    }, {"x": (X, (4, 9))}, {"y": (OUT, (4, 9))})
    y = m.run({"x": np.concatenate([x, bias], axis=1)})["y"]
    expected = np.exp(x * 0.5 + bias)
    np.testing.assert_allclose(y[:, :8], expected, rtol=1e-6)
    np.testing.assert_allclose(y[:, 8], expected.sum(axis=1), rtol=1e-6)


def test_activation_scales_by_a_column():
    """scale may be a [P, 1] column, as nki.isa.activation's vector scale: one factor per partition."""
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    scale = np.array([[0.5], [-2.0], [0.0], [3.0]], np.float32)
    bias = np.arange(4, dtype=np.float32).reshape(4, 1)
    # columns 8 and 9 of the input tile hold the scale and the bias
    m = model({
        "DMA0": [make("dma_copy", dst=sbuf(4, 10), src=hbm(X, 4, 10), signal=5),
                 make("dma_copy", dst=hbm(OUT, 4, 8), src=sbuf(4, 8, 4096), waits=((1, 1),))],
        "ACT": [make("activation", dst=sbuf(4, 8, 4096), src=sbuf(4, 8), scale=sbuf(4, 1, 32), bias=sbuf(4, 1, 36),
                     func=ActFunc.silu, waits=((5, 1),), signal=1)],
    }, {"x": (X, (4, 10))}, {"y": (OUT, (4, 8))})
    y = m.run({"x": np.concatenate([x, scale, bias], axis=1)})["y"]
    z = (x * scale + bias).astype(np.float64)
    np.testing.assert_allclose(y, z / (1 + np.exp(-z)), rtol=1e-6)


def test_activation_column_scale_must_be_one_per_partition():
    instr = make("activation", dst=sbuf(4, 8, 4096), src=sbuf(4, 8), scale=sbuf(4, 2, 32), func=ActFunc.copy)
    assert any("scale must be [4, 1]" in problem for problem in OPS["activation"].check(instr, None))


def test_matmul_accumulates_in_psum():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 5)).astype(np.float32)  # stationary [K=6, M=5]
    b = rng.standard_normal((6, 7)).astype(np.float32)  # moving [K=6, N=7]
    m = model({
        "DMA0": [make("dma_copy", dst=sbuf(6, 5), src=hbm(X, 6, 5), signal=5),
                 make("dma_copy", dst=sbuf(6, 7, 256), src=hbm(Y, 6, 7), signal=5),
                 make("dma_copy", dst=hbm(OUT, 5, 7), src=sbuf(5, 7, 512), waits=((1, 1),))],
        "PE": [make("nc_matmul", dst=psum(5, 7), stationary=sbuf(6, 5), moving=sbuf(6, 7, 256), accumulate=False,
                    waits=((5, 2),)),
               make("nc_matmul", dst=psum(5, 7), stationary=sbuf(6, 5), moving=sbuf(6, 7, 256), accumulate=True,
                    signal=0)],
        "ACT": [make("activation", dst=sbuf(5, 7, 512), src=psum(5, 7), func=ActFunc.copy, scale=1.0,
                     waits=((0, 1),), signal=1)],
    }, {"a": (X, (6, 5)), "b": (Y, (6, 7))}, {"y": (OUT, (5, 7))})
    y = m.run({"a": a, "b": b})["y"]
    np.testing.assert_allclose(y, 2 * (a.T @ b), rtol=1e-6)


def test_transpose_on_pe():
    x = np.random.default_rng(4).standard_normal((4, 8)).astype(np.float32)
    m = model({
        "DMA0": [make("dma_copy", dst=sbuf(4, 8), src=hbm(X, 4, 8), signal=5),
                 make("dma_copy", dst=hbm(OUT, 8, 4), src=sbuf(8, 4, 512), waits=((1, 1),))],
        "PE": [make("nc_transpose", dst=psum(8, 4), src=sbuf(4, 8), waits=((5, 1),), signal=0)],
        "ACT": [make("tensor_copy", dst=sbuf(8, 4, 512), src=psum(8, 4), waits=((0, 1),), signal=1)],
    }, {"x": (X, (4, 8))}, {"y": (OUT, (8, 4))})
    np.testing.assert_array_equal(m.run({"x": x})["y"], x.T)


@pytest.mark.parametrize("op", [AluOp.subtract, AluOp.divide, AluOp.power, AluOp.maximum, AluOp.less])
@pytest.mark.parametrize("reverse", [False, True])
def test_tensor_scalar_with_reverse(op, reverse):
    x = np.abs(np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)) + 0.5
    instr = make("tensor_scalar", dst=sbuf(4, 8, 4096), src=sbuf(4, 8), op0=op, scalar0=1.5, reverse0=reverse,
                 op1=AluOp.multiply, scalar1=2.0, reverse1=False)
    y = _run_unary(instr, "DVE", x)
    a, b = (np.float32(1.5), x) if reverse else (x, np.float32(1.5))
    np.testing.assert_allclose(y, ALU[op](a, b).astype(np.float32) * 2, rtol=1e-6)


def test_mod_keeps_the_dividends_sign():
    """AluOp.mod is C's fmod: -7 mod 3 is -1 (Python's % would give 2), 7.5 mod -2 is 1.5."""
    x = np.array([[-7, 7, 7.5, -7.5, 0.25, -0.25, 6, -6]] * 4, np.float32)
    instr = make("tensor_scalar", dst=sbuf(4, 8, 4096), src=sbuf(4, 8), op0=AluOp.mod, scalar0=-2.0, reverse0=False,
                 op1=None, scalar1=None, reverse1=False)
    y = _run_unary(instr, "DVE", x)
    np.testing.assert_array_equal(y, np.vectorize(lambda v: math.fmod(v, -2.0))(x).astype(np.float32))
    instr = make("tensor_scalar", dst=sbuf(4, 8, 4096), src=sbuf(4, 8), op0=AluOp.mod, scalar0=3.0, reverse0=False,
                 op1=None, scalar1=None, reverse1=False)
    np.testing.assert_array_equal(_run_unary(instr, "DVE", x)[0, :2], [-1, 1])


def test_scalar_tensor_tensor_scales_then_combines():
    x = np.random.default_rng(6).standard_normal((4, 8)).astype(np.float32)
    # (x * 0.5) + x, reading x as both tensor inputs
    instr = make("scalar_tensor_tensor", dst=sbuf(4, 8, 4096), src=sbuf(4, 8), op0=AluOp.multiply, scalar=0.5,
                 op1=AluOp.add, b=sbuf(4, 8))
    np.testing.assert_allclose(_run_unary(instr, "DVE", x), x * np.float32(0.5) + x, rtol=1e-6)


def test_tensor_reduce_over_trailing_axes():
    x = np.random.default_rng(6).standard_normal((4, 8)).astype(np.float32)
    src = sbuf(4, 8)
    src = type(src)(src.mem, src.dtype, 0, 4, 0, ((2, 4), (4, 1)))  # each partition as [2, 4]
    m = model({
        "DMA0": [make("dma_copy", dst=sbuf(4, 8), src=hbm(X, 4, 8), signal=5),
                 make("dma_copy", dst=hbm(OUT, 4, 2), src=sbuf(4, 2, 4096), waits=((2, 1),))],
        "DVE": [make("tensor_reduce", dst=sbuf(4, 2, 4096), src=src, op=AluOp.maximum, axes=1, waits=((5, 1),),
                     signal=2)],
    }, {"x": (X, (4, 8))}, {"y": (OUT, (4, 2))})
    np.testing.assert_array_equal(m.run({"x": x})["y"], x.reshape(4, 2, 4).max(axis=2))


def test_iota_and_memset():
    m = model({
        "POOL": [make("iota", dst=sbuf(4, 8), base=3, channel_multiplier=10, steps=(2,), signal=3),
                 make("memset", dst=sbuf(4, 8, 4096), value=-1.5, signal=3)],
        "DMA0": [make("dma_copy", dst=hbm(OUT, 4, 8), src=sbuf(4, 8), waits=((3, 1),)),
                 make("dma_copy", dst=hbm(OUT + 128, 4, 8), src=sbuf(4, 8, 4096), waits=((3, 2),))],
    }, {}, {"iota": (OUT, (4, 8)), "fill": (OUT + 128, (4, 8))})
    out = m.run({})
    np.testing.assert_array_equal(out["iota"], 3 + 10 * np.arange(4)[:, None] + 2 * np.arange(8)[None, :])
    np.testing.assert_array_equal(out["fill"], np.full((4, 8), -1.5, np.float32))


def test_dma_casts_with_round_to_nearest_even():
    x = np.array([[1.0 + 2**-8, 1.0 + 3 * 2**-8, 70000.0, -1e-3]], dtype=np.float32)
    m = model({
        "DMA0": [make("dma_copy", dst=sbuf(1, 4, 0, DType.bf16), src=hbm(X, 1, 4), signal=5)],
        "DMA1": [make("dma_copy", dst=hbm(OUT, 1, 4), src=sbuf(1, 4, 0, DType.bf16), waits=((5, 1),))],
    }, {"x": (X, (1, 4))}, {"y": (OUT, (1, 4))})
    y = m.run({"x": x})["y"]
    np.testing.assert_array_equal(y, x.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert y[0, 0] == 1.0 and y[0, 1] == 1.0 + 2**-6  # ties go to even


def test_float_to_int_rounds_and_saturates():
    from runtime.semantics import convert

    values = np.array([2.5, 3.5, -2.5, 1e10, -1e10, np.nan], dtype=np.float32)
    np.testing.assert_array_equal(convert(values, np.dtype(np.int8)), [2, 4, -2, 127, -128, 0])


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 128), k=st.integers(1, 128), n=st.integers(1, 512), data=st.data())
def test_matmul_gives_equal_columns_equal_bits(m, k, n, data):
    """As on the PE array, every output column is computed alike: a moving tile of equal columns gives an
    output of equal columns, whatever the shape."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    a = (rng.standard_normal((k, m)) * 1e3).astype(np.float32)
    b = np.repeat(rng.standard_normal((k, 1)).astype(np.float32), n, axis=1)
    runs = model({
        "DMA0": [make("dma_copy", dst=sbuf(k, m), src=hbm(X, k, m), signal=5),
                 make("dma_copy", dst=sbuf(k, n, 1024), src=hbm(Y, k, n), signal=5),
                 make("dma_copy", dst=hbm(OUT, m, n), src=sbuf(m, n, 4096), waits=((1, 1),))],
        "PE": [make("nc_matmul", dst=psum(m, n), stationary=sbuf(k, m), moving=sbuf(k, n, 1024), accumulate=False,
                    waits=((5, 2),), signal=0)],
        "ACT": [make("tensor_copy", dst=sbuf(m, n, 4096), src=psum(m, n), waits=((0, 1),), signal=1)],
    }, {"a": (X, (k, m)), "b": (Y, (k, n))}, {"y": (OUT, (m, n))}).run({"a": a, "b": b})["y"]
    assert all(len(np.unique(row)) == 1 for row in runs)


def _erf_term_by_term(x):
    """erf as the semantics defines it: its Taylor series summed term by term in float64 below 2.5, the
    Abramowitz-Stegun 7.1.26 complement above, rounded once to fp32."""
    x64 = x.astype(np.float64)
    a = np.abs(x64)
    small = np.minimum(a, 2.5)
    term, total, sq = small.copy(), small.copy(), small * small
    for n in range(1, 60):
        term = term * -sq / n
        total += term / (2 * n + 1)
    series = total * (2 / math.sqrt(math.pi))
    t = 1 / (1 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    tail = 1 - poly * np.exp(-a * a)
    return (np.sign(x64) * np.where(a < 2.5, series, tail)).astype(np.float32)


def test_erf_gives_the_bits_of_the_term_by_term_series():
    """The runtime nests the series and sums term by term only where the fp32 rounding could differ; every bit
    must stay that of the definition, a NaN's sign included. Every fp32 value was compared once; here: the
    subnormals, every value near the seam at 2.5, a million random ones, NaNs among them and the special values."""
    from runtime.semantics import _erf

    rng = np.random.default_rng(7)
    seam = np.float32(2.5).view(np.uint32)
    x = np.concatenate([
        np.arange(1 << 16, dtype=np.uint32).view(np.float32),
        np.arange(seam - (1 << 16), seam + (1 << 16), dtype=np.uint32).view(np.float32),
        rng.uniform(-3, 3, 1 << 20).astype(np.float32),
        (rng.standard_normal(1 << 18) * 10).astype(np.float32),
        np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, -3.4e38], np.float32),
    ])
    nans = np.array([0x7FC00000, 0xFFC00000, 0xFFFFFFFF, 0x7F800001], np.uint32).view(np.float32)  # 0xFF: unwritten
    x[rng.integers(0, x.size, 64)] = rng.choice(nans, 64)
    with np.errstate(all="ignore"):
        for values in (x, x[:1 << 20].reshape(128, -1)):  # tiles are (partitions, n)
            np.testing.assert_array_equal(_erf(values).view(np.uint32), _erf_term_by_term(values).view(np.uint32))


def test_bn_stats_then_bn_aggr_give_the_mean_and_variance():
    """Two bn_stats over a row's halves (odd lengths: the odd elements are one fewer), one bn_aggr: numpy's mean
    and population variance of the whole row."""
    x = (np.random.default_rng(7).standard_normal((4, 13)) * 3 + 5).astype(np.float32)
    first, second = sbuf(4, 7), sbuf(4, 6, 7 * 4)  # elements 0..6 and 7..12 of each row
    stats = sbuf(4, 12, 8192)
    halves = [sbuf(4, 6, 8192 + 24 * k) for k in range(2)]
    m = model({
        "DMA0": [make("dma_copy", dst=sbuf(4, 13), src=hbm(X, 4, 13), signal=5),
                 make("dma_copy", dst=hbm(OUT, 4, 2), src=sbuf(4, 2, 4096), waits=((2, 1),))],
        "DVE": [make("bn_stats", dst=halves[0], src=first, waits=((5, 1),)),
                make("bn_stats", dst=halves[1], src=second),
                make("bn_aggr", dst=sbuf(4, 2, 4096), src=stats, signal=2)],
    }, {"x": (X, (4, 13))}, {"y": (OUT, (4, 2))})
    y = m.run({"x": x})["y"]
    np.testing.assert_allclose(y[:, 0], x.astype(np.float64).mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose(y[:, 1], x.astype(np.float64).var(axis=1), rtol=1e-6)


def _scatter_model(rows: int, n: int) -> runtime.Model:
    """out = table (rows x 4), then row index[p] of out = updates[p] for p < n: a copy HBM -> HBM, two loads and
    the scatter, in order on one queue."""
    table, updates, index, out = 0, 4096, 8192, 12288
    int32 = DType.int32
    streams = {"DMA0": [make("dma_copy", dst=hbm(out, rows, 4), src=hbm(table, rows, 4)),
                        make("dma_copy", dst=sbuf(n, 4), src=hbm(updates, n, 4)),
                        make("dma_copy", dst=sbuf(n, 1, 64, int32), src=hbm(index, n, 1, int32)),
                        make("dma_scatter", dst=hbm(out, 1, 4), src=sbuf(n, 4), index=sbuf(n, 1, 64, int32),
                             rows=rows, row_stride=4)]}
    tensors = [("table", (rows, 4), "float32", table), ("updates", (n, 4), "float32", updates),
               ("index", (n, 1), "int32", index)]
    b = Bundle("trn1", HBM_SIZE, [TensorInfo.whole(name, shape, dt, DType.from_numpy(np.dtype(dt)).name, at)
                                  for name, shape, dt, at in tensors],
               [TensorInfo.whole("out", (rows, 4), "float32", "fp32", out)],
               [{name: Stream(instrs, [""] * len(instrs)) for name, instrs in streams.items()}])
    return runtime.Model(b)


def test_dma_scatter_writes_rows_the_highest_partition_last():
    rng = np.random.default_rng(3)
    table, updates = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    index = np.array([[4], [1], [4], [0], [1]], np.int32)
    expected = table.copy()
    for p in range(5):  # numpy's reference, one row after another: the later partition wins
        expected[index[p, 0]] = updates[p]
    out = _scatter_model(6, 5).run({"table": table, "updates": updates, "index": index}, check_races=True)["out"]
    np.testing.assert_array_equal(out, expected)


def test_dma_scatter_index_outside_the_table_names_the_instruction():
    inputs = {"table": np.zeros((6, 4), np.float32), "updates": np.ones((2, 4), np.float32),
              "index": np.array([[1], [6]], np.int32)}
    with pytest.raises(runtime.AccessError,
                       match=r"DMA0 #3 dma_scatter.*: dma_scatter index 6 outside the table's 6 rows$"):
        _scatter_model(6, 2).run(inputs)


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
def test_bit_vector_operators_read_all_32_bits_of_an_integer_tile(dtype):
    """fp32 holds 24 bits: a shift or an and read through it would lose the low bits of these values."""
    d = DType.from_numpy(np.dtype(dtype))
    info = np.iinfo(dtype)
    x = np.random.default_rng(9).integers(info.min, info.max, (4, 8), dtype=np.int64).astype(dtype)
    m = model({
        "DMA0": [make("dma_copy", dst=sbuf(4, 8, 0, d), src=hbm(X, 4, 8, d), signal=5),
                 make("dma_copy", dst=hbm(OUT, 4, 8, d), src=sbuf(4, 8, 4096, d), waits=((0, 1),)),
                 make("dma_copy", dst=hbm(Y, 4, 8, d), src=sbuf(4, 8, 8192, d), waits=((0, 2),))],
        "DVE": [make("tensor_scalar", dst=sbuf(4, 8, 4096, d), src=sbuf(4, 8, 0, d), op0=AluOp.left_shift,
                     scalar0=4.0, reverse0=False, reverse1=False, waits=((5, 1),), signal=0),
                make("tensor_tensor", dst=sbuf(4, 8, 8192, d), a=sbuf(4, 8, 0, d), b=sbuf(4, 8, 0, d),
                     op=AluOp.bitwise_and, signal=0)],
    }, {"x": (X, (4, 8))}, {"shifted": (OUT, (4, 8)), "same": (Y, (4, 8))}, dtype=dtype)
    out = m.run({"x": x})
    np.testing.assert_array_equal(out["shifted"], (x.astype(np.int64) << 4).astype(dtype))
    np.testing.assert_array_equal(out["same"], x)


def test_a_dma_writes_skewed_rows_onto_a_diagonal():
    """A DMA's SBUF rows may each start further in (partition_stride on SBUF: a descriptor per row): the taps
    [4, 3] land at element c * 3 + t of partition c, the diagonals of a [4, 4 x 3] tile, and the rest stays zero."""
    from isa.operand import Mem, Operand
    taps = np.arange(1, 13, dtype=np.float32).reshape(4, 3)
    skewed = Operand(Mem.SBUF, DType.fp32, 0, 4, 0, ((3, 1),), 3)
    m = model({"DMA0": [make("dma_copy", dst=sbuf(4, 12), src=hbm(Y, 4, 12), signal=5),
                        make("dma_copy", dst=skewed, src=hbm(X, 4, 3), waits=((5, 1),), signal=6),
                        make("dma_copy", dst=hbm(OUT, 4, 12), src=sbuf(4, 12), waits=((6, 1),))]},
              {"x": (X, (4, 3)), "zeros": (Y, (4, 12))}, {"y": (OUT, (4, 12))})
    got = m.run({"x": taps, "zeros": np.zeros((4, 12), np.float32)})["y"].reshape(4, 4, 3)
    want = np.zeros((4, 4, 3), np.float32)
    want[np.arange(4), np.arange(4)] = taps
    np.testing.assert_array_equal(got, want)
