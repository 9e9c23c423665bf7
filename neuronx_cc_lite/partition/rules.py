"""How placements flow through one operator.

    rule(node, graph, placements of its inputs, n, decision) -> (placement each input must have, of each output)

A rule keeps what the operator can compute locally (each rank on its block) and asks for the rest to be moved:
an elementwise op runs on any blocks that line up; LayerNorm, Softmax and reductions need their own axes whole;
Reshape and Transpose carry a shard to wherever its axis goes; a matmul whose contracted axis is sharded on both
sides gives partial sums; a weight matmul with a whole input may be cut by output columns and a large embedding
table by rows (the `decision` the planner tries). An operator without a rule reads every input whole (correct,
just not faster).
"""

from __future__ import annotations

from typing import Callable

from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.ops.registry import kind_of
from neuronx_cc_lite.ops.traits import OpKind
from neuronx_cc_lite.partition.placement import PARTIAL, REPLICATED, Placement, Shard, refines, valid

Rule = Callable[[Node, Graph, list[Placement], int, "Shard | None"], tuple[list[Placement], list[Placement]]]

_LINEAR_PAIRS = frozenset({"Add", "Sub"})  # partial + partial stays partial


def _shape(g: Graph, name: str) -> tuple[int, ...]:
    return tuple(g.tensors[name].shape)


def _whole(p: Placement) -> Placement:
    return REPLICATED if p.partial else p


def _is_const(g: Graph, name: str) -> bool:
    return bool(name) and g.tensors[name].is_constant


def _broadcast_map(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> dict[int, int]:
    """Input axis -> output axis, right-aligned, for the axes that are not broadcast."""
    off = len(out_shape) - len(in_shape)
    return {j: j + off for j, n in enumerate(in_shape) if n == out_shape[j + off]}


def _inverse(mapping: dict[int, int]) -> dict[int, int]:
    return {v: k for k, v in mapping.items()}


def _fit(p: Placement, shape: tuple[int, ...], n: int) -> Placement:
    return p if valid(p, shape, n) else REPLICATED


def elementwise(node: Node, g: Graph, ins: list[Placement], n: int, decision: Shard | None):
    out_shape = _shape(g, node.outputs[0])
    partial = [p.partial for p in ins]
    if any(partial):
        others_whole = all(not p.shards and not p.partial for p, f in zip(ins, partial) if not f)
        if (node.op in _LINEAR_PAIRS and all(partial)) or (node.op in ("Neg", "Identity") and partial[0]) or \
                (node.op == "Cast" and g.tensors[node.outputs[0]].dtype.kind == "f") or \
                (node.op in ("Mul", "Div") and sum(partial) == 1 and others_whole and (partial[0] or node.op == "Mul")):
            return list(ins), [PARTIAL] * len(node.outputs)
    maps = [_broadcast_map(_shape(g, name), out_shape) if name else {} for name in node.inputs]  # "": absent
    mapped = [_whole(p).remap(m) for p, m in zip(ins, maps)]
    target = max(mapped, key=lambda p: len(p.shards))
    target = _fit(target, out_shape, n)
    required = [target.remap(_inverse(m)) for m in maps]
    return required, [target] * len(node.outputs)


def transpose(node: Node, g: Graph, ins: list[Placement], n: int, decision: Shard | None):
    rank = len(_shape(g, node.inputs[0]))
    perm = node.attrs.get("perm")
    perm = [int(p) % rank for p in perm] if perm is not None else list(reversed(range(rank)))
    return [ins[0]], [ins[0].remap({p: k for k, p in enumerate(perm)})]


def reshape_groups(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Consecutive axes of `a` and of `b` with equal products: the pieces a reshape maps onto each other."""
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        gi, gj, pa, pb = [], [], 1, 1
        if i < len(a):
            gi.append(i); pa *= a[i]; i += 1  # noqa: E702
        if j < len(b):
            gj.append(j); pb *= b[j]; j += 1  # noqa: E702
        while pa != pb:
            if (pa < pb and i < len(a)) or j == len(b):
                gi.append(i); pa *= a[i]; i += 1  # noqa: E702
            else:
                gj.append(j); pb *= b[j]; j += 1  # noqa: E702
        groups.append((gi, gj))
    return groups


def _merge(p: Placement, shape: tuple[int, ...], axes: list[int]) -> tuple[int, int] | None:
    """The shards on a group of axes as one shard of their flattened extent: (parts, stride), (1, 1) when none,
    None when the blocks are not contiguous pieces of it in rank order."""
    sharded = [a for a in axes if p.shard_of(a)]
    if not sharded:
        return 1, 1
    if any(shape[a] != 1 for a in axes if a < sharded[0]):
        return None
    parts, prev = 1, None
    for a in range(sharded[0], sharded[-1] + 1):
        s = p.shard_of(a)
        if s is None:
            if shape[a] != 1:
                return None
            continue
        if prev is not None and (prev.parts != shape[prev.axis] or prev.stride != s.stride * s.parts):
            return None
        parts *= s.parts
        prev = s
    return parts, prev.stride  # type: ignore[union-attr]


def _split(parts: int, stride: int, shape: tuple[int, ...], axes: list[int]) -> list[Shard] | None:
    """A shard of a flattened extent laid over the axes it unflattens to, outermost first."""
    shards = []
    for a in axes:
        if parts == 1:
            break
        if shape[a] == 1:
            continue
        if shape[a] % parts == 0:
            shards.append(Shard(a, parts, stride))
            parts = 1
        elif parts % shape[a] == 0:
            parts //= shape[a]
            shards.append(Shard(a, shape[a], stride * parts))
        else:
            return None
    return shards if parts == 1 else None


def reshape(node: Node, g: Graph, ins: list[Placement], n: int, decision: Shard | None):
    a, b = _shape(g, node.inputs[0]), _shape(g, node.outputs[0])
    p = ins[0]
    kept_in: list[Shard] = []
    out: list[Shard] = []
    for gi, gj in reshape_groups(a, b):
        merged = _merge(p, a, gi)
        split = _split(*merged, b, gj) if merged else None
        if split is None:
            continue  # this group's shards are gathered before the reshape
        kept_in += [s for s in p.shards if s.axis in gi]
        out += split
    required = Placement(tuple(s for s in p.shards if s in kept_in), p.partial)
    result = Placement(Placement.of(out).shards, p.partial)
    return [required] + [REPLICATED] * (len(node.inputs) - 1), [result]


def _matmul_axes(node: Node, g: Graph) -> tuple[dict[str, int], dict[str, int], dict[int, int], dict[int, int]]:
    """Axis numbers of M, K, N in A, B and the output, and the batch axes of A and B -> output axes."""
    sa, sb, so = _shape(g, node.inputs[0]), _shape(g, node.inputs[1]), _shape(g, node.outputs[0])
    ta, tb = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
    ra, rb, r = len(sa), len(sb), len(so)
    a = {"m": ra - 1 if ta else ra - 2, "k": ra - 2 if ta else ra - 1}
    b = {"k": rb - 1 if tb else rb - 2, "n": rb - 2 if tb else rb - 1}
    o = {"m": r - 2, "n": r - 1}
    a_batch = {j: r - ra + j for j in range(ra - 2) if sa[j] == so[r - ra + j]}
    b_batch = {j: r - rb + j for j in range(rb - 2) if sb[j] == so[r - rb + j]}
    return {**a, "om": o["m"]}, {**b, "on": o["n"]}, a_batch, b_batch


def matmul(node: Node, g: Graph, ins: list[Placement], n: int, decision: Shard | None):
    sa, sb, so = _shape(g, node.inputs[0]), _shape(g, node.inputs[1]), _shape(g, node.outputs[0])
    if len(sa) < 2 or len(sb) < 2:
        return default(node, g, ins, n, decision)
    ax_a, ax_b, a_batch, b_batch = _matmul_axes(node, g)
    pa, pb = _whole(ins[0]), _whole(ins[1])
    ka, kb = pa.shard_of(ax_a["k"]), pb.shard_of(ax_b["k"])
    activation = node.op == "MatMulEpilogue" and node.attrs.get("activation")
    # partial sums when either side's K is cut: into n blocks, one per rank, each side slicing locally what it
    # holds (4 head blocks on 8 ranks are 8 half-head blocks of the contraction)
    k = Shard(ax_a["k"], n, 1) if (ka or kb) and sa[ax_a["k"]] % n == 0 else None
    if k is not None and ka is not None and not refines(Placement((k,)), Placement((ka,)), sa, n):
        k = None
    if k is not None and kb is not None and not refines(Placement((Shard(ax_b["k"], n, 1),)), Placement((kb,)), sb, n):
        k = None
    rest = [s for s in pa.shards if s.axis != ax_a["k"]] + [s for s in pb.shards if s.axis != ax_b["k"]]
    extra = list(node.inputs[2:])
    if k is not None and not activation and not rest:
        req_a = Placement((Shard(ax_a["k"], k.parts, k.stride),))
        req_b = Placement((Shard(ax_b["k"], k.parts, k.stride),))
        req_extra = [(ins[2 + i] if ins[2 + i].partial else REPLICATED) if name else REPLICATED
                     for i, name in enumerate(extra)]
        return [req_a, req_b, *req_extra], [PARTIAL]
    to_out_a = {**a_batch, ax_a["m"]: ax_a["om"]}
    to_out_b = {**b_batch, ax_b["n"]: ax_b["on"]}
    shards = list(pa.remap(to_out_a).shards)
    b_out = pb.remap(to_out_b).shards
    if decision is not None and _is_const(g, node.inputs[1]) and not b_out:
        b_out = (Shard(ax_b["on"], decision.parts, decision.stride),)
    for s in b_out:
        if all(t.axis != s.axis for t in shards) and valid(Placement.of([*shards, s]), so, n):
            shards.append(s)
    target = _fit(Placement.of(shards), so, n)
    req_a = target.remap(_inverse(to_out_a))
    req_b = target.remap(_inverse(to_out_b))
    req_extra = []
    for i, name in enumerate(extra):
        if not name:
            req_extra.append(REPLICATED)
        elif node.op == "MatMulEpilogue" and i == 0:  # the bias: one value per output column
            req_extra.append(target.remap({ax_b["on"]: 0}))
        else:  # a residual or Gemm's C: broadcast against the output
            req_extra.append(target.remap(_inverse(_broadcast_map(_shape(g, name), so))))
    return [req_a, req_b, *req_extra], [target]


def _axes_from(node: Node, g: Graph, rank: int, attr: str = "axes", index: int = 1) -> set[int] | None:
    if node.attrs.get(attr) is not None:
        return {int(a) % rank for a in node.attrs[attr]}
    if len(node.inputs) > index and node.inputs[index]:
        t = g.tensors[node.inputs[index]]
        return {int(a) % rank for a in t.value.reshape(-1)} if t.is_constant else set(range(rank))
    return None


def normalize(node: Node, g: Graph, ins: list[Placement], n: int, decision: Shard | None):
    """LayerNorm and RMSNorm (axes from `axis` on), Softmax (one axis; from `axis` on before opset 13)."""
    rank = len(_shape(g, node.inputs[0]))
    axis = int(node.attrs.get("axis", -1)) % rank
    if node.op in ("Softmax", "LogSoftmax") and g.opset_of(node) >= 13:
        whole = {axis}
    else:
        whole = set(range(axis, rank))
    p = _whole(ins[0]).without(whole)
    outs = [p] + [Placement.of([s for s in p.shards if s.axis < axis])] * (len(node.outputs) - 1)
    return [p] + [REPLICATED] * (len(node.inputs) - 1), outs


def reduction(node: Node, g: Graph, ins: list[Placement], n: int, decision: Shard | None):
    rank = len(_shape(g, node.inputs[0]))
    if node.op in ("ArgMax", "ArgMin"):
        axes = {int(node.attrs.get("axis", 0)) % rank}
    else:
        axes = _axes_from(node, g, rank)
        if axes is None:
            axes = set() if node.attrs.get("noop_with_empty_axes") else set(range(rank))
    p = _whole(ins[0]).without(axes)
    keep = int(node.attrs.get("keepdims", 1))
    mapping = {a: a if keep else a - sum(1 for r in axes if r < a) for a in range(rank) if a not in axes}
    return [p] + [REPLICATED] * (len(node.inputs) - 1), [p.remap(mapping)]


def along_axis(node: Node, g: Graph, ins: list[Placement], n: int, decision: Shard | None):
    """Split, Concat and Slice: the axes they cut or join must be whole; the rest pass through."""
    rank = len(_shape(g, node.inputs[0]))
    if node.op == "Slice":
        axes = _axes_from(node, g, rank, index=3)
        whole = axes if axes is not None else set(range(rank))
        p = _whole(ins[0]).without(whole)
        return [p] + [REPLICATED] * (len(node.inputs) - 1), [p]
    axis = int(node.attrs.get("axis", 0)) % rank
    if node.op == "Split":
        p = ins[0].without({axis}) if not ins[0].partial else ins[0]
        return [p] + [REPLICATED] * (len(node.inputs) - 1), [p] * len(node.outputs)
    target = max((_whole(p).without({axis}) for p in ins), key=lambda p: len(p.shards))
    return [target] * len(ins), [target]


def gather(node: Node, g: Graph, ins: list[Placement], n: int, decision: Shard | None):
    data, indices = node.inputs[:2]
    rank = len(_shape(g, data))
    axis = int(node.attrs.get("axis", 0)) % rank
    ri = len(_shape(g, indices))
    if _is_const(g, data):
        p = _whole(ins[1])
        if decision is not None and axis == 0 and decision.parts == n:  # a table cut by rows: partial sums
            return [Placement((Shard(0, n, 1),)), REPLICATED], [PARTIAL]
        return [REPLICATED, p], [p.remap({j: axis + j for j in range(ri)})]
    p = _whole(ins[0]).without({axis})
    mapping = {a: a if a < axis else a + ri - 1 for a in range(rank) if a != axis}
    return [p, REPLICATED], [p.remap(mapping)]


def expand(node: Node, g: Graph, ins: list[Placement], n: int, decision: Shard | None):
    m = _broadcast_map(_shape(g, node.inputs[0]), _shape(g, node.outputs[0]))
    p = _whole(ins[0])
    return [p, REPLICATED], [p.remap(m)]


def scatter_rows(node: Node, g: Graph, ins: list[Placement], n: int, decision: Shard | None):
    """TensorScatter (a KV cache written at its positions): the cache and its update cut alike on any axis but
    the one written along, so that each rank writes its heads of the cache in place; the positions whole."""
    rank = len(_shape(g, node.inputs[0]))
    axis = int(node.attrs.get("axis", -2)) % rank
    if _shape(g, node.inputs[0])[:axis] + _shape(g, node.inputs[0])[axis + 1:] != \
            _shape(g, node.inputs[1])[:axis] + _shape(g, node.inputs[1])[axis + 1:]:
        return default(node, g, ins, n, decision)
    p = max((_whole(q).without({axis}) for q in ins[:2]), key=lambda q: len(q.shards))
    p = _fit(p, _shape(g, node.outputs[0]), n)
    return [p, p] + [REPLICATED] * (len(node.inputs) - 2), [p]


def default(node: Node, g: Graph, ins: list[Placement], n: int, decision: Shard | None):
    return [REPLICATED] * len(ins), [REPLICATED] * len(node.outputs)


def rule_for(op: str) -> Rule:
    by_kind = {OpKind.ELEMENTWISE: elementwise, OpKind.VIEW: reshape, OpKind.MATMUL: matmul,
               OpKind.REDUCTION: reduction}  # the op registry's trait
    kind = kind_of(op)
    if kind in by_kind:
        return by_kind[kind]
    return {"Transpose": transpose, "LayerNormalization": normalize, "RMSNormalization": normalize,
            "Softmax": normalize, "LogSoftmax": normalize, "Split": along_axis, "Concat": along_axis,
            "Slice": along_axis, "Gather": gather, "Expand": expand, "TensorScatter": scatter_rows}.get(op, default)


# An embedding table this large is cut by rows (vocabulary-parallel): each rank looks up the ids in its rows and
# zeros the others, an AllReduce sums them. A smaller one stays whole: the lookup is a gather of a few rows, which
# costs less than the AllReduce, and the table's bytes per rank matter little.
VOCABULARY_BYTES = 4 << 20


def weight_columns(node: Node, g: Graph) -> int | None:
    """The dimension the planner may cut: the output columns (N) of a matmul by a constant 2-D weight, or the
    rows of a large embedding table (a Gather from a constant along axis 0); else None."""
    if node.op == "Gather" and _is_const(g, node.inputs[0]) and int(node.attrs.get("axis", 0)) == 0:
        table = g.tensors[node.inputs[0]].value
        return table.shape[0] if table.ndim == 2 and table.nbytes >= VOCABULARY_BYTES else None
    if kind_of(node.op) is not OpKind.MATMUL or len(node.inputs) < 2 or not _is_const(g, node.inputs[1]):
        return None
    sb = _shape(g, node.inputs[1])
    if len(sb) != 2 or len(_shape(g, node.inputs[0])) < 2:
        return None
    return sb[0] if int(node.attrs.get("transB", 0)) else sb[1]

