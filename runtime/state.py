"""Device state: tensors that stay in HBM from one run to the next (a KV cache and its write position).

A bundle declares its state tensors like its inputs (name, shape, types, and the piece of the tensor each rank holds
at which HBM offset). The program reads and writes them in place; no run copies them to or from the host. A
`DeviceState` owns their bytes, one array per rank's piece, and the models bound to it see those arrays where
their programs address the pieces: a prefill bundle and a decode bundle loaded with one DeviceState share one cache,
wherever each of them placed it in its HBM.

    prefill = runtime.load("prefill.neff")
    decode = runtime.load("decode.neff", state=prefill.state)   # the same cache
    prefill.state.reset()                                       # every byte back to zero
    lengths = prefill.state.read("past_length")                 # a copy to the host, counted

Two bundles share a tensor when they declare it alike: the same shape, the same types, and pieces of the same
slices on the same ranks (their HBM offsets may differ). The state starts as zeros and `reset()` makes it zeros
again. `read` and `write` are the only copies between the host and the state, and they are counted
(`bytes_to_host`, `bytes_to_device`), so that a test can hold that a decode loop never moves its cache.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from isa.bundle import Placement, TensorInfo
from isa.dtypes import DType
from runtime.errors import InputError, LoadError
from runtime.layout import piece, piece_bytes, piece_shape


class DeviceState:
    def __init__(self, local: Callable[[int], bool] = lambda rank: True) -> None:
        """`local(rank)`: whether this process holds the rank's memories (an MPI job's other ranks are elsewhere)."""
        self._local = local
        self.tensors: dict[str, TensorInfo] = {}
        self._pieces: dict[tuple[str, int], np.ndarray] = {}  # (name, placement index) -> its bytes (uint8)
        self.bytes_to_host = 0
        self.bytes_to_device = 0

    @property
    def names(self) -> list[str]:
        return list(self.tensors)

    def declare(self, info: TensorInfo) -> None:
        """Hold `info`'s pieces (zeros), or check that an earlier declaration of it agrees (LoadError if not)."""
        held = self.tensors.get(info.name)
        if held is None:
            self.tensors[info.name] = info
            for k, p in enumerate(info.placements):
                if self._local(p.rank):
                    self._pieces[info.name, k] = np.zeros(piece_bytes(info, p), np.uint8)
            return
        if _signature(held) != _signature(info):
            raise LoadError(f"state tensor {info.name!r}: this bundle declares it {_describe(info)}, the shared "
                            f"state holds it {_describe(held)}")

    def piece_array(self, name: str, p: Placement) -> np.ndarray:
        """The bytes of the piece of `name` that placement `p` (of any bundle declaring it alike) addresses."""
        info = self.tensors[name]
        k = [(q.rank, q.axis, q.start, q.stop) for q in info.placements].index((p.rank, p.axis, p.start, p.stop))
        return self._pieces[name, k]

    def reset(self) -> None:
        """Every state byte back to zero, as at load."""
        for array in self._pieces.values():
            array.fill(0)

    def read(self, name: str) -> np.ndarray:
        """A copy of state tensor `name` on the host, in the type the bundle gives it (where pieces overlap, as
        replicas do, the first listed is read)."""
        info = self._info(name)
        out = np.empty(info.shape, np.dtype(info.dtype))
        for k in reversed(range(len(info.placements))):
            p = info.placements[k]
            if (name, k) in self._pieces:
                out[piece(info, p)] = self._typed(info, k).astype(out.dtype)
                self.bytes_to_host += self._pieces[name, k].nbytes
        return out

    def write(self, name: str, value: np.ndarray) -> None:
        """Set state tensor `name` from the host (every piece of it this process holds)."""
        info = self._info(name)
        array = np.asarray(value)
        if array.shape != info.shape:
            raise InputError(f"state {name!r}: shape {list(array.shape)}, expected {list(info.shape)}")
        for k, p in enumerate(info.placements):
            if (name, k) in self._pieces:
                self._typed(info, k)[...] = array[piece(info, p)].astype(DType[info.device_dtype].np)
                self.bytes_to_device += self._pieces[name, k].nbytes

    def _info(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise InputError(f"no state tensor {name!r} (the state holds {', '.join(self.tensors) or 'none'})")
        return self.tensors[name]

    def _typed(self, info: TensorInfo, k: int) -> np.ndarray:
        shape = piece_shape(info, info.placements[k])
        return self._pieces[info.name, k].view(DType[info.device_dtype].np).reshape(shape)


def _signature(info: TensorInfo) -> tuple[object, ...]:
    return (info.shape, info.dtype, info.device_dtype,
            tuple(sorted((p.rank, p.axis, p.start, p.stop) for p in info.placements)))


def _describe(info: TensorInfo) -> str:
    pieces = ", ".join(f"rank {p.rank} [{p.start}, {p.stop}) of axis {p.axis}" for p in info.placements)
    return f"{info.device_dtype}{list(info.shape)} in pieces {pieces}"
