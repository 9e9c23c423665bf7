"""Every rank of a bundle runs, with collectives: each of the five against numpy on 2 to 64 ranks of every target,
mismatched collectives and deadlocks named, the race checker around collectives, link contention and the checks at
load. Bundles are written by hand: each rank's CC stream runs collectives between HBM buffers of its own."""

from __future__ import annotations

import functools
import struct

import ml_dtypes
import numpy as np
import pytest

import runtime
from isa import bundle as bundle_format
from isa.bundle import Bundle, Placement, Stream, TensorInfo
from isa.collectives import collective_cost, topology
from isa.dtypes import DType
from isa.functions import AluOp
from isa.instructions import Instruction, make
from isa.target import TARGETS
from runtime.errors import CollectiveError, DeadlockError, LoadError
from tests.runtime.helpers import hbm, sbuf

IN, STAGE, OUT = 0, 16384, 32768  # HBM offsets in each rank
HBM_SIZE = 65536
TARGET_CONFIGS = [("trn1", 1), ("inf2", 1), ("trn2", 1), ("trn2", 2)]
DTYPES = {"fp32": np.dtype(np.float32), "int32": np.dtype(np.int32), "bf16": np.dtype(ml_dtypes.bfloat16)}


def _per_rank(name: str, ranks: int, width: int, dtype: np.dtype, offset: int) -> TensorInfo:
    """A [ranks, width] tensor whose row r lives in rank r's HBM at `offset`."""
    return TensorInfo(name, (ranks, width), dtype.name, DType.from_numpy(dtype).name,
                      tuple(Placement(r, offset, 0, r, r + 1) for r in range(ranks)))


def bundle(streams: list[dict[str, list[Instruction]]], in_width: int, out_width: int, dtype: np.dtype,
           target: str = "trn1", lnc: int = 1, groups: list[tuple[int, ...]] | None = None) -> Bundle:
    """Input x row r in rank r's HBM at IN, output y row r read from rank r's HBM at OUT."""
    ranks = len(streams)
    return Bundle(target, HBM_SIZE, [_per_rank("x", ranks, in_width, dtype, IN)],
                  [_per_rank("y", ranks, out_width, dtype, OUT)],
                  [{name: Stream(list(instrs), [f"/{name.lower()}/{i}" for i in range(len(instrs))])
                    for name, instrs in s.items()} for s in streams],
                  lnc=lnc, groups=[tuple(range(ranks))] if groups is None else groups)


def buffer(offset: int, elements: int, dtype: np.dtype) -> object:
    """An HBM buffer of `elements` on two partitions (so that buffers are read partition by partition)."""
    return hbm(offset, 2, elements // 2, DType.from_numpy(dtype))


# What each collective computes, from the rows of x (one per rank of the group), independently of the runtime:
# reductions in float64 (or exact integers), then rounded to the type once.
def _sum(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64).sum(axis=0)


EXPECTED = {
    "all_reduce": lambda x, n, shift: np.tile(_sum(x), (n, 1)),
    "all_gather": lambda x, n, shift: np.tile(x.reshape(-1), (n, 1)),
    "reduce_scatter": lambda x, n, shift: _sum(x).reshape(n, -1),
    "all_to_all": lambda x, n, shift: x.reshape(n, n, -1).transpose(1, 0, 2).reshape(n, -1),
    "permute": lambda x, n, shift: np.roll(x, shift, axis=0),
}
BLOCK = 4  # elements of a block (a rank's share): kept small, so 64 ranks stay fast
SIZES = {  # (src elements, dst elements) on n ranks
    "all_reduce": lambda n: (2 * BLOCK, 2 * BLOCK),
    "all_gather": lambda n: (2 * BLOCK, 2 * BLOCK * n),
    "reduce_scatter": lambda n: (2 * BLOCK * n, 2 * BLOCK),
    "all_to_all": lambda n: (2 * BLOCK * n, 2 * BLOCK * n),
    "permute": lambda n: (2 * BLOCK, 2 * BLOCK),
}


def _inputs(ranks: int, width: int, dtype: np.dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype.kind == "i":
        return rng.integers(-1000, 1000, (ranks, width)).astype(dtype)
    return rng.standard_normal((ranks, width)).astype(dtype)


def _one_collective(mnemonic: str, ranks: int, dtype: np.dtype, shift: int = 1, **fields: object
                    ) -> tuple[list[dict[str, list[Instruction]]], int, int]:
    """Every rank runs `mnemonic` from x's row at IN to y's row at OUT on group 0 (all ranks)."""
    src, dst = SIZES[mnemonic](ranks)
    if mnemonic in ("all_reduce", "reduce_scatter"):
        fields.setdefault("op", AluOp.add)
    if mnemonic == "permute":
        fields["shift"] = shift
    streams = [{"CC": [make(mnemonic, dst=buffer(OUT, dst, dtype), src=buffer(IN, src, dtype), group=0, **fields)]}
               for _ in range(ranks)]
    return streams, src, dst


def _check(op: str, ranks: int, dtype: np.dtype, target: str, lnc: int, policy: str = "clock",
           shift: int = 1) -> runtime.Model:
    streams, src, dst = _one_collective(op, ranks, dtype, shift)
    model = runtime.load(bundle(streams, src, dst, dtype, target, lnc))
    x = _inputs(ranks, src, dtype)
    y = model.run({"x": x}, policy=policy)["y"]
    expected = EXPECTED[op](x, ranks, shift).astype(dtype)
    if dtype == DTYPES["bf16"]:  # the sum in fp32, rounded once to bf16: within an ulp of the exact sum's rounding
        np.testing.assert_allclose(y.astype(np.float64), expected.astype(np.float64), rtol=2 ** -7, atol=1e-6)
    elif dtype.kind == "f" and op in ("all_reduce", "reduce_scatter"):
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5 * ranks)
    else:
        np.testing.assert_array_equal(y, expected)
    return model


OPS = list(EXPECTED)


@pytest.mark.parametrize("target,lnc", TARGET_CONFIGS, ids=lambda v: str(v))
@pytest.mark.parametrize("ranks", [2, 3, 8, 64])
@pytest.mark.parametrize("op", OPS)
def test_each_collective_matches_numpy(op, ranks, target, lnc):
    _check(op, ranks, DTYPES["fp32"], target, lnc)
    _check(op, ranks, DTYPES["int32"], target, lnc)


@pytest.mark.slow
@pytest.mark.parametrize("target,lnc", TARGET_CONFIGS, ids=lambda v: str(v))
@pytest.mark.parametrize("ranks", [2, 3, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("policy", ["clock", "random"])
def test_each_collective_on_every_size_type_and_policy(op, ranks, target, lnc, dtype, policy):
    _check(op, ranks, DTYPES[dtype], target, lnc, policy)


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter"])
def test_bf16_reductions(op):
    _check(op, 8, DTYPES["bf16"], "trn2", 2)


@pytest.mark.parametrize("shift", [-1, 2, 5])
def test_permute_by_any_shift(shift):
    _check("permute", 5, DTYPES["int32"], "trn1", 1, shift=shift)


@pytest.mark.parametrize("op", OPS)
def test_random_policy_gives_the_same_results(op):
    _check(op, 4, DTYPES["fp32"], "trn1", 1, policy="random")


@pytest.mark.parametrize("reduce", [AluOp.maximum, AluOp.minimum, AluOp.multiply])
def test_all_reduce_combines_with_its_op(reduce):
    streams, src, dst = _one_collective("all_reduce", 3, DTYPES["int32"], op=reduce)
    x = _inputs(3, src, DTYPES["int32"]) % 7
    y = runtime.load(bundle(streams, src, dst, DTYPES["int32"])).run({"x": x})["y"]
    fold = {AluOp.maximum: np.maximum, AluOp.minimum: np.minimum, AluOp.multiply: np.multiply}[reduce]
    assert (y == functools.reduce(fold, list(x))).all()


def test_a_rank_is_its_place_in_the_group_and_groups_run_side_by_side():
    """Group 0 is ranks (3, 1) and group 1 ranks (0, 2): an all_gather puts rank 3's block first in group 0."""
    dt = DTYPES["int32"]
    streams = [{"CC": [make("all_gather", dst=buffer(OUT, 4, dt), src=buffer(IN, 2, dt), group=g)]}
               for g in (1, 0, 1, 0)]
    x = _inputs(4, 2, dt)
    model = runtime.load(bundle(streams, 2, 4, dt, groups=[(3, 1), (0, 2)]))
    y = model.run({"x": x})["y"]
    np.testing.assert_array_equal(y[[1, 3]], np.tile(np.concatenate([x[3], x[1]]), (2, 1)))
    np.testing.assert_array_equal(y[[0, 2]], np.tile(np.concatenate([x[0], x[2]]), (2, 1)))


def test_a_placement_can_hold_the_whole_tensor_on_every_rank():
    """An input replicated on every rank, an all_reduce, and the output read from the rank listed first."""
    dt = DTYPES["fp32"]
    streams = [{"CC": [make("all_reduce", dst=buffer(OUT, 8, dt), src=buffer(IN, 8, dt), group=0, op=AluOp.add)]}
               for _ in range(3)]
    b = bundle(streams, 8, 8, dt)
    b.inputs = [TensorInfo("x", (8,), "float32", "fp32", tuple(Placement(r, IN, 0, 0, 8) for r in range(3)))]
    b.outputs = [TensorInfo("y", (2, 4), "float32", "fp32", (Placement(2, OUT, 0, 0, 2), Placement(0, OUT, 1, 0, 4)))]
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(runtime.load(b).run({"x": x})["y"], (3 * x).reshape(2, 4))


# ---- time: the cost model's time, links held exclusively, HBM shared per chip ----------------------------------


def _elapsed(streams: list[dict[str, list[Instruction]]], groups: list[tuple[int, ...]], src: int, dst: int,
             target: str = "trn1", algorithm: str = "auto") -> runtime.Model:
    model = runtime.load(bundle(streams, src, dst, DTYPES["fp32"], target, groups=groups),
                         collective_algorithm=algorithm)
    model.run({"x": np.zeros((len(streams), src), np.float32)}, trace=True)
    return model


def test_a_collective_lasts_what_the_cost_model_says_on_every_rank_cc_row():
    streams, src, dst = _one_collective("all_reduce", 8, DTYPES["fp32"])
    for algorithm in ("ring", "rdh"):
        model = _elapsed(streams, [tuple(range(8))], src, dst, algorithm=algorithm)
        cost = collective_cost("all_reduce", src * 4, 4, tuple(range(8)), topology(TARGETS["trn1"], 1, 8), algorithm)
        assert model.last_run.elapsed_ns == pytest.approx(cost.ns)
        events = [e for e in model.last_run.trace if e.stream == "CC"]
        assert sorted(e.core for e in events) == list(range(8))
        assert all(e.end - e.start == pytest.approx(cost.ns) for e in events)


@pytest.mark.parametrize("target,lnc", TARGET_CONFIGS, ids=lambda v: str(v))
def test_a_collective_on_sbuf_operands_moves_sbuf_to_sbuf(target, lnc):
    """Each rank loads its row of x into SBUF, all-reduces it SBUF to SBUF and stores the sum: numpy's answer, in
    the time the cost model gives SBUF operands (the ranks' collective DMA, not the chip's HBM: for the ranks of one
    chip, no more than the same collective on HBM buffers)."""
    dt, width = DTYPES["fp32"], 2 * 4096
    rank = {"DMA0": [make("dma_copy", dst=sbuf(2, width // 2), src=buffer(IN, width, dt), signal=1),
                     make("dma_copy", dst=buffer(OUT, width, dt), src=sbuf(2, width // 2, offset=width * 2),
                          waits=((2, 1),))],
            "CC": [make("all_reduce", dst=sbuf(2, width // 2, offset=width * 2), src=sbuf(2, width // 2), group=0,
                        op=AluOp.add, waits=((1, 1),), signal=2)]}
    ranks = TARGETS[target].ranks_per_chip(lnc)
    b = bundle([rank] * ranks, width, width, dt, target, lnc)
    b.hbm_size = 1 << 20
    model = runtime.load(b)
    x = _inputs(ranks, width, dt)
    y = model.run({"x": x}, trace=True)["y"]
    np.testing.assert_allclose(y, EXPECTED["all_reduce"](x, ranks, 1), rtol=1e-5, atol=1e-5 * ranks)
    topo = topology(TARGETS[target], lnc, ranks)
    on_sbuf = collective_cost("all_reduce", width * 4, 4, tuple(range(ranks)), topo, sbuf=True)
    spans = [e.end - e.start for e in model.last_run.trace if e.stream == "CC"]
    assert len(spans) == ranks and spans == pytest.approx([on_sbuf.ns] * ranks)
    assert all(link.startswith(("cc", "link:")) for link in on_sbuf.links)  # no chip's HBM
    assert on_sbuf.ns <= collective_cost("all_reduce", width * 4, 4, tuple(range(ranks)), topo).ns


def test_collectives_sharing_a_link_run_one_after_the_other():
    """On trn1, ranks 0, 1 sit on chip 0 and ranks 2, 3 on chip 1. Groups (0, 2) and (1, 3) both cross the link
    between the chips: the second waits for the first. Groups (0, 1) and (2, 3) stay on their chips: side by side."""
    topo = topology(TARGETS["trn1"], 1, 4)
    dt = DTYPES["fp32"]
    streams = [{"CC": [make("all_reduce", dst=buffer(OUT, 64, dt), src=buffer(IN, 64, dt), group=g, op=AluOp.add)]}
               for g in (0, 1, 0, 1)]
    crossing = collective_cost("all_reduce", 256, 4, (0, 2), topo)
    assert crossing.links & collective_cost("all_reduce", 256, 4, (1, 3), topo).links
    assert _elapsed(streams, [(0, 2), (1, 3)], 64, 64).last_run.elapsed_ns == pytest.approx(2 * crossing.ns)
    streams = [{"CC": [make("all_reduce", dst=buffer(OUT, 64, dt), src=buffer(IN, 64, dt), group=g, op=AluOp.add)]}
               for g in (0, 0, 1, 1)]
    local = collective_cost("all_reduce", 256, 4, (0, 1), topo)
    assert not local.links & collective_cost("all_reduce", 256, 4, (2, 3), topo).links
    assert _elapsed(streams, [(0, 1), (2, 3)], 64, 64).last_run.elapsed_ns == pytest.approx(local.ns)


def test_the_ranks_of_a_chip_share_its_hbm_bandwidth():
    """Every DMA queue of two ranks copying HBM to HBM at once asks for more than one chip's HBM gives: on one chip
    (ranks 0 and 1) they take longer than on two (ranks 0 and 2 of three)."""
    t = TARGETS["trn1"]
    assert 2 * t.dma_queues * t.dma_queue_gbps * 2 > t.hbm_gbps  # both sides of each copy are in HBM
    chunk = 262144  # bytes per copy: long enough for the bandwidth to matter beside a transfer's latency
    copies = {f"DMA{q}": [make("dma_copy", dst=hbm(2 * q * chunk + chunk, 1, chunk // 4),
                               src=hbm(2 * q * chunk, 1, chunk // 4))] for q in range(t.dma_queues)}

    def elapsed(streams: list[dict[str, list[Instruction]]]) -> float:
        b = bundle(streams, 1, 1, DTYPES["fp32"], groups=[])
        b.hbm_size = 2 * t.dma_queues * chunk + (1 << 20)
        m = runtime.load(b)
        m.run({"x": np.zeros((len(streams), 1), np.float32)})
        return m.last_run.elapsed_ns

    alone, same_chip, two_chips = elapsed([copies]), elapsed([copies, copies]), elapsed([copies, {}, copies])
    assert two_chips == pytest.approx(alone)
    assert same_chip >= 2 * t.dma_queues * 2 * chunk / t.hbm_gbps > 1.15 * alone


# ---- synchronisation around collectives, and the race checker ----------------------------------------------------


def _staged(ranks: int, wait_before: bool = True, wait_after: bool = True) -> Bundle:
    """Each rank: DMA copies x to a staging buffer (s1), CC all-reduces it into another (waits s1, signals s2), DMA
    copies that to y (waits s2)."""
    dt = DTYPES["fp32"]
    rank = {
        "DMA0": [make("dma_copy", dst=hbm(STAGE, 2, 4), src=hbm(IN, 2, 4), signal=1),
                 make("dma_copy", dst=hbm(OUT, 2, 4), src=hbm(STAGE + 4096, 2, 4),
                      waits=((2, 1),) if wait_after else ())],
        "CC": [make("all_reduce", dst=buffer(STAGE + 4096, 8, dt), src=buffer(STAGE, 8, dt), group=0, op=AluOp.add,
                    waits=((1, 1),) if wait_before else (), signal=2)],
    }
    return bundle([rank] * ranks, 8, 8, dt)


@pytest.mark.parametrize("policy", ["clock", "random"])
def test_a_synchronised_program_has_no_race_and_the_right_answer(policy):
    x = _inputs(4, 8, DTYPES["fp32"])
    for seed in range(3):
        y = runtime.load(_staged(4)).run({"x": x}, policy=policy, seed=seed, check_races=True)["y"]
        np.testing.assert_allclose(y, np.tile(_sum(x), (4, 1)), rtol=1e-6)


@pytest.mark.parametrize("before", [True, False])
def test_a_missing_wait_around_a_collective_is_a_race(before):
    model = runtime.load(_staged(3, wait_before=not before, wait_after=before))
    with pytest.raises(runtime.RaceError) as e:
        model.run({"x": np.ones((3, 8), np.float32)}, check_races=True)
    assert "all_reduce" in str(e.value) and "dma_copy" in str(e.value)


def test_what_a_rank_knew_before_a_collective_happens_before_what_follows_it_on_every_rank():
    """The race checker joins the members' clocks when a collective starts: rank 1's DMA, which follows the
    collective, is ordered after rank 0's DMA before it (ranks share no memory, so this is seen in the clocks)."""
    model = runtime.load(_staged(2))
    checker = model._race_checker()
    model.simulator.run("clock", checker=checker)
    streams = model.simulator.streams
    k0 = next(k for k, s in enumerate(streams) if (s.core, s.name) == (0, "DMA0"))
    k1 = next(k for k, s in enumerate(streams) if (s.core, s.name) == (1, "DMA0"))
    assert checker.clocks[k1][k0] >= 1  # rank 1's DMA0 saw rank 0's first copy


# ---- errors: mismatches, deadlocks, a failing rank ---------------------------------------------------------------


@pytest.mark.parametrize("policy", ["clock", "random"])
def test_ranks_that_post_different_collectives_are_named(policy):
    dt = DTYPES["fp32"]
    streams = [{"CC": [make("all_reduce", dst=buffer(OUT, 8, dt), src=buffer(IN, 8, dt), group=0, op=op)]}
               for op in (AluOp.add, AluOp.add, AluOp.maximum)]
    with pytest.raises(CollectiveError) as e:
        runtime.load(bundle(streams, 8, 8, dt)).run({"x": np.ones((3, 8), np.float32)}, policy=policy)
    text = str(e.value)
    assert text.startswith("NRT_COLLECTIVE: ")
    assert "rank 2 CC #0 all_reduce (node /cc/0)" in text and "op=maximum" in text and "op=add" in text
    assert "rank 0 CC #0" in text or "rank 1 CC #0" in text


def test_different_types_or_sizes_are_named_too():
    dt, it = DTYPES["fp32"], DTYPES["int32"]
    streams = [{"CC": [make("permute", dst=buffer(OUT, 8, dt), src=buffer(IN, 8, dt), group=0, shift=1)]},
               {"CC": [make("permute", dst=buffer(OUT, 4, it), src=buffer(IN, 4, it), group=0, shift=1)]}]
    with pytest.raises(CollectiveError, match=r"fp32 src 8 dst 8 elements shift=1.*int32 src 4 dst 4 elements"):
        runtime.load(bundle(streams, 8, 8, dt)).run({"x": np.ones((2, 8), np.float32)})


def test_a_deadlock_names_the_rank_that_never_posted():
    """Rank 2 waits on a semaphore nothing signals, so it never posts the all_reduce ranks 0 and 1 wait in: a
    collective left pending (NRT_COLLECTIVE), and why."""
    dt = DTYPES["fp32"]
    coll = make("all_reduce", dst=buffer(OUT, 8, dt), src=buffer(IN, 8, dt), group=0, op=AluOp.add)
    stuck = make("all_reduce", dst=buffer(OUT, 8, dt), src=buffer(IN, 8, dt), group=0, op=AluOp.add, waits=((7, 1),))
    for policy in ("clock", "random"):
        with pytest.raises(CollectiveError) as e:
            runtime.load(bundle([{"CC": [coll]}, {"CC": [coll]}, {"CC": [stuck]}], 8, 8, dt)).run(
                {"x": np.ones((3, 8), np.float32)}, policy=policy)
        text = str(e.value)
        assert text.startswith("NRT_COLLECTIVE: every engine is blocked: ")
        assert "all_reduce #0 of group 0 posted by rank(s) 0, 1; rank(s) 2 never posted it" in text
        assert "core 2 CC #0 all_reduce (node /cc/0) waits for s7>=1 (is 0)" in text


def test_a_deadlock_without_a_pending_collective_stays_a_deadlock():
    dt = DTYPES["fp32"]
    stuck = make("all_reduce", dst=buffer(OUT, 8, dt), src=buffer(IN, 8, dt), group=0, op=AluOp.add, waits=((7, 1),))
    with pytest.raises(DeadlockError, match="core 1 CC #0 all_reduce .* waits for s7>=1"):
        runtime.load(bundle([{"CC": [stuck]}] * 2, 8, 8, dt)).run({"x": np.ones((2, 8), np.float32)})


def test_a_rank_that_fails_stops_the_run_with_its_error():
    """Rank 1 gathers a row past its table; rank 0 waits in an all_reduce that rank 1 would post after."""
    dt = DTYPES["fp32"]
    coll = make("all_reduce", dst=buffer(OUT, 8, dt), src=buffer(IN, 8, dt), group=0, op=AluOp.add, waits=((3, 1),))
    index = sbuf(1, 1, dtype=DType.int32)
    failing = {"DMA0": [make("dma_copy", dst=index, src=hbm(STAGE, 1, 1, DType.int32)),
                        make("dma_gather", dst=sbuf(1, 4, 64), src=hbm(IN, 1, 4), index=index, rows=2, row_stride=4,
                             signal=3)],
               "CC": [coll]}
    b = bundle([{"CC": [make("all_reduce", dst=buffer(OUT, 8, dt), src=buffer(IN, 8, dt), group=0, op=AluOp.add)]},
                failing], 8, 8, dt)
    b.weights = [bundle_format.Segment(STAGE, np.array([5], np.int32).tobytes(), 1)]
    for policy in ("clock", "random"):
        with pytest.raises(runtime.AccessError, match=r"^NRT_ACCESS: core 1 DMA0 #1 dma_gather \(node /dma0/1\): "
                                                      "dma_gather index 5 outside the table's 2 rows$"):
            runtime.load(b).run({"x": np.ones((2, 8), np.float32)}, policy=policy)


# ---- loading ----------------------------------------------------------------------------------------------------


def test_many_ranks_cost_only_what_they_touch():
    streams, src, dst = _one_collective("all_gather", 64, DTYPES["fp32"])
    model = runtime.load(bundle(streams, src, dst, DTYPES["fp32"], "trn2", 2))
    assert model.ranks == 64
    assert model.memory.sbuf == [None] * 64 and model.memory.psum == [None] * 64
    assert all(h.size == OUT + dst * 4 for h in model.memory.hbm)


def _bad(mutate) -> Bundle:  # type: ignore[no-untyped-def]
    streams, src, dst = _one_collective("all_gather", 4, DTYPES["fp32"])
    b = bundle(streams, src, dst, DTYPES["fp32"])
    mutate(b)
    return b


def _set(name: str, value: object):  # type: ignore[no-untyped-def]
    return lambda b: setattr(b, name, value)


def _cc(instr: Instruction):  # type: ignore[no-untyped-def]
    def mutate(b: Bundle) -> None:
        b.cores[1] = {"CC": Stream([instr], [""])}
    return mutate


F32 = DTYPES["fp32"]
BAD = {
    "lnc": (_set("lnc", 2), "LNC 2; trn1 offers 1"),
    "too many ranks": (_set("cores", [{}] * 257), "257 ranks"),
    "hbm per chip": (_set("hbm_size", 17 << 30), "2 ranks of a trn1 chip"),
    "empty group": (_set("groups", [()]), "replica group 0 is empty"),
    "rank outside": (_set("groups", [(0, 1, 2, 4)]), "replica group 0 names rank 4"),
    "rank twice": (_set("groups", [(0, 1, 1, 2)]), "names rank 1 twice"),
    "group index": (_cc(make("all_gather", dst=buffer(OUT, 32, F32), src=buffer(IN, 8, F32), group=1)),
                    "core 1 CC #0 all_gather: group 1; the bundle has 1 replica group(s)"),
    "not a member": (lambda b: (_set("groups", [(0, 1, 2, 3), (0, 2, 3)])(b), _cc(
        make("all_gather", dst=buffer(OUT, 24, F32), src=buffer(IN, 8, F32), group=1))(b)),
        "rank 1 is not in group 1 (0, 2, 3)"),
    "memories mixed": (_cc(make("all_reduce", dst=sbuf(2, 4), src=buffer(IN, 8, F32), group=0, op=AluOp.add)),
                       "both in HBM or both in SBUF"),
    "all_gather size": (_cc(make("all_gather", dst=buffer(OUT, 16, F32), src=buffer(IN, 8, F32), group=0)),
                        "all_gather on 4 ranks needs dst = 4 x src"),
    "reduce_scatter size": (_cc(make("reduce_scatter", dst=buffer(OUT, 4, F32), src=buffer(IN, 8, F32), group=0,
                                     op=AluOp.add)), "reduce_scatter on 4 ranks needs src = 4 x dst"),
    "all_to_all size": (_cc(make("all_to_all", dst=buffer(OUT, 6, F32), src=buffer(IN, 6, F32), group=0)),
                        "all_to_all on 4 ranks needs a multiple of 4 elements"),
    "placement rank": (lambda b: setattr(b, "inputs", [TensorInfo("x", (4, 8), "float32", "fp32",
                                                                  (Placement(9, IN, 0, 0, 4),))]),
                       "placement on rank 9: the bundle has ranks 0..3"),
    "placement slice": (lambda b: setattr(b, "inputs", [TensorInfo("x", (4, 8), "float32", "fp32",
                                                                   (Placement(0, IN, 1, 4, 9),))]),
                        "[4, 9) of axis 1"),
    "placement past hbm": (lambda b: setattr(b, "inputs", [TensorInfo("x", (4, 8), "float32", "fp32",
                                                                      (Placement(0, HBM_SIZE - 8, 0, 0, 4),))]),
                           "lies outside the rank's"),
    "output not covered": (lambda b: setattr(b, "outputs", [TensorInfo("y", (4, 32), "float32", "fp32",
                                                                       (Placement(0, OUT, 0, 0, 3),))]),
                           "output 'y': no placement holds element [3, 0]"),
    # the placements' intervals are checked, not an array of the declared shape (here 40 GiB of bools)
    "output of 2^32 rows not covered": (lambda b: setattr(b, "outputs", [
        TensorInfo("y", (2**32 + 1, 10), "float32", "fp32", (Placement(0, OUT, 0, 0, 3),))]),
        "output 'y': no placement holds element [3, 0]"),
    "output covered on no axis": (lambda b: setattr(b, "outputs", [
        TensorInfo("y", (4, 32), "float32", "fp32", (Placement(0, OUT, 0, 0, 2), Placement(1, OUT, 1, 0, 16)))]),
        "output 'y': no placement holds element [2, 16]"),
    "weights rank": (_set("weights", [bundle_format.Segment(0, b"1234", 4)]), "weight segment for rank 4"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_bundle_is_a_coded_load_error(case):
    mutate, message = BAD[case]
    with pytest.raises(LoadError) as e:
        runtime.Model(_bad(mutate))  # the runtime's own checks, whatever decoding a file checks before them
    assert str(e.value).startswith("NRT_LOAD: ") and message in str(e.value)


def test_a_format_1_bundle_is_refused_clearly(tmp_path):
    streams, src, dst = _one_collective("all_gather", 2, DTYPES["fp32"])
    data = bytearray(bundle_format.to_bytes(bundle(streams, src, dst, DTYPES["fp32"])))
    struct.pack_into("<H", data, 8, 1)  # the version, after the magic
    (tmp_path / "old.neff").write_bytes(bytes(data))
    with pytest.raises(LoadError, match="bundle format version 1; this tool reads version 4 .recompile"):
        runtime.load(tmp_path / "old.neff")


def test_an_unknown_collective_algorithm_is_refused():
    streams, src, dst = _one_collective("all_gather", 2, DTYPES["fp32"])
    with pytest.raises(ValueError, match="collective algorithm 'tree'"):
        runtime.load(bundle(streams, src, dst, DTYPES["fp32"]), collective_algorithm="tree")


def test_the_trace_and_the_summary_show_collectives_on_each_rank_cc_row():
    from runtime.profile import chrome_trace, estimated_latency_ns, summarize

    model = _elapsed(*_one_collective("reduce_scatter", 4, DTYPES["fp32"])[:1], [tuple(range(4))],
                     *SIZES["reduce_scatter"](4))
    cost = collective_cost("reduce_scatter", SIZES["reduce_scatter"](4)[0] * 4, 4, tuple(range(4)),
                           topology(TARGETS["trn1"], 1, 4))
    events = [e for e in chrome_trace(model)["traceEvents"] if e.get("name") == "reduce_scatter"]
    assert sorted(e["pid"] for e in events) == [1, 2, 3, 4]
    assert all(e["cat"] == "CC" and e["dur"] == pytest.approx(cost.ns / 1000) for e in events)
    assert all(e["args"]["algorithm"] == cost.algorithm and set(e["args"]["links"]) == set(cost.links)
               for e in events)
    summary = summarize(model)
    assert summary.engines["CC"] == pytest.approx(1.0) and summary.dma_transfers == 0
    assert estimated_latency_ns(model.bundle, model.target) == pytest.approx(model.last_run.elapsed_ns)


def test_an_algorithm_that_does_not_fit_the_group_is_a_load_error_naming_the_instruction():
    """Hierarchical needs as many of the group's ranks on each of its chips: trn1's ranks 0, 1 and 2 are two on
    chip 0 and one on chip 1."""
    streams, src, dst = _one_collective("all_reduce", 3, DTYPES["fp32"])
    b = bundle(streams, src, dst, DTYPES["fp32"])
    assert runtime.load(b, collective_algorithm="ring").run({"x": np.ones((3, src), np.float32)})["y"].min() == 3
    with pytest.raises(LoadError, match=r"^NRT_LOAD: core 0 CC #0 all_reduce \(node /cc/0\): hierarchical needs"):
        runtime.load(b, collective_algorithm="hierarchical")


def test_an_empty_tensor_has_an_empty_placement():
    b = Bundle("trn1", HBM_SIZE, [TensorInfo.whole("x", (0, 3), "float32", "fp32", IN)],
               [TensorInfo.whole("y", (0,), "float32", "fp32", OUT)], [{}])
    assert runtime.load(b).run({"x": np.zeros((0, 3), np.float32)})["y"].shape == (0,)
