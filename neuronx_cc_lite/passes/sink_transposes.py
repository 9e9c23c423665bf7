"""Move each Transpose below the elementwise ops, slices and concatenations that read it, towards the operator
that needs its order (a MatMul, which reads a transposed operand as an access pattern).

A Llama export transposes each projection's [batch, seq, heads, dim] output to [batch, heads, seq, dim] and then
applies RoPE to it: two multiplies by cos and sin, a rotate-half of two Slices, a Neg and a Concat, an Add. On the
transposed order every one of those reads rows of 64 elements with the heads on 32 partitions; in the
projection's own order they read its rows whole, on 128 partitions, and one Transpose is left at the end.

The rewrites (x the Transpose's input, p its perm, inv the inverse perm):
- an elementwise op (the registry's trait) of Transpose_p(x) and other operands, each a Transpose_p of something
  or a constant: the op of their inputs and of the constants transposed by inv now, then Transpose_p;
- Slice(Transpose_p(x)) along axis a: Slice(x) along p[a], then Transpose_p;
- Concat of Transpose_p's (and constants) along axis a: Concat along p[a], then Transpose_p;
- Transpose_q(Transpose_p(x)): one Transpose of the composed perm (nothing when that is the identity).
A Transpose moves only when every reader of its result can take it (so it is gone, not doubled) and its result
is no graph output; each move leaves one Transpose below, which moves on in turn. A Transpose a move leaves unread
(b's in Add(T(a), T(b)) when a's stays for its other readers) is dropped.
"""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node, Tensor
from neuronx_cc_lite.ops.attributes import transpose_perm
from neuronx_cc_lite.ops.registry import kind_of
from neuronx_cc_lite.ops.traits import OpKind


def run(g: Graph) -> Graph:
    work = [n for n in g.nodes if n.op == "Transpose"]
    while work:
        transpose = work.pop()
        if transpose in g.nodes:
            work.extend(_sink(g, transpose))
    # a Transpose whose reader took the other operand's Transpose instead (Add(T(a), T(b)) -> T(Add(a, b)), moved
    # from b's side while a's stays for its other readers) is read by nobody: gone now, not at the end of the
    # pipeline, so that fuse-epilogues sees a's producer read by the Add alone (ConvNeXt's first block)
    read = {i for n in g.nodes for i in n.inputs}
    g.nodes = [n for n in g.nodes if n.op != "Transpose" or n.outputs[0] in read or n.outputs[0] in g.outputs]
    return g


def _sink(g: Graph, transpose: Node) -> list[Node]:
    """Move `transpose` below all its readers; the Transposes it leaves below them (none when it cannot move)."""
    result = transpose.outputs[0]
    readers = g.consumers().get(result, [])
    if not readers or result in g.outputs or g.tensors[transpose.inputs[0]].shape is None:
        return []  # nothing to sink into, or a shape known only at run time (a host partition's)
    producers = g.producers()
    perm = transpose_perm(transpose, g)
    rewrites = []
    for reader in {id(r): r for r in readers}.values():  # a reader naming it twice (x * x) is one rewrite
        rewrite = _commuted(g, reader, perm, producers)
        if rewrite is None:
            return []
        rewrites.append((reader, rewrite))
    below = []
    for reader, rewrite in rewrites:
        at = g.nodes.index(reader)
        g.nodes[at:at + 1] = rewrite
        below += [n for n in rewrite if n.op == "Transpose"]
    return below


def _commuted(g: Graph, node: Node, perm: list[int], producers: dict[str, Node]) -> list[Node] | None:
    """The nodes that compute `node`'s output with the Transposes (perm) of its operands moved below it; None
    when it is not one of the rewrites."""
    rank, inv = len(perm), [int(k) for k in np.argsort(perm)]
    shape = g.tensors[node.outputs[0]].shape if len(node.outputs) == 1 else None
    if node.domain or shape is None or len(shape) != rank:
        return None

    def untransposed(name: str) -> str | None:
        """The operand before the Transpose: its input, a constant transposed now, or None."""
        up = producers.get(name)
        if up is not None and up.op == "Transpose" and transpose_perm(up, g) == perm:
            return up.inputs[0]
        t = g.tensors[name]
        if t.value is None or t.value.ndim > rank:
            return None
        value = t.value.reshape((1,) * (rank - t.value.ndim) + t.value.shape).transpose(inv)
        const = g.fresh(f"{name}/transposed")
        g.tensors[const] = Tensor(const, value.shape, t.dtype, np.ascontiguousarray(value))
        return const

    if node.op == "Transpose":
        composed = [perm[k] for k in transpose_perm(node, g)]
        x = producers[node.inputs[0]].inputs[0]
        if composed == list(range(rank)):
            return [Node("Identity", node.name, [x], node.outputs)]
        return [Node("Transpose", node.name, [x], node.outputs, {"perm": composed})]
    attrs = dict(node.attrs)
    if kind_of(node.op) is OpKind.ELEMENTWISE:
        inputs = [untransposed(name) if name else "" for name in node.inputs]
    elif node.op == "Concat":
        inputs = [untransposed(name) for name in node.inputs]
        attrs["axis"] = perm[node.attrs["axis"] % rank]
    elif node.op == "Slice" and g.opset_of(node) >= 10 and all(g.tensors[n].is_constant for n in node.inputs[1:]
                                                                if n):
        x = untransposed(node.inputs[0])
        starts = g.tensors[node.inputs[1]].value
        axes = (g.tensors[node.inputs[3]].value if len(node.inputs) > 3 and node.inputs[3]
                else np.arange(len(starts)))
        moved = g.fresh(f"{node.name}/axes")
        g.tensors[moved] = Tensor(moved, (len(axes),), np.dtype(np.int64),
                                  np.array([perm[int(a) % rank] for a in axes], np.int64))
        inputs = [x, node.inputs[1], node.inputs[2], moved, *node.inputs[4:5]]
    else:
        return None
    if any(name is None for name in inputs):
        return None
    y = g.tensors[node.outputs[0]]
    before = g.fresh(f"{y.name}/untransposed")
    g.tensors[before] = Tensor(before, tuple(y.shape[k] for k in inv), y.dtype)
    return [Node(node.op, node.name, inputs, [before], attrs, node.domain, node.opset),  # type: ignore[arg-type]
            Node("Transpose", f"{node.name}/transpose", [before], [y.name], {"perm": list(perm)})]
