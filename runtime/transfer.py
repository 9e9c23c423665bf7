"""Disaggregated serving's KV transfer: the device state a prefill group of ranks wrote (its KV cache, the cache's
length, the next token) sent to the decode group's ranks over the links, device to device.

The two groups run the same tensor-parallel layout: rank i of the prefill group holds the same pieces as rank i of
the decode group (the decode bundle's placements, ranks shifted by the prefill group's size when both groups sit
on one topology). Each state piece is copied from the prefill state's array to the decode state's: no byte
crosses to the host (neither state's host counters move). Its time is the chip model's: a permute over the
topology of both groups (rank i -> rank i + group size), each rank sending all its pieces as one transfer, as
isa/collectives.py prices a collective permute: the links' bandwidth and hops, EFA when the groups are on two
instances, and the collective's fixed cost, which is calibrated to nccom-test.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from isa.collectives import collective_cost, topology
from isa.target import Target
from runtime.errors import InputError
from runtime.layout import piece_bytes
from runtime.state import DeviceState


@dataclass(frozen=True)
class KvTransfer:
    """What a transfer moved and how long the chip model says it takes."""

    bytes_per_rank: int  # the most any rank of the prefill group sends
    total_bytes: int
    ranks: int  # in each group
    ns: float
    instances: int  # of the topology holding both groups (2: the groups are on separate instances, over EFA)

    @property
    def us(self) -> float:
        return self.ns / 1e3


def transfer_time(per_rank: list[int], target: Target, lnc: int = 1) -> KvTransfer:
    """The time of sending `per_rank[i]` bytes from rank i of a group of len(per_rank) ranks to rank i of a second
    group placed after it on one topology (a permute by the group size; module docstring)."""
    n = len(per_rank)
    topo = topology(target, lnc, 2 * n)
    size = max(per_rank)
    cost = collective_cost("permute", size, 1, tuple(range(2 * n)), topo, shift=n)
    return KvTransfer(size, sum(per_rank), n, cost.ns, topo.instances)


def send_state(source: DeviceState, dest: DeviceState, target: Target, lnc: int = 1) -> KvTransfer:
    """Copy every state tensor the two hold, piece by piece, from `source` (the prefill group's) to `dest` (the
    decode group's, declared alike: the same shapes, types and pieces on the same ranks of its group), and time it.
    InputError when they do not hold the same tensors alike."""
    if sorted(source.names) != sorted(dest.names):
        raise InputError(f"the prefill state holds {', '.join(sorted(source.names))}; the decode state "
                         f"{', '.join(sorted(dest.names))}")
    per_rank: dict[int, int] = defaultdict(int)
    for name in source.names:
        have, want = source.tensors[name], dest.tensors[name]
        if (have.shape, have.dtype, have.device_dtype) != (want.shape, want.dtype, want.device_dtype) or \
                [(p.rank, p.axis, p.start, p.stop) for p in have.placements] != \
                [(p.rank, p.axis, p.start, p.stop) for p in want.placements]:
            raise InputError(f"state {name!r} is not placed alike in the prefill and decode groups")
        for p, q in zip(have.placements, want.placements):
            dest.piece_array(name, q)[...] = source.piece_array(name, p)
            per_rank[p.rank] += piece_bytes(have, p)
    ranks = max(per_rank) + 1 if per_rank else 1
    return transfer_time([per_rank.get(r, 0) for r in range(ranks)], target, lnc)
