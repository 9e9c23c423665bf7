"""Rewrite what exporters spell in many steps into the one step it is, before lowering sees it:

- a chain of Reshape, Transpose, Squeeze, Unsqueeze and Flatten whose intermediate values nothing else reads is
  at most one Reshape that splits axes, then one Transpose (the order the layout stage follows): torch's SDPA
  export turns the keys with Reshape [B, S, H, D], Transpose, Reshape [B*H, S, D], Transpose, Reshape
  [B, H, D, S], which is Reshape [B, S, H, D] then Transpose(perm [0, 2, 3, 1]). The chain's effect is found
  by moving an index array through it (numpy, at compile time); chains over tensors of more than MAX_TRACKED
  elements are left alone.
- a MatMul of operands multiplied (or divided) by scalar constants is the MatMul of the operands, multiplied
  by the product of the scalars: the SDPA export scales both Q and K^T by sqrt(scale); one scale after the
  MatMul is applied as PSUM is evacuated (fuse-epilogues), where two scales of the operands were passes of
  their own over them.

A rewrite happens only when every value it swallows has no other reader and is no graph output, so the rest of
the graph sees the same values. Nodes left without readers are removed by eliminate-dead-code.
"""

from __future__ import annotations


import numpy as np

from neuronx_cc_lite.ir import Graph, Node, Tensor

VIEWS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
MAX_TRACKED = 1 << 24  # elements: an index array of this size is 64 MiB of int32


def run(g: Graph) -> Graph:
    _compose_views(g)
    _scalars_after_matmul(g)
    return g


# ---- chains of views ------------------------------------------------------------------------------------------

def _compose_views(g: Graph) -> None:
    producers, users = g.producers(), g.consumers()
    for node in list(g.nodes):
        if node.op not in VIEWS or node not in g.nodes:
            continue
        readers = users.get(node.outputs[0], [])
        if len(readers) == 1 and readers[0].op in VIEWS and node.outputs[0] not in g.outputs:
            continue  # not the chain's end: its reader's chain takes this node in
        chain = [node]
        while True:  # walk up while the value feeding the chain is a view's result only the chain reads
            source = chain[0].inputs[0]
            up = producers.get(source)
            if up is None or up.op not in VIEWS or len(users.get(source, [])) != 1 or source in g.outputs:
                break
            chain.insert(0, up)
        if len(chain) < 2 or not any(n.op == "Transpose" for n in chain):
            continue
        x, y = chain[0].inputs[0], chain[-1].outputs[0]
        replacement = _one_step(g, x, y, chain)
        if replacement is None or len(replacement) >= len(chain):
            continue
        at = g.nodes.index(chain[-1])
        g.nodes[at:at + 1] = replacement
        for n in chain[:-1]:
            users[n.inputs[0]] = [u for u in users.get(n.inputs[0], []) if u is not n]
        for n in replacement:
            producers[n.outputs[0]] = n
            users.setdefault(n.inputs[0], []).append(n)


def _one_step(g: Graph, x: str, y: str, chain: list[Node]) -> list[Node] | None:
    """What the chain amounts to as at most a Reshape of x (splitting its row-major order into axes) then a
    Transpose of those axes; None when it is no such thing.

    Each axis of y steps through x's elements (in row-major order) by a stride. Sorted by stride, y's axes of size
    > 1 must each step by the next one's stride times its size, the last by 1: then they split x's order into
    those sizes (the Reshape, y's axes of size 1 first), and y puts them in its own order (the Transpose)."""
    src, dst = g.tensors[x], g.tensors[y]
    if any(g.tensors[n.outputs[0]].shape is None for n in chain) or src.shape is None:
        return None  # a shape left to run time (refused, or a host part's): nothing to simplify
    if src.size > MAX_TRACKED or src.size != dst.size or src.size < 2:
        return None
    value = np.arange(src.size, dtype=np.int32).reshape(src.shape)
    for n in chain:
        value = _apply(g, n, value)
        if value is None:
            return None
    if value.shape != dst.shape:
        return None
    name = chain[-1].name
    if np.array_equal(value.reshape(-1), np.arange(src.size, dtype=np.int32)):
        return [_reshape(g, x, y, name, dst.shape)]
    origin = int(value.reshape(-1)[0])
    stride = {k: int(value[tuple(1 if a == k else 0 for a in range(len(dst.shape)))]) - origin
              for k, n in enumerate(dst.shape) if n > 1}
    units = [k for k, n in enumerate(dst.shape) if n == 1]
    order = units + sorted(stride, key=lambda k: -stride[k])
    split = tuple(dst.shape[k] for k in order)
    expected = 1
    for k in reversed(order[len(units):]):
        if stride[k] != expected:
            return None
        expected *= dst.shape[k]
    perm = [order.index(k) for k in range(len(dst.shape))]
    if not np.array_equal(np.arange(src.size, dtype=np.int32).reshape(split).transpose(perm), value):
        return None
    nodes = []
    if split != src.shape:
        split_name = g.fresh(f"{name}/split")
        g.tensors[split_name] = Tensor(split_name, split, src.dtype)
        nodes.append(_reshape(g, x, split_name, f"{name}/reshape", split))
        x = split_name
    nodes.append(Node("Transpose", name, [x], [y], {"perm": perm}))
    return nodes


def _apply(g: Graph, n: Node, value: np.ndarray) -> np.ndarray | None:
    out = g.tensors[n.outputs[0]].shape
    if n.op == "Transpose":
        perm = n.attrs.get("perm")
        return value.transpose(perm if perm is not None else None)
    if n.op in ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"):
        return value.reshape(out) if value.size == int(np.prod(out, dtype=np.int64)) else None
    return None


def _reshape(g: Graph, x: str, y: str, name: str, shape: tuple[int, ...]) -> Node:
    target = g.fresh(f"{name}/shape")
    g.tensors[target] = Tensor(target, (len(shape),), np.dtype(np.int64), np.array(shape, dtype=np.int64))
    return Node("Reshape", name, [x, target], [y])


# ---- scalars through a MatMul -----------------------------------------------------------------------------------

def _scalars_after_matmul(g: Graph) -> None:
    producers, users = g.producers(), g.consumers()
    for node in list(g.nodes):
        if node.op != "MatMul":
            continue
        factor, inputs, swallowed = 1.0, list(node.inputs), []
        for k, name in enumerate(node.inputs[:2]):
            scaled = producers.get(name)
            scale = _scalar_factor(g, scaled) if scaled is not None else None
            if scale is None or len(users.get(name, [])) != 1 or name in g.outputs:
                continue
            factor *= scale[1]
            inputs[k] = scale[0]
            swallowed.append(scaled)
        if not swallowed:
            continue
        out = g.tensors[node.outputs[0]]
        product = g.fresh(f"{node.name}/unscaled")
        g.tensors[product] = Tensor(product, out.shape, out.dtype)
        constant = g.fresh(f"{node.name}/scale")
        g.tensors[constant] = Tensor(constant, (), out.dtype, np.array(factor, dtype=out.dtype))
        matmul = Node("MatMul", node.name, inputs, [product], dict(node.attrs), node.domain, node.opset)
        mul = Node("Mul", f"{node.name}/scaled", [product, constant], list(node.outputs))
        at = g.nodes.index(node)
        g.nodes[at:at + 1] = [matmul, mul]
        for n in swallowed:
            users[n.outputs[0]] = []


def _scalar_factor(g: Graph, n: Node) -> tuple[str, float] | None:
    """(x, s) when the node is x * s, s * x or x / s with s a scalar constant, in fp32. A narrower type's product
    (an fp16 model's Q * scale) is rounded to it before the MatMul reads it: moving the scale would skip that."""
    if n.op not in ("Mul", "Div") or len(n.inputs) != 2:
        return None
    a, b = (g.tensors[i] for i in n.inputs)
    out = g.tensors[n.outputs[0]]
    if out.shape != (a.shape if b.is_constant else b.shape) or out.dtype != np.float32:
        return None
    if b.is_constant and b.value.size == 1:
        s = float(b.value.reshape(-1)[0])
        return (n.inputs[0], 1.0 / s if n.op == "Div" else s) if s != 0 else None
    if n.op == "Mul" and a.is_constant and a.value.size == 1:
        return n.inputs[1], float(a.value.reshape(-1)[0])
    return None
