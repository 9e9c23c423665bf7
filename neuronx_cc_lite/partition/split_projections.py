"""Split fused projections: a matmul by a constant weight whose output columns a Split cuts apart (GPT's c_attn,
one matmul for Q, K and V) becomes one matmul per piece.

    y = MatMulEpilogue(x, W, b)  [-> Reshape that keeps the last axis]  -> Split(y, last axis, sizes)
    =>  y_i = MatMulEpilogue(x, W[:, cols_i], b[cols_i])  [-> Reshape to [..., size_i]]
(or a Gemm, its C a constant row of biases, as TorchScript and dynamo exports of GPT-2 make it)

The same products, so the same numbers; but now each piece can be cut by columns on its own (Q, K and V by head),
where a cut of the fused columns into rank blocks would straddle the pieces. Run only for tensor parallelism.
"""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node, Tensor
from neuronx_cc_lite.declared import contiguous


def _sizes(g: Graph, split: Node, n: int) -> list[int] | None:
    if len(split.inputs) > 1 and split.inputs[1]:
        t = g.tensors[split.inputs[1]]
        return [int(v) for v in t.value.reshape(-1)] if t.is_constant else None
    if split.attrs.get("split") is not None:
        return [int(v) for v in split.attrs["split"]]
    k = len(split.outputs)
    return [n // k] * k if n % k == 0 else None


def _piece(g: Graph, head: Node, start: int, stop: int, out: str, i: int) -> Node:
    w = g.tensors[head.inputs[1]]
    cols = w.value[start:stop] if int(head.attrs.get("transB", 0)) else w.value[:, start:stop]
    name = f"{head.inputs[1]}/cols{start}"
    g.tensors[name] = Tensor(name, tuple(cols.shape), w.dtype, contiguous(cols))
    inputs = [head.inputs[0], name, "", ""] if head.op == "MatMulEpilogue" else [head.inputs[0], name]
    if len(head.inputs) > 2 and head.inputs[2]:
        b = g.tensors[head.inputs[2]]
        bias = f"{head.inputs[2]}/cols{start}"
        cut = contiguous(b.value[..., start:stop])
        g.tensors[bias] = Tensor(bias, tuple(cut.shape), b.dtype, cut)
        inputs[2:3] = [bias]
    return Node(head.op, f"{head.name}/part{i}", inputs, [out], dict(head.attrs), head.domain, head.opset)


def _fused(g: Graph, head: Node) -> bool:
    """Whether `head` is a matmul by a constant 2-D weight whose columns may be cut into pieces: a MatMulEpilogue
    with no residual, or a Gemm whose C is a constant row (one bias per column) and whose A is not transposed."""
    if len(head.inputs) < 2 or not g.tensors[head.inputs[1]].is_constant or \
            len(g.tensors[head.inputs[1]].shape) != 2:
        return False
    if head.op == "MatMulEpilogue":
        return len(head.inputs) >= 4 and not any(head.inputs[3:])  # no residual, no gate
    if head.op == "Gemm" and not int(head.attrs.get("transA", 0)):
        if len(head.inputs) < 3 or not head.inputs[2]:
            return True
        c = g.tensors[head.inputs[2]]
        return c.is_constant and (len(c.shape) == 1 or (len(c.shape) == 2 and c.shape[0] == 1))
    return False


def run(g: Graph) -> Graph:
    users = g.consumers()
    producers = g.producers()
    replace: dict[int, list[Node]] = {}
    dead: set[int] = set()
    for split in g.nodes:
        if split.op != "Split":
            continue
        x = split.inputs[0]
        shape = g.tensors[x].shape
        if int(split.attrs.get("axis", 0)) % len(shape) != len(shape) - 1 or len(users.get(x, [])) != 1 or \
                x in g.outputs:
            continue
        head = producers.get(x)
        reshape = None
        if head is not None and head.op == "Reshape" and len(users.get(head.inputs[0], [])) == 1 and \
                g.tensors[head.inputs[0]].shape[-1] == shape[-1] and head.inputs[0] not in g.outputs:
            reshape, head = head, producers.get(head.inputs[0])
        if head is None or not _fused(g, head):
            continue
        sizes = _sizes(g, split, shape[-1])
        if sizes is None or sum(sizes) != shape[-1]:
            continue
        nodes, start = [], 0
        for i, (size, out) in enumerate(zip(sizes, split.outputs)):
            if reshape is None:
                nodes.append(_piece(g, head, start, start + size, out, i))
            else:
                flat = f"{out}/flat"
                flat_shape = (*g.tensors[head.outputs[0]].shape[:-1], size)
                g.tensors[flat] = Tensor(flat, flat_shape, g.tensors[out].dtype)
                target = f"{out}/shape"
                g.tensors[target] = Tensor(target, (len(g.tensors[out].shape),), np.dtype(np.int64),
                                           np.array(g.tensors[out].shape, np.int64))
                nodes += [_piece(g, head, start, start + size, flat, i),
                          Node("Reshape", f"{reshape.name}/part{i}", [flat, target], [out], {}, "", reshape.opset)]
            start += size
        replace[id(split)] = nodes
        dead |= {id(head)} | ({id(reshape)} if reshape is not None else set())
    g.nodes = [m for node in g.nodes if id(node) not in dead for m in replace.get(id(node), [node])]
    return g
