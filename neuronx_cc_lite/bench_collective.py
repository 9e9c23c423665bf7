"""bench-collective: nccl-tests' `*_perf` on the simulated chip.

For each size, doubling from min_bytes to max_bytes (nccl-tests' "size": the larger of src and dst on one rank):

    counts   = elements of src and dst on each rank; all_gather, reduce_scatter and all_to_all round the count down
               to a multiple of n ranks (one block per rank), as nccl-tests does
    if bytes x ranks <= check_bytes:
        bundle = one CC instruction per rank on group (0 .. n-1): src at HBM 0, dst after it; input "x" of shape
                 [n, src count] placed one row per rank, output "y" [n, dst count] gathered one row per rank
        run it (runtime.load(bundle, collective_algorithm=algorithm)) on distinct data per rank, compare "y"
        with numpy; time = the run's simulated time
    else (too large to hold in this process's memory for every rank):
        time = collective_cost(...) alone, the same model the runtime times the collective by; not checked
    algbw = bytes / time;  busbw = algbw x the op's bus factor (isa/collectives.py)

Reduced data are small integers (-3..3; 0..3 unsigned): their sums are exact in fp32 and int64 whatever the order
the chip adds in, so the reference (the exact sum, rounded or saturated once into the type, as the engines store)
does not depend on it. The other collectives move random values of the type untouched.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterator

import numpy as np

from isa.bundle import Bundle, Placement, Stream, TensorInfo
from isa.collectives import OPS, Topology, bus_bandwidth, bus_bandwidth_limit, collective_cost, topology
from isa.dtypes import DType
from isa.functions import AluOp
from isa.instructions import OPS as INSTRUCTIONS
from isa.instructions import Instruction
from isa.operand import Mem, Operand
from isa.target import Target

REDUCING = frozenset({"all_reduce", "reduce_scatter"})
BLOCKED = frozenset({"all_gather", "reduce_scatter", "all_to_all"})  # a buffer split into one block per rank
HBM_ALIGN = 64  # dst starts on a fresh 64-byte line after src


@dataclass(frozen=True)
class BenchRow:
    bytes: int  # the larger of src and dst on one rank
    count: int  # elements of that buffer
    dtype: str
    algorithm: str  # what the cost model chose or was told
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    checked: bool  # ran on the simulator with data and compared with numpy
    check: str  # "ok", "FAIL: ...", or "model" (timed by the cost model only)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """min_bytes, doubled until past max_bytes. ValueError for sizes that give no row."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"sizes need 1 <= --min-bytes <= --max-bytes, got {min_bytes} and {max_bytes}")
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= 2
    return out


def counts(op: str, nbytes: int, dtype: DType, n: int) -> tuple[int, int]:
    """Elements of src and dst on one rank for a buffer of about nbytes (at least one element per block)."""
    count = max(nbytes // dtype.size, 1)
    if op in BLOCKED:
        count = max(count // n, 1) * n
    if op == "all_gather":
        return count // n, count
    if op == "reduce_scatter":
        return count, count // n
    return count, count


def _hbm(dtype: DType, count: int, offset: int, partitions: int) -> Operand:
    """`count` elements at `offset` as [P, count / P]: the most partitions (a power of two) that divide it."""
    p = math.gcd(count, partitions)
    return Operand(Mem.HBM, dtype, 0, p, offset, ((count // p, 1),), partition_stride=count // p)


def build_bundle(op: str, topo: Topology, dtype: DType, src_count: int, dst_count: int, shift: int = 1) -> Bundle:
    """One `op` on all ranks of `topo` as one replica group, each rank's src and dst in its own HBM."""
    n, parts = topo.ranks, topo.target.partitions
    dst_offset = -(-src_count * dtype.size // HBM_ALIGN) * HBM_ALIGN
    args: dict[str, object] = {"dst": _hbm(dtype, dst_count, dst_offset, parts),
                               "src": _hbm(dtype, src_count, 0, parts), "group": 0}
    if any(f.name == "op" for f in INSTRUCTIONS[op].fields):
        args["op"] = AluOp.add
    if op == "permute":
        args["shift"] = shift
    instr = Instruction(op, args)
    host = dtype.np.name

    def rows(name: str, count: int, offset: int) -> TensorInfo:
        return TensorInfo(name, (n, count), host, dtype.name,
                          tuple(Placement(r, offset, 0, r, r + 1) for r in range(n)))

    return Bundle(topo.target.name, dst_offset + dst_count * dtype.size,
                  [rows("x", src_count, 0)], [rows("y", dst_count, dst_offset)],
                  [{"CC": Stream([instr], [""])} for _ in range(n)],
                  flags={"bench_collective": op}, lnc=topo.lnc, groups=[tuple(range(n))])


def inputs(op: str, dtype: DType, n: int, src_count: int, seed: int = 0) -> np.ndarray:
    """Distinct data per rank: small integers where they are summed (exact in every type), else random values."""
    rng = np.random.default_rng(seed)
    if op in REDUCING:
        return rng.integers(0 if dtype.np.kind == "u" else -3, 4, (n, src_count)).astype(dtype.np)
    if dtype.np.kind in "iu":
        info = np.iinfo(dtype.np)
        return rng.integers(info.min, info.max, (n, src_count), endpoint=True).astype(dtype.np)
    return rng.standard_normal((n, src_count)).astype(dtype.np)


def expected(op: str, x: np.ndarray, shift: int = 1) -> np.ndarray:
    """What each rank's dst holds after `op` on the rows of x (row i: rank i's src), by numpy."""
    n = x.shape[0]
    if op in REDUCING:
        total = x.astype(np.float64).sum(axis=0)
        if x.dtype.kind in "iu":
            total = np.clip(total, np.iinfo(x.dtype).min, np.iinfo(x.dtype).max)
        total = total.astype(x.dtype)
        return np.tile(total, (n, 1)) if op == "all_reduce" else total.reshape(n, -1)
    if op == "all_gather":
        return np.tile(x.reshape(-1), (n, 1))
    if op == "all_to_all":  # dst_i block j = src_j block i
        return x.reshape(n, n, -1).transpose(1, 0, 2).reshape(n, -1)
    return np.roll(x, shift, axis=0)  # permute: dst_i = src_{i - shift}


def bench(op: str, target: Target, ranks: int, lnc: int, algorithm: str, min_bytes: int, max_bytes: int,
          dtype: DType, check_bytes: int) -> Iterator[BenchRow]:
    """The rows, one per size (module docstring), made as they are iterated. ValueError, at once, for an op, rank
    count, lnc or sizes the target cannot run."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    topo, row_sizes = topology(target, lnc, ranks), sizes(min_bytes, max_bytes)
    # The algorithm must apply to the group (hierarchical wants as many ranks on every chip): ask the model once.
    collective_cost(op, dtype.size * ranks, dtype.size, tuple(range(ranks)), topo, algorithm)
    return _rows(op, topo, algorithm, row_sizes, dtype, check_bytes)


def _rows(op: str, topo: Topology, algorithm: str, row_sizes: list[int], dtype: DType,
          check_bytes: int) -> Iterator[BenchRow]:
    import runtime

    ranks, group = topo.ranks, tuple(range(topo.ranks))
    for size in row_sizes:
        src_count, dst_count = counts(op, size, dtype, ranks)
        count = max(src_count, dst_count)
        nbytes = count * dtype.size
        cost = collective_cost(op, nbytes, dtype.size, group, topo, algorithm)
        if nbytes * ranks <= check_bytes:
            model = runtime.load(build_bundle(op, topo, dtype, src_count, dst_count), collective_algorithm=algorithm)
            x = inputs(op, dtype, ranks, src_count)
            y = model.run({"x": x})["y"]
            want = expected(op, x)
            ns = model.last_run.elapsed_ns if model.last_run else 0.0
            check = "ok" if np.array_equal(y, want) else f"FAIL: {int(np.sum(y != want))} of {want.size} differ"
        else:
            ns, check = cost.ns, "model"
        yield BenchRow(nbytes, count, dtype.name, cost.algorithm, ns / 1e3, nbytes / ns if ns else 0.0,
                       bus_bandwidth(op, nbytes, ranks, ns), check != "model", check)


def report(op: str, topo: Topology, algorithm: str, rows: list[BenchRow], check_bytes: int) -> str:
    """The rows as nccl-tests prints them, with what bounds the bus bandwidth and which rows were checked."""
    group = tuple(range(topo.ranks))
    lines = [f"# bench-collective {op}: {topo.ranks} ranks on {topo.target.name}, lnc {topo.lnc} ({topo.chips} "
             f"chip(s), {topo.instances} instance(s)), algorithm {algorithm}",
             f"# busbw limit: {bus_bandwidth_limit(op, group, topo):.1f} GB/s (what the links carry: "
             "isa/collectives.py bus_bandwidth_limit)",
             f"#{'bytes':>12} {'count':>10} {'dtype':>8}  {'algorithm':<12} {'time(us)':>11} {'algbw(GB/s)':>12} "
             f"{'busbw(GB/s)':>12}  check"]
    for r in rows:
        lines.append(f" {r.bytes:>12} {r.count:>10} {r.dtype:>8}  {r.algorithm:<12} {r.time_us:>11.2f} "
                     f"{r.algbw_gbps:>12.2f} {r.busbw_gbps:>12.2f}  {r.check}")
    lines.append(f"# checked: rows whose bytes x ranks <= {check_bytes} (--check-bytes) ran on the simulator with "
                 "data and were compared with numpy; \"model\" rows were timed by the cost model alone")
    if rows:
        lines.append(f"# avg busbw: {sum(r.busbw_gbps for r in rows) / len(rows):.2f} GB/s")
    return "\n".join(lines)
