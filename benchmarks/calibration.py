"""The chip model against every published measurement it should reproduce, one row each.

    .venv/bin/python benchmarks/calibration.py [--json OUT.json] [--section dma|instructions|guide|collectives]

Sections (../shared/CHIP.md, "Published measurements"; isa/target.py names the source of every figure):
- dma: the NKI DMA bandwidth guide's per-core bandwidths (17 B/ns x 16 on trn1/inf2, 23 B/ns x 16 on trn2) and its
  curve of bandwidth against bytes per partition, and the NKI DMA overview's profiled transfers on trn2 (one
  engine moving 32 KiB in 1,416 ns; a [128, 128] bf16 load: 97 ns per engine, 739 ns from trigger to the first
  engine, 1,207 ns to the last completion). Each is a program run on the simulator.
- instructions: the nki.isa reference's cost formulas with the documented fixed costs (access start, the static
  overhead of small instructions, GPSIMD_START, ActReadAccumulator): the model's cycles must equal them.
- guide: the NKI performance guide's measured examples (264 ScalarE cycles per dependent one-element
  activation; one fused activation 3x faster than three instructions; partition vectorization 2x).
- collectives: the nccom-test user guide's tables on trn1 (2 ranks all_reduce 1 KiB - 1 GiB, 32 ranks
  all_gather 1 - 512 KiB, 64 ranks on two instances all_reduce 8 B - 1 GiB, and its 32 MiB uint8 example), timed
  by bench-collective (small rows run on the simulator, the rest by the same cost model).

A row holds when model / published lies in its band: +-25% with the model never more than 10% faster
([0.90, 1.25]) for measured times, exactly 1 for formulas; the guide's qualitative curve gives a band on the
share of the peak reached. Rows marked "info" are printed, not held, with the reason. tests/test_calibration.py
holds every other row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from isa.bundle import Bundle, Stream  # noqa: E402
from isa.costs import clock_ghz, compute_cycles  # noqa: E402
from isa.dtypes import DType  # noqa: E402
from isa.functions import ActFunc, AluOp  # noqa: E402
from isa.instructions import Instruction, make  # noqa: E402
from isa.operand import Engine, Mem, Operand  # noqa: E402
from isa.streams import StreamId  # noqa: E402
from isa.target import TRN1, TRN2, Target  # noqa: E402

TIME_BAND = (0.90, 1.25)  # the model may be up to 25% slower than a measurement, never more than 10% faster
EXACT = (1.0, 1.0)
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


@dataclass
class Row:
    section: str
    name: str
    source: str
    unit: str
    model: float
    published: float | None  # None: a qualitative statement, held as an absolute band on the model's value
    band: tuple[float, float]  # on model / published, or on the model's value when published is None
    held: bool = True
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if self.published is None else self.model / self.published

    @property
    def ok(self) -> bool:
        value = self.model if self.published is None else self.ratio
        return self.band[0] * (1 - 1e-9) <= value <= self.band[1] * (1 + 1e-9)

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "ratio": self.ratio, "ok": self.ok}


# ---- programs on the simulator ----------------------------------------------------------------------------------

def _hbm(offset: int, rows: int, cols: int, dtype: DType = DType.fp32) -> Operand:
    return Operand(Mem.HBM, dtype, 0, rows, offset, ((cols, 1),), cols)


def _sbuf(start: int, rows: int, cols: int, offset: int = 0, dtype: DType = DType.fp32) -> Operand:
    return Operand(Mem.SBUF, dtype, start, rows, offset, ((cols, 1),))


def _run(target: Target, streams: dict[str, list[Instruction]], hbm_bytes: int = 1 << 20):
    """Run a one-core program of hand-written streams on the simulator; its last run's stats (traced)."""
    import runtime

    b = Bundle(target.name, hbm_bytes, [], [], [{name: Stream(list(i), [""] * len(i)) for name, i in streams.items()}])
    model = runtime.load(b)
    model.run({}, trace=True)
    return model.last_run


def _stream_of_loads(target: Target, bytes_per_partition: int, per_queue: int) -> tuple[float, float]:
    """Back-to-back loads of [128, bytes_per_partition] from a contiguous HBM tensor, each split over the 16
    queues (8 partitions a queue, as the hardware splits a transfer over its engines), `per_queue` deep:
    (bytes moved, elapsed ns)."""
    cols = bytes_per_partition // 4
    queues = target.dma_queues
    rows = target.partitions // queues
    loads = [[make("dma_copy", dst=_sbuf(0, rows, cols, (k % 2) * bytes_per_partition),
                   src=_hbm((q * per_queue + k) * rows * bytes_per_partition, rows, cols)) for k in range(per_queue)]
             for q in range(queues)]
    streams = {StreamId(Engine.DMA, q).name: queue for q, queue in enumerate(loads)}
    moved = queues * per_queue * rows * bytes_per_partition
    return moved, _run(target, streams, moved + MIB).elapsed_ns


def dma_rows() -> list[Row]:
    rows = []
    guide = "NKI DMA bandwidth guide, table of bandwidth per engine"
    for target in (TRN1, TRN2):
        moved, ns = _stream_of_loads(target, 16 * KIB, 32)
        peak = target.dma_queues * target.dma_queue_gbps
        rows.append(Row("dma", f"{target.name}: one core's DMA, [128 x 16 KiB] loads on 16 queues", guide, "GB/s",
                        moved / ns, peak, (1 / TIME_BAND[1], 1 / TIME_BAND[0]),
                        note="a rate: the band is the time band inverted"))
    curve = "NKI DMA bandwidth guide, bandwidth against bytes per partition (back-to-back loads)"
    peak = TRN1.dma_queues * TRN1.dma_queue_gbps
    for per_partition, band, words in [(128, (0.0, 0.25), "< 256 B: severely overhead-bound"),
                                       (1 * KIB, (0.25, 0.85), "256 B - 2 KiB: improving, still below peak"),
                                       (2 * KIB, (0.60, 1.0), ">= 2 KiB: approaches peak"),
                                       (4 * KIB, (0.90, 1.0), ">= 4 KiB: saturates the engines")]:
        moved, ns = _stream_of_loads(TRN1, per_partition, 32)
        rows.append(Row("dma", f"trn1: {per_partition} B per partition ('{words}')", curve, "share of peak",
                        moved / ns / peak, None, band))
    overview = "NKI DMA overview, profile on trn2"
    one = _run(TRN2, {"DMA0": [make("dma_copy", dst=_sbuf(0, 4, 4096, dtype=DType.bf16),
                                    src=_hbm(0, 4, 4096, DType.bf16))]})
    e = one.trace[0]
    rows.append(Row("dma", "trn2: A[4, 4096] bf16 HBM -> SBUF on one engine, engine time", overview + " (example 1)",
                    "ns", e.end - e.start, 1416, TIME_BAND))
    split = _run(TRN2, {StreamId(Engine.DMA, q).name: [make("dma_copy", dst=_sbuf(8 * q, 8, 128, dtype=DType.bf16),
                                                            src=_hbm(q * 8 * 256, 8, 128, DType.bf16))]
                        for q in range(16)})
    rows.append(Row("dma", "trn2: A[128, 128] bf16 on 16 engines, one engine's 2 KiB", overview + " (example 2)",
                    "ns", max(e.end - e.start for e in split.trace), 97, TIME_BAND))
    rows.append(Row("dma", "trn2: A[128, 128] bf16, trigger to the first engine moving", overview + " (example 2: "
                    "33,300 -> 34,039 ns)", "ns", min(e.start for e in split.trace), 739, TIME_BAND))
    rows.append(Row("dma", "trn2: A[128, 128] bf16, trigger to the last engine done", overview + " (example 2: "
                    "33,300 -> 34,507 ns)", "ns", split.elapsed_ns, 1207, TIME_BAND))
    trn1 = _run(TRN1, {"DMA0": [make("dma_copy", dst=_sbuf(0, 8, 8), src=_hbm(0, 8, 8))]})
    rows.append(Row("dma", "trn1: trigger to the first byte of a transfer", "NKI DMA bandwidth guide: descriptor "
                    "setup and semaphore-to-start '~1300 ns cross-engine'", "ns", trn1.trace[0].start, 1300,
                    TIME_BAND))
    return rows


# ---- instruction costs against the reference formulas ----------------------------------------------------------

def _sb(rows: int, cols: int, dtype: DType = DType.fp32, offset: int = 0) -> Operand:
    return _sbuf(0, rows, cols, offset, dtype)


def _ps(rows: int, cols: int) -> Operand:
    return Operand(Mem.PSUM, DType.fp32, 0, rows, 0, ((cols, 1),))


def instruction_rows() -> list[Row]:
    t = TRN1
    start, small, gp = t.access_start_cycles, t.static_overhead_cycles, t.gpsimd_start_cycles
    n = 512
    cases: list[tuple[str, Instruction, Engine, str, int]] = [
        ("nc_matmul bf16, N 512", make("nc_matmul", dst=_ps(128, n), stationary=_sb(128, 128, DType.bf16),
                                       moving=_sb(128, n, DType.bf16, 1024), accumulate=False),
         Engine.PE, "max(N, 64)", n),
        ("nc_matmul bf16, N 8", make("nc_matmul", dst=_ps(128, 8), stationary=_sb(128, 128, DType.bf16),
                                     moving=_sb(128, 8, DType.bf16, 1024), accumulate=False),
         Engine.PE, "max(N, 64)", 64),
        ("nc_matmul fp32, N 512", make("nc_matmul", dst=_ps(128, n), stationary=_sb(128, 128),
                                       moving=_sb(128, n, offset=1024), accumulate=False),
         Engine.PE, "4 max(N, 64)", 4 * n),
        ("nc_transpose bf16 128x128", make("nc_transpose", dst=Operand(Mem.PSUM, DType.bf16, 0, 128, 0, ((128, 1),)),
                                           src=_sb(128, 128, DType.bf16)), Engine.PE, "max(P, min(64, F))", 128),
        ("activation, N 512", make("activation", dst=_sb(128, n), src=_ps(128, n), func=ActFunc.exp, scale=1.0),
         Engine.ACT, "max(MIN_II, N) + access start", n + start),
        ("activation, N 8", make("activation", dst=_sb(128, 8), src=_sb(128, 8, offset=64), func=ActFunc.exp,
                                 scale=1.0), Engine.ACT, "max(MIN_II, N) + access start + static overhead",
         64 + start + small),
        ("activation with row sums, N 512", make("activation", dst=_sb(128, n), src=_ps(128, n), func=ActFunc.exp,
                                                 scale=1.0, reduce=_sb(128, 1, offset=4096)),
         Engine.ACT, "max(MIN_II, N) + access start + ActReadAccumulator (64)", n + start + 64),
        ("tensor_tensor fp32 add, both SBUF", make("tensor_tensor", dst=_sb(128, n), a=_sb(128, n, offset=4096),
                                                   b=_sb(128, n, offset=8192), op=AluOp.add),
         Engine.DVE, "max(MIN_II, 2N) + access start", 2 * n + start),
        ("tensor_tensor fp32 add, one in PSUM", make("tensor_tensor", dst=_sb(128, n), a=_ps(128, n),
                                                     b=_sb(128, n, offset=8192), op=AluOp.add),
         Engine.DVE, "max(MIN_II, N) + access start", n + start),
        ("tensor_tensor bf16 multiply, SBUF", make("tensor_tensor", dst=_sb(128, n, DType.bf16),
                                                   a=_sb(128, n, DType.bf16, 4096), b=_sb(128, n, DType.bf16, 8192),
                                                   op=AluOp.multiply),
         Engine.DVE, "max(MIN_II, N) + access start", n + start),
        ("tensor_tensor bf16 maximum, SBUF", make("tensor_tensor", dst=_sb(128, n, DType.bf16),
                                                  a=_sb(128, n, DType.bf16, 4096), b=_sb(128, n, DType.bf16, 8192),
                                                  op=AluOp.maximum),
         Engine.DVE, "max(MIN_II, 2N) + access start", 2 * n + start),
        ("scalar_tensor_tensor fp32", make("scalar_tensor_tensor", dst=_sb(128, n), src=_sb(128, n, offset=4096),
                                           op0=AluOp.multiply, scalar=2.0, op1=AluOp.add,
                                           b=_sb(128, n, offset=8192)),
         Engine.DVE, "as tensor_tensor: max(MIN_II, 2N) + access start", 2 * n + start),
        ("tensor_scalar", make("tensor_scalar", dst=_sb(128, n), src=_sb(128, n, offset=4096), op0=AluOp.multiply,
                               scalar0=2.0, reverse0=False, op1=AluOp.add, scalar1=1.0, reverse1=False),
         Engine.DVE, "max(MIN_II, N) + access start", n + start),
        ("tensor_reduce fp32 add", make("tensor_reduce", dst=_sb(128, 1), src=_sb(128, n, offset=64), op=AluOp.add,
                                        axes=1), Engine.DVE, "N + access start", n + start),
        ("tensor_reduce bf16 maximum", make("tensor_reduce", dst=_sb(128, 1, DType.bf16),
                                            src=_sb(128, n, DType.bf16, 64), op=AluOp.maximum, axes=1),
         Engine.DVE, "N/2 + access start", n // 2 + start),
        ("bn_stats, N 512", make("bn_stats", dst=_sb(128, 6), src=_sb(128, n, offset=64)), Engine.DVE,
         "max(MIN_II, N) + access start", n + start),
        ("bn_aggr, 8 x 6 statistics", make("bn_aggr", dst=_sb(128, 2), src=_sb(128, 48, offset=64)), Engine.DVE,
         "max(MIN_II, 13 N / 3) + access start + static overhead (N < 128)", 13 * 48 // 3 + start + small),
        ("iota, N 512", make("iota", dst=_sbuf(0, 128, n, dtype=DType.int32), base=0, channel_multiplier=1,
                             steps=(1,)), Engine.POOL, "GPSIMD_START + N", gp + n),
        ("tensor_copy on GpSimd, N 512", make("tensor_copy", dst=_sb(128, n), src=_sb(128, n, offset=4096)),
         Engine.POOL, "GPSIMD_START + N", gp + n),
    ]
    return [Row("instructions", name, "nki.isa reference: " + formula, "cycles",
                compute_cycles(instr, engine, t), reference, EXACT) for name, instr, engine, formula, reference in cases]


# ---- the performance guide's measured examples -------------------------------------------------------------------

def guide_rows() -> list[Row]:
    t = TRN1
    guide = "NKI performance guide"
    # Opt #5a: back-to-back one-element activations, each reading the last's output
    chain = [make("activation", dst=_sb(128, 1, offset=4 * ((k + 1) % 2)), src=_sb(128, 1, offset=4 * (k % 2)),
                  func=ActFunc.copy, scale=1.0) for k in range(16)]
    interval = _run(t, {"ACT": chain}).elapsed_ns / len(chain) * t.act_ghz
    rows = [Row("guide", "dependent one-element activations, ScalarE cycles apart", guide + ", Opt #5a: 189 ns = "
                "264 ScalarE cycles", "cycles", interval, 264, TIME_BAND)]

    # Opt #6: exp(data * scale + bias) as one activation against multiply, add and exp on ScalarE (its table warm)
    def act(func: ActFunc, src: int, dst: int, scale: float = 1.0) -> Instruction:
        return make("activation", dst=_sb(128, 512, offset=dst), src=_sb(128, 512, offset=src), func=func,
                    scale=scale)

    warm = act(ActFunc.exp, 0, 8192)
    base = _run(t, {"ACT": [warm]}).elapsed_ns
    three = _run(t, {"ACT": [warm, act(ActFunc.copy, 0, 2048, 2.0), act(ActFunc.copy, 2048, 4096),
                             act(ActFunc.exp, 4096, 6144)]}).elapsed_ns - base
    one = _run(t, {"ACT": [warm, act(ActFunc.exp, 0, 6144, 2.0)]}).elapsed_ns - base
    rows.append(Row("guide", "multiply, add, exp as three ScalarE instructions against one activation",
                    guide + ", Opt #6: 'impl 2 is 3x faster'", "x", three / one, 3.0, TIME_BAND))

    # Opt #5b: two 64-partition reductions against one of 128 partitions
    def reduce(start: int, rows_: int) -> Instruction:
        return make("tensor_reduce", dst=_sbuf(start, rows_, 1), src=_sbuf(start, rows_, 512, 64), op=AluOp.add,
                    axes=1)

    two = _run(t, {"DVE": [reduce(0, 64), reduce(64, 64)]}).elapsed_ns
    whole = _run(t, {"DVE": [reduce(0, 128)]}).elapsed_ns
    rows.append(Row("guide", "two 64-partition reductions against one of 128 (partition vectorization)",
                    guide + ", Opt #5b: 'performing the reduction 2x faster'", "x", two / whole, 2.0, TIME_BAND))
    return rows


# ---- collectives: nccom-test's tables --------------------------------------------------------------------------

NCCOM = "nccom-test user guide"
NCCOM_ROWS: list[tuple[str, int, str, int, float, str]] = [  # (op, ranks, dtype, bytes, us, table)
    *[("all_reduce", 2, "fp32", b, us, "2 ranks, one trn1 instance") for b, us in [
        (1 * KIB, 58), (4 * KIB, 58), (16 * KIB, 58), (64 * KIB, 58), (256 * KIB, 60), (1 * MIB, 68), (4 * MIB, 107),
        (16 * MIB, 332), (64 * MIB, 1214), (256 * MIB, 4750), (1 * GIB, 18930)]],
    *[("all_gather", 32, "fp32", b, us, "32 ranks, one trn1 instance") for b, us in [
        (1 * KIB, 151), (8 * KIB, 149), (64 * KIB, 150), (512 * KIB, 179)]],
    *[("all_reduce", 64, "fp32", b, us, "64 ranks, two trn1 instances") for b, us in [
        (8, 520), (16, 520), (32, 523), (64, 525), (128, 553), (256, 709), (512, 782), (1 * KIB, 840),
        (2 * KIB, 881), (4 * KIB, 916), (8 * KIB, 1013), (16 * KIB, 1031), (32 * KIB, 1174), (64 * KIB, 1315),
        (128 * KIB, 1315), (256 * KIB, 1311), (512 * KIB, 1312), (1 * MIB, 1328), (2 * MIB, 1329), (4 * MIB, 1378),
        (8 * MIB, 1419), (16 * MIB, 2138), (32 * MIB, 2711), (64 * MIB, 3963), (128 * MIB, 6279), (256 * MIB, 11954),
        (512 * MIB, 21803), (1 * GIB, 41806)]],
    ("all_reduce", 2, "uint8", 32 * MIB, 768.0, "its first example, 2 ranks, uint8"),
]


def collective_rows(check_bytes: int = 256 * KIB) -> list[Row]:
    from neuronx_cc_lite.bench_collective import bench

    rows = []
    for op, ranks, dtype, nbytes, us, table in NCCOM_ROWS:
        (r,) = list(bench(op, TRN1, ranks, 1, "auto", nbytes, nbytes, DType[dtype], check_bytes))
        rows.append(Row("collectives", f"{op} {ranks} ranks {dtype} {nbytes} B ({r.algorithm}, {r.check})",
                        f"{NCCOM}, {table}", "us", r.time_us, us, TIME_BAND))
    return rows


SECTIONS: dict[str, Callable[[], list[Row]]] = {
    "dma": dma_rows, "instructions": instruction_rows, "guide": guide_rows, "collectives": collective_rows}


def report(rows: list[Row]) -> str:
    lines = []
    section = None
    for r in rows:
        if r.section != section:
            section = r.section
            lines += ["", f"== {section}", f"{'row':<74} {'model':>11} {'published':>11} {'ratio':>6}  band"
                      f"{'':8} verdict"]
        published = "-" if r.published is None else f"{r.published:.6g}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        band = f"[{r.band[0]:.2f}, {r.band[1]:.2f}]"
        verdict = ("ok" if r.ok else "OUT") if r.held else ("info, ok" if r.ok else "info, out")
        lines.append(f"{r.name[:74]:<74} {r.model:>11.5g} {published:>11} {ratio:>6}  {band:<12} {verdict} "
                     f"({r.unit})")
        if r.note:
            lines.append(f"{'':<4}{r.note}")
    held = [r for r in rows if r.held]
    lines += ["", f"{sum(r.ok for r in held)} of {len(held)} held rows within their band; "
              f"{len(rows) - len(held)} informational"]
    return "\n".join(lines).lstrip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=list(SECTIONS), action="append",
                        help="only these sections (repeatable); all by default")
    parser.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    rows = [r for name in (args.section or SECTIONS) for r in SECTIONS[name]()]
    print(report(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_json() for r in rows], f, indent=1)
    return 0 if all(r.ok for r in rows if r.held) else 1


if __name__ == "__main__":
    sys.exit(main())
