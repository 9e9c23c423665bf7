"""Collectives in the runtime: what each one computes, and the rendezvous that starts it.

A collective runs on the ranks of one replica group (the bundle's `groups[g]`, rank i being the i-th of it, n
ranks). Each rank's CC stream posts it when its semaphore waits are met; the ranks' k-th collectives on a group
are one collective, so they must agree on what it is:

    post(rank r, its k-th collective c on group g):
        first = the first rank to post its k-th collective on g
        if c's signature (mnemonic, dtype, elements of src and dst, reduce op, shift) differs from first's:
            CollectiveError naming both ranks and both instructions
        when all n ranks of g have posted: the collective is ready; the simulator starts it once the links it
        needs are free, reads every member's src then, and writes every member's dst when it ends

What each computes, on buffers (an operand's elements in (partition, free dimensions) order) split in n blocks:

    all_reduce      dst_i = combine(src_0, ..., src_{n-1})
    all_gather      dst_i = src_0 | src_1 | ... | src_{n-1}
    reduce_scatter  dst_i = block i of combine(src_0, ..., src_{n-1})
    all_to_all      dst_i = block i of src_0 | block i of src_1 | ... | block i of src_{n-1}
    permute         dst_i = src_{(i - shift) mod n}

`combine` applies the reduce op in group order (src_0 first), in fp32 for floats and int64 for integers, and the
result is rounded (floats) or saturated (integers) once into dst's type, as the engines store. The order is fixed
so that a run is deterministic; the chip's ring order would round differently, within the same bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from isa.dtypes import DType
from isa.functions import AluOp
from isa.instructions import Instruction
from runtime.errors import CollectiveError

Combine = Callable[[list[np.ndarray], int, "CollectiveArgs"], list[np.ndarray]]


@dataclass(frozen=True)
class CollectiveArgs:
    """What the ranks of a group must agree on for their k-th collective to be one."""

    mnemonic: str
    dtype: str
    src_elements: int
    dst_elements: int
    op: AluOp | None
    shift: int | None

    @classmethod
    def of(cls, instr: Instruction) -> CollectiveArgs:
        src, dst = instr.args["src"], instr.args["dst"]
        return cls(instr.op, src.dtype.name, src.num_partitions * src.free_size, dst.num_partitions * dst.free_size,
                   instr.args.get("op"), instr.args.get("shift"))

    def describe(self) -> str:
        op = None if self.op is None else self.op.name
        extra = "".join(f" {k}={v}" for k, v in (("op", op), ("shift", self.shift)) if v is not None)
        return f"{self.mnemonic} {self.dtype} src {self.src_elements} dst {self.dst_elements} elements{extra}"


def size_problem(args: CollectiveArgs, n: int) -> str | None:
    """Why the sizes cannot be those of this collective on a group of n ranks, or None."""
    src, dst = args.src_elements, args.dst_elements
    if args.mnemonic == "all_gather" and dst != n * src:
        return f"all_gather on {n} ranks needs dst = {n} x src elements, has dst {dst} and src {src}"
    if args.mnemonic == "reduce_scatter" and src != n * dst:
        return f"reduce_scatter on {n} ranks needs src = {n} x dst elements, has src {src} and dst {dst}"
    if args.mnemonic == "all_to_all" and src % n:
        return f"all_to_all on {n} ranks needs a multiple of {n} elements, has {src}"
    return None


# ---- what each computes: member buffers in, member buffers out (group order) ---------------------------------------


_FOLD = {AluOp.add: np.add, AluOp.multiply: np.multiply, AluOp.maximum: np.maximum, AluOp.minimum: np.minimum}


def _combine(srcs: list[np.ndarray], a: CollectiveArgs) -> np.ndarray:
    assert a.op is not None
    wide = np.float32 if DType[a.dtype].is_float else np.int64
    fold = _FOLD[a.op]
    total = srcs[0].astype(wide)
    for x in srcs[1:]:
        total = fold(total, x.astype(wide))
    return total


def all_reduce(srcs: list[np.ndarray], n: int, a: CollectiveArgs) -> list[np.ndarray]:
    return [_combine(srcs, a)] * n


def all_gather(srcs: list[np.ndarray], n: int, a: CollectiveArgs) -> list[np.ndarray]:
    return [np.concatenate(srcs)] * n


def reduce_scatter(srcs: list[np.ndarray], n: int, a: CollectiveArgs) -> list[np.ndarray]:
    return np.split(_combine(srcs, a), n)


def all_to_all(srcs: list[np.ndarray], n: int, a: CollectiveArgs) -> list[np.ndarray]:
    blocks = [np.split(x, n) for x in srcs]
    return [np.concatenate([blocks[j][i] for j in range(n)]) for i in range(n)]


def permute(srcs: list[np.ndarray], n: int, a: CollectiveArgs) -> list[np.ndarray]:
    assert a.shift is not None
    return [srcs[(i - a.shift) % n] for i in range(n)]


COLLECTIVE_HANDLERS: dict[str, Combine] = {
    fn.__name__: fn for fn in (all_reduce, all_gather, reduce_scatter, all_to_all, permute)}


# ---- one rank's collective, loaded, and the rendezvous -------------------------------------------------------------


@dataclass(slots=True, eq=False)
class CollectiveOp:
    """A collective instruction of one rank, ready to post: its group, what it is, how long the whole collective
    takes and the links it holds (the cost model's answer for it), and how to read its src and write its dst."""

    group: int
    args: CollectiveArgs
    ns: float
    links: tuple[str, ...]
    algorithm: str
    read: Callable[[], Any]  # this rank's src as a flat buffer
    write: Callable[[Any], None]  # store a flat buffer into this rank's dst
    combine: Combine


@dataclass(eq=False)
class Collective:
    """The k-th collective on a group: who has posted it so far (stream states in group order, None for a rank
    that has not)."""

    group: int
    k: int
    members: list[Any]
    first: Any  # the first stream to post it, whose instruction the others must match
    posted: int = 0

    def op(self) -> CollectiveOp:
        return self.first.ops[self.first.pc].collective


@dataclass
class Rendezvous:
    """Matches the collectives the ranks post (see the module docstring). `groups` are the bundle's groups."""

    groups: list[tuple[int, ...]]
    position: list[dict[int, int]] = field(init=False)  # per group: rank -> its place in the group
    posts: dict[tuple[int, int], int] = field(default_factory=dict)  # (rank, group) -> collectives posted
    pending: dict[tuple[int, int], Collective] = field(default_factory=dict)  # (group, k) -> not yet complete

    def __post_init__(self) -> None:
        self.position = [{rank: i for i, rank in enumerate(g)} for g in self.groups]

    def post(self, stream: Any) -> Collective | None:
        """Post the collective at `stream`'s pc; the collective when this post completes it, else None."""
        op: CollectiveOp = stream.ops[stream.pc].collective
        g, rank = op.group, stream.core
        k = self.posts.get((rank, g), 0)
        self.posts[rank, g] = k + 1
        c = self.pending.get((g, k))
        if c is None:
            c = self.pending[g, k] = Collective(g, k, [None] * len(self.groups[g]), stream)
        elif c.op().args != op.args:
            raise CollectiveError(
                f"ranks {c.first.core} and {rank} disagree on collective #{k} of group {g}: "
                f"{_name(c.first)} is {c.op().args.describe()}; {_name(stream)} is {op.args.describe()}")
        c.members[self.position[g][rank]] = stream
        c.posted += 1
        if c.posted < len(c.members):
            return None
        del self.pending[g, k]
        return c

    def reset(self) -> None:
        self.posts.clear()
        self.pending.clear()

    def describe_pending(self) -> list[str]:
        """For a deadlock message: each collective some ranks posted and others never did."""
        lines = []
        for (g, k), c in sorted(self.pending.items()):
            posted = [s.core for s in c.members if s is not None]
            missing = [rank for rank, s in zip(self.groups[g], c.members) if s is None]
            lines.append(f"{c.op().args.mnemonic} #{k} of group {g} posted by rank(s) {_ranks(posted)}; "
                         f"rank(s) {_ranks(missing)} never posted it")
        return lines


def start_collective(c: Collective) -> list[Callable[[], None]]:
    """Read every member's src and compute; one commit per member (group order) writing its dst."""
    op = c.op()
    results = op.combine([s.ops[s.pc].collective.read() for s in c.members], len(c.members), op.args)
    return [_commit(s.ops[s.pc].collective.write, r) for s, r in zip(c.members, results)]


def _commit(write: Callable[[Any], None], values: Any) -> Callable[[], None]:
    return lambda: write(values)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _name(s: Any) -> str:
    op = s.ops[s.pc]
    node = f" (node {op.node})" if op.node else ""
    return f"rank {s.core} {s.name} #{s.pc} {op.mnemonic}{node}"
