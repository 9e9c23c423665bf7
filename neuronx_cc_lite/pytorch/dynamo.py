"""The torch.compile backend: `torch.compile(model, backend="neuronx_cc_lite")`.

Dynamo hands `backend` each graph it captured (an FX GraphModule) and gets back a callable that, at each call:

    key = the tensor arguments' shapes and dtypes, the other arguments' values (sizes, under dynamic shapes)
    if key is new, or a parameter or buffer was written or rebound (`param.data = ...`) since it was compiled:
        bind the graph's parameters and buffers as constants and its non-tensor arguments as they are
        export it to ONNX and compile it (the compile cache applies)
        if it cannot be exported or compiled: split it (partition.py): the operators the chip supports in runs
                                              compiled for it, the others eagerly on the CPU between them; log
                                              one warning with the reason (it names the operator)
    run the bundle on the simulated chip with the remaining tensors, the user's inputs

Dynamo lifts the module's parameters and buffers into graph inputs (so that new weights need no new graph); the
compiler wants them as constants (it lays weights out at compile time and folds batch norm into convolutions), so
the backend bakes them in, as torch_neuronx.trace and inductor's freezing do, and recompiles when a tensor's
version counter shows an in-place write (an optimizer step, load_state_dict). Compiling at the call rather than in
`backend` is what lets a dynamic-shape graph run: its sizes are known only then. The chip computes values only:
outputs carry no autograd history.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from torch._guards import CompileContext

import neuronx_cc_lite
from neuronx_cc_lite.compiler import check_options
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.pytorch.chip import OnChip
from neuronx_cc_lite.pytorch.export import input_names, to_onnx

log = logging.getLogger(__name__)

# torch.compile(..., options={...}): the keywords of neuronx_cc_lite.compile that apply to a graph
OPTIONS = ("target", "auto_cast", "auto_cast_type", "optimize", "cache", "cache_dir")


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
            options: Mapping[str, Any] | None = None) -> CompiledGraph:
    """The backend function dynamo calls; `options` are compile options (OPTIONS): an unknown one is a TypeError,
    a bad value (auto_cast="bogus") the CompileError NCC_OPTION that neuronx_cc_lite.compile would raise, here,
    rather than at every graph's compile (where it would send each graph to eager)."""
    unknown = sorted(set(options or {}) - set(OPTIONS))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)} for the neuronx_cc_lite backend "
                        f"(known: {', '.join(OPTIONS)})")
    check_options(**{k: v for k, v in (options or {}).items() if k not in ("cache", "cache_dir")})
    name = str(CompileContext.current_compile_id() or "graph")
    return CompiledGraph(gm, _module_state(gm), dict(options or {}), name)


@dataclass(frozen=True)
class _Entry:
    chip: OnChip | None  # None: the graph runs on the CPU, as `eager`
    live: tuple[int, ...]  # the argument positions that feed the chip's inputs, in order
    stamp: tuple[tuple[int, int, int], ...]  # (id, data pointer, version) of the module state it was compiled with
    eager: Any = None  # without a chip: the graph, or the graph split between the chip and the CPU


class CompiledGraph:
    """One dynamo graph, compiled per call signature (see the module's docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, state: frozenset[int], options: dict[str, Any],
                 name: str, split: bool = True) -> None:
        self.gm = gm
        self.state = state  # the argument positions that are the module's parameters and buffers
        self.options = options
        self.name = name
        self.split = split  # on failure, split between the chip and the CPU (a part of a split graph: eagerly)
        self.outputs = len(gm.graph.output_node().args[0])
        self._entries: dict[tuple[Any, ...], _Entry] = {}

    def __call__(self, *args: Any) -> Any:
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        # `param.data = t` keeps the parameter (its id) and may keep its version: the data pointer tells
        stamp = tuple((id(args[i]), args[i].data_ptr(), args[i]._version) for i in sorted(self.state))
        entry = self._entries.get(key)
        if entry is None or (entry.chip is not None and entry.stamp != stamp):
            entry = self._entries[key] = self._compile(args, stamp)
        if entry.chip is None:
            return entry.eager(*args)
        results = entry.chip.run(dict(zip(input_names(len(entry.live)), (args[i] for i in entry.live))))
        return tuple(results[name] for name in _output_names(self.outputs))

    def _compile(self, args: Sequence[Any], stamp: tuple[tuple[int, int, int], ...]) -> _Entry:
        module, tensors = bound_module(self.gm, args, self.state)
        live = module.live
        try:
            model = to_onnx(module, tensors, _output_names(self.outputs))
            bundle = neuronx_cc_lite.compile(model, **self.options)
        except CompileError as e:
            return _Entry(None, live, stamp, self._on_cpu(args, e))
        return _Entry(OnChip(bundle), live, stamp)

    def _on_cpu(self, args: Sequence[Any], error: CompileError) -> Any:
        """What runs when the graph cannot be compiled whole: its supported runs on the chip and the rest on the
        CPU (partition.py), or all of it eagerly; one warning says which."""
        from neuronx_cc_lite.pytorch.partition import split

        parts = None
        if self.split:
            parts = split(self.gm, args, self.state, self.options, self.name,
                          lambda sub, state, name: CompiledGraph(sub, state, self.options, name, split=False))
        if parts is None:
            log.warning(f"neuronx_cc_lite: {self.name} runs eagerly: {error}")
            return self.gm
        log.warning(f"neuronx_cc_lite: {self.name} is split: {len(parts.on_cpu)} operator(s) run on the CPU "
                    f"({', '.join(sorted(set(parts.on_cpu)))}), the rest in {parts.parts} part(s) on the chip; "
                    f"{error}")
        return parts.module


def bound_module(gm: torch.fx.GraphModule, args: Sequence[Any],
                 state: frozenset[int]) -> tuple[_Bound, list[torch.Tensor]]:
    """The graph as a module of its live tensors only (module state baked in, other arguments fixed), and those
    tensors: what the exporter traces."""
    live = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in state)
    return _Bound(gm, args, live, state), [args[i] for i in live]


class _Bound(torch.nn.Module):
    """The graph with its module state as buffers (the exporter makes them initializers) and its non-tensor
    arguments fixed: it takes the live tensors only."""

    def __init__(self, gm: torch.fx.GraphModule, args: Sequence[Any], live: tuple[int, ...],
                 state: frozenset[int]) -> None:
        super().__init__()
        self.graph_module = gm
        self.live = live
        self.state = sorted(state)
        self.fixed = [None if isinstance(a, torch.Tensor) else a for a in args]
        for i in self.state:
            self.register_buffer(f"state_{i}", args[i].detach(), persistent=False)

    def forward(self, *tensors: torch.Tensor) -> tuple[Any, ...]:
        args = list(self.fixed)
        for i, t in zip(self.live, tensors):
            args[i] = t
        for i in self.state:
            args[i] = getattr(self, f"state_{i}")
        return tuple(self.graph_module(*args))


def _module_state(gm: torch.fx.GraphModule) -> frozenset[int]:
    """The placeholders dynamo made of an nn.Module's parameters and buffers, by where their values came from."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    return frozenset(i for i, node in enumerate(placeholders) if _is_module_state(node))


def _is_module_state(node: torch.fx.Node) -> bool:
    source = getattr(node.meta.get("grapharg"), "source", None)
    if source is None:
        return False
    guard = source.guard_source
    return guard.is_specialized_nn_module() or guard.is_unspecialized_nn_module()


def _output_names(count: int) -> list[str]:
    return [f"output_{i}" for i in range(count)]
