"""One rank's graph from a plan: every tensor at its local shape, weights cut to the rank's block, and the moves
the plan asks for spelled out as nodes.

    local slice       Slice with the rank's own starts (no data crosses ranks)
    all_reduce        AllReduce(x)                                   partial sums -> the whole on every rank
    reduce_scatter    ReduceScatter(x)                               partial sums -> this rank's block
    gather            AllGather(x) -> [n, *local], then Reshape / Slice / Transpose / Reshape back to the whole:
                      the gathered buffer is the blocks in rank order; a rank index is digits (one per shard,
                      the rest replication), so the buffer reshaped to [*digits, *local] needs the replication
                      digits cut to one and each shard's digit moved in front of its axis

Collectives are nodes of the compiler's domain (lower/collective.py) on replica group `group`. Shape inputs
(Reshape's, Expand's) become the local shapes. A lookup in a table cut by rows looks up the ids the rank holds
and zeros the rest. A matmul that makes partial sums keeps its bias and residual on the
group's first rank only (zeros and nothing elsewhere), so that they are added once.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from neuronx_cc_lite.ir import Graph, Node, Tensor
from neuronx_cc_lite.partition.placement import REPLICATED, Placement, digits, is_block_order, refines
from neuronx_cc_lite.partition.plan import Plan
from neuronx_cc_lite.declared import contiguous
from neuronx_cc_lite.ops.registry import INTERNAL_DOMAIN

COLLECTIVES = ("AllReduce", "AllGather", "ReduceScatter")


class _Builder:
    def __init__(self, g: Graph, plan: Plan, rank: int, group: int) -> None:
        self.g, self.plan, self.rank, self.group, self.n = g, plan, rank, group, plan.n
        self.tensors: dict[str, Tensor] = {}
        self.nodes: list[Node] = []
        self.converted: dict[tuple[str, Placement], str] = {}

    # ---- tensors ---------------------------------------------------------------------------------------------

    def new(self, name: str, shape: tuple[int, ...], like: str, value: np.ndarray | None = None) -> str:
        dtype = (self.tensors[like] if like in self.tensors else self.g.tensors[like]).dtype
        self.tensors[name] = Tensor(name, tuple(shape), dtype, value)
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        value = contiguous(value)
        self.tensors[name] = Tensor(name, tuple(value.shape), value.dtype, value)
        return name

    def cut(self, name: str, want: Placement) -> str:
        """A constant as rank `rank` holds it."""
        if want.replicated:
            self.tensors.setdefault(name, self.g.tensors[name])
            return name
        key = (name, want)
        if key not in self.converted:
            t = self.g.tensors[name]
            box = want.box(tuple(t.shape), self.rank)
            value = t.value[tuple(slice(a, b) for a, b in box)]
            self.converted[key] = self.const(f"{name}/rank{self.rank}", value)
        return self.converted[key]

    # ---- moves -----------------------------------------------------------------------------------------------

    def node(self, op: str, name: str, inputs: list[str], output: str, shape: tuple[int, ...], like: str,
             attrs: dict | None = None, domain: str = "") -> str:
        self.new(output, shape, like)
        self.nodes.append(Node(op, name, inputs, [output], attrs or {}, domain))
        return output

    def collective(self, op: str, src: str, shape: tuple[int, ...], like: str) -> str:
        return self.node(op, f"{src}/{op}", [src], f"{src}/{op}", shape, like, {"group": self.group},
                         INTERNAL_DOMAIN)

    def convert(self, name: str, have: Placement, want: Placement, shape: tuple[int, ...]) -> str:
        """`name` (of global shape `shape`) as `want` places it."""
        if have == want:
            return name
        key = (name, want)
        if key not in self.converted:
            self.converted[key] = self._convert(name, have, want, shape)
        return self.converted[key]

    def _convert(self, name: str, have: Placement, want: Placement, shape: tuple[int, ...]) -> str:
        if have.partial:
            if is_block_order(want, shape, self.n):
                return self.collective("ReduceScatter", name, want.local_shape(shape), name)
            whole = self.collective("AllReduce", name, shape, name)
            return self.slice(whole, REPLICATED, want, shape)
        if refines(want, have, shape, self.n):
            return self.slice(name, have, want, shape)
        return self.slice(self.gather(name, have, shape), REPLICATED, want, shape)

    def slice(self, name: str, have: Placement, want: Placement, shape: tuple[int, ...]) -> str:
        if have == want:
            return name
        mine, theirs = want.box(shape, self.rank), have.box(shape, self.rank)
        axes = [a for a, (w, h) in enumerate(zip(mine, theirs)) if w != h]
        starts = [mine[a][0] - theirs[a][0] for a in axes]
        ends = [mine[a][1] - theirs[a][0] for a in axes]
        out = f"{name}/slice{self.rank}"
        ins = [name, self.const(f"{out}/starts", np.array(starts, np.int64)),
               self.const(f"{out}/ends", np.array(ends, np.int64)), self.const(f"{out}/axes", np.array(axes, np.int64))]
        return self.node("Slice", out, ins, out, want.local_shape(shape), name)

    def gather(self, name: str, have: Placement, shape: tuple[int, ...]) -> str:
        local = have.local_shape(shape)
        gathered = self.collective("AllGather", name, (self.n, *local), name)
        if is_block_order(have, shape, self.n):
            return self.reshape(gathered, shape, name)
        ds = digits(have, self.n)
        split = self.reshape(gathered, tuple(b for b, _ in ds) + local, name)
        reps = [k for k, (_, s) in enumerate(ds) if s is None]
        if reps:
            out = f"{split}/one"
            ins = [split, self.const(f"{out}/starts", np.zeros(len(reps), np.int64)),
                   self.const(f"{out}/ends", np.ones(len(reps), np.int64)),
                   self.const(f"{out}/axes", np.array(reps, np.int64))]
            sizes = tuple(1 if s is None else b for b, s in ds) + local
            split = self.node("Slice", out, ins, out, sizes, name)
        k = len(ds)
        digit_of = {s.axis: j for j, (_, s) in enumerate(ds) if s is not None}
        perm = reps + [x for a in range(len(shape)) for x in ([digit_of[a]] if a in digit_of else []) + [k + a]]
        sizes = tuple((1 if ds[p][1] is None else ds[p][0]) if p < k else local[p - k] for p in perm)
        moved = self.node("Transpose", f"{split}/order", [split], f"{split}/order", sizes, name, {"perm": perm})
        return self.reshape(moved, shape, name)

    def reshape(self, name: str, shape: tuple[int, ...], like: str) -> str:
        out = f"{name}/as{'x'.join(map(str, shape))}"
        target = self.const(f"{out}/shape", np.array(shape, np.int64))
        return self.node("Reshape", out, [name, target], out, shape, like)

    # ---- the graph -------------------------------------------------------------------------------------------

    def build(self, inputs: dict[str, Placement]) -> Graph:
        g, plan = self.g, self.plan
        for name in g.inputs:
            self.new(name, inputs.get(name, REPLICATED).local_shape(tuple(g.tensors[name].shape)), name)
        renamed = {o: f"{o}/local" for o in g.outputs if plan.placement[o] != plan.outputs[o]}
        for i, node in enumerate(g.nodes):
            ins = []
            for j, name in enumerate(node.inputs):
                if not name:
                    ins.append(name)
                    continue
                want = plan.reads[(i, j)]
                if g.tensors[name].is_constant:
                    ins.append(self.cut(name, want))
                else:
                    ins.append(self.convert(renamed.get(name, name), plan.placement[name], want,
                                            tuple(g.tensors[name].shape)))
            outs = [renamed.get(o, o) for o in node.outputs]
            for o, local in zip(node.outputs, outs):
                if o:
                    self.new(local, plan.placement[o].local_shape(tuple(g.tensors[o].shape)), o)
            if node.op == "Gather" and plan.placement[node.outputs[0]].partial:
                self.lookup(node, ins, outs[0])
                continue
            self.nodes.append(Node(node.op, node.name, self._local_inputs(node, ins, outs), outs, dict(node.attrs),
                                   node.domain, node.opset))
        for o, local in renamed.items():  # the output, as delivered, takes the output's name
            final = self.convert(local, plan.placement[o], plan.outputs[o], tuple(g.tensors[o].shape))
            for node in self.nodes:
                node.inputs = [o if name == final else name for name in node.inputs]
                node.outputs = [o if name == final else name for name in node.outputs]
            self.tensors[o] = Tensor(o, self.tensors.pop(final).shape, g.tensors[o].dtype)
        return Graph(g.name, self.nodes, self.tensors, list(g.inputs), list(g.outputs), g.opset)

    def lookup(self, node: Node, ins: list[str], out: str) -> None:
        """An embedding lookup in this rank's rows [lo, lo + rows) of the table: ids outside them read row 0 and
        are zeroed, so that the ranks' results sum to the lookup in the whole table."""
        table, ids = ins
        rows = self.tensors[table].shape[0]
        kind = self.tensors[ids].dtype
        shape = self.tensors[ids].shape
        name = node.name

        def op(op: str, inputs: list[str], suffix: str, like: str, out_shape: tuple[int, ...] = shape,
               **attrs: object) -> str:
            return self.node(op, f"{name}/{suffix}", inputs, f"{name}/{suffix}", out_shape, like, attrs)

        local = op("Sub", [ids, self.const(f"{name}/lo", np.array(self.rank * rows, kind))], "local", ids)
        above = op("GreaterOrEqual", [local, self.const(f"{name}/zero", np.array(0, kind))], "above", ids)
        below = op("Less", [local, self.const(f"{name}/count", np.array(rows, kind))], "below", ids)
        for t in (above, below):
            self.tensors[t].dtype = np.dtype(np.bool_)
        mine = op("And", [above, below], "mine", above)
        safe = op("Where", [mine, local, f"{name}/zero"], "safe", ids)
        found = op("Gather", [table, safe], "found", out, self.tensors[out].shape, axis=0)
        keep = op("Cast", [mine], "keep", out, to=int(helper.np_dtype_to_tensor_dtype(self.tensors[out].dtype)))
        column = self.reshape(keep, (*shape, 1), keep)
        self.new(out, self.tensors[out].shape, out)
        self.nodes.append(Node("Mul", f"{name}/mask", [found, column], [out]))

    def _local_inputs(self, node: Node, ins: list[str], outs: list[str]) -> list[str]:
        """Shape inputs at the local shape; a partial sum's bias and residual on the first rank only."""
        if node.op in ("Reshape", "Expand") and len(ins) > 1:
            shape = self.tensors[outs[0]].shape
            ins[1] = self.const(f"{node.name}/shape{self.rank}", np.array(shape, np.int64))
        partial = self.plan.placement.get(node.outputs[0], REPLICATED).partial
        if node.op in ("MatMulEpilogue", "Gemm") and partial and self.rank != 0:
            if len(ins) > 2 and ins[2]:
                bias = self.tensors[ins[2]]
                ins[2] = self.const(f"{ins[2]}/zero", np.zeros(bias.shape, bias.dtype))
            if len(ins) > 3 and ins[3] and not self.plan.placement.get(node.inputs[3], REPLICATED).partial:
                ins[3] = ""
        return ins


def rank_graph(g: Graph, plan: Plan, rank: int, group: int, inputs: dict[str, Placement] | None = None) -> Graph:
    """The graph rank `rank` (its index in the group, 0 .. n-1) runs; its collectives run on replica group
    `group`."""
    return _Builder(g, plan, rank, group).build(inputs or {})
