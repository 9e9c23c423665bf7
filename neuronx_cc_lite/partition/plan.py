"""Plan a tensor-parallel split: a placement for every tensor, and what must move between ranks.

    propagate(graph, n, decisions):
        each input: replicated (or as given)
        for each node in order: rule(node, placements of its inputs, its decision) -> what it reads, what it makes
        a read whose placement differs from the tensor's is a move: a local slice (free), an AllReduce of partial
        sums, a ReduceScatter, or an AllGather (then a slice)

    choose(graph, n):  Megatron by search
        decisions = {}
        for each matmul by a constant weight not cut yet, in order, whose input is whole or partial sums (again,
        while a sweep cuts more):
            for parts in the divisors of n, largest first:
                cut the weight's columns into `parts` blocks (rank t holds block t // (n / parts))
                keep the cut if no tensor it shaped is ever gathered, i.e. its shards run on through the graph
                until a matmul sums them away (the second layer of a pair, the attention output projection: one
                AllReduce) or they reach a graph output

A cut whose shards would have to be gathered again (the columns of a projection Split into Q, K and V, a head dim
cut across heads) is not taken at that size; a smaller `parts` replicates blocks over ranks instead: 4 heads over
8 ranks are 4 blocks, each on 2 ranks (Q and K), while V and the output projection still split 8 ways, by head and
head dim. Key/value heads fewer than the ranks (grouped-query attention) are found the same way. A large embedding
table is a candidate too: cut by rows into n blocks, each rank looks up the ids it holds and the partial sums are
all-reduced (vocabulary-parallel).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from neuronx_cc_lite.ir import Graph
from neuronx_cc_lite.partition.placement import REPLICATED, Placement, Shard, is_block_order, refines
from neuronx_cc_lite.partition.rules import rule_for, weight_columns


@dataclass
class Move:
    tensor: str
    node: str  # the node that reads it
    kind: str  # "slice", "all_reduce", "reduce_scatter", "gather"
    at: int  # the reader's index (len(nodes) for a graph output)


@dataclass
class Plan:
    n: int
    decisions: dict[str, Shard]
    placement: dict[str, Placement] = field(default_factory=dict)  # every computed tensor, as made
    reads: dict[tuple[int, int], Placement] = field(default_factory=dict)  # (node index, input index) -> as read
    outputs: dict[str, Placement] = field(default_factory=dict)  # graph output -> as delivered
    moves: list[Move] = field(default_factory=list)
    origins: dict[str, frozenset[str]] = field(default_factory=dict)  # tensor -> the cuts that shaped it


def move_kind(have: Placement, want: Placement, shape: tuple[int, ...], n: int) -> str | None:
    if have == want:
        return None
    if have.partial:
        return "all_reduce" if want.replicated else "reduce_scatter" if is_block_order(want, shape, n) else "gather"
    return "slice" if refines(want, have, shape, n) else "gather"


def propagate(g: Graph, n: int, decisions: dict[str, Shard], inputs: dict[str, Placement] | None = None,
              sharded_outputs: bool = True, base: Plan | None = None, start: int = 0,
              watch: tuple[str, list[int]] | None = None, outputs: dict[str, Placement] | None = None) -> Plan:
    """The plan under `decisions`. With `base` (a plan that differs only from node `start` on), its placements
    before `start` are taken as they are. With `watch` (a cut, the index of each tensor's last reader), it stops
    once every tensor that cut shaped has been read for the last time: enough to judge the cut. `outputs`: graph
    outputs delivered as given (device state's next values, placed as the state is)."""
    plan = Plan(n, dict(decisions))
    if base is not None:
        plan.placement, plan.origins, plan.reads = dict(base.placement), dict(base.origins), dict(base.reads)
        plan.moves = [m for m in base.moves if m.at < start]
    else:
        for name in g.inputs:
            plan.placement[name] = (inputs or {}).get(name, REPLICATED)
            plan.origins[name] = frozenset()
    alive = -1
    for i in range(start, len(g.nodes)):
        node = g.nodes[i]
        have = [plan.placement.get(name, REPLICATED) if name else REPLICATED for name in node.inputs]
        want, made = rule_for(node.op)(node, g, have, n, decisions.get(node.name))
        origin: frozenset[str] = frozenset({node.name}) if node.name in decisions else frozenset()
        for j, name in enumerate(node.inputs):
            if not name:
                continue
            plan.reads[(i, j)] = want[j]
            if g.tensors[name].is_constant:
                continue  # cut at compile time
            kind = move_kind(have[j], want[j], tuple(g.tensors[name].shape), n)
            if kind is not None:
                plan.moves.append(Move(name, node.name, kind, i))
            if not want[j].replicated:
                origin |= plan.origins.get(name, frozenset())
        for name, p in zip(node.outputs, made):
            if name:
                plan.placement[name] = p
                plan.origins[name] = origin if not p.replicated else frozenset()
                if watch is not None and watch[0] in plan.origins[name]:
                    alive = max(alive, watch[1][i] if len(node.outputs) == 1 else len(g.nodes))
        if watch is not None and i >= alive:
            return plan
    for name in g.outputs:
        p = plan.placement.get(name, REPLICATED)
        final = p if (sharded_outputs and not p.partial and len(p.shards) <= 1) else REPLICATED
        final = (outputs or {}).get(name, final)
        plan.outputs[name] = final
        kind = move_kind(p, final, tuple(g.tensors[name].shape), n)
        if kind is not None:
            plan.moves.append(Move(name, f"output {name}", kind, len(g.nodes)))
    return plan


def _last_reads(g: Graph) -> list[int]:
    """For each node, the index of the last node that reads its (first) output; len(nodes) for a graph output."""
    last: dict[str, int] = {name: len(g.nodes) for name in g.outputs}
    for i, node in enumerate(g.nodes):
        for name in node.inputs:
            if name and name not in g.outputs:
                last[name] = i
    return [last.get(node.outputs[0], i) if node.outputs else i for i, node in enumerate(g.nodes)]


def _keeps(plan: Plan, cut: str) -> bool:
    """Whether no tensor the cut shaped has to be gathered."""
    return not any(m.kind == "gather" and cut in plan.origins.get(m.tensor, ()) for m in plan.moves)


def choose(g: Graph, n: int, sharded_outputs: bool = True) -> Plan:
    decisions: dict[str, Shard] = {}
    plan = propagate(g, n, decisions, sharded_outputs=sharded_outputs)
    last = _last_reads(g)
    # Sweep until a sweep cuts nothing more: a cut is judged against the cuts made before it, so one whose partner
    # comes later in the graph is refused the first time. A SwiGLU MLP whose gate's SiLU feeds the up projection's
    # epilogue (fuse-epilogues) lists the gate first: cut alone, its columns would be gathered for the up
    # projection, still whole; once the up projection is cut, the gate's cut lines up with it. (Llama-3-8B's
    # prefill on 32 trn1 ranks computed every gate projection whole on every rank: 117 MB of weights a layer.)
    while True:
        before = len(decisions)
        for i, node in enumerate(g.nodes):
            columns = weight_columns(node, g)
            if columns is None or node.name in decisions or plan.placement.get(node.inputs[0], REPLICATED).shards:
                continue  # (an input of partial sums is whole once all-reduced, as it must be for any reader)
            sizes = [n] if node.op == "Gather" else range(n, 1, -1)  # a table's partial sums need every rank's rows
            for parts in (d for d in sizes if n % d == 0 and columns % d == 0):
                trial = {**decisions, node.name: Shard(-1, parts, n // parts)}
                tried = propagate(g, n, trial, sharded_outputs=sharded_outputs, base=plan, start=i,
                                  watch=(node.name, last))
                if node.name in tried.origins.get(node.outputs[0], ()) and _keeps(tried, node.name):
                    decisions = trial
                    plan = propagate(g, n, trial, sharded_outputs=sharded_outputs, base=plan, start=i)
                    break
        if len(decisions) == before:
            return plan
