"""Collectives over many ranks: where the ranks sit, how each algorithm moves the data, and what that costs.

Topology (target config, isa/target.py; CHIP.md "Collectives"):
    ranks fill chips in order, ranks_per_chip(lnc) to a chip; chips fill instances, chips_per_instance each.
    Resources, each with a bandwidth in GB/s (= bytes per ns):
      "chip{c}"                chip c's HBM: hbm_gbps, shared by every transfer that reads or writes it (a copy
                               between two ranks of the chip does both; a transfer between chips reads the
                               sender's and writes the receiver's)
      "link:chip{a}->chip{b}"  one direction of the NeuronLink between neighbouring chips a and b:
                               link_gbps / chip_neighbours() (a chip's NeuronLink bandwidth split over its ports)
      "efa:{i}"                what leaves instance i over EFA: efa_gbps
      "cc{r}"                  rank r's collective DMA, which every transfer rank r sends takes, one after
                               another: a transfer is cut into cc_chunk_bytes pieces, each on a DMA engine
                               (dma_queue_gbps), at most lnc x cc_rank_gbps in all (transfer_ns); on SBUF operands
                               it moves the data from SBUF to SBUF and HBM is not touched
    route(a, b): inside a chip, its "chip{c}" twice, read and write (chip_hop_ns); between the chips of an
    instance, the sender's chip, dimension order round the ring or torus, the shorter way round each dimension
    (the positive way on a tie), one link per hop (link_hop_ns per hop), and the receiver's chip; between
    instances, the sender's chip, its instance's EFA (efa_hop_ns) and the receiver's chip. Every transfer also
    takes its sender's "cc{r}"; on SBUF operands it touches no HBM.

A step is a set of transfers (src rank, dst rank, bytes) that run at once:
    step_ns = max(latency of each transfer's route) + max over resources(the time the step keeps it busy)
where a link, an HBM or an EFA is busy for the bytes the step puts on it over its bandwidth, and a rank's "cc{r}"
for the sum of its transfers' times, plus, in a step that combines what it receives (a reduce-scatter's),
elements / cc_reduce_gelems for each transfer (the combining runs on the same collective DMA); so transfers that share a link (multi-hop routes, rings that cross, chips
whose ranks all copy through one HBM) slow each other down. A collective is its fixed cost and then a sequence of
steps:
    fixed_ns = cc_setup_ns + cc_sync_round_ns x ceil(log2 n)   (set-up, and a barrier of log2 n rounds)
               + cc_efa_setup_ns(S), interpolated on log2 S, when the group spans instances
(fitted to nccom-test's tables: isa/target.py names each figure). The runtime holds every resource any step uses
for the collective's whole duration, which is how concurrent collectives contend.

Algorithms; n ranks in the group, g[i] its i-th rank, S = nbytes (the larger of src and dst on one rank), a
block is S/n:
  ring (NCCL's ring, run on as many directed rings at once as a chip has NeuronLink ports, NCCL's channels):
      rings = chip orders: a ring of chips both ways; a k x k torus as two edge-disjoint Hamiltonian cycles
              (row r visited from column -r rightwards; column j from row -j downwards), each both ways: four
              rings, one per out-port; other grids a snake both ways. A rank's place follows its chip's place.
      each ring carries S / len(rings) of the buffer
      reduce_scatter, all_gather: n-1 steps; in each, on every ring, each rank sends S/n/len(rings) to the next
      all_reduce: reduce_scatter then all_gather, 2(n-1) steps
      all_to_all: n-1 steps; in step k each rank g[i] sends its block for g[i+k] straight to it
  rdh (recursive halving, then doubling; p = the largest power of two <= n):
      if n > p: g[i], i >= p, first sends its buffer to g[i-p] and last gets its result back from it
      reduce_scatter: for k = 0 .. log2(p)-1: g[i] sends S/2^(k+1) to g[i xor 2^k]
      all_gather: the same steps in reverse order;  all_reduce: both
      all_to_all (Bruck): for k = 0 .. ceil(log2 n)-1: g[i] sends the blocks whose index has bit k set to
                          g[i + 2^k]
  hierarchical (the levels: ranks of one chip; then the ranks in the same place on each chip of an instance;
      then those in the same place in each instance; a level's groups all run at once, each as a ring):
      reduce_scatter: reduce-scatter at each level, inner to outer, each on what the last one left (S, S/r, ...)
      all_gather: all-gather at each level, outer to inner;  all_reduce: both (CHIP.md's "reduce-scatter inside
      the node, all-reduce across nodes, all-gather inside the node", one level more)
      all_to_all: at each level, inner to outer, each rank sends its block of S/k to each of the k-1 others
  permute (whatever the algorithm): one step, g[i] sends S to g[(i + shift) % n]
  mesh (CHIP.md's "mesh (small messages)": one step, every rank straight to every other, so one hop's latency
      for n-1 times the bytes):
      all_reduce: each rank sends its whole buffer S to every other, and each sums what it gets
      reduce_scatter: g[i] sends block j to g[j];  all_gather: g[i] sends its block to every other rank
      all_to_all: g[i] sends block j to g[j], all blocks at once
  auto: the fastest of those that apply.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from isa.instructions import Instruction
from isa.operand import Mem
from isa.target import Target

ALGORITHMS = ("ring", "rdh", "hierarchical", "mesh")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "permute")
# busbw = algbw * this (nccl-tests' PERFORMANCE.md): what each rank's link carries, whatever n is.
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "permute": lambda n: 1.0,
}

Transfer = tuple[int, int, int]  # (src rank, dst rank, bytes)


@dataclass(frozen=True)
class Step:
    transfers: tuple[Transfer, ...]
    repeat: int = 1  # a ring repeats the same step n-1 times: priced once
    reduces: bool = False  # each transfer is combined into what its receiver holds (a reduce-scatter's steps)


@dataclass(frozen=True)
class Route:
    resources: tuple[str, ...]
    ns: float  # latency: the fixed cost of the hops


@dataclass(frozen=True)
class CollectiveCost:
    ns: float
    algorithm: str
    links: frozenset[str]  # resources the collective holds while it runs


@dataclass(frozen=True)
class Topology:
    """Where `ranks` ranks of `lnc` physical cores each sit on `target`'s chips and instances."""

    target: Target
    lnc: int
    ranks: int
    _routes: dict[tuple[int, int], Route] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def ranks_per_chip(self) -> int:
        return self.target.ranks_per_chip(self.lnc)

    @property
    def chips(self) -> int:
        return math.ceil(self.ranks / self.ranks_per_chip)

    @property
    def instances(self) -> int:
        return math.ceil(self.chips / self.target.chips_per_instance)

    def chip_of(self, rank: int) -> int:
        return rank // self.ranks_per_chip

    def instance_of(self, rank: int) -> int:
        return self.chip_of(rank) // self.target.chips_per_instance

    def bandwidth(self, resource: str) -> float:
        """GB/s of a resource named as in the module docstring (a rank's "cc{r}": for a large transfer)."""
        if resource.startswith("cc"):
            return self.lnc * self.target.cc_rank_gbps
        if resource.startswith("link:"):
            return self.target.link_gbps / self.target.chip_neighbours()
        if resource.startswith("efa:"):
            return self.target.efa_gbps
        return self.target.hbm_gbps

    def route(self, a: int, b: int, sbuf: bool = False) -> Route:
        key = (a, b, sbuf)
        if key not in self._routes:
            self._routes[key] = self._find_route(a, b, sbuf)
        return self._routes[key]

    def _find_route(self, a: int, b: int, sbuf: bool) -> Route:
        t = self.target
        ca, cb = self.chip_of(a), self.chip_of(b)
        # what the transfer takes at its ends: the sender's collective DMA, and the HBM it reads and writes
        ends = ((f"cc{a}",), ()) if sbuf else ((f"cc{a}", f"chip{ca}"), (f"chip{cb}",))
        if ca == cb:
            return Route((*ends[0], *ends[1]), t.chip_hop_ns)
        if self.instance_of(a) != self.instance_of(b):
            return Route((*ends[0], f"efa:{self.instance_of(a)}", *ends[1]), t.efa_hop_ns)
        base = ca - ca % t.chips_per_instance
        links = []
        for here, there in _dimension_order_hops(self._coords(ca), self._coords(cb), t.chip_grid):
            links.append(f"link:chip{base + self._local(here)}->chip{base + self._local(there)}")
        return Route((*ends[0], *links, *ends[1]), t.link_hop_ns * len(links))

    def _coords(self, chip: int) -> tuple[int, ...]:
        """Grid coordinates (row-major) of a chip inside its instance."""
        local, coords = chip % self.target.chips_per_instance, []
        for size in reversed(self.target.chip_grid):
            coords.append(local % size)
            local //= size
        return tuple(reversed(coords))

    def _local(self, coords: tuple[int, ...]) -> int:
        local = 0
        for c, size in zip(coords, self.target.chip_grid):
            local = local * size + c
        return local

    def ring_orders(self, members: Sequence[int]) -> list[tuple[int, ...]]:
        """The rings of the ring algorithm over `members`: one order per channel (module docstring)."""
        orders = []
        for chip_cycle in _chip_cycles(self.target.chip_grid):
            place = {self._local(c): i for i, c in enumerate(chip_cycle)}
            chips = self.target.chips_per_instance
            order = tuple(sorted(members, key=lambda r: (self.instance_of(r), place[self.chip_of(r) % chips], r)))
            orders += [order, tuple(reversed(order))]
        return orders


def topology(target: Target, lnc: int, ranks: int) -> Topology:
    """The topology of `ranks` ranks at `lnc`; ValueError when the target cannot hold them."""
    if lnc not in target.lnc_choices:
        raise ValueError(f"{target.name} takes --lnc {' or '.join(map(str, target.lnc_choices))}, not {lnc}")
    if ranks < 1:
        raise ValueError(f"a bundle has at least one rank, not {ranks}")
    topo = Topology(target, lnc, ranks)
    if topo.instances > target.max_instances:
        per_instance = topo.ranks_per_chip * target.chips_per_instance
        raise ValueError(f"{ranks} ranks need {topo.instances} {target.name} instances of {per_instance} ranks "
                         f"(lnc {lnc}); at most {target.max_instances} instances, {per_instance * target.max_instances}"
                         f" ranks")
    return topo


def _dimension_order_hops(src: tuple[int, ...], dst: tuple[int, ...],
                          grid: tuple[int, ...]) -> Iterable[tuple[tuple[int, ...], tuple[int, ...]]]:
    here = list(src)
    for d, size in enumerate(grid):
        ahead = (dst[d] - here[d]) % size
        step, count = (1, ahead) if ahead <= size - ahead else (-1, size - ahead)
        for _ in range(count):
            before = tuple(here)
            here[d] = (here[d] + step) % size
            yield before, tuple(here)


def _chip_cycles(grid: tuple[int, ...]) -> list[list[tuple[int, ...]]]:
    """Cycles through every chip of an instance, edge-disjoint where the grid allows (module docstring)."""
    if len(grid) == 1:
        return [[(c,) for c in range(grid[0])]]
    rows, cols = grid
    if rows == cols:
        k = rows
        return [[(r, (j - r) % k) for r in range(k) for j in range(k)],
                [((i - j) % k, j) for j in range(k) for i in range(k)]]
    return [[(r, c if r % 2 == 0 else cols - 1 - c) for r in range(rows) for c in range(cols)]]


# ---- the algorithms: each a list of steps ------------------------------------------------------------------------

def _chunk(nbytes: int, parts: int, dtype_size: int) -> int:
    """Bytes of one of `parts` pieces of a buffer, in whole elements."""
    return math.ceil(nbytes / dtype_size / parts) * dtype_size


def _ring_pass(groups: Sequence[Sequence[int]], nbytes: int, dtype_size: int, topo: Topology,
               reduces: bool) -> list[Step]:
    """A reduce-scatter (`reduces`) or all-gather of nbytes per rank on every group at once: k-1 steps of
    blocks."""
    k = len(groups[0])
    if k == 1:
        return []
    transfers = []
    for members in groups:
        orders = topo.ring_orders(members)
        piece = _chunk(nbytes, k * len(orders), dtype_size)
        transfers += [(o[i], o[(i + 1) % k], piece) for o in orders for i in range(k)]
    return [Step(tuple(transfers), k - 1, reduces)]


def _pairwise(groups: Sequence[Sequence[int]], nbytes: int, dtype_size: int) -> list[Step]:
    """All-to-all on every group at once: in step m, member i sends its block for member i+m."""
    k = len(groups[0])
    block = _chunk(nbytes, k, dtype_size)
    return [Step(tuple((g[i], g[(i + m) % k], block) for g in groups for i in range(k))) for m in range(1, k)]


def _ring(op: str, group: tuple[int, ...], nbytes: int, dtype_size: int, topo: Topology) -> list[Step]:
    if op == "all_to_all":
        return _pairwise([group], nbytes, dtype_size)
    if op == "all_reduce":
        return _ring_pass([group], nbytes, dtype_size, topo, True) + _ring_pass([group], nbytes, dtype_size, topo,
                                                                                False)
    return _ring_pass([group], nbytes, dtype_size, topo, op == "reduce_scatter")


def _rdh(op: str, group: tuple[int, ...], nbytes: int, dtype_size: int, topo: Topology) -> list[Step]:
    n = len(group)
    if op == "all_to_all":  # Bruck
        block, steps = _chunk(nbytes, n, dtype_size), []
        for k in range(math.ceil(math.log2(n))):
            sent = block * sum(1 for j in range(n) if j >> k & 1)
            steps.append(Step(tuple((group[i], group[(i + (1 << k)) % n], sent) for i in range(n))))
        return steps
    p = 1 << (n.bit_length() - 1)
    halving = [Step(tuple((group[i], group[i ^ (1 << k)], _chunk(nbytes, 2 << k, dtype_size)) for i in range(p)),
                    reduces=True) for k in range(p.bit_length() - 1)]
    doubling = [Step(s.transfers) for s in reversed(halving)]
    steps = {"reduce_scatter": halving, "all_gather": doubling, "all_reduce": halving + doubling}[op]
    if n == p:
        return steps
    # The ranks past p hand their buffer to a partner and get their part of the result back from it.
    block = _chunk(nbytes, n, dtype_size)
    sent, returned = {"all_reduce": (nbytes, nbytes), "reduce_scatter": (nbytes, block),
                      "all_gather": (block, nbytes)}[op]
    first = Step(tuple((group[i], group[i - p], sent) for i in range(p, n)), reduces=op != "all_gather")
    last = Step(tuple((group[i - p], group[i], returned) for i in range(p, n)))
    return [first, *steps, last]


def hierarchy_levels(group: tuple[int, ...], topo: Topology) -> list[list[list[int]]]:
    """The hierarchical algorithm's levels, inner to outer: each a list of groups that run at once. ValueError
    when the group's ranks are not spread evenly over its chips and instances (the levels would not line up)."""
    places: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in group:
        places[topo.instance_of(r)][topo.chip_of(r)].append(r)
    chips = [chips_ranks for inst in places.values() for chips_ranks in inst.values()]
    if len({len(c) for c in chips}) > 1 or len({len(inst) for inst in places.values()}) > 1:
        raise ValueError("hierarchical needs the same number of the group's ranks on each of its chips, and of its "
                         "chips in each of its instances")
    grid = [list(inst.values()) for inst in places.values()]  # [instance][chip][rank]
    per_chip, per_instance = len(grid[0][0]), len(grid[0])
    levels = [[c for inst in grid for c in inst],
              [[inst[c][j] for c in range(per_instance)] for inst in grid for j in range(per_chip)],
              [[inst[c][j] for inst in grid] for c in range(per_instance) for j in range(per_chip)]]
    return [level for level in levels if len(level[0]) > 1]


def _hierarchical(op: str, group: tuple[int, ...], nbytes: int, dtype_size: int, topo: Topology) -> list[Step]:
    levels = hierarchy_levels(group, topo)
    if op == "all_to_all":
        return [s for level in levels for s in _pairwise(level, nbytes, dtype_size)]
    scatter, size = [], nbytes
    for level in levels:
        scatter.append(_ring_pass(level, size, dtype_size, topo, op != "all_gather"))
        size = _chunk(size, len(level[0]), dtype_size)
    # An all-gather at a level is the reduce-scatter's transfers again, combining nothing; outer levels first.
    gather = [Step(s.transfers, s.repeat) for steps in reversed(scatter) for s in steps]
    scatter_steps = [s for steps in scatter for s in steps]
    return {"reduce_scatter": scatter_steps, "all_gather": gather, "all_reduce": scatter_steps + gather}[op]


def _mesh(op: str, group: tuple[int, ...], nbytes: int, dtype_size: int, topo: Topology) -> list[Step]:
    sent = nbytes if op == "all_reduce" else _chunk(nbytes, len(group), dtype_size)
    return [Step(tuple((a, b, sent) for a in group for b in group if a != b), reduces=op != "all_gather")]


_BUILDERS = {"ring": _ring, "rdh": _rdh, "hierarchical": _hierarchical, "mesh": _mesh}


# ---- pricing ---------------------------------------------------------------------------------------------------

def transfer_ns(nbytes: int, topo: Topology) -> float:
    """How long a rank's collective DMA takes to send one transfer: cut into cc_chunk_bytes pieces, each on a DMA
    engine of its own (so no faster than one chunk on one engine), and at most the rank's collective rate."""
    t = topo.target
    return max(min(nbytes, t.cc_chunk_bytes) / t.dma_queue_gbps, nbytes / (topo.lnc * t.cc_rank_gbps))


def fixed_ns(group: Sequence[int], nbytes: int, topo: Topology) -> float:
    """A collective's cost beyond its steps (module docstring)."""
    t = topo.target
    ns = t.cc_setup_ns + t.cc_sync_round_ns * math.ceil(math.log2(len(group)))
    if len({topo.instance_of(r) for r in group}) > 1:
        ns += _log_interpolate(t.cc_efa_setup_ns, nbytes)
    return ns


def _log_interpolate(points: Sequence[tuple[int, float]], x: int) -> float:
    """The piecewise-linear function of log2(x) through `points` (sorted by x), flat beyond its ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * math.log2(x / x0) / math.log2(x1 / x0)
    return points[-1][1]


def _price(steps: Sequence[Step], topo: Topology, sbuf: bool, dtype_size: int) -> tuple[float, frozenset[str]]:
    total, used = 0.0, set()
    reduce_rate = topo.lnc * topo.target.cc_reduce_gelems  # elements per ns
    for step in steps:
        busy: dict[str, float] = defaultdict(float)  # ns each resource is kept busy
        latency = 0.0
        for a, b, nbytes in step.transfers:
            route = topo.route(a, b, sbuf)
            latency = max(latency, route.ns)
            for resource in route.resources:
                if resource.startswith("cc"):  # the collective DMA sends it, combining it on the way
                    busy[resource] += transfer_ns(nbytes, topo) + \
                        (nbytes / dtype_size / reduce_rate if step.reduces else 0.0)
                else:
                    busy[resource] += nbytes / topo.bandwidth(resource)
        if busy:
            total += step.repeat * (latency + max(busy.values()))
            used.update(busy)
    return total, frozenset(used)


# Every rank of a group asks for the same collective's cost: price it once (a 256-rank all_to_all takes seconds).
@functools.lru_cache(maxsize=1024)
def collective_cost(op: str, nbytes: int, dtype_size: int, group: tuple[int, ...], topo: Topology,
                    algorithm: str = "auto", shift: int = 1, sbuf: bool = False) -> CollectiveCost:
    """Simulated time of one collective on `group` (ranks of `topo`), by `algorithm` or the fastest ("auto").
    `nbytes` is the larger of src and dst on one rank; `shift` is a permute's; `sbuf` when its operands are in
    SBUF. ValueError on a bad op, algorithm or group, or hierarchical on a group it does not fit."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    if algorithm != "auto" and algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: auto, {', '.join(ALGORITHMS)}")
    if len(set(group)) != len(group) or not all(0 <= r < topo.ranks for r in group):
        raise ValueError(f"group {group} must list distinct ranks below {topo.ranks}")
    n = len(group)
    if n == 1 or nbytes == 0:
        return CollectiveCost(0.0, "direct" if op == "permute" else
                              ("ring" if algorithm == "auto" else algorithm), frozenset())
    if op == "permute":
        step = Step(tuple((group[i], group[(i + shift) % n], nbytes) for i in range(n) if (i + shift) % n != i))
        if not step.transfers:  # every rank its own partner: nothing crosses between ranks
            return CollectiveCost(0.0, "direct", frozenset())
        ns, links = _price([step], topo, sbuf, dtype_size)
        return CollectiveCost(fixed_ns(group, nbytes, topo) + ns, "direct", links)
    candidates = ALGORITHMS if algorithm == "auto" else (algorithm,)
    best: CollectiveCost | None = None
    for name in candidates:
        try:
            steps = _BUILDERS[name](op, group, nbytes, dtype_size, topo)
        except ValueError:
            if algorithm != "auto":
                raise
            continue
        ns, links = _price(steps, topo, sbuf, dtype_size)
        if best is None or ns < best.ns:
            best = CollectiveCost(ns, name, links)
    assert best is not None, "ring applies to every group"
    return CollectiveCost(fixed_ns(group, nbytes, topo) + best.ns, best.algorithm, best.links)


def instruction_cost(instr: Instruction, groups: Sequence[Sequence[int]], topo: Topology,
                     algorithm: str = "auto") -> CollectiveCost:
    """The cost of a collective instruction on its replica group, as the runtime times it: nbytes is the larger of
    its src and dst on one rank. The compiler's scheduler asks it too (codegen/schedule.py), so that its estimate
    of a rank's program holds the collective the runtime will run."""
    src, dst = instr.args["src"], instr.args["dst"]
    size = src.dtype.size
    nbytes = max(src.num_partitions * src.free_size, dst.num_partitions * dst.free_size) * size
    return _cached_cost(instr.op, nbytes, size, tuple(groups[instr.args["group"]]), topo, algorithm,
                        instr.args.get("shift", 1), src.mem is Mem.SBUF)


# Every rank of a group asks the same question: pricing a 64-rank collective once, not 64 times.
_cached_cost = functools.lru_cache(maxsize=1024)(collective_cost)


def bus_bandwidth(op: str, nbytes: int, n: int, ns: float) -> float:
    """nccl-tests' bus bandwidth in GB/s: algbw (bytes / time) times the op's bus factor."""
    return nbytes / ns * BUS_FACTOR[op](n) if ns else 0.0


def bus_bandwidth_limit(op: str, group: tuple[int, ...], topo: Topology) -> float:
    """The bus bandwidth no algorithm can beat on `group`, in GB/s: what the links physically carry.

    Inside one chip: half its HBM's bandwidth (every byte exchanged is read and written there). Across the chips
    of one instance: one chip's link_gbps (a ring's bytes all cross some chip's NeuronLink ports). Across
    instances the busbw formula's premise, that every rank's bytes cross every link, no longer holds:
    hierarchical and rdh send less over EFA than a ring. The limit is then the cut: an instance holding p of the
    group's n ranks must send at least
        all_reduce S (the sum of its inputs);  all_gather p S/n (its blocks);  reduce_scatter (n-p) S/n (its
        share of the others' blocks);  all_to_all p (n-p) S/n;  permute S per rank whose partner is outside
    over its efa_gbps, so busbw <= bus factor x efa_gbps x S / those bytes (the tightest instance)."""
    t, n = topo.target, len(group)
    if len({topo.chip_of(r) for r in group}) == 1:
        return t.hbm_gbps / 2
    instances = [sum(1 for r in group if topo.instance_of(r) == i) for i in {topo.instance_of(r) for r in group}]
    if len(instances) == 1:
        return t.link_gbps
    leaving = {
        "all_reduce": lambda p: 1.0,
        "all_gather": lambda p: p / n,
        "reduce_scatter": lambda p: (n - p) / n,
        "all_to_all": lambda p: p * (n - p) / n,
        "permute": lambda p: 1.0,  # at least one rank of some instance sends its buffer out
    }[op]
    return BUS_FACTOR[op](n) * t.efa_gbps / max(leaving(p) for p in instances)
