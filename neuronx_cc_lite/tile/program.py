"""The tile program: what lowering produces and codegen/ turns into engine streams.

Lowering an op appends instructions to a `Program` in program order. Their operands are still virtual: a
`TileAccess` names a `Tile` (an SBUF or PSUM buffer of up to pmax partitions that the allocator will place) and an
`HbmAccess` names an `HbmTensor` (placed by the HBM layout). Everything else about an instruction - opcode, engine,
fields - is final. `Program.dma` moves any HBM view to or from a tile, splitting the copy into as many dma_copy
instructions as the four-dimension access patterns need.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from isa.collectives import Topology
from isa.costs import duration_ns
from isa.dtypes import DType
from isa.functions import ActFunc
from isa.instructions import OPS, Instruction
from isa.operand import MAX_FREE_DIMS, Engine, Mem, Operand
from isa.target import Target
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.tile.hbm import HbmTensor, HbmView, coalesce

ALIGN = 64  # bytes: where tiles and HBM tensors start
# Tiles of depthwise diagonals in turn (Program.diagonals): a tile's next load waits for PE to have read it, so
# with four the load of tile k + 4 runs while PE multiplies tiles k + 1 .. k + 3.
DIAGONAL_RING = 4
# Tiles of the groups of a depthwise convolution with its rows on the partitions (Program.bands, Program.windows):
# a group's PE work (a matmul a kernel column, 64 cycles or so) is far shorter than its loads' DMA latency, so
# many groups' loads must be in flight at once.
ROWS_RING = 16


@dataclass(eq=False)
class Tile:
    mem: Mem
    partitions: int
    free: int  # elements per partition
    dtype: DType
    name: str
    offset: int | None = None  # bytes into each partition, set by the allocator

    @property
    def bytes_per_partition(self) -> int:
        return -(-self.free * self.dtype.size // ALIGN) * ALIGN

    def ap(self, dims: tuple[tuple[int, int], ...] | None = None, offset: int = 0, first: int = 0,
           partitions: int | None = None) -> TileAccess:
        """An access to the tile: `dims` (size, stride) in elements from element `offset` of partitions
        first .. first + partitions - 1. By default the whole tile, densely."""
        count = self.partitions - first if partitions is None else partitions
        return TileAccess(self, first, count, offset, ((self.free, 1),) if dims is None else dims)

    def region(self, offset: int, size: int, first: int = 0, partitions: int | None = None) -> TileAccess:
        return self.ap(((size, 1),), offset, first, partitions)


@dataclass(frozen=True)
class TileAccess:
    tile: Tile
    first: int
    partitions: int
    offset: int  # elements
    dims: tuple[tuple[int, int], ...]
    skew: int = 0  # elements further into its row each partition's pattern starts: a DMA's only (isa/operand.py)

    @property
    def space(self) -> Tile:
        return self.tile

    def resolve(self) -> Operand:
        assert self.tile.offset is not None, f"tile {self.tile.name} was never placed"
        return self.placed_at(self.tile.offset)

    def placed_at(self, base: int) -> Operand:
        """The operand as if the tile started at byte `base` of each partition (0: relative to the tile)."""
        t = self.tile
        return Operand(t.mem, t.dtype, self.first, self.partitions, base + self.offset * t.dtype.size, self.dims,
                       self.skew)


@dataclass(frozen=True)
class Columns:
    """Columns [offset, offset + free) of a tile's first `partitions` partitions, addressed as a tile of their own
    (Tile.ap): one output tile's accumulator beside the others' in a PSUM bank (lower/conv.py)."""
    tile: Tile
    offset: int
    free: int
    partitions: int

    def ap(self, dims: tuple[tuple[int, int], ...] | None = None, offset: int = 0, first: int = 0,
           partitions: int | None = None) -> TileAccess:
        count = self.partitions - first if partitions is None else partitions
        return TileAccess(self.tile, first, count, self.offset + offset, ((self.free, 1),) if dims is None else dims)


@dataclass(frozen=True)
class HbmAccess:
    tensor: HbmTensor
    dtype: DType
    partitions: int
    partition_stride: int
    offset: int  # elements
    dims: tuple[tuple[int, int], ...]

    @property
    def space(self) -> HbmTensor:
        return self.tensor

    def resolve(self) -> Operand:
        assert self.tensor.offset is not None, f"HBM tensor {self.tensor.name} was never placed"
        return self.placed_at(self.tensor.offset)

    def placed_at(self, base: int) -> Operand:
        return Operand(Mem.HBM, self.dtype, 0, self.partitions, base + self.offset * self.dtype.size, self.dims,
                       self.partition_stride)


VirtualOperand = TileAccess | HbmAccess


@dataclass
class PendingInstr:
    op: str
    engine: Engine
    queue: int  # DMA queue, for dma_copy: chosen by the scheduler
    args: dict[str, Any]
    node: str

    def instruction(self, placed: bool = True) -> Instruction:
        """The instruction with physical operands, or (placed=False) with every tile and HBM tensor taken to
        start at 0: enough for its cost and its footprint inside each tile or tensor."""
        return Instruction(self.op, {k: (v.resolve() if placed else v.placed_at(0))
                                     if isinstance(v, (TileAccess, HbmAccess)) else v for k, v in self.args.items()})

    def accesses(self) -> Iterator[tuple[VirtualOperand, bool]]:
        """Every virtual operand, with whether the instruction writes it (the whole table of an indirect DMA
        included: it lies in the tensor of the row operand, "src" of a gather, "dst" of a scatter)."""
        spec = OPS[self.op]
        for f in spec.operand_fields:
            value = self.args[f.name]
            if isinstance(value, (TileAccess, HbmAccess)):
                yield value, f.writes
        if spec.implicit_reads or spec.implicit_writes:
            for o, writes in self.instruction(placed=False).implicit_operands().values():
                row = self.args["dst" if writes else "src"]
                yield HbmAccess(row.tensor, o.dtype, o.num_partitions, o.partition_stride,
                                o.offset // o.dtype.size, o.dims), writes


def _pending(mnemonic: str, engine: Engine, args: dict[str, Any], node: str) -> PendingInstr:
    """The instruction with its fields from `args`, those not given None."""
    spec = OPS[mnemonic]
    values = {f.name: args.pop(f.name, None) for f in spec.fields}
    assert not args, f"{mnemonic} has no field(s) {sorted(args)}"
    return PendingInstr(mnemonic, engine, 0, values, node)


class Program:
    def __init__(self, target: Target, matmul_dtype: DType | None = None,
                 copy_hbm: Callable[[Program, HbmView, HbmView], None] | None = None) -> None:
        self.target = target
        self.matmul_dtype = matmul_dtype  # auto-cast: the type matmul operands are loaded as
        # how `dma` copies one HBM view into another: a lowering decision (lower/relayout.py: a DMA alone, or through
        # SBUF and PE when the copy transposes), which lowering hands in
        self.copy_hbm = copy_hbm
        self.instrs: list[PendingInstr] = []
        self.tiles: list[Tile] = []
        self.hbm: list[HbmTensor] = []
        self.node = ""  # the ONNX node being lowered, recorded on every instruction
        self.schedule_tries = 0  # list schedules tried until one fitted memory (0: the lowering order was kept)
        self.hbm_size = 0  # bytes, once the HBM layout has placed every tensor
        self._filled: dict[tuple[DType, str, int, int], Tile] = {}  # the constant tiles: ones, scalars, filled
        self._rings: dict[tuple, tuple[list[Tile], int]] = {}  # zeroed rings (diagonals, bands) -> (ring, turns)
        # a rank's replica groups and where the ranks sit (compiler.compile_graph, under --tp and --dp): the
        # scheduler prices each collective as the runtime will
        self.groups: list[tuple[int, ...]] = []
        self.topology: Topology | None = None

    def operand_dtype(self, dtype: DType) -> DType:
        """The type a matmul operand of type `dtype` is held in on chip: the auto-cast type for fp32."""
        return self.matmul_dtype if self.matmul_dtype is not None and dtype is DType.fp32 else dtype

    # ---- storage -----------------------------------------------------------------------------------------------

    def tile(self, mem: Mem, partitions: int, free: int, dtype: DType, name: str) -> Tile:
        assert 0 < partitions <= self.target.partitions, (name, partitions)
        t = Tile(mem, partitions, free, dtype, f"{name}#{len(self.tiles)}")
        self.tiles.append(t)
        return t

    def sbuf(self, partitions: int, free: int, dtype: DType, name: str) -> Tile:
        return self.tile(Mem.SBUF, partitions, free, dtype, name)

    def psum(self, partitions: int, free: int, name: str, dtype: DType = DType.fp32) -> Tile:
        """A PSUM tile: fp32 for matmul results; a transpose writes its input's type."""
        return self.tile(Mem.PSUM, partitions, free, dtype, name)

    def ones(self, dtype: DType) -> Tile:
        """A pmax x pmax tile of ones, filled at the start of the program: the stationary operand that makes PE
        sum over partitions or repeat a row on every partition."""
        pmax = self.target.partitions
        return self.filled(pmax, pmax, dtype, 1.0, f"ones/{dtype.name}")

    def scalar(self, value: float, dtype: DType) -> Tile:
        """A pmax x 1 tile holding `value` on every partition, filled once at the start of the program: a constant
        an instruction must read from a tile (with stride 0 along its free axes) costs no load and no fill per use."""
        return self.filled(self.target.partitions, 1, dtype, value, f"scalar/{dtype.name}/{value:g}")

    def filled(self, partitions: int, free: int, dtype: DType, value: float, name: str | None = None) -> Tile:
        """A [partitions, free] tile holding `value`, filled once at the start of the program and shared by every
        lowering that asks for the same (a convolution epilogue's ones, against which PE adds its bias rows: one
        fill where each convolution's own was a GpSimdE pass on the dependent chain's shared SBUF port)."""
        key = (dtype, repr(float(value)), partitions, free)  # repr tells -0.0 from 0.0
        if key not in self._filled:
            self._filled[key] = tile = self.sbuf(partitions, free, dtype, name or f"filled/{dtype.name}/{value:g}")
            self.instrs.insert(0, PendingInstr("memset", Engine.POOL, 0, {"dst": tile.ap(), "value": value}, ""))
        return self._filled[key]

    def diagonals(self, taps: int, dtype: DType) -> Tile:
        """The next of a ring of DIAGONAL_RING [pmax, pmax x taps] tiles that hold a depthwise convolution's
        stationary operands (lower/depthwise.py): element (c, j * taps + t) is tap t's weight at (c, j), nonzero on
        the diagonal j = c only. Each tile is zeroed once, when first handed out, and every write after that lands
        on the diagonal, so the zeros stay: a tile of 128 channels loads its 128 x taps weights, not 128 x 128 x
        taps elements mostly zero. The ring lets the next tiles' loads run while PE reads the earlier ones. ScalarE
        zeroes them, a bank's width at a time (a copy of a zero column read with stride 0): a memset runs on VectorE
        or GpSimdE, whose shared SBUF port a network's first layers hold (MobileNetV3 bf16: 104.5 us, 107.5 with
        GpSimdE's memsets)."""
        pmax = self.target.partitions
        return self._zeroed_ring(("diagonals", taps, dtype), pmax * taps, dtype, f"diagonals/{taps}/{dtype.name}")

    def bands(self, kh: int, kw: int, dtype: DType) -> Tile:
        """The next of a ring of ROWS_RING [pmax, (pmax + kh) x kw] tiles that hold a depthwise convolution's
        banded stationary operands when a channel's rows lie on the partitions (lower/row_depthwise.py): element
        (p, j * kw + kx) is kernel column kx's weight joining input row p to output column j, nonzero for j = p ..
        p + kh - 1 only. Zeroed once, as the diagonals are; every write after lands on those places."""
        pmax = self.target.partitions
        return self._zeroed_ring(("bands", kh, kw, dtype), (pmax + kh) * kw, dtype, f"bands/{kh}x{kw}/{dtype.name}",
                                 ROWS_RING, memset=True)

    def windows(self, width: int, dtype: DType) -> Tile:
        """The next of a ring of ROWS_RING [pmax, width] tiles, zeroed once, into which a depthwise convolution with
        its rows on the partitions loads a group's rows between padding columns (lower/row_depthwise.py): every
        load of one geometry writes the same interior, so the padding stays zero."""
        return self._zeroed_ring(("windows", width, dtype), width, dtype, f"rows/{width}/{dtype.name}", ROWS_RING,
                                 memset=True)

    def _zeroed_ring(self, key: tuple, free: int, dtype: DType, name: str, depth: int = DIAGONAL_RING,
                     memset: bool = False) -> Tile:
        """The next tile of a ring of `depth` [pmax, free] tiles, each zeroed when first handed out: by ScalarE in
        pieces (the diagonals': _zero_on_scalar_engine), or with `memset` by GpSimdE at once (the rows' rings, handed
        out in the middle of a network, where ScalarE evacuates every layer; ConvNeXt-T 636.4 / 1,404.6 us in bf16 /
        fp32 that way, 633.3 / 1,408.8 with ScalarE's pieces: about the same, in fewer instructions)."""
        ring, turns = self._rings.get(key, ([], 0))
        if len(ring) < depth:
            tile = self.sbuf(self.target.partitions, free, dtype, name)
            ring.append(tile)
            if memset:
                self.emit("memset", Engine.POOL, dst=tile.ap(), value=0.0)
            else:
                self._zero_on_scalar_engine(tile)
        self._rings[key] = (ring, turns + 1)
        return ring[turns % depth]

    def _zero_on_scalar_engine(self, tile: Tile) -> None:
        """Zero the tile by ScalarE copies of a zero column read with stride 0, in pieces half a bank's evacuation
        long: a fill of 3,200 columns held ScalarE 2.3 us at a time, and the list schedule, which cannot interrupt
        it, started one just before a stem's epilogue was ready (MobileNetV3 bf16 102.8 -> 102.2 us, fp32 188.1 ->
        186.0); a bank's width still held the stem's and the first blocks' epilogues 0.4 us each (82.8 -> 81.6 us in
        bf16 with half; a quarter the same, an eighth 107.7: 400 fills, each paying an instruction's fixed cost on
        the ScalarE the network's start waits for)."""
        zero = self.scalar(0.0, tile.dtype)
        step = min(self.target.psum_bank_fmax, self.target.gemm_moving_fmax) // 2
        for c0 in range(0, tile.free, step):
            n = min(step, tile.free - c0)
            self.emit("activation", Engine.ACT, dst=tile.ap(((n, 1),), c0), src=zero.ap(((n, 0),)),
                      func=ActFunc.copy, scale=1.0)

    def hbm_tensor(self, name: str, nbytes: int, kind: TensorKind, dtype: DType,
                   data: bytes | None = None) -> HbmTensor:
        t = HbmTensor(name, nbytes, kind, dtype, data)
        self.hbm.append(t)
        return t

    # ---- instructions ----------------------------------------------------------------------------------------

    def emit(self, mnemonic: str, engine: Engine, /, **args: Any) -> None:
        self.instrs.append(_pending(mnemonic, engine, args, self.node))

    def cost_ns(self, mnemonic: str, engine: Engine, /, dependent: bool = False, **args: Any) -> float:
        """How long the instruction `emit` would append keeps its engine, by the cost model (isa/costs.py), its
        operands' tiles not yet placed: a lowering weighs one arrangement against another with it. `dependent`:
        it reads what the instruction before it on its engine wrote."""
        return duration_ns(_pending(mnemonic, engine, args, self.node).instruction(placed=False), engine,
                           self.target, dependent)

    def dma(self, dst: TileAccess | HbmView, src: TileAccess | HbmView) -> None:
        """Copy between a view of HBM and a dense tile region, or between two HBM views of one shape (`copy_hbm`).

        An HBM view given with a tile has shape (partitions, *free): its axis 0 lands on the tile's partitions,
        the rest fill each partition densely in row-major order."""
        if isinstance(dst, HbmView) and isinstance(src, HbmView):
            assert self.copy_hbm is not None, "a program that copies HBM to HBM is built with copy_hbm"
            self.copy_hbm(self, dst, src)
            return
        view, access = (src, dst) if isinstance(src, HbmView) else (dst, src)
        assert isinstance(access, TileAccess) and len(access.dims) == 1 and access.dims[0][1] == 1, access
        assert view.shape[0] == access.partitions and math.prod(view.shape[1:]) == access.dims[0][0], \
            (view.shape, access)
        shape, (strides,) = coalesce([view], keep_first=True)
        free_shape, free_strides = shape[1:], strides[1:]
        outer = max(0, len(free_shape) - MAX_FREE_DIMS)
        inner_size = math.prod(free_shape[outer:])
        for index in itertools.product(*(range(n) for n in free_shape[:outer])):
            offset = view.offset + sum(i * s for i, s in zip(index, free_strides))
            position = sum(i * math.prod(free_shape[k + 1:outer]) for k, i in enumerate(index)) * inner_size
            hbm = HbmAccess(view.tensor, view.dtype, shape[0], strides[0], offset,
                            tuple(zip(free_shape[outer:], free_strides[outer:])))
            tile = TileAccess(access.tile, access.first, access.partitions, access.offset + position,
                              ((inner_size, 1),))
            if view is src:
                self.emit("dma_copy", Engine.DMA, dst=tile, src=hbm)
            else:
                self.emit("dma_copy", Engine.DMA, dst=hbm, src=tile)
