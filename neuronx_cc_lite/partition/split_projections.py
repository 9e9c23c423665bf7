"""Split fused projections: a matmul by a constant weight whose output columns a Split cuts apart (GPT's c_attn,
one matmul for Q, K and V) becomes one matmul per piece.

    y = MatMulEpilogue(x, W, b)  [-> a view that keeps each row]  -> Split(y, last axis, sizes)
    =>  y_i = MatMulEpilogue(x, W[:, cols_i], b[cols_i])  [-> Reshape to [..., size_i]]
(or a Gemm, its C a constant row of biases, as TorchScript and dynamo exports of GPT-2 make it, or a plain MatMul).
A Split of the axis before the last, after a Reshape of the columns into [heads, head size], cuts whole heads:
Falcon's query_key_value, 4 query heads and a key and a value head.
Slices of the last axis that are y's only readers cut it the same way, each into its own matmul: Phi-3's qkv_proj,
whose dynamo export slices Q, K and V out of one product (and its gate_up_proj, Split in two).

The same products, so the same numbers; but now each piece can be cut by columns on its own (Q, K and V by head),
where a cut of the fused columns into rank blocks would straddle the pieces. Run only for tensor parallelism.
"""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node, Tensor
from neuronx_cc_lite.declared import contiguous


# Views between the product and its Split that keep each of its rows whole (_keeps_columns): GPT-2's Reshape,
# GPTBigCode's Unsqueeze of a leading axis, Falcon's Reshape of the columns into heads
VIEWS = frozenset({"Reshape", "Unsqueeze", "Squeeze"})


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
    """Whether `head` is a matmul by a constant 2-D weight whose columns may be cut into pieces: a MatMul, a
    MatMulEpilogue with no residual, or a Gemm whose C is a constant row (one bias per column) and whose A is not
    transposed."""
    if head.op not in ("MatMul", "MatMulEpilogue", "Gemm") or len(head.inputs) < 2 or not head.inputs[1] or \
            not g.tensors[head.inputs[1]].is_constant or \
            len(g.tensors[head.inputs[1]].shape) != 2:
        return False
    if head.op == "MatMul":
        return len(g.tensors[head.inputs[0]].shape) >= 2
    if head.op == "MatMulEpilogue":
        return len(head.inputs) >= 4 and not any(head.inputs[3:])  # no residual, no gate
    if head.op == "Gemm" and not int(head.attrs.get("transA", 0)):
        if len(head.inputs) < 3 or not head.inputs[2]:
            return True
        c = g.tensors[head.inputs[2]]
        return c.is_constant and (len(c.shape) == 1 or (len(c.shape) == 2 and c.shape[0] == 1))
    return False


def _keeps_columns(before: tuple[int, ...], after: tuple[int, ...], unit: int) -> bool:
    """Whether a view from `before` to `after` keeps each row of the last axis whole: that axis unchanged (unit
    1), or cut into [n / unit, unit] with the leading axes as they were."""
    if unit == 1:
        return before[-1] == after[-1]
    return before[:-1] == after[:-2] and before[-1] == after[-2] * after[-1]


def _columns(g: Graph, node: Node, n: int) -> tuple[int, int] | None:
    """[start, stop) of the last axis (of length n) that a Slice of that axis alone, step 1, keeps; else None."""
    if node.op != "Slice" or len(node.inputs) < 3:
        return None
    parts = [g.tensors[name] if name else None for name in (node.inputs + ["", ""])[1:5]]
    if any(t is not None and not t.is_constant for t in parts):
        return None
    starts, ends, axes, steps = (None if t is None else [int(v) for v in t.value.reshape(-1)] for t in parts)
    rank = len(g.tensors[node.inputs[0]].shape)
    if len(starts) != 1 or (axes is not None and axes[0] % rank != rank - 1) or \
            (axes is None and rank != 1) or (steps is not None and steps[0] != 1):
        return None
    start, stop = (min(max(v + n if v < 0 else v, 0), n) for v in (starts[0], ends[0]))
    return (start, stop) if start < stop else None


def _slice_pieces(g: Graph, users: dict[str, list[Node]], replace: dict[int, list[Node]], dead: set[int]) -> None:
    """A fused projection read only by Slices of its last axis, which do not overlap: one matmul per Slice."""
    for head in g.nodes:
        y = head.outputs[0] if head.outputs else ""
        readers = users.get(y, [])
        if not readers or y in g.outputs or id(head) in dead or not _fused(g, head):
            continue
        n = g.tensors[y].shape[-1]
        columns = [_columns(g, r, n) if r.inputs[0] == y else None for r in readers]
        if any(c is None for c in columns) or len(readers) < 2:
            continue
        spans = sorted(c for c in columns if c is not None)
        if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
            continue
        for i, (reader, (start, stop)) in enumerate(zip(readers, columns)):  # type: ignore[misc]
            replace[id(reader)] = [_piece(g, head, start, stop, reader.outputs[0], i)]
        dead.add(id(head))


def run(g: Graph) -> Graph:
    users = g.consumers()
    producers = g.producers()
    replace: dict[int, list[Node]] = {}
    dead: set[int] = set()
    _slice_pieces(g, users, replace, dead)
    for split in g.nodes:
        if split.op != "Split":
            continue
        x = split.inputs[0]
        shape = g.tensors[x].shape
        axis = int(split.attrs.get("axis", 0)) % len(shape)
        if axis < len(shape) - 2 or len(users.get(x, [])) != 1 or x in g.outputs:
            continue
        # columns a unit of the split axis covers: 1 on the last axis; on the one before it (Falcon's heads,
        # after a Reshape of the product's columns into heads x head size) a row of the last axis
        unit = 1 if axis == len(shape) - 1 else shape[-1]
        head = producers.get(x)
        reshape = None
        if head is not None and head.op in VIEWS and len(users.get(head.inputs[0], [])) == 1 and \
                head.inputs[0] not in g.outputs and _keeps_columns(g.tensors[head.inputs[0]].shape, shape, unit):
            reshape, head = head, producers.get(head.inputs[0])
        if head is None or not _fused(g, head) or (unit > 1 and reshape is None):
            continue
        sizes = _sizes(g, split, shape[axis])
        if sizes is None or sum(sizes) != shape[axis]:
            continue
        sizes = [size * unit for size in sizes]
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
