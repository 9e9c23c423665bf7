"""Inline control flow that compile time decides: the device runs straight-line code only.

    If(cond)                   cond a constant: the chosen branch's nodes, spliced in place
    Loop(M, cond, v0...)       M a constant: M copies of the body, the carried values threaded from copy to copy;
                               a while loop (M beyond the copy limit, torch's INT64_MAX) as many copies as its
                               exit, folded copy by copy, takes (a condition on its counter and constants)
    Scan(s0..., x...)          the scan axis static: a copy of the body per slice of the scan inputs

Instantiating a body: its inputs are bound to the values that feed them, the names it defines get a prefix unique
to the copy (`Loop_3/iter2/`), names it reads from around it stay as they are, Constant nodes and initializers
become constants, and the names its own nested subgraphs read from it are renamed to match. Its results are then
bound to the node's outputs (the producing node renamed; an Identity where a result is a name from outside).

Loop, iteration i (the body's inputs: iteration number i, the condition, the carried values):

    r_0 = cond (absent: true)                  r_i: "iteration i runs"
    outs = body(i, r_i, v_i)                   folded at once, so a condition that is a constant is seen as one
    v_{i+1} = r_i ? outs.v : v_i               a Where only while r_i is known at run time only
    r_{i+1} = r_i and outs.cond                a constant false ends the unrolling (a static early exit)

An exit known only at run time is thus predicated: every copy runs, and after the exit the carried values stop
changing; the scan outputs of such a loop would have a data-dependent length, which is refused. Scan outputs are
each copy's result, unsqueezed and concatenated (in reverse for scan_output_directions 1); scan inputs are sliced
at t, or T-1-t for scan_input_directions 1. Scan-8's batch axis is a Scan per batch row, stacked.

The pass repeats, folding constants after each round, until nothing changes (a branch's folded arithmetic decides
the next If; a Loop body's If is inlined a round after the Loop is unrolled); MAX_ROUNDS bounds the nesting.
Nodes it keeps (a condition or trip count known only at run time) are explained by `why_kept`; a loop beyond the
unroll limits is a coded error naming it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.frontend import _constant_value, attr_value
from neuronx_cc_lite.ir import Graph, Node, Tensor, upstream
from neuronx_cc_lite.ops.registry import kept_by_pass
from neuronx_cc_lite.passes import fold_constants

MAX_ROUNDS = 8  # nesting depth of If/Loop/Scan inside one another that the pass takes apart
MAX_BODY_COPIES = 4096  # a trip count beyond this is a while loop in disguise (torch's INT64_MAX), not a block
MAX_UNROLLED_NODES = 1 << 16  # copies x body nodes: beyond this the compile itself would take minutes
HELPER_OPSET = 13  # the semantics of the Slice, Squeeze, Unsqueeze (axes as inputs), Concat, Where and And nodes
                  # this pass writes


def run(g: Graph) -> Graph:
    for _ in range(MAX_ROUNDS):
        nodes: list[Node] = []
        changed = False
        for node in g.nodes:
            replaced = _replace(node, g) if node.domain in ("", "ai.onnx") else None
            nodes.extend(replaced if replaced is not None else [node])
            changed |= replaced is not None
        g.nodes = nodes
        if not changed:
            break
        g = fold_constants.run(g)
    return g


class _RunTimeExit(Exception):
    """A while loop (a trip count beyond MAX_BODY_COPIES) whose exit the unrolling cannot see: it stays a Loop."""


def _replace(node: Node, g: Graph) -> list[Node] | None:
    """The nodes that replace a control-flow node, or None to keep it."""
    if node.op == "If" and g.tensors[node.inputs[0]].is_constant:
        return _inline_if(node, g)
    if node.op == "Loop" and _trip_count(node, g) is not None:
        try:
            return _unroll_loop(node, g)
        except _RunTimeExit:
            return None
    if node.op == "Scan" and _scan_length(node, g) is not None:
        return _unroll_scan(node, g)
    return None


# ---------------------------------------------------------------------------------------------------------------
# Why a node stays

@kept_by_pass("If", "Loop", "Scan")
def why_kept(node: Node, g: Graph) -> str | None:
    if node.op == "If":
        return (f"its condition {node.inputs[0]!r} is known only at run time{_depends_on(node.inputs[0], g)}; an If "
                "compiles when its condition folds to a constant (pin the input with --input-value NAME=VALUE)")
    if node.op == "Loop":
        if len(node.inputs) < 1 or not node.inputs[0]:
            return "a Loop without a trip count (a while loop) cannot be unrolled"
        trips = _trip_count(node, g)
        if trips is not None:
            return (f"a while loop (its trip count {trips}) whose exit condition depends on values known only at run "
                    "time; a while loop unrolls when its condition follows from its counter, the values it carries "
                    "from constants, and constants")
        return (f"its trip count {node.inputs[0]!r} is known only at run time{_depends_on(node.inputs[0], g)}; a "
                "Loop compiles when it folds to a constant (pin the input with --input-value NAME=VALUE)")
    if node.op == "Scan" and g.opset_of(node) < 9 and node.inputs[0]:
        return "a Scan with sequence_lens (opset 8) cannot be unrolled"
    return "the lengths of its scan inputs along the scan axes are not static or differ"


def _depends_on(name: str, g: Graph) -> str:
    """' (it depends on input(s) ...)' naming the graph inputs the value is computed from, or ''."""
    producers = g.producers()
    seen, stack, found = set(), [name], []
    while stack:
        current = stack.pop()
        if current in seen or not current:
            continue
        seen.add(current)
        if current in g.inputs:
            found.append(current)
        elif current in producers:
            stack.extend(producers[current].inputs)
    return f" (it depends on input(s) {', '.join(map(repr, sorted(found)))})" if found else ""


# ---------------------------------------------------------------------------------------------------------------
# Instantiating a body

def _fresh(g: Graph, name: str) -> str:
    return g.fresh(name)


def _renamed(graph: onnx.GraphProto, names: dict[str, str]) -> onnx.GraphProto:
    """A copy of a nested subgraph whose reads from around it follow `names`."""
    copy = onnx.GraphProto()
    copy.CopyFrom(graph)
    _rename_reads(copy, names)
    return copy


def _rename_reads(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    local = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {
        o for n in graph.node for o in n.output}
    names = {k: v for k, v in names.items() if k not in local}
    if not names:
        return
    for n in graph.node:
        n.input[:] = [names.get(i, i) for i in n.input]
        for a in n.attribute:
            for sub in (*([a.g] if a.type == onnx.AttributeProto.GRAPH else []), *a.graphs):
                _rename_reads(sub, names)
    for o in graph.output:
        o.name = names.get(o.name, o.name)


def _renamed_attr(value: Any, names: dict[str, str]) -> Any:
    """An attribute value with the reads of its subgraphs (a GRAPH or GRAPHS attribute) following `names`."""
    if isinstance(value, onnx.GraphProto):
        return _renamed(value, names)
    if isinstance(value, tuple) and value and isinstance(value[0], onnx.GraphProto):
        return tuple(_renamed(v, names) for v in value)
    return value


def _attrs(proto: onnx.NodeProto, names: dict[str, str]) -> dict[str, Any]:
    return {a.name: _renamed_attr(attr_value(a), names) for a in proto.attribute}


def _instantiate(body: onnx.GraphProto, prefix: str, bound: dict[str, str], g: Graph,
                 opset: int | None) -> tuple[list[Node], list[str]]:
    """One copy of `body` in g: its nodes (of the opset of the node holding the body) and the names of its
    results. `bound`: body input -> the value fed to it."""
    names = dict(bound)
    for init in body.initializer:
        value = numpy_helper.to_array(init)
        names[init.name] = _constant(g, prefix + init.name, value)
    nodes = []
    for index, proto in enumerate(body.node):
        name = prefix + (proto.name or f"{proto.op_type}_{index}")
        if proto.op_type == "Constant" and proto.domain in ("", "ai.onnx"):
            names[proto.output[0]] = _constant(g, prefix + proto.output[0],
                                               _constant_value(_attrs(proto, names), name))
            continue
        inputs = [names.get(i, i) for i in proto.input]
        attrs = _attrs(proto, names)
        for out in proto.output:
            if out:
                names[out] = _fresh(g, prefix + out)
                g.tensors[names[out]] = Tensor(names[out], None, None)  # type: ignore[arg-type]  # inferred by folding
        nodes.append(Node(proto.op_type, name, inputs, [names.get(o, "") for o in proto.output], attrs,
                          proto.domain, opset))
    return nodes, [names.get(o.name, o.name) for o in body.output]


def _constant(g: Graph, name: str, value: np.ndarray) -> str:
    name = _fresh(g, name)
    g.tensors[name] = Tensor(name, tuple(value.shape), value.dtype, value)
    return name


def _bind(nodes: list[Node], results: list[str], outputs: list[str], g: Graph, prefix: str) -> list[Node]:
    """`nodes` with each result renamed to the output it becomes (Identity where a result is not theirs to rename:
    a name from outside, a constant, a result bound twice)."""
    producers = {o: n for n in nodes for o in n.outputs if o}
    renames: dict[str, str] = {}
    copies = []
    for result, out in zip(results, outputs):
        if not out:
            continue
        if result in producers and result not in renames:
            renames[result] = out
        else:
            copies.append(Node("Identity", f"{prefix}{out}", [result], [out]))
    for old, new in renames.items():
        t, known = g.tensors.pop(old), g.tensors[new]  # the output's type from ONNX inference, when it had one
        g.tensors[new] = Tensor(new, t.shape if t.shape is not None else known.shape,
                                t.dtype if t.dtype is not None else known.dtype)
    for n in nodes:
        n.inputs = [renames.get(i, i) for i in n.inputs]
        n.outputs = [renames.get(o, o) for o in n.outputs]
        n.attrs = {k: _renamed_attr(v, renames) for k, v in n.attrs.items()}
    return nodes + copies


class _Writer:
    """A loop's unrolled nodes in order: the body copies and the helpers around them (slices, selects, stacks),
    the helpers named under the loop's node and folded as they are written."""

    def __init__(self, node: Node, g: Graph) -> None:
        self.node, self.g, self.count = node, g, 0
        self.nodes: list[Node] = []

    def add(self, op: str, inputs: list[str], **attrs: Any) -> str:
        self.count += 1
        out = _fresh(self.g, f"{self.node.name}/{op.lower()}{self.count}")
        self.g.tensors[out] = Tensor(out, None, None)  # type: ignore[arg-type]  # inferred as it is folded
        node = Node(op, f"{self.node.name}/{op}{self.count}", inputs, [out], attrs, opset=HELPER_OPSET)
        self.nodes += fold_constants.fold_nodes([node], self.g)
        return out

    def body(self, body: onnx.GraphProto, prefix: str, bound: dict[str, str]) -> list[str]:
        """A copy of the body, folded at once (the copy's own constants, its iteration number, settle its shapes
        and a loop's exit): the names of its results."""
        copy, results = _instantiate(body, prefix, bound, self.g, self.node.opset)
        self.nodes += fold_constants.fold_nodes(copy, self.g)
        return results

    def const(self, value: Any, dtype: type = np.int64) -> str:
        self.count += 1
        return _constant(self.g, f"{self.node.name}/const{self.count}", np.asarray(value, dtype=dtype))

    def take(self, x: str, axis: int, index: int) -> str:
        """x[..., index, ...] along `axis`, the axis dropped."""
        piece = self.add("Slice", [x, self.const([index]), self.const([index + 1]), self.const([axis])])
        return self.add("Squeeze", [piece, self.const([axis])])

    def stack(self, parts: list[str], axis: int) -> str:
        """The parts (of one shape) stacked along a new `axis` (negative: counted in the result's rank, as
        Unsqueeze and Concat count it, so no part's shape is needed: a nested If may not be inlined yet)."""
        return self.add("Concat", [self.add("Unsqueeze", [p, self.const([axis])]) for p in parts], axis=axis)


def _limit(node: Node, copies: int, body: onnx.GraphProto) -> None:
    if copies > MAX_BODY_COPIES or copies * len(body.node) > MAX_UNROLLED_NODES:
        raise CompileError("NCC_UNSUPPORTED", f"unrolling it takes {copies} copies of its {len(body.node)}-node body; "
                           f"the limits are {MAX_BODY_COPIES} copies and {MAX_UNROLLED_NODES} nodes", node.name,
                           node.op)


# ---------------------------------------------------------------------------------------------------------------
# If

def _inline_if(node: Node, g: Graph) -> list[Node]:
    taken = bool(np.asarray(g.tensors[node.inputs[0]].value).reshape(-1)[0])
    body = node.attrs["then_branch" if taken else "else_branch"]
    prefix = f"{node.name}/{'then' if taken else 'else'}/"
    nodes, results = _instantiate(body, prefix, {}, g, node.opset)
    return _bind(nodes, results, node.outputs, g, prefix)


# ---------------------------------------------------------------------------------------------------------------
# Loop

def _trip_count(node: Node, g: Graph) -> int | None:
    if not node.inputs or not node.inputs[0] or not g.tensors[node.inputs[0]].is_constant:
        return None
    return int(np.asarray(g.tensors[node.inputs[0]].value).reshape(-1)[0])


def _unroll_loop(node: Node, g: Graph) -> list[Node]:
    body: onnx.GraphProto = node.attrs["body"]
    trips = max(_trip_count(node, g) or 0, 0)
    # a while loop (torch writes INT64_MAX for "no limit") unrolls while its exit folds, up to the limits
    bounded = trips <= MAX_BODY_COPIES or not _exit_reads_values(body)
    if bounded:
        _limit(node, trips, body)
    carried = node.inputs[2:]
    scans = len(body.output) - 1 - len(carried)
    w = _Writer(node, g)
    cond = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else None
    running: str | bool = True if cond is None else _static(cond, g)  # does iteration i run?
    true = w.const(True, np.bool_)
    formal = [vi.name for vi in body.input]
    values = list(carried)
    per_iteration: list[list[str]] = [[] for _ in range(scans)]
    for i in range(trips):
        if running is False:
            break
        if not bounded and running is not True:
            raise _RunTimeExit
        if not bounded and (i == MAX_BODY_COPIES or (i + 1) * len(body.node) > MAX_UNROLLED_NODES):
            raise CompileError("NCC_UNSUPPORTED", f"a while loop whose exit has not come after {i} copies of its "
                               f"{len(body.node)}-node body; the limits are {MAX_BODY_COPIES} copies and "
                               f"{MAX_UNROLLED_NODES} nodes", node.name, node.op)
        bound = {formal[0]: w.const(i), formal[1]: true if running is True else running,
                 **dict(zip(formal[2:], values))}
        results = w.body(body, f"{node.name}/iter{i}/", bound)
        exit_, new, out = results[0], results[1:1 + len(carried)], results[1 + len(carried):]
        if running is True:
            values = new
            for k, o in enumerate(out):
                per_iteration[k].append(o)
        elif scans:
            raise CompileError("NCC_UNSUPPORTED", "the loop's exit is known only at run time, so the length of its "
                               "scan outputs is data-dependent", node.name, node.op)
        else:
            values = [_select(w, running, n, v, node) for n, v in zip(new, values)]
        after = _static(exit_, g)
        if after is False:
            running = False  # r and false: the loop ends here whether or not this iteration ran
        elif running is True:
            running = after
        elif after is not True:
            running = w.add("And", [running, exit_])
    if scans and not per_iteration[0]:
        raise CompileError("NCC_UNSUPPORTED", "the loop runs no iteration: its scan outputs would be empty",
                           node.name, node.op)
    stacked = [w.stack(parts, 0) for parts in per_iteration]
    return _bind(w.nodes, [*values, *stacked], node.outputs, g, f"{node.name}/")


def _exit_reads_values(body: onnx.GraphProto) -> bool:
    """Whether the body's exit condition reads more than the condition it was given and constants (its counter, a
    carried value, a value from outside): only then can the loop end before its trip count."""
    given = {body.input[1].name} if len(body.input) > 1 else set()
    made = {o for n in body.node for o in n.output} | {i.name for i in body.initializer}
    return bool(upstream(body, [body.output[0].name]) - made - given)


def _static(name: str, g: Graph) -> str | bool:
    """A condition's value when it is a constant, else its name."""
    t = g.tensors[name]
    return bool(np.asarray(t.value).reshape(-1)[0]) if t.is_constant else name


def _select(w: _Writer, running: str, new: str, old: str, node: Node) -> str:
    shapes = (w.g.tensors[new].shape, w.g.tensors[old].shape)
    if None not in shapes and shapes[0] != shapes[1]:
        raise CompileError("NCC_UNSUPPORTED", f"the carried value {old!r} changes shape from one iteration to the "
                           "next, and the loop's exit is known only at run time", node.name, node.op)
    return w.add("Where", [running, new, old])


# ---------------------------------------------------------------------------------------------------------------
# Scan

def _scan_parts(node: Node) -> tuple[list[str], list[str]]:
    """(initial states, scan inputs) of a Scan of opset 9 or later."""
    n = node.attrs["num_scan_inputs"]
    return node.inputs[:len(node.inputs) - n], node.inputs[len(node.inputs) - n:]


def _scan_length(node: Node, g: Graph) -> int | None:
    if g.opset_of(node) < 9:
        if node.inputs[0]:
            return None  # sequence_lens: each batch row its own length
        n = node.attrs["num_scan_inputs"]
        shapes = [g.tensors[x].shape for x in node.inputs[len(node.inputs) - n:]]
        axes = [1] * n
    else:
        _, xs = _scan_parts(node)
        shapes = [g.tensors[x].shape for x in xs]
        axes = list(node.attrs.get("scan_input_axes", [0] * len(xs)))
    if any(s is None for s in shapes):
        return None
    lengths = {s[a + len(s) if a < 0 else a] for s, a in zip(shapes, axes)}
    return lengths.pop() if len(lengths) == 1 else None


def _unroll_scan(node: Node, g: Graph) -> list[Node]:
    body: onnx.GraphProto = node.attrs["body"]
    length = _scan_length(node, g) or 0
    w = _Writer(node, g)
    if g.opset_of(node) >= 9:
        states, xs = _scan_parts(node)
        _limit(node, length, body)
        finals, outs = _scan_steps(node, w, body, states, xs, length, "")
        return _bind(w.nodes, [*finals, *outs], node.outputs, g, f"{node.name}/")
    # Scan-8: axis 0 is a batch of independent scans, the scan axis is 1 and the outputs only append
    n = node.attrs["num_scan_inputs"]
    states, xs = node.inputs[1:len(node.inputs) - n], node.inputs[len(node.inputs) - n:]
    batch = g.tensors[xs[0]].shape[0]
    _limit(node, batch * length, body)
    rows = []
    for b in range(batch):
        finals, outs = _scan_steps(node, w, body, [w.take(s, 0, b) for s in states], [w.take(x, 0, b) for x in xs],
                                   length, f"b{b}/")
        rows.append([*finals, *outs])
    return _bind(w.nodes, [w.stack(list(parts), 0) for parts in zip(*rows)], node.outputs, g, f"{node.name}/")


def _scan_steps(node: Node, w: _Writer, body: onnx.GraphProto, states: list[str], xs: list[str], length: int,
                tag: str) -> tuple[list[str], list[str]]:
    """The copies of a Scan-9 body over `length` steps, written to w: (final states, stacked scan outputs)."""
    g = w.g
    legacy = g.opset_of(node) < 9
    axes = [0] * len(xs) if legacy else list(node.attrs.get("scan_input_axes", [0] * len(xs)))
    directions = list(node.attrs.get("directions" if legacy else "scan_input_directions", [0] * len(xs)))
    scans = len(body.output) - len(states)
    out_axes = [0] * scans if legacy else list(node.attrs.get("scan_output_axes", [0] * scans))
    out_directions = [0] * scans if legacy else list(node.attrs.get("scan_output_directions", [0] * scans))
    formal = [vi.name for vi in body.input]
    values = list(states)
    per_step: list[list[str]] = [[] for _ in range(scans)]
    for t in range(length):
        slices = [w.take(x, a + len(g.tensors[x].shape) if a < 0 else a, length - 1 - t if d else t)
                  for x, a, d in zip(xs, axes, directions)]
        results = w.body(body, f"{node.name}/{tag}step{t}/", dict(zip(formal, [*values, *slices])))
        values = results[:len(states)]
        for k, o in enumerate(results[len(states):]):
            per_step[k].append(o)
    if scans and length == 0:
        raise CompileError("NCC_UNSUPPORTED", "the scan axis has length 0: its scan outputs would be empty",
                           node.name, node.op)
    # direction 1 prepends: the last step's result comes first
    return values, [w.stack(parts[::-1] if d else parts, a) for parts, a, d in zip(per_step, out_axes,
                                                                                   out_directions)]
