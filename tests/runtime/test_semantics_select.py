"""nki.isa's selection, search, scan, select and shuffle instructions against numpy, each through a hand-written
bundle: inputs loaded into SBUF, one instruction on its engine, its results stored."""

from __future__ import annotations

import numpy as np
import pytest

from isa.costs import compute_cycles
from isa.dtypes import DType
from isa.functions import AluOp
from isa.instructions import make
from isa.operand import Engine
from isa.target import get_target
from runtime.semantics import dropout_draws
import runtime
from isa.bundle import Bundle, Stream, TensorInfo
from tests.runtime.helpers import HBM_SIZE, hbm, sbuf

IN, OUT = 0, 1 << 18  # HBM offsets: inputs one after another from IN, outputs from OUT
STRIDE = 1 << 15  # bytes between the HBM inputs, and between the SBUF tiles


def _call(engine: str, mnemonic: str, inputs: dict[str, np.ndarray], outputs: dict[str, tuple], **args) -> dict:
    """Load each input [P, F] into an SBUF tile of its own (named by the operand field it feeds), run `mnemonic` with
    those operands, the other `args` and the `outputs` ((P, F, DType) tiles), and store the outputs."""
    loads, operands, infos_in = [], {}, []
    for k, (name, value) in enumerate(inputs.items()):
        dtype = DType.from_numpy(value.dtype)
        operands[name] = sbuf(*value.shape, k * STRIDE, dtype)
        loads.append(make("dma_copy", dst=operands[name], src=hbm(IN + k * STRIDE, *value.shape, dtype), signal=5))
        infos_in.append(TensorInfo.whole(name, value.shape, value.dtype.name, dtype.name, IN + k * STRIDE))
    stores, infos_out = [], []
    for k, (name, (p, f, dtype)) in enumerate(outputs.items()):
        operands[name] = sbuf(p, f, (len(inputs) + k) * STRIDE, dtype)
        stores.append(make("dma_copy", dst=hbm(OUT + k * STRIDE, p, f, dtype), src=operands[name], waits=((0, 1),)))
        infos_out.append(TensorInfo.whole(name, (p, f), dtype.np.name, dtype.name, OUT + k * STRIDE))
    instr = make(mnemonic, **{**args, **operands}, waits=((5, len(inputs)),), signal=0)
    streams = {"DMA0": loads + stores, engine: [instr]}
    b = Bundle("trn1", HBM_SIZE, infos_in, infos_out,
               [{name: Stream(list(instrs), [""] * len(instrs)) for name, instrs in streams.items()}])
    return runtime.Model(b).run(inputs)


RNG = np.random.default_rng(7)


def test_max8_gives_the_eight_largest_largest_first():
    x = RNG.standard_normal((5, 40)).astype(np.float32)
    x[0, :10] = 3.0  # ties
    out = _call("DVE", "max8", {"src": x}, {"dst": (5, 8, DType.fp32)})["dst"]
    np.testing.assert_array_equal(out, -np.sort(-x, axis=1)[:, :8])


def test_find_index8_pairs_equal_values_with_their_occurrences_in_order():
    x = RNG.integers(0, 6, (4, 32)).astype(np.float32)
    vals = -np.sort(-x, axis=1)[:, :8]  # with repeats
    out = _call("DVE", "nc_find_index8", {"data": x, "vals": vals}, {"dst": (4, 8, DType.uint32)})["dst"]
    for row, v, idx in zip(x, vals, out):
        expected = np.argsort(-row, kind="stable")[:8]  # descending, ties by position: ascending occurrences
        np.testing.assert_array_equal(idx, expected)
        np.testing.assert_array_equal(row[idx], v)


def test_match_replace8_replaces_first_occurrences_and_pairs_equal_vals_from_the_last():
    x = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8, 0]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    got = _call("DVE", "nc_match_replace8", {"data": x, "vals": vals},
                {"dst": (1, 12, DType.fp32), "dst_idx": (1, 8, DType.uint32)}, imm=-1.0)
    np.testing.assert_array_equal(got["dst"], [[1, 2, -1, 4, -1, -1, -1, -1, -1, -1, -1, 0]])
    np.testing.assert_array_equal(got["dst_idx"], [[2, 10, 9, 8, 7, 6, 5, 4]])  # the reference's example


@pytest.mark.parametrize("op0, op1, reverse0", [(AluOp.add, AluOp.add, False), (AluOp.multiply, AluOp.add, False),
                                                (AluOp.subtract, AluOp.multiply, True)])
def test_tensor_tensor_scan_carries_in_fp32(op0, op1, reverse0):
    a = RNG.standard_normal((3, 20)).astype(np.float32)
    b = RNG.standard_normal((3, 20)).astype(np.float32)
    init = RNG.standard_normal((3, 1)).astype(np.float32)
    out = _call("DVE", "tensor_tensor_scan", {"data0": a, "data1": b, "initial": init}, {"dst": (3, 20, DType.fp32)},
                op0=op0, op1=op1, reverse0=reverse0, reverse1=False)["dst"]
    ops = {AluOp.add: np.add, AluOp.multiply: np.multiply, AluOp.subtract: np.subtract}
    carried = init[:, 0].copy()
    for i in range(20):
        carried = ops[op0](carried, a[:, i]) if reverse0 else ops[op0](a[:, i], carried)
        carried = ops[op1](carried, b[:, i]).astype(np.float32)
        np.testing.assert_array_equal(out[:, i], carried)


def test_dropout_drops_with_the_given_probability_from_seeded_draws():
    x = RNG.standard_normal((64, 256)).astype(np.float32) + 5
    out = _call("DVE", "dropout", {"src": x}, {"dst": (64, 256, DType.fp32)}, prob=0.25, seed=11)["dst"]
    np.testing.assert_array_equal(out, np.where(dropout_draws(11, x.shape) >= np.float32(0.25), x, 0))
    assert abs(np.mean(out == 0) - 0.25) < 0.01
    again = _call("DVE", "dropout", {"src": x}, {"dst": (64, 256, DType.fp32)}, prob=0.25, seed=11)["dst"]
    np.testing.assert_array_equal(out, again)


def test_stream_shuffle_permutes_within_each_quadrant():
    x = RNG.standard_normal((64, 6)).astype(np.float32)
    mask = tuple([31 - i for i in range(31)] + [255])  # reverse the first 31 partitions, keep the last
    out = _call("DVE", "nc_stream_shuffle", {"src": x}, {"dst": (64, 6, DType.fp32)}, mask=mask)["dst"]
    for q in range(2):
        np.testing.assert_array_equal(out[q * 32:q * 32 + 31], x[q * 32 + 31 - np.arange(31)])
        assert np.isnan(out[q * 32 + 31]).all()  # kept: SBUF starts as NaN and nothing wrote it


def test_select_reduce_selects_and_takes_the_row_maximum():
    pred = RNG.integers(0, 2, (4, 10)).astype(np.uint8)
    x = RNG.standard_normal((4, 10)).astype(np.float32)
    got = _call("DVE", "select_reduce", {"predicate": pred, "on_true": x},
                {"dst": (4, 10, DType.fp32), "reduce": (4, 1, DType.fp32)}, on_false=-7.0, reverse=False)
    expected = np.where(pred != 0, x, -7.0)
    np.testing.assert_array_equal(got["dst"], expected)
    np.testing.assert_array_equal(got["reduce"][:, 0], expected.max(axis=1))


def test_affine_select_keeps_where_the_affine_expression_compares_true():
    x = RNG.standard_normal((6, 9)).astype(np.float32)
    out = _call("POOL", "affine_select", {"src": x}, {"dst": (6, 9, DType.fp32)}, offset=-1, channel_multiplier=1,
                steps=(-1,), cmp=AluOp.greater_equal, fill=0.0)["dst"]
    p, i = np.indices(x.shape)
    np.testing.assert_array_equal(out, np.where(p - i - 1 >= 0, x, 0))  # strictly below the diagonal: tril(-1)


def test_local_gather_reads_each_groups_indices_down_then_along():
    x = RNG.standard_normal((32, 40)).astype(np.float32)
    index = RNG.integers(0, 10, (32, 3)).astype(np.uint16) * 4  # element offsets of runs of 4
    out = _call("POOL", "local_gather", {"src": x, "index": index}, {"dst": (32, 40 * 4, DType.fp32)},
                elems=4, valid=40)["dst"]
    for g in range(2):
        starts = index[g * 16:(g + 1) * 16].reshape(-1, order="F")[:40].astype(np.int64)
        at = (starts[:, None] + np.arange(4)).reshape(-1)
        np.testing.assert_array_equal(out[g * 16:(g + 1) * 16], x[g * 16:(g + 1) * 16][:, at])


@pytest.mark.parametrize("op", [AluOp.add, AluOp.maximum])
def test_partition_reduce_combines_the_partitions(op):
    x = RNG.standard_normal((20, 12)).astype(np.float32)
    out = _call("POOL", "tensor_partition_reduce", {"src": x}, {"dst": (1, 12, DType.fp32)}, op=op)["dst"]
    expected = x[0].copy()
    for row in x[1:]:
        expected = expected + row if op is AluOp.add else np.maximum(expected, row)
    np.testing.assert_array_equal(out[0], expected)


def test_costs_follow_the_reference_formulas():
    """The row's streaming term: N for max8, nc_find_index8, nc_match_replace8, dropout and nc_stream_shuffle, 2N
    for tensor_tensor_scan, N for affine_select (GpSimdE's start is costs.py's), and local_gather's."""
    t = get_target("trn1")
    n = 2048
    cases = [("max8", dict(dst=sbuf(4, 8), src=sbuf(4, n)), n),
             ("tensor_tensor_scan", dict(dst=sbuf(4, n), data0=sbuf(4, n), data1=sbuf(4, n), initial=0.0,
                                         op0=AluOp.add, op1=AluOp.add, reverse0=False, reverse1=False), 2 * n),
             ("affine_select", dict(dst=sbuf(4, n), src=sbuf(4, n), offset=0, channel_multiplier=1, steps=(1,),
                                    cmp=AluOp.less, fill=0.0), n)]
    for op, args, work in cases:
        instr = make(op, **args)
        engine = Engine.POOL if op == "affine_select" else Engine.DVE
        assert instr.spec.cycles(instr, t) == work, op
        assert compute_cycles(instr, engine, t) >= work
    gather = make("local_gather", dst=sbuf(16, 64 * 4), src=sbuf(16, 512), index=sbuf(16, 4, 0, DType.uint16),
                  elems=4, valid=64)
    c = ((28 + 4 * 4) / (4 * 4)) / min(4 / 4, 4)
    assert gather.spec.cycles(gather, t) == int(np.ceil(64 * 4 / c))
