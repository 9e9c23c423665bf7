"""Einsum with one or two operands, rewritten as the ops it is made of: ReduceSum, Transpose, Reshape, MatMul.

For A,B->out, each label is a batch label (in A, B and out), contracted (in A and B, not out), kept from one side
(in one input and out), or summed on its own side (in one input only): those are summed first. Then

    A -> Transpose [batch, left, contracted] -> Reshape [batch..., L, K]
    B -> Transpose [batch, contracted, right] -> Reshape [batch..., K, R]
    MatMul -> [batch..., L, R] -> Reshape [batch..., left..., right...] -> Transpose to out's order.

One operand is a ReduceSum over the labels out lacks, then a Transpose. An equation this cannot express (a label
repeated within a term, a diagonal; three or more operands) is left as Einsum, whose check names the reason.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from neuronx_cc_lite.ir import Graph, Node, Tensor

_ELLIPSIS_LABELS = "0123456789"  # stand-ins for the axes "..." covers (digits are never einsum labels)


def parse(node: Node, g: Graph) -> tuple[list[str], str] | str:
    """(the label string of each input, the output's) with "..." spelled out, or why the equation is refused."""
    eq = node.attrs["equation"]
    eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(node.inputs) or len(terms) > 2:
        return f"Einsum with {len(node.inputs)} operands (one or two only)"
    ranks = [len(g.tensors[name].shape) for name in node.inputs]
    dots = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    terms = [t.replace("...", _ELLIPSIS_LABELS[dots - (r - len(t.replace("...", ""))):dots]) for t, r in
             zip(terms, ranks)]
    if not arrow:  # implicit output: the labels seen once, in order, after the ellipsis axes
        counts = Counter("".join(terms))
        out = _ELLIPSIS_LABELS[:dots] + "".join(sorted(c for c, k in counts.items() if k == 1 and c.isalpha()))
    else:
        out = out.replace("...", _ELLIPSIS_LABELS[:dots])
    for t, r in zip(terms, ranks):
        if len(t) != r:
            return f"Einsum term {t!r} does not match its input's rank {r}"
        if len(set(t)) != len(t):
            return f"Einsum term {t!r} repeats a label (a diagonal)"
    return terms, out


class _Builder:
    def __init__(self, g: Graph, node: Node) -> None:
        self.g, self.node, self.count = g, node, 0
        self.nodes: list[Node] = []
        self.dtype = g.tensors[node.inputs[0]].dtype

    def add(self, op: str, inputs: list[str], shape: tuple[int, ...], out: str | None = None,
            **attrs: object) -> str:
        self.count += 1
        name = out or f"{self.node.name}/einsum{self.count}"
        if out is None:
            self.g.tensors[name] = Tensor(name, tuple(shape), self.dtype)
        self.nodes.append(Node(op, f"{self.node.name}/{op}{self.count}", inputs, [name], attrs))
        return name

    def const(self, values: list[int]) -> str:
        self.count += 1
        name = f"{self.node.name}/einsum_const{self.count}"
        value = np.asarray(values, dtype=np.int64)
        self.g.tensors[name] = Tensor(name, value.shape, value.dtype, value)
        return name

    def reduce_sum(self, x: str, labels: str, keep: str) -> tuple[str, str]:
        """x summed over its labels not in `keep`: (result, its labels)."""
        axes = [i for i, c in enumerate(labels) if c not in keep]
        if not axes:
            return x, labels
        shape = tuple(n for i, n in enumerate(self.g.tensors[x].shape) if i not in axes)
        if self.g.opset_of(self.node) >= 13:
            return self.add("ReduceSum", [x, self.const(axes)], shape, keepdims=0), "".join(
                c for c in labels if c in keep)
        return self.add("ReduceSum", [x], shape, axes=axes, keepdims=0), "".join(c for c in labels if c in keep)

    def transpose(self, x: str, labels: str, order: str, out: str | None = None) -> str:
        if labels == order and out is None:
            return x
        perm = [labels.index(c) for c in order]
        shape = tuple(self.g.tensors[x].shape[p] for p in perm)
        return self.add("Transpose", [x], shape, out, perm=perm)

    def reshape(self, x: str, shape: tuple[int, ...], out: str | None = None) -> str:
        if self.g.tensors[x].shape == shape and out is None:
            return x
        return self.add("Reshape", [x, self.const(list(shape))], shape, out)


def _expand(g: Graph, node: Node, terms: list[str], out: str) -> list[Node]:
    b = _Builder(g, node)
    if len(terms) == 1:
        x, labels = b.reduce_sum(node.inputs[0], terms[0], out)
        b.transpose(x, labels, out, node.outputs[0])
        return b.nodes
    (ta, tb), (a, bname) = terms, node.inputs
    a, ta = b.reduce_sum(a, ta, tb + out)
    bname, tb = b.reduce_sum(bname, tb, ta + out)
    batch = "".join(c for c in out if c in ta and c in tb)
    contracted = "".join(c for c in ta if c in tb and c not in out)
    left = "".join(c for c in ta if c not in tb)
    right = "".join(c for c in tb if c not in ta)
    sa, sb = dict(zip(ta, g.tensors[a].shape)), dict(zip(tb, g.tensors[bname].shape))
    size = {**sa, **sb}
    for c in batch + contracted:  # batch axes broadcast as MatMul's do
        size[c] = max(sa[c], sb[c])
    if not left and not right:  # a dot product per batch index: an elementwise product and a sum, no 1x1 matmul
        shape = tuple(size[c] for c in batch + contracted)
        product = b.add("Mul", [b.transpose(a, ta, batch + contracted), b.transpose(bname, tb, batch + contracted)],
                        shape)
        summed, labels = b.reduce_sum(product, batch + contracted, out)
        b.transpose(summed, labels, out, node.outputs[0])
        return b.nodes
    k = math.prod(sa[c] for c in contracted)
    a2 = b.reshape(b.transpose(a, ta, batch + left + contracted),
                   tuple(sa[c] for c in batch) + (math.prod(sa[c] for c in left), k))
    b2 = b.reshape(b.transpose(bname, tb, batch + contracted + right),
                   tuple(sb[c] for c in batch) + (k, math.prod(sb[c] for c in right)))
    product = b.add("MatMul", [a2, b2], tuple(size[c] for c in batch) + (
        math.prod(sa[c] for c in left), math.prod(sb[c] for c in right)))
    labels = batch + left + right
    if sorted(labels) == sorted(out) and "".join(c for c in out if c in labels) == labels:
        b.reshape(product, tuple(size[c] for c in labels), node.outputs[0])  # already in out's order
    else:
        b.transpose(b.reshape(product, tuple(size[c] for c in labels)), labels, out, node.outputs[0])
    return b.nodes


def run(g: Graph) -> Graph:
    nodes: list[Node] = []
    for node in g.nodes:
        parsed = parse(node, g) if node.op == "Einsum" and node.domain in ("", "ai.onnx") else None
        if parsed is None or isinstance(parsed, str):
            nodes.append(node)
            continue
        nodes.extend(_expand(g, node, *parsed))
    g.nodes = nodes
    return g
