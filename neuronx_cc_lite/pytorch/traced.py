"""`trace`: a torch module compiled ahead of time for its example inputs, in the spirit of torch_neuronx.trace.

    traced = neuronx_cc_lite.trace(model, (x,))   # export to ONNX, compile (the compile cache applies)
    y = traced(x)                                  # on the simulated chip; torch tensors in and out
    traced.save("model.neff")
    neuronx_cc_lite.load_traced("model.neff")(x)   # the same module again, from the bundle alone

The bundle is all a traced module keeps, so its names carry the torch signature: inputs input_0.. in argument
order, and the output `output` when the module returns one tensor, output_0.. when it returns a tuple. A bundle
with other names (any compiled ONNX model) loads too: inputs in the bundle's order, outputs as a tuple.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

import neuronx_cc_lite
import runtime
from neuronx_cc_lite.compiler import check_options
from isa import bundle as bundle_format
from isa.bundle import Bundle, TensorInfo
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.pytorch.chip import OnChip
from neuronx_cc_lite.pytorch.export import to_onnx
from runtime.errors import InputError

SINGLE_OUTPUT = "output"  # the output name of a module that returns one tensor (not a tuple)


def trace(module: torch.nn.Module, example_inputs: torch.Tensor | Sequence[torch.Tensor], *,
          target: str = "trn1", auto_cast: str = "none", auto_cast_type: str = "bf16", optimize: int = 2,
          cache: bool = True, cache_dir: str | os.PathLike[str] | None = None) -> TracedModule:
    """Export `module` with torch.onnx for `example_inputs` (a tensor or a tuple of tensors: the positional
    arguments), compile it with neuronx_cc_lite.compile and these options, and return it as a module that runs
    on the simulated chip and takes tensors of exactly those shapes and dtypes. The module is traced in eval mode
    (dropout off, batch norm on its running statistics) and left in the mode it was in. It must return a tensor
    or a tuple of tensors. A module torch.onnx cannot export raises CompileError NCC_TORCH, naming the operator;
    one the compiler cannot compile raises the compiler's error (NCC_UNSUPPORTED names the ONNX node)."""
    check_options(target=target, auto_cast=auto_cast, auto_cast_type=auto_cast_type, optimize=optimize)
    args = _arguments(example_inputs)
    training = module.training
    module.eval()
    try:
        with torch.no_grad():
            outputs = _output_names(module(*args))
        model = to_onnx(module, args, outputs)
    finally:
        module.train(training)
    bundle = neuronx_cc_lite.compile(model, target=target, auto_cast=auto_cast, auto_cast_type=auto_cast_type,
                                     optimize=optimize, cache=cache, cache_dir=cache_dir)
    return TracedModule(bundle)


def load_traced(path: str | os.PathLike[str]) -> TracedModule:
    """A module saved with TracedModule.save (or any bundle file), ready to run."""
    return TracedModule(os.fspath(path))


class TracedModule(torch.nn.Module):
    """A compiled bundle as a torch module: call it with the traced shapes and dtypes; `bundle` is what runs,
    `model` the runtime's model (`model.last_run.elapsed_ns` is the simulated latency of the last call)."""

    def __init__(self, bundle: Bundle | str) -> None:
        super().__init__()
        self._chip = OnChip(bundle)

    @property
    def model(self) -> runtime.Model:
        return self._chip.model

    @property
    def bundle(self) -> Bundle:
        return self._chip.model.bundle

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        expected: list[TensorInfo] = self.model.inputs
        _check(inputs, expected)
        results = self._chip.run({info.name: t for info, t in zip(expected, inputs)})
        outputs = tuple(results[info.name] for info in self.model.outputs)
        return outputs[0] if [info.name for info in self.model.outputs] == [SINGLE_OUTPUT] else outputs

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the bundle (atomically); load_traced(path) gives this module back."""
        bundle_format.write(self.bundle, path)

    def extra_repr(self) -> str:
        return (f"target={self.bundle.target}, inputs=[{', '.join(map(_describe, self.model.inputs))}], "
                f"outputs=[{', '.join(map(_describe, self.model.outputs))}]")


def _arguments(example_inputs: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    if not all(isinstance(a, torch.Tensor) for a in args):
        raise TypeError("example_inputs: a tensor or a tuple of tensors (the module's positional arguments), got "
                        f"{', '.join(type(a).__name__ for a in args)}")
    return args


def _output_names(result: Any) -> list[str]:
    if isinstance(result, torch.Tensor):
        return [SINGLE_OUTPUT]
    if type(result) is tuple and all(isinstance(r, torch.Tensor) for r in result):
        return [f"output_{i}" for i in range(len(result))]
    hint = ""
    if hasattr(result, "to_tuple"):  # a transformers ModelOutput (a dict of tensors that also indexes as a tuple)
        hint = ("; a transformers model returns a tuple when called with return_dict=False (set "
                "model.config.return_dict = False, or load it with from_pretrained(..., return_dict=False))")
    raise CompileError("NCC_TORCH", f"trace takes a module that returns a tensor or a tuple of tensors; this one "
                                    f"returns {type(result).__name__}{hint}")


def _check(inputs: Sequence[torch.Tensor], expected: list[TensorInfo]) -> None:
    """The traced shapes and dtypes exactly: the bundle is compiled for them and for nothing else."""
    if len(inputs) != len(expected):
        raise InputError(f"the traced module takes {len(expected)} tensor(s) "
                         f"({', '.join(map(_describe, expected))}), got {len(inputs)}")
    for i, (t, info) in enumerate(zip(inputs, expected)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"input {i}: a tensor, got {type(t).__name__}")
        dtype = str(t.dtype).removeprefix("torch.")  # torch's dtype names are numpy's for the types both have
        if tuple(t.shape) != info.shape or dtype != info.dtype:
            raise InputError(f"input {i}: {dtype}{list(t.shape)}, traced with {_describe(info)}; trace again "
                             "for another shape or dtype")


def _describe(info: TensorInfo) -> str:
    return f"{info.dtype}{list(info.shape)}"
