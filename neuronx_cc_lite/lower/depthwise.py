"""Depthwise convolution over few channels, with bands of output rows stacked on the partitions.

A depthwise tap on PE is a diagonal stationary over the channels, and the moving operand streams one column per
output pixel whatever the channel count: over C channels PE uses C of its rows and the epilogue C partitions.
MobileNetV3's first block has C = 16 at 56x56 outputs: 9 taps x 3,136 columns on 16 rows (40 us of PE in fp32,
its largest node). With B = pmax // C bands, band b holds the window of its R output rows (halo rows included)
on partitions b * C ..; a tap's stationary operand is its diagonal repeated on each band's block, so one matmul
covers B bands: B times fewer columns, and the epilogue runs on B * C partitions.

    R rows a band (below);  B = min(pmax // C, bands of R rows the outputs have)
    for each image, for each group of B bands (R * B output rows):
        window [B * C, span(R) x span(W)]: a fill where no input lands (padding, rows past the last output),
            one load per band onto its partitions (on chip, an SBUF-to-SBUF copy: codegen/on_chip.py)
        acc [B * C, R * W] = sum over taps of diag_B(w[:, tap]).T @ (window read at the tap)
        epilogue (lower/conv_epilogue.py), each band's rows stored from its partitions

R is small, a bank of at least min_efficient_elements columns (128: below it the epilogue's instructions pay a
fixed overhead), so that the first group can start while the producer of the input still writes its later rows
(MobileNetV3: 3 rows of 56; bf16 151.1 -> 150.0 us, fp32 280.9 -> 249.6; 2 rows gave 151.9 and 255.3, 7 rows
153.5 and 266.4).

A depthwise output reads one channel, so PE does one useful multiply-add a column per partition, at a quarter of
its rate in fp32, about VectorE's (a tap being one multiply-add a partition and element there too). Where the cost
model says it saves a fifth of a block's time (fp32, not bf16), VectorE takes a share of the taps into a partial
sum of its own, and PE adds that through one more diagonal, the identity (vector_taps, diagonal_products; both
the banded layers here and the diagonal ones of lower/conv.py): MobileNetV3 in fp32 212.4 -> 191.9 us.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.operand import Engine, Mem
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.ir import Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.conv_epilogue import Epilogue
from neuronx_cc_lite.lower.conv_geometry import ConvGeometry
from neuronx_cc_lite.lower.instr import act
from neuronx_cc_lite.lower.windows import Block, fill_window, flat_window, needs_fill, window_strides, window_taps
from neuronx_cc_lite.ops.attributes import reduced_axes
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import HbmAccess, Program, Tile, TileAccess


def band_plan(ctx: LowerCtx, node: Node, geo: ConvGeometry, window_budget: int,
              per_band: int | None = None) -> tuple[int, int]:
    """(bands, output rows a band), or (1, 0) where bands do not apply: they need a 2-D depthwise convolution
    (no zero insertion) with constant weights over at most half the partitions, whose rows fit a bank and
    whose windows the budget. `per_band`: rows a band, where the caller chooses them (lower/banded_stem.py)."""
    target = ctx.program.target
    if not geo.depthwise or geo.transposed or len(geo.axes) != 2 or any(ax.up != 1 for ax in geo.axes):
        return 1, 0
    if not ctx.graph.tensors[node.inputs[1]].is_constant:
        return 1, 0
    rows, cols = geo.axes
    per_bank = min(target.psum_bank_fmax, target.gemm_moving_fmax) // cols.out
    if per_band is None:
        per_band = min(-(-target.min_efficient_elements // cols.out), per_bank)
    bands = min(target.partitions // geo.channels, -(-rows.out // max(per_band, 1)))
    if bands < 2 or not 1 <= per_band <= per_bank or rows.span(per_band) * cols.span(cols.out) > window_budget:
        return 1, 0
    return bands, per_band


# VectorE takes a share of a depthwise block's taps only where that saves this much of the block's time
MIN_SHARE_GAIN = 0.2


class DiagonalWeights:
    """A depthwise convolution's weights as PE's stationary operands: `load(c0, ct)` gives a tile of
    Program.diagonals whose tap t reads as diagonal_tap(tile, t, ct). With bands, partition b * C + c holds channel
    c of band b (each band's block repeats the diagonal). HBM holds the weights as the model does, [C, taps]
    (repeated per band): one DMA writes each partition's taps, a run of taps elements, at element c * taps of
    partition c (its row's skew, isa/operand.py), onto the diagonal of every tap at once.

    With `identity`, where VectorE takes a share of the taps (vector_taps), each row has one more column of ones:
    its diagonal is the identity through which PE adds VectorE's partial sum, and `scalars(c0, ct)` loads the rows
    as they lie, tap t's weights a [ct, 1] column VectorE multiplies by."""

    def __init__(self, ctx: LowerCtx, node: Node, geo: ConvGeometry, bands: int = 1, identity: bool = False,
                 first: int = 0) -> None:
        self.prog = prog = ctx.program
        # (`first`: the first of the geometry's channels among the node's, a remainder_bands part)
        w = ctx.graph.tensors[node.inputs[1]].value.astype(np.float64).reshape(-1, geo.taps)
        w = w[first:first + geo.channels]
        if identity:
            w = np.concatenate([w, np.ones((geo.channels, 1))], axis=1)
        self.columns = w.shape[1]
        self.dtype = prog.operand_dtype(DType.fp32)  # auto-cast: stored in the type the matmul reads
        data = np.tile(w, (bands, 1)).astype(self.dtype.np)
        self.tensor = prog.hbm_tensor(f"{node.name}/taps{first or ''}", data.nbytes, TensorKind.WEIGHT, self.dtype,
                                      data.tobytes())
        # the roofline counts the model's weights: not the ones, nor the bands' repeats
        self.tensor.needed = geo.channels * geo.taps * self.dtype.size
        self.name = node.name

    def load(self, c0: int, ct: int) -> Tile:
        n, prog = self.columns, self.prog
        tile = prog.diagonals(n, self.dtype)
        prog.emit("dma_copy", Engine.DMA, dst=TileAccess(tile, 0, ct, 0, ((n, 1),), skew=n),
                  src=HbmAccess(self.tensor, self.dtype, ct, n, c0 * n, ((n, 1),)))
        return tile

    def scalars(self, c0: int, ct: int) -> Tile:
        n, prog = self.columns, self.prog
        tile = prog.sbuf(ct, n, self.dtype, f"{self.name}/tap_columns")
        prog.emit("dma_copy", Engine.DMA, dst=tile.ap(),
                  src=HbmAccess(self.tensor, self.dtype, ct, n, c0 * n, ((n, 1),)))
        return tile


def vector_taps(prog: Program, geo: ConvGeometry, size: int, partitions: int) -> int:
    """How many of the taps of a block of `size` outputs on `partitions` partitions VectorE takes while PE runs
    the others, by the cost model: PE's taps and the one that adds VectorE's partial sum against VectorE's, each
    reading what the one before wrote; 0 unless sharing saves a fifth of the block's time (with less, the
    hand-offs and the epilogues' VectorE work that waits behind the taps lose it: MobileNetV3 in bf16, its 5x5
    blocks 12% faster on paper, ran 104.5 -> 106.2 us). VectorE's taps read the window PE does (with the
    convolution's stride along the row) and accumulate in PSUM, one input there and one in SBUF: a pass each.
    PE's rate falls four times in fp32 while VectorE's does not: MobileNetV3's 5x5 layers over 14 x 14 outputs
    take 280 ns a tap on PE in fp32 (70 in bf16), 354 on VectorE; 11 of 25 taps on VectorE take a block from 7.0
    to 4.2 us."""
    return diagonal_block(prog, geo, size, partitions)[1]


def diagonal_block(prog: Program, geo: ConvGeometry, size: int, partitions: int) -> tuple[float, int]:
    """(ns, VectorE's taps): the time of a block's taps with the share of vector_taps."""
    target, taps = prog.target, geo.taps
    dtype = prog.operand_dtype(DType.fp32)
    stride = geo.axes[-1].stride
    acc = Tile(Mem.PSUM, partitions, size, DType.fp32, "acc").ap()
    stationary = Tile(Mem.SBUF, partitions, partitions, dtype, "diagonal").ap()
    moving = Tile(Mem.SBUF, partitions, size * stride, dtype, "window").ap(((size, stride),))
    column = Tile(Mem.SBUF, partitions, 1, dtype, "column").ap()
    pe = prog.cost_ns("nc_matmul", Engine.PE, dst=acc, stationary=stationary, moving=moving, accumulate=True)
    vector = prog.cost_ns("scalar_tensor_tensor", Engine.DVE, dependent=True, dst=acc, src=moving,
                          op0=AluOp.multiply, scalar=column, op1=AluOp.add, b=acc)
    handoff = 2 * target.semaphore_handoff_ns
    alone = taps * pe
    best, share = alone, 0
    for k in range(1, taps - 1):
        shared = max((taps - k + 1) * pe, k * vector + handoff)
        if shared < best:
            best, share = shared, k
    return (best, share) if alone - best >= MIN_SHARE_GAIN * alone else (alone, 0)


def diagonal_products(prog: Program, acc: Tile, weights: DiagonalWeights, tile: Tile, scalars: Tile | None,
                      products: list[tuple[int, TileAccess, TileAccess]], channels: int, share: int) -> None:
    """A block's taps into `acc`: `products` (window_taps: tap, what of acc it adds to, what it reads of the
    window, those that write all of acc first) as PE's matmuls of the taps' diagonals, and with a `share` the last
    of them on VectorE: its first tap writes a PSUM partial sum of acc's shape (each tap where it would in acc),
    the others add to it, its last writes the sum to SBUF, which PE then adds to acc through the identity diagonal
    (DiagonalWeights with identity). VectorE's first and last taps write every output."""
    whole = [i for i, (_, dst, _) in enumerate(products) if dst.dims == products[0][1].dims]
    if share and len(whole) < 3:
        share = 0  # (PE's first tap and VectorE's first and last must write every output)
    on_vector: list[int] = []
    if share:
        ends = whole[-2:]
        middle = [i for i in range(len(products) - 1, 0, -1) if i not in ends][:share - 2]
        on_vector = [ends[0], *sorted(middle), ends[1]] if share > 1 else [ends[1]]
    first = True
    for i, (t, dst, moving) in enumerate(products):
        if i in on_vector:
            continue
        prog.emit("nc_matmul", Engine.PE, dst=dst, stationary=diagonal_tap(tile, t, channels), moving=moving,
                  accumulate=not first)
        first = False
    if not on_vector:
        return
    assert scalars is not None
    partial = prog.psum(acc.partitions, acc.free, f"{weights.name}/partial")
    total = prog.sbuf(channels, acc.free, weights.dtype, f"{weights.name}/vector_taps")
    for n, i in enumerate(on_vector):
        t, into, moving = products[i]
        column = scalars.ap(((1, 1),), t, 0, channels)
        part = replace(into, tile=partial)
        dst = total.ap(((acc.free, 1),), 0, 0, channels) if n == len(on_vector) - 1 else part
        if n == 0:
            prog.emit("tensor_scalar", Engine.DVE, dst=dst, src=moving, op0=AluOp.multiply, scalar0=column,
                      reverse0=False, reverse1=False)
        else:
            prog.emit("scalar_tensor_tensor", Engine.DVE, dst=dst, src=moving, op0=AluOp.multiply, scalar=column,
                      op1=AluOp.add, b=part)
    prog.emit("nc_matmul", Engine.PE, dst=acc.ap(((acc.free, 1),), 0, 0, channels),
              stationary=diagonal_tap(tile, weights.columns - 1, channels),
              moving=total.ap(((acc.free, 1),), 0, 0, channels), accumulate=True)


def diagonal_tap(tile: Tile, tap: int, channels: int) -> TileAccess:
    """Tap `tap` of a tile of diagonal_weights: [channels, channels], element (c, j) at c's j * taps + tap."""
    taps = tile.free // tile.partitions
    return tile.ap(((channels, taps),), tap, 0, channels)


@dataclass(frozen=True)
class BandWindows:
    """Where a banded depthwise convolution reads its input: for image n and the group of bands whose first output
    row is r0 (`groups`), a window tile [bands * C, image] in the matmul's type, band b's on partitions b * C ..,
    each band's window laid out as a whole band's (past the last output row too), rows `strides[0]` apart. Over
    rows shorter than an efficient DMA piece (`flat`) the windows hold the input's rows whole (a run per band, not
    a piece per row), the taps along the row writing only the outputs they reach (windows.window_taps)."""

    geo: ConvGeometry
    bands: int
    per_band: int
    flat: bool
    strides: tuple[int, ...]
    image: int
    dtype: DType

    def groups(self, images: int) -> list[tuple[int, int]]:
        """(image, first output row) of each group of bands, in the order the convolution computes them."""
        return [(n, r0) for n in range(images) for r0 in range(0, self.geo.axes[0].out, self.bands * self.per_band)]

    def blocks(self, n: int, r0: int) -> list[Block]:
        """The outputs of each band of the group, past the last output row too."""
        cols = self.geo.axes[1]
        return [Block(n, 1, (r0 + b * self.per_band, 0), (self.per_band, cols.out)) for b in range(self.bands)]

    def needs_fill(self, n: int, r0: int) -> bool:
        """Whether some of the group's windows has no input element (padding, rows past the input's last)."""
        axes = self.geo.axes[:-1] if self.flat else self.geo.axes
        return any(needs_fill(block, axes) for block in self.blocks(n, r0))


def band_windows(ctx: LowerCtx, node: Node, geo: ConvGeometry, bands: int, per_band: int) -> BandWindows:
    dtype = ctx.program.operand_dtype(DType.fp32)
    first = Block(0, 1, (0, 0), (per_band, geo.axes[1].out))
    # (the input's type: that of the tensor in HBM, which its producer may not have made yet)
    flat = flat_window(first, geo.axes, ctx.dtype(node.inputs[0]), dtype)
    strides, image = window_strides(first, geo.axes, flat)
    return BandWindows(geo, bands, per_band, flat, strides, image, dtype)


def remainder_bands(ctx: LowerCtx, node: Node, geo: ConvGeometry, window_budget: int
                    ) -> tuple[ConvGeometry, int, int] | None:
    """For a depthwise convolution over more channels than the partitions, the last tile's when few enough for
    bands (at most half the partitions): (its geometry, bands, output rows a band), else None. PE streams a column
    per output pixel whatever a tile's channels, so the last tile of 16 of 144 channels costs what a whole one
    does; banded (lower_banded_depthwise over those channels) it takes a fraction of the columns (MobileNetV2's
    144-channel layers at 56 x 56: 9 x 3,136 columns for 16 channels, 9 x 504 in 8 bands of 3 rows). Only where
    the bands take at most half the columns: the remainder's own windows and epilogue add instructions to the
    layer's chain (MobileNetV3's 16 of 144 channels at 14 x 14, in two bands of 10 rows, 140 columns a tap instead
    of 196: 80.0 -> 81.4 us in bf16)."""
    pmax = ctx.program.target.partitions
    rest = geo.channels % pmax
    if not geo.depthwise or geo.channels < pmax or rest == 0:
        return None
    part = replace(geo, groups=rest, channels=rest, outputs=rest)
    bands, per_band = band_plan(ctx, node, part, window_budget)
    rows = geo.axes[0].out
    if bands < 2 or 2 * -(-rows // (bands * per_band)) * per_band > rows:
        return None
    return part, bands, per_band


def lower_banded_depthwise(ctx: LowerCtx, node: Node, geo: ConvGeometry, bands: int, per_band: int,
                           first: int = 0) -> None:
    """`first`: where geo's channels start among the node's (remainder_bands: the last tile's), else 0 (all)."""
    prog = ctx.program
    c, p = geo.channels, bands * geo.channels
    # (a remainder's output: the tensor the node's whole tiles store to)
    out = ctx.views[node.outputs[0]] if first else None
    x, epilogue = ctx.view(node.inputs[0]), Epilogue(ctx, node, bands, (first, c), out)
    src = x.transpose((1, 0, 2, 3)).slice(0, first, first + c)  # (C, batch, rows, columns)
    rows, cols = geo.axes
    share = vector_taps(prog, geo, per_band * cols.out, p)
    diagonals = DiagonalWeights(ctx, node, geo, bands, identity=share > 0, first=first)
    weights = diagonals.load(0, p)
    scalars = diagonals.scalars(0, p) if share else None
    column = epilogue.bias_column(p, [(b * c, first, c) for b in range(bands)])
    taps = list(itertools.product(*(range(k) for k in geo.kernel)))
    plan = band_windows(ctx, node, geo, bands, per_band)
    # the windows its producer wrote (a stem's bands, lower/banded_stem.py), else loaded here
    written = ctx.windows.pop(node.inputs[0], None) if first == 0 else None
    assert written is None or written[0] == plan, (written, plan)
    groups = plan.groups(x.shape[0])
    mean = _mean_reader(ctx, node, plan, epilogue, x.shape[0]) if first == 0 else None
    sums = prog.sbuf(p, len(groups), DType.fp32, f"{node.name}/sums") if mean is not None else None
    for g, (n, r0) in enumerate(groups):
        whole = plan.blocks(n, r0)
        window = written[1][n, r0] if written is not None else None
        if window is None:
            window = prog.sbuf(p, plan.image, plan.dtype, f"{node.name}/x")
            if plan.needs_fill(n, r0):
                prog.emit("memset", Engine.POOL, dst=window.ap(), value=0.0)
            for b, block in enumerate(whole):
                fill_window(prog, window, src, block, geo.axes, b * c, flat=plan.flat)
        acc = prog.psum(p, per_band * cols.out, f"{node.name}/acc")
        products = window_taps(window, (plan.image, *plan.strides), whole[0], geo.axes, taps, p, acc, plan.flat)
        diagonal_products(prog, acc, diagonals, weights, scalars, products, p, share)
        parts = [(Block(n, 1, block.starts, (min(per_band, rows.out - block.starts[0]), cols.out)), b * c, first, c)
                 for b, block in enumerate(whole) if block.starts[0] < rows.out]
        epilogue.finish(acc, column, parts, sums=sums.ap(((1, 1),), g) if sums is not None else None)
    if mean is not None and sums is not None:
        ctx.means[mean.outputs[0]] = _band_means(ctx, node, plan, sums)


def _mean_reader(ctx: LowerCtx, node: Node, plan: BandWindows, epilogue: Epilogue, images: int) -> Node | None:
    """A ReduceMean over the rows and columns of the convolution's output, or a GlobalAveragePool (a
    squeeze-and-excitation's pooling, MobileNetV3's first block; TorchScript exports it with the latter), when
    the epilogue can give each partition's sum as it evacuates a group of bands (Epilogue.can_sum) and every band
    of a group is whole or wholly past the last output row (a band's sum is then all its own or none of it counts):
    the sums become the mean (_band_means), where the pooling read the output back, after a transfer of each
    band's rows to the channels' partitions, on C partitions."""
    rows = plan.geo.axes[0]
    if images != 1 or not epilogue.can_sum() or rows.out % plan.per_band:
        return None
    return next((r for r in ctx.consumers.get(node.outputs[0], []) if r.inputs[0] == node.outputs[0] and
                 (r.op == "GlobalAveragePool" or r.op == "ReduceMean" and reduced_axes(r, ctx.graph) == (2, 3))),
                None)


def _band_means(ctx: LowerCtx, node: Node, plan: BandWindows, sums: Tile) -> Tile:
    """The channels' means [C, 1] from each group's sums [B * C, 1] (column g of `sums`): PE adds each group's
    bands, a band's channel c on partition b * C + c, through a [B * C, C] matrix of ones where the band holds
    outputs (zeros for the bands past the last row), every group into one accumulation, and ScalarE scales by 1 /
    (rows x columns) as it leaves the bank. In fp32: the sums are not rounded."""
    prog, c = ctx.program, plan.geo.channels
    rows, cols = plan.geo.axes
    groups = plan.groups(1)
    ones = np.zeros((sums.partitions, len(groups) * c), np.float32)
    for g, (n, r0) in enumerate(groups):
        for b, block in enumerate(plan.blocks(n, r0)):
            if block.starts[0] < rows.out:
                ones[b * c:(b + 1) * c, g * c:(g + 1) * c] = np.eye(c, dtype=np.float32)
    tensor = prog.hbm_tensor(f"{node.name}/band_sums", ones.nbytes, TensorKind.WEIGHT, DType.fp32, ones.tobytes())
    tensor.needed = 0  # (not the model's data: the roofline leaves it out)
    matrix = prog.sbuf(sums.partitions, ones.shape[1], DType.fp32, f"{node.name}/band_sums")
    prog.dma(matrix.ap(), HbmView(tensor, DType.fp32, ones.shape, (ones.shape[1], 1)))
    total = prog.psum(c, 1, f"{node.name}/total")
    for g in range(len(groups)):
        prog.emit("nc_matmul", Engine.PE, dst=total.ap(), stationary=matrix.ap(((c, 1),), g * c),
                  moving=sums.ap(((1, 1),), g), accumulate=g > 0)
    mean = prog.sbuf(c, 1, DType.fp32, f"{node.name}/mean")
    act(prog, mean.ap(), total.ap(), ActFunc.copy, scale=1.0 / (rows.out * cols.out))
    return mean
