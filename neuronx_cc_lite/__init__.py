"""neuronx-cc-lite: an ahead-of-time compiler from ONNX models to bundles for a simulated NeuronCore chip.

    import neuronx_cc_lite, runtime
    bundle = neuronx_cc_lite.compile("model.onnx", auto_cast="matmult", output="model.neff")
    outputs = runtime.load(bundle).run({"input": x})

    traced = neuronx_cc_lite.trace(torch_module, (x,))   # with the [torch] extra: runs on the simulated chip
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # the package imports onnx, the compiler and torch only when a function needs them
    import onnx
    import torch

    from isa.bundle import Bundle
    from neuronx_cc_lite.pytorch import TracedModule

__version__ = "0.1.0"


def compile(model: str | os.PathLike[str] | onnx.ModelProto, *,  # noqa: A001 - the name users expect
            target: str = "trn1",
            auto_cast: str = "none", auto_cast_type: str = "bf16",
            input_shapes: Mapping[str, Sequence[int]] | None = None, optimize: int = 2,
            input_values: Mapping[str, Any] | None = None, state: Mapping[str, str] | None = None,
            tp: int = 1, dp: int = 1, lnc: int | None = None,
            output: str | os.PathLike[str] | None = None, cache: bool = True,
            cache_dir: str | os.PathLike[str] | None = None, cache_size: int | None = None) -> Bundle:
    """Compile an ONNX model (a path or a ModelProto) to a bundle, the options as the command line has them:
    target trn1 | trn2 | inf2, auto_cast none | matmult | all, auto_cast_type bf16 | fp16 | fp8_e4m3 |
    fp8_e5m2, input_shapes {input: dims} to pin dynamic dimensions, input_values {input: a number, bool, list or
    array} to pin inputs to constants (the Ifs and Loops they decide fold), optimize 1 (fast compiles) or 2 (the best
    code), tp N (tensor parallel: N ranks share each layer), dp N (data parallel: N replica groups, each on its
    share of the batch), lnc 1 | 2 (physical cores per rank; None: the target's default), state {input: output}
    (device state: the input stays in HBM across runs and the output is written into it, runtime/state.py).
    With `output`, the bundle is also written there, atomically. The compile cache (neuronx_cc_lite/cache.py)
    answers a model compiled before with the same options; `cache_dir` overrides where it lives, `cache_size` the bytes it may hold
    (least recently used entries go first), `cache=False` skips it. Errors raise neuronx_cc_lite.errors.CompileError
    (its `code` is the one-line error's code)."""
    import numpy as np

    from isa import bundle as bundle_format
    from isa.files import check_replaceable
    from neuronx_cc_lite.cache import cached, default_dir
    from neuronx_cc_lite.compiler import Options, compile_model

    _check_arguments(model, input_shapes, input_values, output, cache_size, state)
    options = Options(target=target, auto_cast=auto_cast, auto_cast_type=auto_cast_type, optimize=optimize,
                      tp=tp, dp=dp, lnc=lnc,
                      input_values={k: np.asarray(v).tolist() for k, v in (input_values or {}).items()},
                      input_shapes={k: tuple(int(n) for n in v) for k, v in (input_shapes or {}).items()},
                      state=dict(state or {}))
    options.check()
    if output is not None:  # before any work: a device, or a file that is not a bundle, is not replaced
        try:
            bundle_format.check_output(output)
            check_replaceable(output)
        except OSError as e:
            raise ValueError(f"output={os.fspath(output)!r}: {e.strerror}") from None
    directory = (os.fspath(cache_dir) if cache_dir is not None else default_dir()) if cache else None
    return cached(model, options.flags(), directory, lambda: compile_model(model, options), output, cache_size)


def _check_arguments(model: Any, input_shapes: Any, input_values: Any, output: Any, cache_size: Any,
                     state: Any = None) -> None:
    """TypeError or ValueError naming the argument, for a call to `compile` that could not mean anything."""
    import numbers

    if not isinstance(model, (str, os.PathLike)) and type(model).__name__ != "ModelProto":
        raise TypeError(f"model must be a path or an onnx.ModelProto, not {type(model).__name__}")
    for name, value in (("input_shapes", input_shapes), ("input_values", input_values), ("state", state)):
        if value is not None and not isinstance(value, Mapping):
            raise TypeError(f"{name} must be a mapping {{input name: ...}}, not {type(value).__name__}")
    for name, dims in (input_shapes or {}).items():
        if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence) or not all(
                isinstance(n, numbers.Integral) and n >= 0 for n in dims):
            raise TypeError(f"input_shapes[{name!r}] must be a sequence of non-negative integers, not {dims!r}")
    if output is not None and not isinstance(output, (str, os.PathLike)):
        raise TypeError(f"output must be a path, not {type(output).__name__}")
    if cache_size is not None and (not isinstance(cache_size, numbers.Integral) or cache_size < 0):
        raise ValueError(f"cache_size must be a number of bytes (an integer >= 0), not {cache_size!r}")


def trace(module: torch.nn.Module, example_inputs: torch.Tensor | Sequence[torch.Tensor],
          **options: Any) -> TracedModule:
    """A torch module exported through torch.onnx, compiled for `example_inputs` (keyword options as `compile`
    has them) and returned as a module that runs on the simulated chip: neuronx_cc_lite/pytorch/traced.py.
    Needs the [torch] extra; without torch it raises CompileError NCC_TORCH."""
    return _pytorch().trace(module, example_inputs, **options)


def load_traced(path: str | os.PathLike[str]) -> TracedModule:
    """A module saved with `trace(...).save(path)`, back from its bundle file. Needs the [torch] extra."""
    return _pytorch().load_traced(path)


def _pytorch() -> ModuleType:
    try:
        import torch  # noqa: F401
    except ImportError:
        from neuronx_cc_lite.errors import CompileError
        raise CompileError("NCC_TORCH", "the PyTorch front door needs torch: pip install "
                                        "'neuronx-cc-lite[torch]'") from None
    from neuronx_cc_lite import pytorch
    return pytorch
