"""Resize: nearest by on-chip copies (or DMA), linear and cubic by matmuls on the Tensor engine.

Along each resized axis, output position o maps to the input coordinate x(o) (coordinate_transformation_mode,
from the scale the model gives or the sizes it asks for). Resize is separable: the axes are resized one at a time.

Nearest reads, for each output, the input element at x(o) rounded by nearest_mode: an index map per axis, cut
into pieces (patterns.py: an integer upscale is one piece, a source stride of 0 repeating each element), one copy
per combination of pieces. When the leading axes are left alone and a row fits, the rows are loaded whole and the
copies replicate on chip (patterns.copy_pieces_on_chip): as DMAs an upscale by 2 moves two elements a piece.
Otherwise the copies are HBM-to-HBM DMAs, the axes it leaves alone merged into the rows of each.

Linear and cubic make each output a fixed combination of the input elements around x(o): a matrix M [out, in]
per axis, computed at compile time (antialias and exclude_outside only change its entries). With the rows of the
images X [(image, h), w] the two resizes are two matmuls:
    Y = X @ Mw^T              stationary X^T [w, rows] (a transposing DMA), moving Mw^T [w, ow]
    Z = A^T @ Y               stationary A [(image, h), (image, oh)] = blockdiag(Mh^T), moving Y
accumulating in PSUM over tiles of w and of (image, h); tiles of M that are all zero (interpolation is local)
are skipped. ScalarE evacuates PSUM.

tf_crop_and_resize samples the roi and gives extrapolation_value to the outputs that sample outside the input:
fills of the index maps for nearest, a DMA of that value over them after the matmuls otherwise.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from isa.dtypes import DType
from isa.functions import ActFunc
from isa.operand import Engine
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import tile_free_max
from neuronx_cc_lite.lower.patterns import contiguous, copy_pieces, copy_pieces_on_chip, pieces
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Program, Tile

COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@dataclass(frozen=True)
class ResizeAxis:
    size: int
    out: int
    scale: float
    roi: tuple[float, float] = (0.0, 1.0)  # the crop of tf_crop_and_resize, as fractions of the input

    @property
    def identity(self) -> bool:
        return self.out == self.size and math.isclose(self.scale, 1.0) and np.allclose(self.roi, (0.0, 1.0))


@dataclass(frozen=True)
class ResizePlan:
    axes: list[ResizeAxis]
    mode: str
    coordinates: str
    nearest: str
    cubic_a: float
    exclude_outside: bool
    antialias: bool
    extrapolation: float  # tf_crop_and_resize's value for outputs that sample outside the input


def _constant_input(node: Node, g: Graph, index: int) -> np.ndarray | None:
    """Input `index` (a compile-time constant: the registry sees to it), None when absent or empty."""
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    value = g.tensors[node.inputs[index]].value
    return value if value.size else None


def _scales(node: Node, g: Graph, shape: tuple[int, ...], out: tuple[int, ...]) -> list[float] | str:
    """The scale of every axis, from `scales` or from `sizes` (and keep_aspect_ratio_policy)."""
    rank = len(shape)
    axes = [int(a) % rank for a in node.attrs.get("axes") or range(rank)]
    scales, sizes = _constant_input(node, g, 2), _constant_input(node, g, 3)
    if scales is not None:
        result = [1.0] * rank
        for a, s in zip(axes, scales.astype(np.float64)):
            result[a] = float(s)
        expected = tuple(int(n * s) for n, s in zip(shape, result))
        if expected != out:
            return f"output shape {list(out)} is not floor(input shape x scales) = {list(expected)}"
        return result
    if sizes is None:
        return "Resize needs scales or sizes"
    ratios = [1.0] * rank
    for a, n in zip(axes, sizes):
        ratios[a] = int(n) / shape[a]
    policy = node.attrs.get("keep_aspect_ratio_policy", "stretch")
    if policy in ("not_larger", "not_smaller"):
        pick = min if policy == "not_larger" else max
        scale = pick(ratios[a] for a in axes)
        ratios = [scale if a in axes else 1.0 for a in range(rank)]
    elif policy != "stretch":
        return f"keep_aspect_ratio_policy {policy!r} is not supported"
    return ratios


def resize_plan(node: Node, g: Graph) -> ResizePlan | str:
    attrs = node.attrs
    x, y = g.tensors[node.inputs[0]], g.tensors[node.outputs[0]]
    mode = attrs.get("mode", "nearest")
    coordinates = attrs.get("coordinate_transformation_mode", "half_pixel")
    nearest = attrs.get("nearest_mode", "round_prefer_floor")
    if mode not in ("nearest", "linear", "cubic"):
        return f"mode {mode!r} is not supported"
    if coordinates not in COORDINATE_MODES:
        return f"coordinate_transformation_mode {coordinates!r} is not supported"
    if nearest not in NEAREST_MODES:
        return f"nearest_mode {nearest!r} is not supported"
    if mode == "nearest" and attrs.get("antialias", 0):
        return "antialias applies to linear and cubic modes only"
    scales = _scales(node, g, x.shape, y.shape)
    if isinstance(scales, str):
        return scales
    rois = [(0.0, 1.0)] * len(x.shape)
    roi = _constant_input(node, g, 1)
    if coordinates == "tf_crop_and_resize":
        if roi is None:
            return "tf_crop_and_resize needs a roi"
        listed = [int(a) % len(x.shape) for a in attrs.get("axes") or range(len(x.shape))]
        if roi.size != 2 * len(listed):
            return f"roi has {roi.size} values for {len(listed)} axes"
        for k, a in enumerate(listed):
            rois[a] = (float(roi[k]), float(roi[k + len(listed)]))
    axes = [ResizeAxis(n, o, s, r) for n, o, s, r in zip(x.shape, y.shape, scales, rois)]
    if mode != "nearest":
        if not np.issubdtype(x.dtype, np.floating):
            return f"{mode} Resize of {x.dtype} tensors is not supported (floating point only)"
        if any(not ax.identity for ax in axes[:-2]):
            return f"{mode} Resize of an axis other than the last two is not supported"
    return ResizePlan(axes, mode, coordinates, nearest, float(attrs.get("cubic_coeff_a", -0.75)),
                      bool(attrs.get("exclude_outside", 0)), bool(attrs.get("antialias", 0)),
                      float(attrs.get("extrapolation_value", 0.0)))


def _check(node: Node, g: Graph) -> str | None:
    plan = resize_plan(node, g)
    return plan if isinstance(plan, str) else None


# ---- per-axis maps ----------------------------------------------------------------------------------------------


def input_coordinates(ax: ResizeAxis, mode: str) -> np.ndarray:
    """x(o) for every output position o: where it samples the input."""
    o = np.arange(ax.out, dtype=np.float64)
    length = ax.scale * ax.size  # the resized length before rounding to an integer
    if mode == "align_corners":
        return np.zeros(ax.out) if length == 1 else o * (ax.size - 1) / (length - 1)
    if mode == "asymmetric":
        return o / ax.scale
    if mode == "tf_crop_and_resize":
        start, end = ax.roi
        if length == 1:
            return np.full(ax.out, (start + end) / 2 * (ax.size - 1))
        return start * (ax.size - 1) + o * (end - start) * (ax.size - 1) / (length - 1)
    if mode == "pytorch_half_pixel" and length == 1:
        return np.full(ax.out, -0.5)
    offset = ax.size / 2 * (1 - ax.out / length) if mode == "half_pixel_symmetric" else 0.0
    return offset + (o + 0.5) / ax.scale - 0.5


def _left_and_ratio(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The input element at or left of each coordinate and the distance past it, in (0, 1]: an exact integer
    coordinate counts as distance 1 past its left neighbour, as the ONNX definition has it."""
    left = np.ceil(x).astype(np.int64) - 1
    return left, x - left


def outside(ax: ResizeAxis, plan: ResizePlan) -> np.ndarray:
    """Which outputs tf_crop_and_resize sets to the extrapolation value: those sampling outside the input."""
    x = input_coordinates(ax, plan.coordinates)
    if plan.coordinates != "tf_crop_and_resize" or ax.identity:
        return np.zeros(ax.out, bool)
    return (x < 0) | (x > ax.size - 1)


def nearest_index(ax: ResizeAxis, plan: ResizePlan) -> list[int]:
    """The input element each output copies, -1 for the extrapolation value."""
    if ax.identity:
        return list(range(ax.size))
    left, ratio = _left_and_ratio(input_coordinates(ax, plan.coordinates))
    up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": ratio == 1,
          "ceil": np.ones_like(ratio, bool)}[plan.nearest]
    return [-1 if out else int(i) for i, out in zip(np.clip(left + up, 0, ax.size - 1), outside(ax, plan))]


def _cubic(distance: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def interpolation_matrix(ax: ResizeAxis, plan: ResizePlan) -> np.ndarray:
    """M [out, in] with output = M @ input along the axis (float64)."""
    left, ratio = _left_and_ratio(input_coordinates(ax, plan.coordinates))
    shrink = min(ax.scale, 1.0) if plan.antialias else 1.0  # antialias widens the kernel when downsampling
    reach = 1 if plan.mode == "linear" else 2  # the kernel's half-width, in input elements at scale 1
    first = int(np.floor(-reach / shrink) + 1)  # neighbours left + first .. left - first + 1
    offsets = np.arange(first, 1 - first + 1)
    distance = (offsets[None, :] - ratio[:, None]) * shrink
    weights = np.clip(1 - np.abs(distance), 0, 1) if plan.mode == "linear" else _cubic(distance, plan.cubic_a)
    neighbours = left[:, None] + offsets[None, :]
    if plan.exclude_outside:
        weights = np.where((neighbours < 0) | (neighbours >= ax.size), 0.0, weights)
    if plan.antialias or plan.exclude_outside:
        sums = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(sums == 0, 1.0, sums)
    m = np.zeros((ax.out, ax.size))
    np.add.at(m, (np.repeat(np.arange(ax.out), len(offsets)), np.clip(neighbours, 0, ax.size - 1).ravel()),
              weights.ravel())
    return m


# ---- lowering ---------------------------------------------------------------------------------------------------


def _plan_or_fail(node: Node, g: Graph) -> ResizePlan:
    plan = resize_plan(node, g)
    if isinstance(plan, str):
        raise CompileError("NCC_UNSUPPORTED", plan, node.name, node.op)
    return plan


def _extrapolation(ctx: LowerCtx, node: Node, plan: ResizePlan) -> HbmView:
    return ctx.view(ctx.constant(f"{node.name}/extrapolation", np.array(plan.extrapolation, np.float32)))


def _lower_nearest(ctx: LowerCtx, node: Node, plan: ResizePlan) -> None:
    x, out = ctx.view(node.inputs[0]), ctx.output(node.outputs[0])
    maps = [nearest_index(ax, plan) for ax in plan.axes]
    fill = _extrapolation(ctx, node, plan) if any(-1 in m for m in maps) else None
    per_axis = [pieces(m) for m in maps]
    if not copy_pieces_on_chip(ctx.program, out, x, per_axis, fill, 2 * tile_free_max(ctx)):
        copy_pieces(ctx.program, out, x, per_axis, fill)


def _spans(total: int, step: int) -> list[tuple[int, int]]:
    return [(start, min(step, total - start)) for start in range(0, total, step)]


def _matmuls(prog: Program, name: str, parts: list[tuple[Tile, Tile]]) -> Tile:
    """The sum of stationary.T @ moving over the parts, accumulated in one PSUM bank and evacuated to SBUF by
    ScalarE."""
    rows, cols = parts[0][0].free, parts[0][1].free
    acc = prog.psum(rows, cols, f"{name}/acc")
    for i, (stationary, moving) in enumerate(parts):
        prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=stationary.ap(), moving=moving.ap(),
                  accumulate=i > 0)
    res = prog.sbuf(rows, cols, DType.fp32, f"{name}/y")
    prog.emit("activation", Engine.ACT, dst=res.ap(), src=acc.ap(), func=ActFunc.copy, scale=1.0)
    return res


def _lower_matrices(ctx: LowerCtx, node: Node, mh: np.ndarray | None, mw: np.ndarray | None) -> None:
    prog, target, name = ctx.program, ctx.program.target, node.name
    pmax, fmax = target.partitions, min(target.psum_bank_fmax, target.gemm_moving_fmax)
    x = contiguous(prog, ctx.view(node.inputs[0]), name)
    out = ctx.output(node.outputs[0])
    (h, w), (oh, ow) = ((1, *v.shape) if len(v.shape) == 1 else v.shape[-2:] for v in (x, out))
    images = math.prod(x.shape[:-2])
    x2, out2 = x.reshape((images * h, w)), out.reshape((images * oh, ow))
    assert x2 is not None and out2 is not None
    loaded: dict[tuple[str, int, int, int, int], Tile] = {}

    def constant(view: HbmView, r0: int, rn: int, c0: int, cn: int) -> Tile:
        """A tile of a compile-time matrix, loaded once."""
        key = (view.tensor.name, r0, rn, c0, cn)
        if key not in loaded:
            loaded[key] = prog.sbuf(rn, cn, DType.fp32, view.tensor.name)
            prog.dma(loaded[key].ap(), view.box((r0, c0), (rn, cn)))
        return loaded[key]

    mw_t = ctx.view(ctx.constant(f"{name}/Mw^T", mw.T.astype(np.float32))) if mw is not None else None

    def along_w(r0: int, rn: int, c0: int, cn: int) -> Tile:
        """Rows r0.. of the images resized along w, output columns c0.., as a tile [rn, cn]."""
        if mw is None or mw_t is None:
            y = prog.sbuf(rn, cn, DType.fp32, f"{name}/x")
            prog.dma(y.ap(), x2.box((r0, c0), (rn, cn)))
            return y
        parts = []
        for w0, wt in [s for s in _spans(w, pmax) if mw[c0:c0 + cn, s[0]:s[0] + s[1]].any()] or [(0, min(pmax, w))]:
            xt = prog.sbuf(wt, rn, DType.fp32, f"{name}/x^T")
            prog.dma(xt.ap(), x2.box((r0, w0), (rn, wt)).transpose((1, 0)))
            parts.append((xt, constant(mw_t, w0, wt, c0, cn)))
        return _matmuls(prog, name, parts)

    if mh is None:  # rows are independent: any pmax of them at a time
        for (r0, rn), (c0, cn) in itertools.product(_spans(images * h, pmax), _spans(ow, fmax)):
            prog.dma(out2.box((r0, c0), (rn, cn)), along_w(r0, rn, c0, cn).ap())
        return
    # The rows of several images at once when they fit a tile: A = blockdiag(Mh^T, ...) mixes each image's own.
    per_tile = max(1, min(pmax // h, pmax // oh, images)) if h <= pmax and oh <= pmax else 1
    a = np.kron(np.eye(per_tile), mh.T)
    a_view = ctx.view(ctx.constant(f"{name}/A", a.astype(np.float32)))
    for i0, (c0, cn) in itertools.product(range(0, images, per_tile), _spans(ow, fmax)):
        count = min(per_tile, images - i0)
        ys = [(k0, kt, along_w(i0 * h + k0, kt, c0, cn)) for k0, kt in _spans(count * h, pmax)]
        for m0, mt in _spans(count * oh, pmax):
            used = [(k0, kt, y) for k0, kt, y in ys if a[k0:k0 + kt, m0:m0 + mt].any()] or ys[:1]
            z = _matmuls(prog, name, [(constant(a_view, k0, kt, m0, mt), y) for k0, kt, y in used])
            prog.dma(out2.box((i0 * oh + m0, c0), (mt, cn)), z.ap())


@lowering("Resize", check=_check, since=11, constant_inputs=(1, 2, 3))  # roi, scales, sizes
def lower_resize(ctx: LowerCtx, node: Node) -> None:
    plan = _plan_or_fail(node, ctx.graph)
    if plan.mode == "nearest" or all(ax.identity for ax in plan.axes):
        _lower_nearest(ctx, node, plan)
        return
    *_, ax_h, ax_w = [ResizeAxis(1, 1, 1.0)] + plan.axes  # a rank-1 input has one row
    mh = None if ax_h.identity else interpolation_matrix(ax_h, plan)
    mw = None if ax_w.identity else interpolation_matrix(ax_w, plan)
    _lower_matrices(ctx, node, mh, mw)
    crops = [outside(ax, plan) for ax in plan.axes]
    if any(c.any() for c in crops):  # then the outputs tf_crop_and_resize extrapolates are overwritten
        out = ctx.view(node.outputs[0])
        maps = [[-1 if c else o for o, c in enumerate(crop)] for crop in crops]
        copy_pieces(ctx.program, out, out, [pieces(m) for m in maps], _extrapolation(ctx, node, plan),
                    fills_only=True)
