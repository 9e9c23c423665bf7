"""Where a bundle's pieces live across its ranks, checked at load, and the bytes of a tensor's placement.

Checks, each a LoadError naming what is wrong:
- the LNC is one the target offers, and the target can hold the bundle's ranks (isa/collectives.py's topology);
- the ranks of one chip fit its HBM: ranks per chip x hbm_size <= the chip's HBM;
- every replica group is non-empty and names distinct ranks of the bundle;
- every placement of an input, output or state tensor lies in its rank's HBM and slices an axis of the tensor, and
  the placements of each output and state tensor cover all of it; every weight segment lies in its rank's HBM.
"""

from __future__ import annotations

import numpy as np

from isa.bundle import Bundle, Placement, TensorInfo
from isa.collectives import Topology, topology
from isa.dtypes import DType, numpy_type
from isa.target import Target
from runtime.errors import LoadError


def check_ranks(b: Bundle, t: Target) -> Topology:
    """The topology of the bundle's ranks on the target, after the checks of the LNC, HBM and groups."""
    if b.lnc not in t.lnc_choices:
        raise LoadError(f"bundle asks for LNC {b.lnc}; {t.name} offers {', '.join(map(str, t.lnc_choices))}")
    if not b.cores:
        raise LoadError("bundle has no ranks")
    try:
        topo = topology(t, b.lnc, len(b.cores))
    except ValueError as e:
        raise LoadError(f"bundle has {len(b.cores)} ranks: {e}") from None
    per_chip = t.ranks_per_chip(b.lnc)
    if not 0 <= b.hbm_size or per_chip * b.hbm_size > t.hbm_bytes:
        raise LoadError(f"bundle needs {b.hbm_size} bytes of HBM per rank; the {per_chip} ranks of a {t.name} chip "
                        f"(LNC {b.lnc}) share its {t.hbm_bytes}")
    for g, ranks in enumerate(b.groups):
        if not ranks:
            raise LoadError(f"replica group {g} is empty")
        outside = [r for r in ranks if not 0 <= r < len(b.cores)]
        if outside:
            raise LoadError(f"replica group {g} names rank {outside[0]}; the bundle has ranks 0..{len(b.cores) - 1}")
        if len(set(ranks)) != len(ranks):
            twice = next(r for r in ranks if ranks.count(r) > 1)
            raise LoadError(f"replica group {g} names rank {twice} twice")
    return topo


def check_placements(b: Bundle) -> None:
    for info in (*b.inputs, *b.outputs, *b.state):
        if info.device_dtype not in DType.__members__:
            raise LoadError(f"tensor {info.name!r} has device type {info.device_dtype!r}, which no engine has")
        try:
            numpy_type(info.dtype)
        except TypeError:
            raise LoadError(f"tensor {info.name!r} has type {info.dtype!r}, which numpy does not know") from None
        if not info.placements:
            raise LoadError(f"tensor {info.name!r} has no placement")
        for p in info.placements:
            where = f"tensor {info.name!r} placement on rank {p.rank}"
            if not 0 <= p.rank < len(b.cores):
                raise LoadError(f"{where}: the bundle has ranks 0..{len(b.cores) - 1}")
            axis_size = info.shape[p.axis] if 0 <= p.axis < len(info.shape) else None
            if axis_size is None and not (info.shape == () and p.axis == 0):
                raise LoadError(f"{where}: axis {p.axis} of a tensor of shape {list(info.shape)}")
            if not 0 <= p.start <= p.stop <= (1 if axis_size is None else axis_size):  # empty tensors too
                raise LoadError(f"{where}: [{p.start}, {p.stop}) of axis {p.axis} of shape {list(info.shape)}")
            end = p.hbm_offset + piece_bytes(info, p)
            if p.hbm_offset < 0 or end > b.hbm_size:
                raise LoadError(f"{where} at HBM [{p.hbm_offset}, {end}) lies outside the rank's {b.hbm_size} "
                                "bytes")
    for kind, infos in (("output", b.outputs), ("state tensor", b.state)):
        for info in infos:
            first = _first_uncovered(info)
            if first is not None:
                raise LoadError(f"{kind} {info.name!r}: no placement holds element {first}")
    for seg in b.weights:
        if not 0 <= seg.rank < len(b.cores):
            raise LoadError(f"weight segment for rank {seg.rank}; the bundle has ranks 0..{len(b.cores) - 1}")
        if seg.hbm_offset < 0 or seg.hbm_offset + len(seg.data) > b.hbm_size:
            raise LoadError(f"weight segment of rank {seg.rank} at HBM offset {seg.hbm_offset} lies outside HBM")


def _first_uncovered(info: TensorInfo) -> list[int] | None:
    """The first element (in row-major order) of an output that none of its placements holds, or None, from the
    placements' intervals alone (a bundle may declare any shape: nothing of its size is allocated). A placement
    holds the elements whose index on its axis lies in its interval, so the elements none holds are the product,
    over the axes, of the indices no interval on that axis takes: none when one axis is taken whole."""
    if not info.shape:
        return None  # a scalar: its placement holds it
    if 0 in info.shape:
        return None  # no elements
    first = []
    for axis, n in enumerate(info.shape):
        taken = 0  # indices [0, taken) of this axis are in some interval
        for start, stop in sorted((p.start, p.stop) for p in info.placements if p.axis == axis):
            if start > taken:
                break
            taken = max(taken, stop)
        if taken >= n:
            return None
        first.append(taken)
    return first


def piece(info: TensorInfo, p: Placement) -> tuple[slice, ...]:
    """The index of the tensor's slice that placement `p` holds."""
    if not info.shape:
        return ()
    return tuple(slice(p.start, p.stop) if axis == p.axis else slice(None) for axis in range(len(info.shape)))


def piece_shape(info: TensorInfo, p: Placement) -> tuple[int, ...]:
    return tuple(p.stop - p.start if axis == p.axis else n for axis, n in enumerate(info.shape))


def piece_bytes(info: TensorInfo, p: Placement) -> int:
    return int(np.prod(piece_shape(info, p), dtype=np.int64)) * DType[info.device_dtype].size
