"""Where a tensor lives across the n ranks of a replica group.

A placement is a set of sharded axes, each cut into `parts` equal blocks, and a partial flag:

    Shard(axis, parts, stride): rank t holds block (t // stride) % parts of `axis`
    replicated:                 no shards; every rank holds the whole tensor
    partial:                    no shards; every rank holds a summand, the tensor is their sum

A rank index is a number in mixed radix: each shard owns one digit (its stride is the digit's weight, its parts
the digit's base); digits no shard owns are replication (those ranks hold the same block). So "the 4 heads over 8
ranks" is Shard(heads, 4, 2): ranks 2h and 2h+1 both hold head h. Everything else (the block a rank holds, whether
one placement is a local slice of another) is computed from the per-rank boxes, which keeps the rules simple.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    axis: int
    parts: int
    stride: int


@dataclass(frozen=True)
class Placement:
    shards: tuple[Shard, ...] = ()  # by stride, largest first
    partial: bool = False

    @classmethod
    def of(cls, shards: list[Shard] | tuple[Shard, ...]) -> Placement:
        return cls(tuple(sorted(shards, key=lambda s: -s.stride)))

    @property
    def replicated(self) -> bool:
        return not self.shards and not self.partial

    def shard_of(self, axis: int) -> Shard | None:
        return next((s for s in self.shards if s.axis == axis), None)

    def parts(self, axis: int) -> int:
        s = self.shard_of(axis)
        return s.parts if s else 1

    def local_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(n // self.parts(a) for a, n in enumerate(shape))

    def box(self, shape: tuple[int, ...], rank: int) -> tuple[tuple[int, int], ...]:
        """[start, stop) per axis of the block rank `rank` holds."""
        out = []
        for a, n in enumerate(shape):
            s = self.shard_of(a)
            if s is None:
                out.append((0, n))
            else:
                size = n // s.parts
                i = (rank // s.stride) % s.parts
                out.append((i * size, (i + 1) * size))
        return tuple(out)

    def without(self, axes: set[int] | frozenset[int]) -> Placement:
        """The placement with the shards on `axes` gathered (replicated along them)."""
        return Placement.of([s for s in self.shards if s.axis not in axes])

    def remap(self, mapping: dict[int, int]) -> Placement:
        """Shards renumbered to other axes (those not in `mapping` dropped): the same digits, another tensor."""
        return Placement(tuple(Shard(mapping[s.axis], s.parts, s.stride) for s in self.shards if s.axis in mapping),
                         self.partial)

    def __str__(self) -> str:
        if self.partial:
            return "partial"
        if not self.shards:
            return "replicated"
        return "sharded " + ", ".join(f"axis {s.axis}/{s.parts}" + (f" (every {s.stride})" if s.stride > 1 else "")
                                      for s in self.shards)


REPLICATED = Placement()
PARTIAL = Placement((), True)


def valid(p: Placement, shape: tuple[int, ...], n: int) -> bool:
    """Each shard divides its axis, and the digits fit in n ranks without overlapping."""
    taken = 1
    for s in sorted(p.shards, key=lambda s: s.stride):
        if s.axis >= len(shape) or s.parts < 2 or shape[s.axis] % s.parts or s.stride % taken or \
                n % (s.stride * s.parts):
            return False
        taken = s.stride * s.parts
    return len({s.axis for s in p.shards}) == len(p.shards)


def refines(fine: Placement, coarse: Placement, shape: tuple[int, ...], n: int) -> bool:
    """Whether every rank's block under `fine` lies inside its block under `coarse`: then `fine` is a local slice
    of `coarse`, no data moves between ranks."""
    if fine.partial or coarse.partial:
        return fine == coarse
    return all(all(c0 <= f0 and f1 <= c1 for (f0, f1), (c0, c1) in zip(fine.box(shape, t), coarse.box(shape, t)))
               for t in range(n))


def is_block_order(p: Placement, shape: tuple[int, ...], n: int) -> bool:
    """Whether rank t holds the t-th of n equal contiguous pieces of the row-major tensor: then AllGather is a
    concatenation and ReduceScatter hands out exactly these pieces."""
    if len(p.shards) != 1:
        return False
    s = p.shards[0]
    return s.parts == n and s.stride == 1 and math.prod(shape[:s.axis]) == 1


def digits(p: Placement, n: int) -> list[tuple[int, Shard | None]]:
    """The rank index's digits, most significant first: (base, the shard that owns it, or None: replication)."""
    out: list[tuple[int, Shard | None]] = []
    cur = n
    for s in p.shards:  # largest stride first
        if cur != s.stride * s.parts:
            out.append((cur // (s.stride * s.parts), None))
        out.append((s.parts, s))
        cur = s.stride
    if cur != 1:
        out.append((cur, None))
    return out
