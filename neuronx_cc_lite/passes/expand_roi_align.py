"""RoiAlign (average mode, a fixed sampling grid) rewritten as two batched matmuls, which PE runs.

Bilinear sampling separates by axis: the value sampled at (y, x) is sum_ij wy_i(y) wx_j(x) V[i, j], with wy
non-zero at floor(y) and floor(y) + 1 only, and the whole sample zero when y or x lies outside [-1, extent]. The
average over a bin's G_h x G_w samples is then, per region r and channel c,

    out[r, c] = Wy[r] @ V[b_r, c] @ Wx[r]^T / (G_h G_w)     Wy[r, p, i] = sum over the bin's samples y of wy_i(y)

where Wy [R, P_h, H] and Wx [R, P_w, W] are interpolation matrices computed from the regions at run time:

    start = roi_start * spatial_scale - offset        offset 0.5 for half_pixel, else 0 (and sizes at least 1)
    y     = start + (p + (g + 0.5) / G) * size / P     for each bin p and sample g (a [R, P*G] tensor)
    y'    = max(y, 0); low = floor(y'), high = low + 1, both clamped with y' to extent - 1 when low reaches it
    wy    = (1 - (y' - low)) at low + (y' - low) at high, times (-1 <= y <= extent); one-hot rows summed over g

which is what onnxruntime's and ONNX's reference kernels compute per sample, summed in another order. The max
mode (a maximum over the bin's weighted corners, not separable) and sampling_ratio 0 (a grid per region, from its
size at run time) are left as RoiAlign, which no lowering takes: compile with `--fallback host` to run them on the
CPU.
"""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.ops.registry import kept_by_pass
from neuronx_cc_lite.passes.writer import Writer

OPSET = 17  # ReduceSum with axes as an input


@kept_by_pass("RoiAlign")
def why_kept(node: Node, g: Graph) -> str | None:
    if node.attrs.get("mode", "avg") != "avg":
        return "RoiAlign in max mode (a maximum over each bin's weighted corners) has no lowering"
    if node.attrs.get("sampling_ratio", 0) <= 0:
        return ("RoiAlign with sampling_ratio 0 takes each region's sampling grid from its size at run time; a fixed "
                "sampling_ratio (torchvision's MultiScaleRoIAlign uses 2) compiles")
    x = g.tensors[node.inputs[0]]
    if x.dtype != np.float32 or x.shape is None or len(x.shape) != 4:
        return "RoiAlign compiles on a static float32 [N, C, H, W] input"
    return "the shapes of its regions are not static"


def _expandable(node: Node, g: Graph) -> bool:
    x, rois = g.tensors[node.inputs[0]], g.tensors[node.inputs[1]]
    return (node.attrs.get("mode", "avg") == "avg" and node.attrs.get("sampling_ratio", 0) > 0
            and x.dtype == np.float32 and x.shape is not None and len(x.shape) == 4
            and rois.shape is not None and rois.dtype == np.float32)


def _weights(w: Writer, rois: str, axis: int, extent: int, pooled: int, grid: int, scale: float,
             half_pixel: bool) -> str:
    """The [R, pooled, extent] interpolation matrix of one axis (axis 0: y, the rois' columns 1 and 3; 1: x, 0 and
    2)."""
    first, last = (1, 3) if axis == 0 else (0, 2)

    def column(k: int) -> str:
        return w.add("Gather", [rois, w.const([k], np.int64)], axis=1)  # [R, 1]

    offset = 0.5 if half_pixel else 0.0
    start = w.add("Sub", [w.add("Mul", [column(first), w.const(scale)]), w.const(offset)])
    end = w.add("Sub", [w.add("Mul", [column(last), w.const(scale)]), w.const(offset)])
    size = w.add("Sub", [end, start])
    if not half_pixel:
        size = w.add("Max", [size, w.const(1.0)])
    fractions = (np.arange(pooled)[:, None] + (np.arange(grid)[None, :] + 0.5) / grid).reshape(-1)
    at = w.add("Add", [start, w.add("Mul", [w.add("Div", [size, w.const(float(pooled))]), w.const(fractions)])])
    inside = w.add("And", [w.add("GreaterOrEqual", [at, w.const(-1.0)]),
                           w.add("LessOrEqual", [at, w.const(float(extent))])])
    clamped = w.add("Max", [at, w.const(0.0)])
    low = w.add("Floor", [clamped])
    top = w.const(float(extent - 1))
    over = w.add("GreaterOrEqual", [low, top])
    high = w.add("Where", [over, top, w.add("Add", [low, w.const(1.0)])])
    low = w.add("Where", [over, top, low])
    frac = w.add("Sub", [w.add("Where", [over, top, clamped]), low])
    zero = w.const(0.0)
    upper = w.add("Where", [inside, frac, zero])
    lower = w.add("Where", [inside, w.add("Sub", [w.const(1.0), frac]), zero])
    positions = w.const(np.arange(extent, dtype=np.float32))
    axes = w.const([-1], np.int64)

    def spread(index: str, weight: str) -> str:  # [R, P*G, extent]: weight where position == index
        hit = w.add("Equal", [w.add("Unsqueeze", [index, axes]), positions])
        return w.add("Where", [hit, w.add("Unsqueeze", [weight, axes]), zero])

    both = w.add("Add", [spread(low, lower), spread(high, upper)])
    rows = w.add("Reshape", [both, w.const([0, pooled, grid, extent], np.int64)])
    return w.add("ReduceSum", [rows, w.const([2], np.int64)], keepdims=0)


def _expand(g: Graph, node: Node) -> list[Node]:
    w = Writer(g, node, OPSET)
    x, rois, batch = node.inputs[:3]
    n, _, height, width = g.tensors[x].shape
    a = node.attrs
    pooled_h, pooled_w = a.get("output_height", 1), a.get("output_width", 1)
    grid, scale = a["sampling_ratio"], float(a.get("spatial_scale", 1.0))
    half_pixel = a.get("coordinate_transformation_mode",
                       "half_pixel" if g.opset_of(node) >= 16 else "output_half_pixel") == "half_pixel"
    wy = _weights(w, rois, 0, height, pooled_h, grid, scale, half_pixel)  # [R, Ph, H]
    wx = _weights(w, rois, 1, width, pooled_w, grid, scale, half_pixel)  # [R, Pw, W]
    one = w.const([1], np.int64)
    values = x if n == 1 else w.add("Gather", [x, batch], axis=0)  # [R or 1, C, H, W]
    rows = w.add("MatMul", [w.add("Unsqueeze", [wy, one]), values])  # [R, C, Ph, W]
    sampled = w.add("MatMul", [rows, w.add("Unsqueeze", [w.add("Transpose", [wx], perm=[0, 2, 1]), one])])
    w.add("Mul", [sampled, w.const(1.0 / (grid * grid))], node.outputs[0])
    return w.folded()


def run(g: Graph) -> Graph:
    nodes: list[Node] = []
    for node in g.nodes:
        if node.op == "RoiAlign" and node.domain in ("", "ai.onnx") and _expandable(node, g):
            nodes.extend(_expand(g, node))
        else:
            nodes.append(node)
    g.nodes = nodes
    return g
