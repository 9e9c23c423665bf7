"""The partition stage: one graph after the passes -> one graph per rank, with the collectives between them.

    --dp D: the batch (axis 0 of every input) in D pieces; each replica group computes its piece alone, so the
            plan over D must move nothing between pieces (a node that mixes batch elements is refused by name)
    --tp T: within each replica group, Megatron-style tensor parallelism chosen by search (plan.py): weight
            matmuls cut by output columns, their partners by input rows, one AllReduce after each pair;
            placements propagate through every other operator (rules.py) and collectives are inserted where a
            reader needs another placement (ranks.py)

Rank r = dp_index * T + tp_index; replica group d holds ranks d*T .. d*T + T - 1. Each rank's inputs and outputs
are slices of the model's: (axis, start, stop) of the whole tensor; an output is delivered by the ranks whose
blocks together cover it (a replicated one by the first rank of each group).

Device state (Graph.state, a KV cache) is placed as the value written into it is made (`place_state`): the plan is
made with the state whole, a cache written by TensorScatter takes the placement of its update (a cache's heads cut
as its key/value projection's columns are, replicated over the ranks that share a head), and the plan is made
again with each state input so placed and its next value delivered so, so that each rank holds and writes its
piece in place and nothing moves. A placement no single axis describes (heads and head size both cut) leaves that
state whole on every rank.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.partition import split_projections
from neuronx_cc_lite.partition.placement import REPLICATED, Placement, Shard
from neuronx_cc_lite.partition.plan import Plan, choose, propagate
from neuronx_cc_lite.partition.ranks import rank_graph
from neuronx_cc_lite.partition.rules import weight_columns
from neuronx_cc_lite.passes.verify import verify

log = logging.getLogger(__name__)

Slice = tuple[int, int, int]  # (axis, start, stop) of the whole tensor
# The share of a model's matmul weights that may stay whole on every rank of a --tp plan without a warning
# (split_tensors): GPTBigCode-1B's one key/value head is 2%, Llama-3-8B's gate projections left whole were 38%.
WHOLE_WEIGHT_SHARE = 0.1


@dataclass
class RankGraph:
    rank: int
    graph: Graph
    inputs: dict[str, Slice]
    outputs: dict[str, Slice]  # only the outputs this rank delivers


def _whole(shape: tuple[int, ...]) -> Slice:
    return (0, 0, shape[0] if shape else 1)


def _refuse(message: str, node: str | None = None) -> CompileError:
    return CompileError("NCC_OPTION", message, node)


def split_batch(g: Graph, dp: int) -> Plan:
    """The plan of --dp: every input cut on axis 0; refused when something needs the whole batch."""
    if not g.inputs:
        raise _refuse(f"--dp {dp}: the model has no inputs to split")
    inputs = {}
    for name in g.inputs:
        shape = tuple(g.tensors[name].shape)
        if not shape or shape[0] % dp:
            raise _refuse(f"--dp {dp}: dimension 0 of input {name!r} ({shape[0] if shape else 'a scalar'}) is not "
                          f"divisible by {dp}")
        inputs[name] = Placement((Shard(0, dp, 1),))
    plan = propagate(g, dp, {}, inputs)
    for m in plan.moves:
        if m.kind != "slice":
            raise _refuse(f"--dp {dp}: the node reads all of tensor {m.tensor!r} across the batch (dimension 0 "
                          f"would have to be gathered)", m.node)
    for name, p in plan.outputs.items():
        if p != inputs[g.inputs[0]]:
            raise _refuse(f"--dp {dp}: output {name!r} is not split by batch along dimension 0")
    return plan


def split_tensors(g: Graph, tp: int, sharded_outputs: bool) -> Plan:
    """The plan of --tp; refused when no weight can be cut into tp blocks because a dimension does not divide.
    When more than WHOLE_WEIGHT_SHARE of the matmul weights stay whole on every rank, a warning names the largest:
    each rank then loads all of them and does all of their matmuls, which no other figure shows (Llama-3-8B's
    prefill computed its gate projections whole on 32 ranks, unnoticed, until plan.py swept its cuts again). A
    multi-query model's one key/value head, replicated on purpose, is a few percent."""
    plan = choose(g, tp, sharded_outputs)
    if not plan.decisions:
        for node in g.nodes:
            columns = weight_columns(node, g)
            if columns is not None and columns % tp:
                raise _refuse(f"--tp {tp}: dimension {columns} (the output columns of weight {node.inputs[1]!r}) "
                              f"is not divisible by {tp}", node.name)
    whole = sorted(whole_weights(g, plan), key=lambda found: -found[1])
    total = sum(_weight_bytes(g, node) for node in _weight_matmuls(g))
    if whole and sum(nbytes for _, nbytes in whole) > WHOLE_WEIGHT_SHARE * total:
        named = ", ".join(f"{node.name!r} {nbytes / 2**20:.1f}" for node, nbytes in whole[:3])
        log.warning(f"--tp {tp}: {sum(n for _, n in whole) / 2**20:.1f} MiB of the {total / 2**20:.1f} MiB of matmul "
                    f"weights are read whole on every rank ({named}{', ...' if len(whole) > 3 else ''} MiB): no cut "
                    f"of their columns keeps the shards apart until a matmul sums them")
    return plan


def whole_weights(g: Graph, plan: Plan) -> list[tuple[Node, int]]:
    """The matmuls whose constant weight every rank of the plan reads whole, with its bytes."""
    index = {id(node): i for i, node in enumerate(g.nodes)}
    return [(node, _weight_bytes(g, node)) for node in _weight_matmuls(g)
            if plan.reads.get((index[id(node)], 1), REPLICATED).replicated]


def _weight_matmuls(g: Graph) -> list[Node]:
    """The matmuls by a constant weight the plan may cut (not an embedding's Gather, whose cut is for its memory)."""
    return [node for node in g.nodes if node.op != "Gather" and weight_columns(node, g) is not None]


def _weight_bytes(g: Graph, node: Node) -> int:
    weight = g.tensors[node.inputs[1]]
    return weight.size * np.dtype(weight.dtype).itemsize


def place_state(g: Graph, tp: int, plan: Plan) -> Plan:
    """The plan again with each state input placed as its next value is made (when one axis describes it), and that
    value delivered so."""
    placed = {}
    for name, after in g.state.items():
        p = plan.placement.get(after, REPLICATED)
        placed[name] = p if not p.partial and len(p.shards) <= 1 else REPLICATED
    if all(p.replicated for p in placed.values()):
        return propagate(g, tp, plan.decisions, outputs={after: REPLICATED for after in g.state.values()})
    return propagate(g, tp, plan.decisions, inputs=placed, outputs={g.state[k]: p for k, p in placed.items()})


def partition(g: Graph, tp: int, dp: int) -> list[RankGraph]:
    if g.state and dp > 1:
        raise _refuse(f"--dp {dp} with device state ({', '.join(g.state)}): each replica would need its own state; "
                      "use --tp alone")
    groups = [g]
    dp_plan = None
    if dp > 1:
        dp_plan = split_batch(g, dp)
        groups = [rank_graph(g, dp_plan, d, d, {n: dp_plan.placement[n] for n in g.inputs}) for d in range(dp)]
    ranks: list[RankGraph] = []
    tp_plan = None
    for d, local in enumerate(groups):
        if tp > 1:
            local = split_projections.run(local)
            verify(local, "split-projections", require_static=True)
            if tp_plan is None:
                tp_plan = split_tensors(local, tp, sharded_outputs=dp == 1)
                if local.state:
                    tp_plan = place_state(local, tp, tp_plan)
        for t in range(tp):
            graph = rank_graph(local, tp_plan, t, d, {n: tp_plan.placement[n] for n in local.state}) \
                if tp_plan is not None else local
            graph.state = dict(local.state)
            verify(graph, "partition", require_static=True)
            inputs = {name: _dp_slice(g, name, d, dp, dp_plan) for name in g.inputs}
            for name in local.state:  # the rank's piece of each state tensor, replicas included
                inputs[name] = _piece(local, name, t, tp_plan)
            outputs = {}
            for name in g.outputs:
                if name in local.state.values():
                    continue  # written into the state, not delivered
                delivered = _delivered(local, name, t, tp_plan)
                if delivered is not None:
                    outputs[name] = delivered if dp == 1 else _dp_slice(g, name, d, dp, dp_plan)
            ranks.append(RankGraph(d * tp + t, graph, inputs, outputs))
    return ranks


def _dp_slice(g: Graph, name: str, d: int, dp: int, plan: Plan | None) -> Slice:
    shape = tuple(g.tensors[name].shape)
    if plan is None:
        return _whole(shape)
    size = shape[0] // dp
    return (0, d * size, (d + 1) * size)


def _piece(g: Graph, name: str, t: int, plan: Plan | None) -> Slice:
    """The block of state tensor `name` rank t holds (every rank holds one; replicas hold the same)."""
    shape = tuple(g.tensors[name].shape)
    p = plan.placement[name] if plan is not None else REPLICATED
    if not p.shards:
        return _whole(shape)
    (s,) = p.shards
    (start, stop) = p.box(shape, t)[s.axis]
    return (s.axis, start, stop)


def _delivered(g: Graph, name: str, t: int, plan: Plan | None) -> Slice | None:
    """The block of output `name` rank t of its group delivers, if any: each block once."""
    shape = tuple(g.tensors[name].shape)
    p = plan.outputs[name] if plan is not None else REPLICATED
    if not p.shards:
        return _whole(shape) if t == 0 else None
    (s,) = p.shards
    if t % s.stride:
        return None
    (start, stop) = p.box(shape, t)[s.axis]
    return (s.axis, start, stop)
