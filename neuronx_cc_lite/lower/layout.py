"""Which tensors to lay out feature-major: their last axis on partitions, the rest in the free dimension.

A matmul contracts over the partitions. Activations laid out token-major (rows on partitions, features in the
free dimension) must be turned on PE before every matmul that reads them; laid out feature-major, they are
already A^T, the matmul's stationary or moving operand as it is, and a matmul can write its result feature-major
too (out^T = B^T A^T: the weights stationary, the activations moving), with the bias a per-partition column that
ScalarE adds for free. A transformer's hidden state then goes from layer to layer without a transpose; only what
needs rows (a softmax over the keys) stays token-major.

    a tensor is feature-major when some reader wants its last axis on partitions and none wants otherwise:
      MatMul A (input 0)             contracts A's last axis                       -> wants it
      MatMul B (input 1)             contracts B's second-to-last axis: wants it when that is the tensor's last
                                     axis (K^T in attention), not when it is another (V)
      LayerNormalization over the last axis  wants it (it normalises over partitions and gives its own
                                     readers the layout they want)
      an elementwise op of the same shape, a fused matmul's residual or gate, an AllReduce (elementwise across
                                     ranks) go as their result goes
      CumSum along another axis      goes as its result goes: feature-major, the sum runs along the free axis
                                     (a scan on VectorE, lower/cumsum.py), the features on partitions
      anything else, a graph output  wants rows
Readers are followed through Reshape (splitting the last axis), Transpose, Squeeze, Unsqueeze and a Slice that
leaves the axis whole, tracking where the tensor's last axis went.
"""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.ops.registry import kind_of
from neuronx_cc_lite.ops.traits import OpKind

# besides the elementwise ops (the registry's trait), the ops whose output follows their input's layout
FOLLOWERS = ("AllReduce",)
# besides the views (the registry's kind), the ops an axis can be followed through (_through_view)
CARRIERS = ("Transpose", "Identity", "Slice")


def _follows(op: str) -> bool:
    return op in FOLLOWERS or kind_of(op) is OpKind.ELEMENTWISE


def _carries(op: str) -> bool:
    return op in CARRIERS or kind_of(op) is OpKind.VIEW


def is_matmul(op: str) -> bool:
    return kind_of(op) is OpKind.MATMUL


def _through_view(node: Node, g: Graph, position: int | None) -> int | None:
    """Where the tracked axis (the source's last axis) is in the view's output, or None when it is lost."""
    if position is None:
        return None
    src, out = g.tensors[node.inputs[0]].shape, g.tensors[node.outputs[0]].shape
    if node.op == "Transpose":
        perm = node.attrs.get("perm") or tuple(reversed(range(len(src))))
        return list(perm).index(position) if position in perm else None
    if node.op == "Slice":  # the axis keeps its place when the slice leaves it whole (heads cut from Q, K, V)
        return position if out and out[position] == src[position] else None
    if kind_of(node.op) is OpKind.VIEW or node.op == "Identity":
        if position != len(src) - 1 or not out:
            return None
        # the last axis survives when the output's last axis is the same or a part of it, with the axes before
        # it unchanged in what they hold
        last, tail = src[-1], out[-1]
        if last % tail:
            return None
        outer_src = 1
        for n in src[:-1]:
            outer_src *= n
        outer_out = 1
        for n in out[:-1]:
            outer_out *= n
        return len(out) - 1 if outer_out == outer_src * (last // tail) else None
    return None


def _channels_first(node: Node, g: Graph, position: int | None) -> bool:
    """Whether `node` is a Transpose that moves its input's last axis (the tracked one) in front of the others and
    keeps their order, size-1 axes aside: [1, H, W, C] to [1, C, H, W], as ConvNeXt's blocks permute back to a
    convolution's layout. The tensor laid out feature-major (C on partitions, the rest in order in the free
    dimension) is then exactly that view laid out by rows."""
    src = g.tensors[node.inputs[0]].shape
    if node.op != "Transpose" or position != len(src) - 1 or len(src) < 3:
        return False
    perm = node.attrs.get("perm") or tuple(reversed(range(len(src))))
    moved = [int(p) % len(src) for p in perm if src[int(p) % len(src)] != 1]
    kept = [a for a in range(len(src)) if src[a] != 1]
    return len(kept) >= 2 and moved == [kept[-1], *kept[:-1]] and kept[-1] == len(src) - 1


class FeatureMajor:
    """The decision for every computed tensor of a graph, made once when lowering starts."""

    def __init__(self, g: Graph, by_rows: frozenset[str] | None = frozenset()) -> None:
        """`by_rows`: tensors to lay out by rows whatever their readers want; None: all of them."""
        self.g = g
        self.users = g.consumers()
        self.memo: dict[str, bool] = {}
        self.by_rows = by_rows

    def __call__(self, name: str) -> bool:
        if self.by_rows is None or name in self.by_rows:
            return False
        if name not in self.memo:
            self.memo[name] = False  # a cycle cannot happen in a DAG; guards against surprises
            votes = list(self._votes(name, len(self.g.tensors[name].shape) - 1))
            self.memo[name] = bool(votes) and all(votes)
        return self.memo[name]

    def _votes(self, name: str, position: int | None):  # type: ignore[no-untyped-def]
        if name in self.g.outputs:
            yield False
        for node in self.users.get(name, []):
            rank = len(self.g.tensors[node.outputs[0]].shape) if node.outputs and node.outputs[0] else 0
            if _carries(node.op) and node.inputs[0] == name and _channels_first(node, self.g, position):
                # the permute back to channels-first: feature-major, the tensor is already that view's rows
                votes = list(self._votes(node.outputs[0], rank - 1))
                yield bool(votes) and not any(votes)
            elif _carries(node.op) and node.inputs[0] == name:
                yield from self._votes(node.outputs[0], _through_view(node, self.g, position))
            elif is_matmul(node.op) and node.inputs[0] == name and node.attrs.get("transA", 0) == 0:
                yield position is not None and position == len(self.g.tensors[name].shape) - 1 >= 1
            elif is_matmul(node.op) and node.inputs[1] == name and node.attrs.get("transB", 0) == 0:
                src_rank = len(self.g.tensors[name].shape)
                yield position is not None and src_rank >= 2 and position == src_rank - 2
            elif node.op == "LayerNormalization" and node.inputs[0] == name:
                # normalising over the partitions is cheap (lower/feature_norm.py), and its output is laid out as
                # its own readers want: it takes feature-major input whatever comes after it
                yield position == rank - 1 and int(node.attrs.get("axis", -1)) % rank == rank - 1
            elif _follows(node.op) or (node.op == "MatMulEpilogue" and name in node.inputs[3:5]) or \
                    (node.inputs[0] == name and scans_another_axis(node, self.g)):
                same = self.g.tensors[node.outputs[0]].shape == self.g.tensors[name].shape
                yield same and position == rank - 1 and self(node.outputs[0])
            else:
                yield False


def scans_another_axis(node: Node, g: Graph) -> bool:
    """Whether the node is a forward float CumSum along an axis other than the last: laid out feature-major, its
    input and result have the summed axis in the free dimension."""
    if node.op != "CumSum" or len(node.inputs) < 2 or node.attrs.get("reverse", 0):
        return False
    x, axis = g.tensors[node.inputs[0]], g.tensors[node.inputs[1]]
    if axis.value is None or axis.value.size != 1 or x.dtype is None or len(x.shape) < 2:
        return False
    if np.dtype(x.dtype).kind != "f":
        return False
    return int(axis.value.reshape(-1)[0]) % len(x.shape) != len(x.shape) - 1


# Convolutions, whose data input auto-cast narrows as a matmul's operand (a ConvEpilogue's residual and gate are
# not). Only dense ones count: with a depthwise reader's input narrowed too, MobileNetV3 ran 80.4 -> 81.3 us and
# MobileNetV2 179.2 -> 184.3 (bf16, trn1), the windows' schedule moved; EfficientNet-B0 gained 4 us of 287.
CONVOLUTIONS = ("Conv", "ConvEpilogue")


def only_multiplied(g: Graph, users: dict[str, list[Node]], name: str) -> bool:
    """Whether every reader of the tensor (through views) is a matmul or a dense convolution taking it as an
    operand: then, under auto-cast, its producer may store it in the matmul type, which is where every reader
    would round it."""
    if name in g.outputs:
        return False
    readers = users.get(name, [])
    for node in readers:
        if _carries(node.op) and node.inputs[0] == name:
            if not only_multiplied(g, users, node.outputs[0]):
                return False
        elif node.op in CONVOLUTIONS:
            if name in node.inputs[1:] or node.attrs.get("group", 1) != 1:
                return False
        elif not (is_matmul(node.op) and name in node.inputs[:2]):
            return False
    return bool(readers)
