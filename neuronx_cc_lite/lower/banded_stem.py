"""A packed convolution over few output channels (an image stem), with bands of output rows stacked on the
partitions.

Packed (lower/conv.py packed_taps), a stem contracts over (shift, input channel) rows: 3 shifts x 3 channels = 9
of PE's 128 rows for MobileNetV3's 3x3 stem, and its 16 output channels fill 16 of the 128 output partitions, so
the epilogue (a HardSwish: a ScalarE and a VectorE pass) runs on 16 lanes over 112 x 112 outputs: 30 us of a
150 us network on one dependent chain. As lower/depthwise.py does for a depthwise convolution, B bands of R output
rows each take their own partitions: channel c of band b's window moved j taps on partition (j * C + c) * B + b,
its outputs on b * M .. (M output channels), and a tap group's stationary operand holds each band's [K, M] weights
in its rows and columns, so that one matmul computes B bands: B times fewer columns, the epilogue on B * M
partitions. With B fewer columns a pass, the shifted copies may load longer than the passes they save: conv.py
then packs none (K = C, a tap a pass).

    B = min(pmax // M, pmax // K, bands of R rows the outputs have);  R as lower/depthwise.band_plan
    for each image, for each group of B bands (R * B output rows):
        window [K * B, span(R) x span(W)]: zeros where no input lands (the padding columns; the rows above the
            image or below it, of every band: the engines start only at a quadrant's first partition, and the
            other bands' loads come after), then per shift j and channel c one load of every band's rows onto
            partitions (j * C + c) * B + b: the bands' rows lie R * stride input rows apart, one stride, so one
            transfer moves them all (a band at the image's edge, with fewer rows, apart)
        acc [B * M, R * W] = sum over tap groups of W_group.T @ (window read at the group's tap), W_group's rows
            (j, c, b) holding band b's weights in its M columns
        epilogue (lower/conv_epilogue.py), each band's rows stored from its partitions
"""

from __future__ import annotations

import itertools

import numpy as np

from isa.dtypes import DType
from isa.instructions import pe_rate
from isa.operand import Engine
from isa.target import Target
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.ir import Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.conv_epilogue import Epilogue
from neuronx_cc_lite.lower.conv_geometry import ConvGeometry, conv_geometry, window_budget
from neuronx_cc_lite.lower.depthwise import BandWindows, band_plan, band_windows
from neuronx_cc_lite.lower.patterns import dma_tile
from neuronx_cc_lite.lower.windows import Axis, Block, row_phase, short_rows, window_ap, window_strides
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Program, Tile

# Two bands halve the passes' columns but add a load per shift and channel a group of bands and the edge fills:
# ResNet's stem (64 outputs: two bands) in bf16 made ResNet-18 174.9 us banded against 160.9 without.
MIN_BANDS = 4


def stem_bands(ctx: LowerCtx, node: Node, geo: ConvGeometry, packed: int, window_budget: int) -> tuple[int, int]:
    """(bands, output rows a band) for a convolution packed_taps packs (few input channels, constant weights), 2-D
    without zero insertion, over rows long enough to load as they lie, when at least MIN_BANDS bands' outputs (M
    each) fit on the partitions; else (1, 0). Bands are taken before row phases (packed_taps): a band group's
    passes cover B bands over 1/B of the columns, where phases only halve the passes (MobileNetV3's stem in fp32:
    56 passes of 448 columns with phases, 21 of 224 banded; 235.3 -> 212.4 us)."""
    target, pmax = ctx.program.target, ctx.program.target.partitions
    if packed < 2 or len(geo.axes) != 2 or any(ax.up != 1 for ax in geo.axes):
        return 1, 0
    x = ctx.graph.tensors[node.inputs[0]]
    dtype = ctx.program.operand_dtype(DType.fp32)
    if short_rows(geo.axes, max(x.dtype.itemsize, dtype.size)):
        return 1, 0  # (their windows load whole rows: windows.flat_rows)
    rows, cols = geo.axes
    per_bank = min(target.psum_bank_fmax, target.gemm_moving_fmax) // cols.out
    per_band = min(-(-target.min_efficient_elements // cols.out), per_bank)
    bands = min(pmax // geo.outputs, pmax // (packed * geo.channels), -(-rows.out // max(per_band, 1)))
    if bands < MIN_BANDS or per_band < 1 or rows.span(per_band) * cols.span(cols.out) > window_budget:
        return 1, 0
    return bands, per_band


def stem_phases(geo: ConvGeometry, packed: int, bands: int, pmax: int) -> int:
    """Row phases of a banded stem (windows.row_phase): with a stride s along the rows, the window's rows
    split into s phases (rows ph, ph + s, ...) on their own partitions, and a pass reads kernel rows s * k + ph of
    every phase, so that the passes fall from the kernel's rows to ceil(rows / s) for the same bytes loaded (each
    input row still loaded once, into its phase): MobileNetV3's 3x3 stride-2 stem takes 6 passes, not 9. Where
    the phases' rows fit the partitions beside the bands'; else 1."""
    rows = geo.axes[0]
    phases = min(rows.stride, rows.kernel)
    if phases < 2 or rows.dilation != 1 or rows.up != 1 or bands * phases * packed * geo.channels > pmax:
        return 1
    return phases


def stem_packing(target: Target, geo: ConvGeometry, packed: int, bands: int, per_band: int, images: int,
                 input_bytes: int, dtype: DType) -> int:
    """The shifted copies of its window a banded stem loads: `packed` (lower/conv.py packed_taps) or 1, whichever
    takes less by the cost model, the longer of PE's passes and the window loads. Each copy is another load of
    the input (its bands' rows and the rows around them) in a transfer per channel, phase and group of bands, and
    short transfers pay the DMA latency, two in flight a queue: MobileNetV2's stem (32 channels, 4 bands of 2
    rows) packed loaded its input 4.5 times in 315 transfers of 9 KB, 34 us before its first matmul, for passes
    that take 6.7 us unpacked. Row phases (stem_phases) fit beside fewer copies, which take fewer passes then."""
    rows, cols = geo.axes
    columns = images * rows.out * cols.out / bands
    groups = images * -(-rows.out // (bands * per_band))
    halo = rows.span(per_band) / (per_band * rows.stride)  # input rows a group's windows load, per input row
    found = []
    for copies in sorted({1, packed}):
        phases = stem_phases(geo, copies, bands, target.partitions)
        passes = -(-geo.kernel[0] // phases) * -(-geo.kernel[1] // copies)
        pe_ns = passes * columns / pe_rate(dtype, target) / target.pe_ghz
        transfers = groups * phases * copies * geo.channels
        each_ns = copies * input_bytes * halo / transfers / target.dma_queue_gbps + target.dma_latency_ns
        dma_ns = transfers * each_ns / (target.dma_queue_depth * target.dma_queues)
        found.append((max(pe_ns, dma_ns), copies))
    return min(found)[1]


def _banded_weights(ctx: LowerCtx, node: Node, geo: ConvGeometry, packed: int, bands: int, phases: int,
                    groups: list[tuple[int, int, int]]) -> Tile:
    """[K * B, groups x B * M] (K = phases x packed x C): group q's block holds, for band b, rows
    ((ph * packed + j) * C + c) * B + b and columns b * M + m: W[m, c, kh, w0 + j] of the group's kernel row kh
    (with phases, phase ph's kernel row k is kh = s * k + ph; zero past the kernel's last row) and first column
    w0 (zero past the kernel's last column)."""
    c, m, k = geo.channels, geo.outputs, phases * packed * geo.channels
    stride = geo.axes[0].stride if phases > 1 else 1
    w = ctx.graph.tensors[node.inputs[1]].value.astype(np.float64)  # [M, C, KH, KW]
    block = np.zeros((bands * k, len(groups), bands * m))
    for q, (kr, w0, count) in enumerate(groups):
        for ph, b, j in itertools.product(range(phases), range(bands), range(count)):
            kh = stride * kr + ph
            if kh >= geo.kernel[0]:
                continue
            rows = [((ph * packed + j) * c + ci) * bands + b for ci in range(c)]
            block[rows, q, b * m:(b + 1) * m] = w[:, :, kh, w0 + j].T
    prog = ctx.program
    dtype = prog.operand_dtype(DType.fp32)  # auto-cast: stored in the type the matmul reads
    data = block.astype(dtype.np)
    tensor = prog.hbm_tensor(f"{node.name}/banded_weights", data.nbytes, TensorKind.WEIGHT, dtype, data.tobytes())
    tensor.needed = min(data.nbytes, w.size * dtype.size)  # the blocks off the diagonal are zeros
    tile = prog.sbuf(bands * k, len(groups) * bands * m, dtype, f"{node.name}/w")
    prog.dma(tile.ap(), HbmView(tensor, dtype, (bands * k, len(groups) * bands * m), (len(groups) * bands * m, 1)))
    return tile


class _Bands:
    """What every pass of a banded stem shares: the bands' weights, the epilogue and its bias column, and where the
    windows read the input: per row phase (stem_phases), the phase's axes and rows of the input."""

    def __init__(self, ctx: LowerCtx, node: Node, geo: ConvGeometry, packed: int, bands: int) -> None:
        self.prog, self.geo, self.packed, self.bands, self.name = ctx.program, geo, packed, bands, node.name
        m, (rows, cols) = geo.outputs, geo.axes
        src = ctx.view(node.inputs[0]).transpose((1, 0, 2, 3))  # (C, batch, rows, columns)
        self.phases = stem_phases(geo, packed, bands, ctx.program.target.partitions)
        self.views = [(geo.axes, src)]
        if self.phases > 1:
            self.views = []
            for ph in range(self.phases):
                axis, first = row_phase(rows, ph)
                self.views.append(([axis, cols], src.slice(2, first, src.shape[2], rows.stride)))
        self.images = src.shape[1]
        # the windows' geometry: with phases, that of phase 0 (each phase holds its rows, alike)
        self.axes = self.views[0][0]
        self.groups = [(kh, w0, min(packed, geo.kernel[1] - w0)) for kh in range(self.axes[0].kernel)
                       for w0 in range(0, geo.kernel[1], packed)]
        self.weights = _banded_weights(ctx, node, geo, packed, bands, self.phases, self.groups)
        self.epilogue = Epilogue(ctx, node, bands)
        self.column = self.epilogue.bias_column(bands * m, [(b * m, 0, m) for b in range(bands)])
        self.shifts = [j * cols.dilation for j in range(packed)]

    def products(self, whole: list[Block]) -> Tile:
        """A bank [B * M, outputs of a block] of the bands' outputs, band b's block whole[b] (the blocks alike,
        their first rows evenly spaced): the bands' windows loaded, then a matmul per tap group."""
        prog, geo, bands = self.prog, self.geo, self.bands
        c, k, p = geo.channels, self.phases * self.packed * geo.channels, bands * geo.outputs
        strides, image = window_strides(whole[0], self.axes)
        window = prog.sbuf(bands * k, image, prog.operand_dtype(DType.fp32), f"{self.name}/x")
        _fill_edges(prog, window, whole, [axes for axes, _ in self.views], self.shifts, (image, *strides))
        for ph, (axes, src) in enumerate(self.views):
            for j, shift in enumerate(self.shifts):
                _load_bands(prog, window, src, whole, axes, shift, ph * self.packed + j, c, strides[0])
        acc = prog.psum(p, whole[0].size, f"{self.name}/acc")
        for q, (kh, w0, _) in enumerate(self.groups):
            prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=self.weights.ap(((p, 1),), q * p),
                      moving=window_ap(window, (image, *strides), whole[0], self.axes, (kh, w0), bands * k),
                      accumulate=q > 0)
        return acc


def lower_banded_stem(ctx: LowerCtx, node: Node, geo: ConvGeometry, packed: int, bands: int, per_band: int) -> None:
    """`packed`: the shifted copies of the window a pass reads (1: a tap a pass; lower/conv.py decides)."""
    stem, m = _Bands(ctx, node, geo, packed, bands), geo.outputs
    rows, cols = geo.axes
    for n in range(stem.images):
        for r0 in range(0, rows.out, bands * per_band):
            # every band's window laid out as a whole band's, past the last output row too
            whole = [Block(n, 1, (r0 + b * per_band, 0), (per_band, cols.out)) for b in range(bands)]
            acc = stem.products(whole)
            parts = [(Block(n, 1, block.starts, (min(per_band, rows.out - block.starts[0]), cols.out)), b * m, 0, m)
                     for b, block in enumerate(whole) if block.starts[0] < rows.out]
            stem.epilogue.finish(acc, stem.column, parts)


def depthwise_reader(ctx: LowerCtx, node: Node, geo: ConvGeometry, packed: int) -> BandWindows | None:
    """The windows of the banded depthwise convolution that alone reads the stem's output (MobileNetV3's first
    block), when the stem may compute its bands straight into them (lower_stem_into_windows): its bands fit the
    stem's partitions, a pass of the stem covers whole rows of a window, and the engines can zero the windows'
    rows outside the input that an output reads (_writable)."""
    g, out, target = ctx.graph, node.outputs[0], ctx.program.target
    readers = ctx.consumers.get(out, [])
    if len(readers) != 1 or out in g.outputs or out in ctx.next_state or (len(node.inputs) > 3 and node.inputs[3]):
        return None
    reader = readers[0]
    if reader.op not in ("Conv", "ConvEpilogue") or reader.inputs[0] != out or \
            (len(reader.inputs) > 4 and reader.inputs[4]):
        return None
    rgeo = conv_geometry(reader, g)
    if isinstance(rgeo, str) or rgeo.channels != geo.outputs:
        return None
    # the reader's bands of R rows: the stem computes each window's rows, span(R) for R a band (the windows
    # overlap), so the R that computes the fewest rows over every group, of those that leave the reader two
    # groups or more (its first group starts while the stem computes the rest); MobileNetV3: 4 rows a band, two
    # groups of 8 bands of 9 rows (144 rows of 112), where 3 (the reader's own choice) makes 3 x 8 x 7 = 168
    found = []
    for rows_a_band in range(1, rgeo.axes[0].out + 1):
        bands, per_band = band_plan(ctx, reader, rgeo, window_budget(target), rows_a_band)
        if bands < 2 or bands * packed * geo.channels > target.partitions:
            continue
        windows = band_windows(ctx, reader, rgeo, bands, per_band)
        groups = len(windows.groups(1))
        if _writable(target, geo, windows):
            found.append((groups < 2, groups * bands * rgeo.axes[0].span(per_band), per_band, windows))
    return min(found, key=lambda f: f[:3])[3] if found else None


def _writable(target: Target, geo: ConvGeometry, windows: BandWindows) -> bool:
    """Whether a stem of geometry `geo` can compute its outputs into the windows: a pass covers whole rows of a
    window, and the only windows' rows outside the input that an output reads (_outside_rows) are those of a
    group's first band (the padding above the image), which the engines can zero (band 0 starts on partition 0).
    (With 32 channels a band, every band starts where an engine's access may, so that the padding below the image
    could be zeroed too; MobileNetV2's and EfficientNet-B0's stems would then compute into their depthwise
    windows, but each band's window computes its halo rows again, 168 rows of 112 where the stem has 112: in bf16
    EfficientNet-B0 ran 274.8 -> 267.7 us, MobileNetV2 the same, but in fp32 543.5 -> 556.6 and 326.8 -> 345.5.)"""
    rows, cols = windows.geo.axes
    row_len = windows.strides[0]  # a window's row: the input's row whole (flat), or between padding columns
    if row_len != cols.size and not (cols.offset >= 0 and cols.offset + cols.size <= row_len):
        return False
    if _stem_rows(target, geo.axes[1].out, rows.span(windows.per_band)) < 1:
        return False
    return all(b == 0 for n, r0 in windows.groups(1) for b, _ in _outside_rows(windows, n, r0))


def _outside_rows(windows: BandWindows, n: int, r0: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """(band, its window's row ranges [lo, hi) outside the input) of each band of the group that stores outputs
    reading rows outside the input (padding above or below the image)."""
    rows = windows.geo.axes[0]
    span = rows.span(windows.per_band)
    found = []
    for b, block in enumerate(windows.blocks(n, r0)):
        outputs = min(windows.per_band, max(0, rows.out - block.starts[0]))  # those it stores
        _, count, pos = rows.interior(block.starts[0], windows.per_band)
        if outputs and (pos > 0 or pos + count < rows.span(outputs)):
            found.append((b, [(lo, hi) for lo, hi in ((0, pos), (pos + count, span)) if hi > lo]))
    return found


def _stem_rows(target: Target, columns: int, rows: int) -> int:
    """Output rows of a stem a pass computes into a depthwise window: as many as a bank holds."""
    return min(rows, min(target.psum_bank_fmax, target.gemm_moving_fmax) // columns)


def lower_stem_into_windows(ctx: LowerCtx, node: Node, geo: ConvGeometry, packed: int, reader: BandWindows) -> None:
    """The stem's outputs computed straight into the windows of the depthwise convolution that reads them
    (depthwise_reader): the stem takes the reader's bands, band b of a group computing the rows of band b's
    window, so that its outputs land on the partitions the window has them on, in the window's layout. The stem
    tensor is never written: where each band's window was an SBUF-to-SBUF transfer from the stem's layout
    (channels on partitions) after another from the stem's bands into it, each one a DMA latency on the chain,
    the reader's first group waits for the stem's passes alone (MobileNetV3's first block). Rows a window holds
    outside the image are computed too (from zeros); those an output reads are zeroed after (_outside_rows); a
    window's padding columns before."""
    prog = ctx.program
    stem, m = _Bands(ctx, node, geo, packed, reader.bands), geo.outputs
    rgeo, p = reader.geo, reader.bands * m
    rows, cols = rgeo.axes
    row_len, span = reader.strides[0], rows.span(reader.per_band)
    per_pass = _stem_rows(prog.target, geo.axes[1].out, span)
    first_col = 0 if row_len == cols.size else cols.offset
    written: dict[tuple[int, int], Tile] = {}
    for n, r0 in reader.groups(stem.images):
        blocks = reader.blocks(n, r0)
        window = prog.sbuf(p, reader.image, reader.dtype, f"{node.name}/window")
        if row_len != cols.size:  # the padding columns
            prog.emit("memset", Engine.POOL, dst=window.ap(), value=0.0)
        # band b's window row w holds the stem's output row (its first output's virtual coordinate) + w - padding;
        # a band past the reader's last output row (the last group's) computes rows from the image's top instead,
        # still evenly spaced (one load a run of bands), where rows past the image would be a fill of its window
        starts = [block.starts[0] for block in blocks]
        past = next((b for b, o in enumerate(starts) if o >= rows.out), len(starts))
        starts[past:] = [(b - past) * reader.per_band for b in range(past, len(starts))]
        for w0 in range(0, span, per_pass):
            count = min(per_pass, span - w0)
            whole = [Block(n, 1, (o * rows.stride - rows.offset + w0, 0), (count, geo.axes[1].out)) for o in starts]
            acc = stem.products(whole)
            dst = window.ap(((count, row_len), (cols.size, 1)), w0 * row_len + first_col, 0, p)
            stem.epilogue.finish_into(acc, stem.column, dst)
        for b, ranges in _outside_rows(reader, n, r0):  # the rows outside the image that outputs read
            for lo, hi in ranges:
                prog.emit("memset", Engine.POOL, dst=window.ap((((hi - lo) * row_len, 1),), lo * row_len, b * m, m),
                          value=0.0)
        written[n, r0] = window
    ctx.windows[node.outputs[0]] = (reader, written)


def _load_bands(prog: Program, window: Tile, src: HbmView, whole: list[Block], axes: list[Axis], shift: int, j: int,
                channels: int, row_stride: int) -> None:
    """The bands' windows moved `shift` columns, channel c of band b on partition (j * C + c) * B + b: one
    transfer per channel for each run of bands whose rows lie alike in their windows (all but those at the
    image's top and bottom edges), the runs' first rows one stride apart."""
    rows, cols = axes
    first_col, ncols, col_pos = cols.interior(0, cols.out, shift)
    if ncols == 0:
        return
    spans = [rows.interior(block.starts[0], block.counts[0]) for block in whole]
    step = (whole[1].starts[0] - whole[0].starts[0]) * rows.stride if len(whole) > 1 else 0
    runs: list[list[int]] = []
    for b, (first, count, pos) in enumerate(spans):
        if count == 0:
            continue
        last = runs[-1][-1] if runs else None
        if last is not None and last == b - 1 and spans[last][1:] == (count, pos) and \
                first - spans[last][0] == step:
            runs[-1].append(b)
        else:
            runs.append([b])
    n, bands = whole[0].n0, len(whole)
    s_c, s_n, s_h, s_w = src.strides
    for run in runs:
        first, count, pos = spans[run[0]]
        for c in range(channels):
            view = HbmView(src.tensor, src.dtype, (len(run), count, ncols), (step * s_h, s_h, s_w),
                           src.offset + c * s_c + n * s_n + first * s_h + first_col * s_w)
            dma_tile(prog, window, view, (row_stride, cols.up), pos * row_stride + col_pos,
                     (j * channels + c) * bands + run[0])


def _fill_edges(prog: Program, window: Tile, whole: list[Block], views: list[list[Axis]], shifts: list[int],
                strides: tuple[int, ...]) -> None:
    """Zero what no load of the group writes: the columns before the first input column and after the last of any
    shift (every band alike), and the rows before and after each band's input rows of any phase (`views`: each
    phase's axes, alike but for where the input's rows fall), on every partition (a band past the image's last
    row: its whole window). The loads, which write over the other bands' and phases' rows, follow."""
    rows, cols = views[0]
    row_span, col_span = rows.span(whole[0].counts[0]), cols.span(cols.out)
    runs = [cols.interior(0, cols.out, shift) for shift in shifts]
    before = max(pos if n else col_span for _, n, pos in runs)
    after = min(pos + n if n else 0 for _, n, pos in runs)
    row_stride = strides[1]
    for lo, hi in ((0, before), (after, col_span)):
        if hi > lo:
            prog.emit("memset", Engine.POOL, dst=window.ap(((row_span, row_stride), (hi - lo, 1)), lo), value=0.0)
    slabs = set()
    for (phase_rows, _), block in itertools.product(views, whole):
        _, count, pos = phase_rows.interior(block.starts[0], block.counts[0])
        slabs |= {(0, pos), (pos + count, row_span)} if count else {(0, row_span)}
    for lo, hi in sorted(slabs):
        if hi > lo:
            prog.emit("memset", Engine.POOL, dst=window.ap((((hi - lo) * row_stride, 1),), lo * row_stride), value=0.0)
