"""Physical operands: where an instruction reads or writes.

An operand is a memory space, a partition range, a byte offset and a free-dimension access pattern of up to four
(size, stride) pairs, strides in elements. In SBUF and PSUM the partition axis is physical: partition p of the
operand is row `start_partition + p` of the memory. HBM is flat per chip, so there the partition axis is one more
stride (`partition_stride`, in elements) and `start_partition` is 0. A DMA builds a descriptor per partition row,
so its SBUF operand may also start each row's pattern further in: partition p's at `offset + p *
partition_stride` elements (a diagonal, as a depthwise convolution's stationary operands need, written without
its zeros); the compute engines read every partition at the same offset, and there it is 0.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from isa.dtypes import DType

MAX_FREE_DIMS = 4


class Mem(enum.IntEnum):
    HBM = 0
    SBUF = 1
    PSUM = 2


class Engine(enum.IntEnum):
    """The engines of a NeuronCore. DMA stands for the DMA queues, each of which runs its own stream
    (isa/streams.py names them)."""

    PE = 0
    ACT = 1
    DVE = 2
    POOL = 3
    SP = 4
    DMA = 5
    CC = 6  # the collective engine of a rank: runs the collectives, one at a time, in its own stream "CC"


COMPUTE_ENGINES = frozenset({Engine.PE, Engine.ACT, Engine.DVE, Engine.POOL})

# Which memories each engine may read and write (CHIP.md: TensorE writes only PSUM; GpSimdE cannot touch PSUM;
# HBM is reached only by DMA).
READABLE: dict[Engine, frozenset[Mem]] = {
    Engine.PE: frozenset({Mem.SBUF}),
    Engine.ACT: frozenset({Mem.SBUF, Mem.PSUM}),
    Engine.DVE: frozenset({Mem.SBUF, Mem.PSUM}),
    Engine.POOL: frozenset({Mem.SBUF}),
    Engine.SP: frozenset({Mem.HBM, Mem.SBUF}),
    Engine.DMA: frozenset({Mem.HBM, Mem.SBUF}),
    Engine.CC: frozenset({Mem.HBM, Mem.SBUF}),  # collectives move HBM or SBUF buffers between ranks
}
WRITABLE: dict[Engine, frozenset[Mem]] = {**READABLE, Engine.PE: frozenset({Mem.PSUM})}


@dataclass(frozen=True, init=False)
class Operand:
    mem: Mem
    dtype: DType
    start_partition: int
    num_partitions: int
    offset: int  # bytes: from the start of the partition (SBUF/PSUM) or of HBM
    dims: tuple[tuple[int, int], ...]  # free access pattern, outermost first: (size, stride in elements)
    partition_stride: int = 0  # elements between partitions (HBM); a DMA's skew of each SBUF row (module doc)

    def __init__(self, mem: Mem, dtype: DType, start_partition: int, num_partitions: int, offset: int,
                 dims: tuple[tuple[int, int], ...], partition_stride: int = 0) -> None:
        # (the fields go into the instance's dict at once: the frozen dataclass's own __init__ sets them one
        # object.__setattr__ at a time, in twice the time, and a compile makes an operand per access per stage)
        self.__dict__.update(mem=mem, dtype=dtype, start_partition=start_partition, num_partitions=num_partitions,
                             offset=offset, dims=dims, partition_stride=partition_stride)

    @property
    def free_shape(self) -> tuple[int, ...]:
        return tuple(size for size, _ in self.dims)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_partitions, *self.free_shape)

    @property
    def free_size(self) -> int:
        """Elements per partition."""
        count = 1
        for size, _ in self.dims:  # (a loop: math.prod over a list made for it took three times as long)
            count *= size
        return count

    @property
    def nbytes(self) -> int:
        """The bytes of the elements it names, over all its partitions."""
        return self.num_partitions * self.free_size * self.dtype.size

    @property
    def partition_span(self) -> tuple[int, int]:
        """[first, last] byte this operand touches inside any of its partition rows (SBUF/PSUM: a DMA's skew
        included; HBM: the pattern of one partition)."""
        size = self.dtype.size
        last = self.offset
        for count, stride in self.dims:  # (a loop: a sum over a generator takes twice as long)
            last += (count - 1) * stride * size
        if self.mem is not Mem.HBM:
            last += (self.num_partitions - 1) * self.partition_stride * size
        return self.offset, last + size - 1

    def byte_span(self) -> tuple[int, int]:
        """[first, last) byte of a flat memory this operand touches, partition stride included (HBM)."""
        first, last = self.partition_span
        last += (self.num_partitions - 1) * self.partition_stride * self.dtype.size
        return first, last + 1
