"""Conv and ConvTranspose on the Tensor engine: a sum of matmuls over kernel taps and input-channel tiles.

    out[m, pixels] = sum over taps t and input channels c of  W[m, c, t] * window_t[c, pixels]

Input channels go on partitions. For each block of outputs (at most one PSUM bank of pixels, windows.py), the
padded input window of each tile of at most pmax input channels is loaded once; every tap is then one nc_matmul
whose stationary operand is the weight slice [channels, output channels] of that tap and whose moving operand is
the window read with the convolution's strides and dilations, all accumulating in one PSUM bank. ScalarE evacuates
the bank adding the bias (a [P, 1] operand: output channels are on partitions) and DMA stores the block.

Groups make the weights of a pair (input-channel tile, output-channel tile) block-diagonal; an output tile reads
only the input channels of its groups, so depthwise convolution is a diagonal stationary per tap over pmax
channels at a time. ConvTranspose is the convolution of the input with zeros inserted between its elements
(`up` = stride), padded by dilation * (kernel - 1) - pads, the kernel flipped and its channel axes swapped.
Constant weights are arranged per pair at compile time, so that each pair loads with one contiguous DMA.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable

import numpy as np

from isa.dtypes import DType
from isa.instructions import pe_rate
from isa.functions import AluOp
from isa.operand import Engine
from isa.target import TARGETS, Target
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.banded_stem import (depthwise_reader, lower_banded_stem, lower_stem_into_windows, stem_bands,
                                               stem_packing)
from neuronx_cc_lite.lower.conv_epilogue import Epilogue
from neuronx_cc_lite.lower.conv_geometry import (ConvGeometry, conv_geometry, conv_transpose_geometry, weight_budget,
                                                 window_budget)
from neuronx_cc_lite.lower.depthwise import (DiagonalWeights, band_plan, diagonal_products, lower_banded_depthwise,
                                             remainder_bands, vector_taps)
from neuronx_cc_lite.lower.row_depthwise import lower_row_depthwise, row_groups
from neuronx_cc_lite.lower.patterns import dma_tile
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Columns, Program, Tile, TileAccess
from neuronx_cc_lite.lower.windows import (Axis, Block, blocks, flat_window, load_moved_windows, load_tight,
                                           load_windows, row_phase, short_rows, tight_taps, tight_window,
                                           window_ap, window_taps)


# check() runs before a target is chosen: it judges by the target with the least SBUF.
SMALLEST = min(TARGETS.values(), key=lambda t: t.sbuf_partition_bytes)


PACK_CHANNELS = 16  # at most this many input channels: the taps of an image stem, not of a hidden layer


def _check(geometry: Callable[[Node, Graph], ConvGeometry | str]) -> Callable[[Node, Graph], str | None]:
    def check(node: Node, g: Graph) -> str | None:
        geo = geometry(node, g)
        if isinstance(geo, str):
            return geo
        if math.prod(ax.extent for ax in geo.axes) > window_budget(SMALLEST):
            return f"the window of one output ({[ax.extent for ax in geo.axes]}) does not fit an SBUF tile"
        if geo.weight_bytes(1, SMALLEST) > weight_budget(SMALLEST):
            return f"the weights of one output channel ({geo.channels} x {geo.taps} taps) do not fit SBUF"
        return None

    return check


# ---- weights ---------------------------------------------------------------------------------------------------

WeightLoader = Callable[[int, int, int, int], Tile]  # (c0, ct, co0, mt) -> tile [ct, taps * mt]


def _per_group(w: np.ndarray | HbmView, geo: ConvGeometry, g: int) -> np.ndarray | HbmView:
    """Group g's weights as (input channels, output channels, *kernel), unflipped."""
    if geo.transposed:
        return w[g * geo.group_in:(g + 1) * geo.group_in] if isinstance(w, np.ndarray) else \
            w.slice(0, g * geo.group_in, (g + 1) * geo.group_in)
    rest = tuple(range(2, 2 + len(geo.kernel)))
    if isinstance(w, np.ndarray):
        return w[g * geo.group_out:(g + 1) * geo.group_out].transpose((1, 0, *rest))
    return w.slice(0, g * geo.group_out, (g + 1) * geo.group_out).transpose((1, 0, *rest))


def _constant_weights(ctx: LowerCtx, node: Node, geo: ConvGeometry,
                      pairs: list[tuple[int, int, int, int]]) -> WeightLoader:
    """Every pair's block [ct, taps, mt] laid out at compile time in one weight tensor."""
    w = ctx.graph.tensors[node.inputs[1]].value.astype(np.float64)
    dtype = ctx.program.operand_dtype(DType.fp32)  # auto-cast: stored in the type the matmul reads
    parts, where = [], {}
    at = 0
    for c0, ct, co0, mt in pairs:
        block = np.zeros((ct, geo.taps, mt))
        for g, c_lo, cn, m_lo, mn in geo.intersections(c0, ct, co0, mt):
            c, m = c_lo - g * geo.group_in, m_lo - g * geo.group_out
            sub = _per_group(w, geo, g)[c:c + cn, m:m + mn]
            block[c_lo - c0:c_lo - c0 + cn, :, m_lo - co0:m_lo - co0 + mn] = \
                sub.reshape(cn, mn, geo.taps).transpose(0, 2, 1)
        parts.append(block.ravel())
        where[(c0, co0)] = at
        at += block.size
    data = np.concatenate(parts).astype(dtype.np)
    tensor = ctx.program.hbm_tensor(f"{node.name}/weights", data.nbytes, TensorKind.WEIGHT, dtype, data.tobytes())
    tensor.needed = min(data.nbytes, w.size * dtype.size)  # grouped: the blocks off the diagonals are zeros

    def load(c0: int, ct: int, co0: int, mt: int, into: TileAccess | None = None) -> Tile:
        """The pair's block in a tile of its own, or `into` a region of another (_scaled_rows)."""
        tile = ctx.program.sbuf(ct, geo.taps * mt, dtype, f"{node.name}/w") if into is None else into.tile
        view = HbmView(tensor, dtype, (ct, geo.taps * mt), (geo.taps * mt, 1), where[(c0, co0)])
        ctx.program.dma(tile.ap() if into is None else into, view)
        return tile

    return load


def _runtime_weights(ctx: LowerCtx, node: Node, geo: ConvGeometry) -> WeightLoader:
    """Weights computed at run time: each group's part of a pair is one DMA that transposes it into place."""
    w = ctx.view(node.inputs[1])
    kernel_strides = tuple(math.prod(geo.kernel[k + 1:]) for k in range(len(geo.kernel)))

    def load(c0: int, ct: int, co0: int, mt: int) -> Tile:
        prog = ctx.program
        tile = prog.sbuf(ct, geo.taps * mt, prog.operand_dtype(DType.fp32), f"{node.name}/w")
        if geo.groups > 1:
            prog.emit("memset", Engine.POOL, dst=tile.ap(), value=0.0)
        for g, c_lo, cn, m_lo, mn in geo.intersections(c0, ct, co0, mt):
            part = _per_group(w, geo, g)
            assert isinstance(part, HbmView)
            view = part.box((c_lo - g * geo.group_in, m_lo - g * geo.group_out) + (0,) * len(geo.kernel),
                            (cn, mn, *geo.kernel))
            dma_tile(prog, tile, view, (1, *(s * mt for s in kernel_strides)), m_lo - co0, c_lo - c0)
        return tile

    return load


def _scaled_rows(ctx: LowerCtx, node: Node, load: WeightLoader, pairs: list[tuple[int, int, int, int]],
                 taps: int) -> WeightLoader:
    """A ConvEpilogue's input scale s, one value per input channel ([1, C, 1, ...]: a squeeze-and-excitation
    gate): conv(x * s) is the convolution of x with each input channel's weights times s, so the weights' rows
    (input channels on partitions) are scaled on chip: ct x taps x mt products where scaling the input would take
    one per input element (the pass admits only 1x1 convolutions of one image). An output tile's K tiles of weights
    lie side by side in one tile, and one VectorE instruction scales every full one (s read as [128, K tiles], each
    column along its tile's row), one more a short last: the gate reaches the matmuls through one instruction on
    the chain, where a tile's each took its own (MobileNetV3's 576-channel gates: five). With `scale_max`, min(s,
    limit) * w in the same instruction (passes/fuse_epilogues.py moves the gate's clamp here)."""
    prog, scale, pmax = ctx.program, ctx.view(node.inputs[4]), ctx.program.target.partitions
    limit = node.attrs.get("scale_max")
    scaled: dict[int, Tile] = {}

    def scale_all(co0: int, mt: int) -> Tile:
        ks = [(c0, ct) for c0, ct, o, _ in pairs if o == co0]
        width = taps * mt
        dtype = prog.operand_dtype(DType.fp32)
        tile = prog.sbuf(max(ct for _, ct in ks), len(ks) * width, dtype, f"{node.name}/w")
        for k, (c0, ct) in enumerate(ks):
            load(c0, ct, co0, mt, into=tile.ap(((width, 1),), k * width, 0, ct))  # type: ignore[call-arg]
        column = prog.sbuf(tile.partitions, len(ks), DType.fp32, f"{node.name}/scale")
        full = sum(1 for _, ct in ks if ct == pmax)
        runs = [(0, full, pmax)] if full else []
        runs += [(k, 1, ct) for k, (_, ct) in enumerate(ks) if ct != pmax]
        s1 = scale.strides[1]
        for k0, count, ct in runs:  # K tiles k0 .. k0 + count of ct partitions: a [ct, count] block of s
            prog.dma(column.ap(((count, 1),), k0, 0, ct),
                     HbmView(scale.tensor, scale.dtype, (ct, count), (s1, pmax * s1), scale.offset + ks[k0][0] * s1))
        for k0, count, ct in runs:
            region = tile.ap(((count * width, 1),), k0 * width, 0, ct)
            gate = column.ap(((count, 1), (width, 0)), k0, 0, ct)  # each K tile's column along its rows
            prog.emit("scalar_tensor_tensor", Engine.DVE, dst=region, src=gate,
                      op0=AluOp.minimum if limit is not None else AluOp.multiply,
                      scalar=float(limit) if limit is not None else 1.0, op1=AluOp.multiply, b=region)
        return tile

    def load_scaled(c0: int, ct: int, co0: int, mt: int) -> Tile | Columns:
        if co0 not in scaled:
            scaled[co0] = scale_all(co0, mt)
        k = [c for c, _, o, _ in pairs if o == co0].index(c0)
        return Columns(scaled[co0], k * taps * mt, taps * mt, ct)

    return load_scaled  # type: ignore[return-value]


# ---- the lowering ----------------------------------------------------------------------------------------------


def packed_taps(ctx: LowerCtx, node: Node, geo: ConvGeometry) -> tuple[int, int]:
    """(taps along the last spatial axis that share a matmul, row phases): (1, 1) packs nothing. A convolution
    over few input channels (an image's 3) would otherwise contract over a few of the 128 PE rows per tap: a 7x7
    stem over RGB takes 49 passes at 2% of the array. Packed, partition block j of the window holds the input
    moved by j taps, so one access pattern reads tap (.., w0 + j) on block j, and the stationary operand stacks
    the taps' weights: 7 passes over 21 rows.

    With a stride s along the first of two spatial axes, the rows split into s phases (rows ph, ph + s, ...):
    tap kh = s * k + ph of output row o reads row o + k of phase ph, so stacking the phases' blocks too, one pass
    covers s kernel rows: the stem's 7 passes become 4 over 42 rows, and each input row is still loaded once per
    shift (a phase holds only its own rows)."""
    pmax = ctx.program.target.partitions
    if geo.transposed or geo.groups != 1 or geo.channels > pmax // 2 or geo.kernel[-1] < 2:
        return 1, 1
    if not ctx.graph.tensors[node.inputs[1]].is_constant:
        return 1, 1
    packed = min(geo.kernel[-1], pmax // geo.channels)
    target, x = ctx.program.target, ctx.graph.tensors[node.inputs[0]]
    dtype = ctx.program.operand_dtype(DType.fp32)
    outputs = x.shape[0] * math.prod(ax.out for ax in geo.axes)
    short = short_rows(geo.axes, max(x.dtype.itemsize, dtype.size))
    if geo.channels > PACK_CHANNELS and (not _packing_pays(target, geo, packed, outputs, x.size * x.dtype.itemsize,
                                                           dtype) or (packed < geo.kernel[-1] and short)):
        # (copies of short rows that do not cover the row's taps are cut a piece per row: windows.flat_rows)
        return 1, 1
    rows = geo.axes[0]
    phases = min(rows.stride, rows.kernel) if len(geo.axes) == 2 and rows.dilation == 1 and rows.up == 1 else 1
    if phases < 2 or packed < geo.kernel[-1] or phases * packed * geo.channels > pmax:
        return packed, 1  # (with every shift of a row in one block, a group's rows are one range of partitions)
    # Phases halve each window load, and a queue keeps only two transfers in flight, each paying the DMA
    # latency: worth it only where the matmuls take well over the loads' time at full DMA bandwidth. ResNet's
    # stem in fp32 (matmuls at a quarter of the bf16 rate: 126 us against 16 us of loads) gains 54 us; in bf16
    # (31 us against 16) it ran 7% slower with them. A phase's rows are apart in the input, a DMA piece each: not
    # where rows are short (windows.short_rows), whose windows load whole otherwise.
    if short:
        return packed, 1
    matmul_ns = rows.kernel * outputs / pe_rate(dtype, target) / target.pe_ghz
    loads_ns = packed * x.size * x.dtype.itemsize / (target.dma_queues * target.dma_queue_gbps)
    return packed, phases if matmul_ns > 3 * loads_ns else 1


PACKING_MARGIN = 3.0  # (_packing_pays)


def _packing_pays(target: Target, geo: ConvGeometry, packed: int, outputs: float, input_bytes: int,
                  dtype: DType) -> bool:
    """Whether packing the taps gains: each extra copy of the window is another load of the input, against the
    passes it saves (3x3 over 64 channels: 6 passes, not 9), over `outputs` columns a pass, by PACKING_MARGIN. A
    hidden layer's convolution (more channels than a stem's) asks for 3x: ResNet's 64-channel 3x3 layers in fp32,
    where PE runs at a quarter of the bf16 rate, save 13 us of matmuls each against 3 us of loads; in bf16 they
    would save 3.4 us against 1.5 us: too close to the loads' latency to gain (the issue's arithmetic on a 3x3
    64->64 convolution in bf16). A banded stem decides by its own estimate (banded_stem.stem_packing)."""
    saved_passes = math.prod(geo.kernel[:-1]) * (geo.kernel[-1] - -(-geo.kernel[-1] // packed))
    saved_ns = saved_passes * outputs / pe_rate(dtype, target) / target.pe_ghz
    loads_ns = (packed - 1) * input_bytes / (target.dma_queues * target.dma_queue_gbps)
    return saved_ns > PACKING_MARGIN * loads_ns


def _packed_weights(ctx: LowerCtx, node: Node, geo: ConvGeometry, packed: int, phases: int,
                    groups: list[tuple[tuple[int, ...], int, int]], co0: int, mt: int) -> Tile:
    """[phases * packed * C, groups x mt]: for tap group q, rows (ph * packed + j) * C + c hold
    W[co0 .. co0 + mt, c, tap (.., w0 + j)], the first axis' tap s * k + ph for the group's k with phases."""
    w = ctx.graph.tensors[node.inputs[1]].value.astype(np.float64)[co0:co0 + mt]  # [mt, C, *kernel]
    c, stride = geo.channels, geo.axes[0].stride
    rows = phases * packed * c
    block = np.zeros((rows, len(groups), mt))
    for q, (outer, w0, count) in enumerate(groups):
        for ph in range(phases):
            taps = (stride * outer[0] + ph,) if phases > 1 else outer
            if taps and taps[0] >= geo.kernel[0]:
                continue
            for j in range(count):
                r0 = (ph * packed + j) * c
                block[r0:r0 + c, q] = w[(slice(None), slice(None), *taps, w0 + j)].T
    dtype = ctx.program.operand_dtype(DType.fp32)
    data = block.astype(dtype.np)
    tensor = ctx.program.hbm_tensor(f"{node.name}/packed_weights{co0}", data.nbytes, TensorKind.WEIGHT, dtype,
                                    data.tobytes())
    tile = ctx.program.sbuf(rows, len(groups) * mt, dtype, f"{node.name}/w")
    ctx.program.dma(tile.ap(), HbmView(tensor, dtype, (rows, len(groups) * mt), (len(groups) * mt, 1)))
    return tile


def lower_windowed_matmul(ctx: LowerCtx, node: Node, geo: ConvGeometry) -> None:
    prog, target = ctx.program, ctx.program.target
    written = ctx.windows.get(node.inputs[0])  # windows its producer wrote, with its bands (banded_stem.py)
    bands, per_band = (written[0].bands, written[0].per_band) if written is not None else \
        band_plan(ctx, node, geo, window_budget(target))
    if bands > 1:  # a depthwise convolution over few channels: bands of output rows share the partitions
        lower_banded_depthwise(ctx, node, geo, bands, per_band)
        return
    groups = row_groups(ctx, node, geo) if written is None else 0
    if groups:  # a depthwise convolution with each channel's rows on the partitions
        lower_row_depthwise(ctx, node, geo, groups)
        return
    x = ctx.view(node.inputs[0])
    rank, batch, pmax = len(geo.kernel), x.shape[0], target.partitions
    mt_max = geo.output_tile(target)
    scaled = len(node.inputs) > 4 and bool(node.inputs[4])  # a ConvEpilogue's input scale (_scaled_rows)
    constant = ctx.graph.tensors[node.inputs[1]].is_constant
    # a depthwise convolution's last tile of few channels in bands of rows, after the whole tiles
    remainder = remainder_bands(ctx, node, geo, window_budget(target)) if constant and not scaled else None
    whole_tiles = geo.outputs - remainder[0].channels if remainder is not None else geo.outputs
    co_tiles = [(co0, min(mt_max, whole_tiles - co0)) for co0 in range(0, whole_tiles, mt_max)]
    packed, phases = packed_taps(ctx, node, geo)
    bands, per_band = stem_bands(ctx, node, geo, packed, window_budget(target))
    if bands > 1 and not scaled:  # a stem over few output channels: bands of output rows share the partitions
        x_info = ctx.graph.tensors[node.inputs[0]]
        copies = stem_packing(target, geo, packed, bands, per_band, batch, x_info.size * x_info.dtype.itemsize,
                              prog.operand_dtype(DType.fp32))
        reader = depthwise_reader(ctx, node, geo, copies)
        if reader is not None:
            lower_stem_into_windows(ctx, node, geo, copies, reader)
        else:
            lower_banded_stem(ctx, node, geo, copies, bands, per_band)
        return
    # the windows' geometry: with row phases, that of one phase (each holds its rows only)
    window_axes_ = [row_phase(geo.axes[0], 0)[0], *geo.axes[1:]] if phases > 1 else geo.axes
    chunks = {}
    for co0, mt in co_tiles:
        lo, hi = geo.input_range(co0, mt)
        chunks[co0] = [(c0, min(pmax, hi - c0)) for c0 in range(lo, hi, pmax)]
    pairs = [(c0, ct, co0, mt) for co0, mt in co_tiles for c0, ct in chunks[co0]]
    diagonal = geo.depthwise and constant  # each tap's weights a diagonal, loaded without its zeros
    out_max = min(target.psum_bank_fmax, target.gemm_moving_fmax)
    plan = blocks(batch, window_axes_, out_max, window_budget(target))
    share = vector_taps(prog, geo, plan[0].size, mt_max) if diagonal and not scaled else 0
    if diagonal:
        diagonals = DiagonalWeights(ctx, node, geo, identity=share > 0)

        def load_weights(c0: int, ct: int, co0: int, mt: int) -> Tile:  # (an output tile reads its own channels)
            return diagonals.load(c0, ct)
    else:
        load_weights = _constant_weights(ctx, node, geo, pairs) if constant else _runtime_weights(ctx, node, geo)
    if scaled:
        load_weights = _scaled_rows(ctx, node, load_weights, pairs, geo.taps)
    taps = list(itertools.product(*(range(k) for k in geo.kernel)))
    # with packing, a tap group: (the taps of the axes before the last, first last-axis tap, taps in the group);
    # with row phases, the first axis' taps are the phases' (k of tap s * k + ph)
    outer_kernel = (window_axes_[0].kernel, *geo.kernel[1:-1]) if phases > 1 else geo.kernel[:-1]
    groups = [(outer, w0, min(packed, geo.kernel[-1] - w0))
              for outer in itertools.product(*(range(k) for k in outer_kernel))
              for w0 in range(0, geo.kernel[-1], packed)]
    spatial = tuple(range(2, 2 + rank))
    epilogue = Epilogue(ctx, node)
    bank = _shared_bank(prog, node, plan, co_tiles, epilogue, packed, out_max, geo.taps)
    for t, (co0, mt) in enumerate(co_tiles):
        if packed > 1:
            packed_w = _packed_weights(ctx, node, geo, packed, phases, groups, co0, mt)
        else:
            weights = [load_weights(c0, ct, co0, mt) for c0, ct in chunks[co0]]
            scalars = diagonals.scalars(co0, mt) if share else None
        column = epilogue.bias_column(mt, [(0, co0, mt)])
        for block in plan:
            acc: Tile | Columns = prog.psum(mt, block.size, f"{node.name}/acc") if bank is None else \
                Columns(bank, t * block.size, block.size, mt)
            if packed > 1:
                _packed_products(prog, acc, packed_w, x, block, geo, packed, phases, groups, mt, node.name)
            else:
                first = True
                for (c0, ct), w in zip(chunks[co0], weights):
                    src = x.box((0, c0) + (0,) * rank, (batch, ct, *x.shape[2:])).transpose((1, 0, *spatial))
                    dtype = prog.operand_dtype(DType.fp32)
                    # the images as they lie, no padding; not where VectorE takes a share of a depthwise
                    # convolution's taps, whose first and last must each write every output, as PE's first does
                    # (one tap alone does), nor for a transposed convolution (its taps read the kernel flipped)
                    if not share and not geo.transposed and tight_window(block, geo.axes):
                        window = load_tight(prog, src, block, geo.axes, dtype, f"{node.name}/x")
                        products = tight_taps(window, block, geo.axes, taps, ct, acc)
                    else:
                        flat = flat_window(block, geo.axes, src.dtype, dtype)
                        window, strides = load_windows(prog, src, block, geo.axes, 0.0, f"{node.name}/x", dtype,
                                                       flat)
                        # (tap t of a transposed convolution reads the kernel flipped)
                        products = [(geo.taps - 1 - t if geo.transposed else t, dst, moving) for t, dst, moving in
                                    window_taps(window, strides, block, geo.axes, taps, ct, acc, flat)]
                    if diagonal:
                        assert isinstance(acc, Tile)  # (a depthwise convolution's banks are its own: _shared_bank)
                        diagonal_products(prog, acc, diagonals, w, scalars, products, mt, share)
                        continue
                    for w_tap, dst, moving in products:
                        prog.emit("nc_matmul", Engine.PE, dst=dst, stationary=w.ap(((mt, 1),), w_tap * mt),
                                  moving=moving, accumulate=not first)
                        first = False
            if bank is None:
                epilogue.finish(acc, column, [(block, 0, co0, mt)], co0)
    if bank is not None:
        epilogue.finish_side_by_side(bank, plan[0], co_tiles)
    if remainder is not None:
        part, bands, per_band = remainder
        lower_banded_depthwise(ctx, node, part, bands, per_band, first=whole_tiles)


def _shared_bank(prog: Program, node: Node, plan: list[Block], co_tiles: list[tuple[int, int]], epilogue: Epilogue,
                 packed: int, out_max: int, taps: int) -> Tile | None:
    """One PSUM bank for every output tile of a single small block, side by side in its columns, when the epilogue
    reads the bank itself (a hard activation, the bias added by PE): its instructions then run once over them all
    instead of once a tile, each paying the fixed overhead of a dependent instruction for a few columns
    (MobileNetV3's 576-channel layers at 7x7: five ScalarE and five VectorE instructions of 49 columns become one
    of each over 245). Not for a convolution of several taps (a depthwise one): there the matmuls of the next
    tile run while one tile's epilogue does, which a shared bank would make wait for the last (MobileNetV3 bf16
    with its depthwise layers' banks shared too: 116.9 us, against 110.2). Only for blocks of fewer columns than
    an instruction needs to run efficiently (target.min_efficient_elements): over more, the instructions' fixed
    costs weigh less than the columns, and a tile's own epilogue lets its reader start on it while the next
    tile's runs (MobileNetV3's expansions at 14x14, 196 columns a tile, feeding depthwise layers tile by tile: bf16
    81.4 -> 80.4 us with them apart)."""
    if packed > 1 or taps > 1 or len(plan) != 1 or len(co_tiles) < 2 or not epilogue.direct or \
            len(co_tiles) * plan[0].size > out_max or plan[0].size >= prog.target.min_efficient_elements:
        return None
    return prog.psum(co_tiles[0][1], len(co_tiles) * plan[0].size, f"{node.name}/acc")


def _packed_products(prog: Program, acc: Tile, weights: Tile, x: HbmView, block: Block, geo: ConvGeometry,
                     packed: int, phases: int, groups: list[tuple[tuple[int, ...], int, int]], mt: int,
                     name: str) -> None:
    """The block's window, copied `packed` times onto partition blocks each moved one tap further along the last
    axis (for each row phase, of that phase's rows), then one matmul per tap group."""
    c, rank = geo.channels, len(geo.kernel)
    src = x.transpose((1, 0, *range(2, 2 + rank)))  # (C, batch, *inputs)
    views = [(geo.axes, src)]
    if phases > 1:
        views = []
        for ph in range(phases):
            axis, first = row_phase(geo.axes[0], ph)
            views.append(([axis, *geo.axes[1:]], src.slice(2, first, src.shape[2], geo.axes[0].stride)))
    shifts = [j * geo.axes[-1].dilation for j in range(packed)]
    window, strides = load_moved_windows(prog, views, block, shifts, prog.operand_dtype(DType.fp32), f"{name}/x")
    for q, (outer, w0, count) in enumerate(groups):
        # the phases with a tap in this group's kernel row (the last may have fewer), each all its shifts
        rows = count * c if phases == 1 else \
            min(phases, geo.kernel[0] - geo.axes[0].stride * outer[0]) * packed * c
        prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=weights.ap(((mt, 1),), q * mt, 0, rows),
                  moving=window_ap(window, strides, block, views[0][0], (*outer, w0), rows),
                  accumulate=q > 0)


def _geometry_or_fail(geo: ConvGeometry | str, node: Node) -> ConvGeometry:
    if isinstance(geo, str):
        raise CompileError("NCC_UNSUPPORTED", geo, node.name, node.op)
    return geo


@lowering("Conv", "ConvEpilogue", check=_check(conv_geometry))
def lower_conv(ctx: LowerCtx, node: Node) -> None:
    lower_windowed_matmul(ctx, node, _geometry_or_fail(conv_geometry(node, ctx.graph), node))


@lowering("ConvTranspose", check=_check(conv_transpose_geometry))
def lower_conv_transpose(ctx: LowerCtx, node: Node) -> None:
    lower_windowed_matmul(ctx, node, _geometry_or_fail(conv_transpose_geometry(node, ctx.graph), node))
