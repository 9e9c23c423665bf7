"""The geometry of a Conv or ConvTranspose node (lower/conv.py lowers it): its spatial axes as windows read them
(lower/windows.py Axis), its groups, channels and kernel, and the SBUF budgets of a window and of a tile's weights.
Apart from conv.py so that the lowerings a convolution hands its work to (an image stem's bands, a depthwise
layer's diagonals) read a reader's geometry without importing conv.py back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from isa.target import Target
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.windows import Axis, window_axes


def window_budget(target: Target) -> int:
    """fp32 elements per partition of one input-window tile: an eighth of a partition, so that windows of the
    next block load while this one's matmuls run, beside the resident weights."""
    return target.sbuf_partition_bytes // 8 // 4


def weight_budget(target: Target) -> int:
    """Bytes per partition of the weights resident for one output-channel tile: a quarter of a partition."""
    return target.sbuf_partition_bytes // 4


@dataclass(frozen=True)
class ConvGeometry:
    axes: list[Axis]
    groups: int
    channels: int  # input channels
    outputs: int  # output channels
    kernel: tuple[int, ...]
    transposed: bool  # ConvTranspose: weights [C, M / groups, *kernel], read flipped

    @property
    def taps(self) -> int:
        return math.prod(self.kernel)

    @property
    def group_in(self) -> int:
        return self.channels // self.groups

    @property
    def group_out(self) -> int:
        return self.outputs // self.groups

    @property
    def depthwise(self) -> bool:
        """One input and one output channel per group: each tap's weights are a diagonal."""
        return self.groups > 1 and self.group_in == 1 and self.group_out == 1

    def input_range(self, co0: int, mt: int) -> tuple[int, int]:
        """The input channels that output channels co0 .. co0 + mt - 1 read: those of their groups."""
        return co0 // self.group_out * self.group_in, ((co0 + mt - 1) // self.group_out + 1) * self.group_in

    def output_tile(self, target: Target) -> int:
        """Output channels per tile: pmax, fewer when the weights of a tile would not fit their budget."""
        mt = min(target.gemm_stationary_fmax, self.outputs)
        while mt > 1 and self.weight_bytes(mt, target) > weight_budget(target):
            mt = -(-mt // 2)
        return mt

    def weight_bytes(self, mt: int, target: Target) -> int:
        """Bytes per partition of the weights of any tile of mt output channels: pmax-channel tiles of the input
        channels of the groups it can straddle, by taps, by mt, in fp32."""
        groups = min(self.groups, -(-(mt - 1) // self.group_out) + 1)
        return -(-groups * self.group_in // target.partitions) * self.taps * mt * 4

    def intersections(self, c0: int, ct: int, co0: int, mt: int) -> list[tuple[int, int, int, int, int]]:
        """(group, first input channel, count, first output channel, count) of each group both tiles touch."""
        found = []
        for g in range(co0 // self.group_out, (co0 + mt - 1) // self.group_out + 1):
            c_lo, c_hi = max(c0, g * self.group_in), min(c0 + ct, (g + 1) * self.group_in)
            m_lo, m_hi = max(co0, g * self.group_out), min(co0 + mt, (g + 1) * self.group_out)
            if c_lo < c_hi and m_lo < m_hi:
                found.append((g, c_lo, c_hi - c_lo, m_lo, m_hi - m_lo))
        return found


def _floats(node: Node, g: Graph) -> str | None:
    for name in (node.inputs[0], node.outputs[0]):
        if not np.issubdtype(g.tensors[name].dtype, np.floating):
            return f"{node.op} on {g.tensors[name].dtype} tensors is not supported (floating point only)"
    return None


def _common(node: Node, g: Graph) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | str:
    """(input, weight, output) shapes, or why the node is out of reach whatever its attributes."""
    x, w, y = (g.tensors[n].shape for n in (node.inputs[0], node.inputs[1], node.outputs[0]))
    if len(x) not in (3, 4, 5):
        return f"{node.op} of a rank-{len(x)} input: 1-D, 2-D and 3-D convolutions only"
    if len(w) != len(x):
        return f"weights of rank {len(w)} for an input of rank {len(x)}"
    kernel_shape = node.attrs.get("kernel_shape")
    if kernel_shape is not None and tuple(kernel_shape) != tuple(w[2:]):
        return f"kernel_shape {list(kernel_shape)} differs from the weights' {list(w[2:])}"
    return _floats(node, g) or (x, w, y)


def conv_geometry(node: Node, g: Graph) -> ConvGeometry | str:
    shapes = _common(node, g)
    if isinstance(shapes, str):
        return shapes
    x, w, y = shapes
    groups = int(node.attrs.get("group", 1))
    if groups < 1 or x[1] != w[1] * groups or w[0] % groups:
        return f"group {groups} does not divide {x[1]} input channels ({w[1]} per group) and {w[0]} outputs"
    axes = window_axes(node.attrs, x[2:], tuple(w[2:]), y[2:])
    if isinstance(axes, str):
        return axes
    return ConvGeometry(axes, groups, x[1], w[0], tuple(w[2:]), False)


def conv_transpose_geometry(node: Node, g: Graph) -> ConvGeometry | str:
    shapes = _common(node, g)
    if isinstance(shapes, str):
        return shapes
    x, w, y = shapes
    attrs, rank = node.attrs, len(x) - 2
    groups = int(attrs.get("group", 1))
    if groups < 1 or x[1] != w[0] or w[0] % groups:
        return f"group {groups} does not divide the {w[0]} input channels of the weights (input has {x[1]})"
    strides = tuple(attrs.get("strides") or (1,) * rank)
    dilations = tuple(attrs.get("dilations") or (1,) * rank)
    extra = tuple(attrs.get("output_padding") or (0,) * rank)
    pads = tuple(attrs.get("pads") or (0,) * 2 * rank)
    auto_pad, output_shape = attrs.get("auto_pad", "NOTSET"), attrs.get("output_shape")
    if len(strides) != rank or len(dilations) != rank or len(extra) != rank or len(pads) != 2 * rank:
        return "strides, dilations, output_padding and pads must give one value per spatial axis (two for pads)"
    if min(strides + dilations) < 1 or min(extra + pads) < 0:
        return "strides and dilations must be positive, pads and output_padding non-negative"
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return f"auto_pad {auto_pad!r} is not supported"
    axes = []
    for k, (n, kern, s, d, e) in enumerate(zip(x[2:], w[2:], strides, dilations, extra)):
        full = (n - 1) * s + e + (kern - 1) * d + 1
        begin, end = (0, 0) if auto_pad == "VALID" else (pads[k], pads[k + rank])
        if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            wanted = output_shape[len(output_shape) - rank + k] if output_shape is not None else n * s
            total = full - wanted  # negative: the output extends past the last tap (zeros and bias)
            end = total // 2 if auto_pad != "SAME_UPPER" else total - total // 2
            begin = total - end
        axes.append(Axis(n, full - begin - end, kern, 1, d, d * (kern - 1) - begin, up=s))
    if tuple(ax.out for ax in axes) != tuple(y[2:]):
        return f"output shape {list(y[2:])} does not match the attributes ({[ax.out for ax in axes]})"
    return ConvGeometry(axes, groups, x[1], w[1] * groups, tuple(w[2:]), True)
