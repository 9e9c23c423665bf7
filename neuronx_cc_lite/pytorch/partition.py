"""A dynamo graph the chip cannot run whole, split: what the chip supports runs on it, the rest on the CPU.

As torch-neuronx's partitioner does, and with torch.fx's own tools:

    run the graph once on the call's arguments (torch.fx.Interpreter), keeping every node's value
    for each operator node: supported if it alone, with those values as its inputs, exports and compiles
        (its result a tensor or a tuple of tensors; a verdict per operator and input signature is kept)
    CapabilityBasedPartitioner groups the supported nodes into the largest runs that keep the graph acyclic
    each run becomes a submodule (fuse_by_partitions), compiled and run on the chip like a whole graph
    (dynamo.CompiledGraph, its module state baked in); the unsupported nodes stay in the parent graph and run
    eagerly on the CPU between them

A run that still fails to compile as a whole (an operator supported alone but not beside its neighbours) runs
eagerly, with the compiled graph's own warning.
"""

from __future__ import annotations

import copy
import logging
import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

import neuronx_cc_lite
from neuronx_cc_lite.errors import CompileError

log = logging.getLogger(__name__)

PREFIX = "on_chip_"  # the fused submodules' names
OPERATORS = ("call_function", "call_method", "call_module")  # the nodes that compute


@dataclass
class Split:
    module: torch.fx.GraphModule  # the graph with its supported runs as submodules that run on the chip
    on_cpu: list[str]  # the operators that run eagerly, by name
    parts: int  # the runs on the chip


Compiled = Callable[[torch.fx.GraphModule, frozenset[int], str], Callable[..., Any]]


def split(gm: torch.fx.GraphModule, args: Sequence[Any], state: frozenset[int], options: Mapping[str, Any],
          name: str, compiled: Compiled) -> Split | None:
    """`gm` split for the chip and the CPU (see the module's docstring), or None when no operator is supported.
    `state`: the placeholder positions that are module state; `compiled(sub, sub_state, name)` makes the callable
    that runs a submodule on the chip."""
    part = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    values = _values(part, args)
    placeholders = part.graph.find_nodes(op="placeholder")
    state_nodes = {placeholders[i] for i in state}
    state_names = {n.target for n in state_nodes}
    support = _Support(values, state_nodes, options)
    partitions = CapabilityBasedPartitioner(part, support, allows_single_node_partition=True).propose_partitions()
    if not partitions:
        return None
    on_cpu = [_operator(n, part) for n in part.graph.nodes
              if n.op in OPERATORS and not support.is_node_supported({}, n)]
    fuse_by_partitions(part, [dict.fromkeys(p.nodes) for p in partitions], prefix=PREFIX, always_return_tuple=True)
    for node in part.graph.find_nodes(op="call_module"):
        if node.target.startswith(PREFIX):
            sub = part.get_submodule(node.target)
            # by name: fusing re-creates the graph's placeholders
            sub_state = frozenset(k for k, a in enumerate(node.args)
                                  if a.op == "placeholder" and a.target in state_names)
            part.add_submodule(node.target, _OnChip(compiled(sub, sub_state, f"{name}/{node.target}")))
    part.recompile()
    return Split(part, on_cpu, len(partitions))


class _OnChip(torch.nn.Module):
    """A compiled run of the graph, as the submodule the parent graph calls."""

    def __init__(self, run: Callable[..., Any]) -> None:
        super().__init__()
        self.run = run

    def forward(self, *args: Any) -> Any:
        return self.run(*args)


class _Support(OperatorSupportBase):
    """An operator node is supported when it alone exports and compiles (module state baked in, as a whole graph's
    is); verdicts are kept per operator and input signature, so repeated layers are tried once."""

    def __init__(self, values: dict[torch.fx.Node, Any], state: set[torch.fx.Node], options: Mapping[str, Any]):
        self.values = values
        self.state = state
        self.options = options
        self.verdicts: dict[torch.fx.Node, bool] = {}
        self._tried: dict[Any, bool] = {}

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: torch.fx.Node) -> bool:
        if node not in self.verdicts:
            self.verdicts[node] = self._try(node)
        return self.verdicts[node]

    def _try(self, node: torch.fx.Node) -> bool:
        if node.op not in OPERATORS:
            return False  # the graph's inputs and output stay the graph's
        if not _tensors(self.values.get(node)):
            return False  # sizes, shapes and other Python values stay with the CPU's graph
        inputs = list(dict.fromkeys(node.all_input_nodes))
        key = (node.op, str(node.target), _signature([self.values.get(i) for i in inputs]),
               repr(node.args), repr(node.kwargs), tuple(i in self.state for i in inputs))
        if key not in self._tried:
            self._tried[key] = self._compiles(node, inputs)
        return self._tried[key]

    def _compiles(self, node: torch.fx.Node, inputs: list[torch.fx.Node]) -> bool:
        from neuronx_cc_lite.pytorch.dynamo import bound_module
        from neuronx_cc_lite.pytorch.export import to_onnx

        graph = torch.fx.Graph()
        env = {i: graph.placeholder(f"input_{k}") for k, i in enumerate(inputs)}
        copied = graph.node_copy(node, lambda n: env[n])
        value = self.values[node]
        outputs = [copied] if isinstance(value, torch.Tensor) else [
            graph.call_function(operator.getitem, (copied, k)) for k in range(len(value))]
        graph.output(tuple(outputs))
        one = torch.fx.GraphModule(node.graph.owning_module, graph)
        args = [self.values[i] for i in inputs]
        state = frozenset(k for k, i in enumerate(inputs) if i in self.state)
        try:
            model = to_onnx(*bound_module(one, args, state), [f"output_{k}" for k in range(len(outputs))])
            neuronx_cc_lite.compile(model, **self.options)
        except CompileError as e:
            log.debug(f"neuronx_cc_lite: {_operator(node, node.graph.owning_module)} stays on the CPU: {e}")
            return False
        return True


def _values(gm: torch.fx.GraphModule, args: Sequence[Any]) -> dict[torch.fx.Node, Any]:
    """Every node's value when `gm` runs on `args`."""
    values: dict[torch.fx.Node, Any] = {}

    class Recording(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            values[n] = result = super().run_node(n)
            return result

    with torch.no_grad():
        Recording(gm).run(*args)
    return values


def _tensors(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return type(value) in (tuple, list) and len(value) > 0 and all(isinstance(v, torch.Tensor) for v in value)


def _signature(values: Sequence[Any]) -> tuple[Any, ...]:
    return tuple((tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else repr(v) for v in values)


def _operator(node: torch.fx.Node, gm: torch.nn.Module | None) -> str:
    """The name a user knows the operator by: torch.acos's `acos`, a method's name, a module's class."""
    if node.op == "call_module" and gm is not None:
        return type(gm.get_submodule(node.target)).__name__
    if node.op == "call_method":
        return str(node.target)
    return getattr(node.target, "__name__", str(node.target))
