"""A torch module to ONNX, as the compiler takes it.

The exporter is torch.onnx's TorchScript one (`dynamo=False`), which torch 2.13 (the version the `[torch]` extra
pins) still ships, deprecated. Both exporters produce graphs this compiler compiles to the same results; the
TorchScript one is chosen because:
- it exports in 0.2-0.3 s where the dynamo exporter takes 5-8 s on this machine (it rebuilds onnxscript's torchlib
  registry, ~4.5 s, on every call): the torch.compile backend exports every graph dynamo hands it;
- it traces any callable module as it is, so dynamo's FX GraphModule goes through unchanged, where the dynamo
  exporter would run torch.export over a graph dynamo has already captured.
Should a later torch drop it, `dynamo=True` is the replacement (onnxscript is in the extra for that reason).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings
from typing import Any, Iterator, Sequence

import onnx
import torch

from neuronx_cc_lite.errors import CompileError

log = logging.getLogger(__name__)

# The TorchScript exporter's newest opset in torch 2.13: Gelu and LayerNormalization come out as single ops.
OPSET = 20


def input_names(count: int) -> list[str]:
    return [f"input_{i}" for i in range(count)]


def to_onnx(module: torch.nn.Module, args: Sequence[torch.Tensor], outputs: Sequence[str]) -> onnx.ModelProto:
    """`module(*args)` as an ONNX model with inputs input_0.. and the given output names, weights as
    initializers; the module runs in eval mode while it is traced (the exporter's default). A module the exporter
    refuses raises NCC_TORCH with the exporter's reason, which names the aten operator."""
    buffer = io.BytesIO()
    printed: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught, _without_fast_path(), _stderr_kept(printed):
            warnings.simplefilter("ignore", DeprecationWarning)  # the deprecated exporter is chosen, see above
            # a graph whose tensors are all baked in (a part of a split graph, made of weights only) has no inputs
            warnings.filterwarnings("ignore", "No input args", UserWarning)
            torch.onnx.export(_Positional(module), tuple(args), buffer, dynamo=False, opset_version=OPSET,
                              input_names=input_names(len(args)), output_names=list(outputs))
        _say_baked_values(caught)
    except Exception as e:  # noqa: BLE001 - the exporter raises many types; each is a model it cannot export
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if printed[0]:
            log.debug(f"what torch.onnx printed as it failed:\n{printed[0]}")
        raise CompileError("NCC_TORCH", f"torch.onnx cannot export the module: {reason}") from e
    if printed[0]:
        sys.stderr.write(printed[0])  # an export that succeeds says what it says
    return onnx.load_from_string(buffer.getvalue())


class BakedValueWarning(UserWarning):
    """The traced module read a tensor's value in Python (an `if` on it, `.item()`): the trace holds what the
    example inputs decided there, for every input."""


def _say_baked_values(caught: list[warnings.WarningMessage]) -> None:
    """Each warning the export raised, as it would have been shown; the tracer's "Converting a tensor to a Python
    ..." about the user's own code (not torch's shape checks, which hold for the traced shapes) as a
    BakedValueWarning that says what it means and what to do."""
    torch_dir = os.path.dirname(torch.__file__)
    for w in caught:
        user_code = not os.path.abspath(w.filename).startswith(torch_dir)
        if issubclass(w.category, torch.jit.TracerWarning) and "Converting a tensor to a Python" in str(w.message) \
                and user_code:
            warnings.warn_explicit(
                "a tensor's value decides Python code here (an `if`, `.item()`, `int()`): the trace keeps what the "
                "example inputs decided, the branch they took, for every input. Compute both sides and choose with "
                "torch.where to follow the data, or use torch.compile(backend=\"neuronx_cc_lite\"), which runs "
                "such code on the CPU", BakedValueWarning, w.filename, w.lineno)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


@contextlib.contextmanager
def _stderr_kept(printed: list[str]) -> Iterator[None]:
    """What the process writes to its stderr (file descriptor 2) while inside, into `printed[0]` instead. The
    TorchScript exporter prints its whole IR from C++ when it fails (twenty lines and more for one unsupported
    operator, which the caller reports in one line), on its ONNX log stream: stdout, which C++ buffers; while
    inside, that log goes to the unbuffered stderr, and is kept with the rest."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as kept:
        os.dup2(kept.fileno(), 2)
        torch._C._jit_set_onnx_log_output_stream("stderr")
        try:
            yield
        finally:
            torch._C._jit_set_onnx_log_output_stream("stdout")  # the exporter's own default
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            kept.seek(0)
            printed.append(kept.read().decode("utf-8", "replace"))


class _Positional(torch.nn.Module):
    """The module called with positional arguments only: given the module itself, the TorchScript exporter makes
    graph inputs of its forward's other parameters' defaults (nn.TransformerEncoderLayer's is_causal=False
    becomes a tensor, which attention then refuses)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: torch.Tensor) -> Any:
        return self.module(*args)


@contextlib.contextmanager
def _without_fast_path() -> Iterator[None]:
    """nn.TransformerEncoderLayer and nn.MultiheadAttention take fused kernels under no_grad (the "fast path"),
    which no exporter can export; with it off they run as the ordinary ops they are made of."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)
