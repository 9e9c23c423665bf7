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
import warnings
from typing import Any, Iterator, Sequence

import onnx
import torch

from neuronx_cc_lite.errors import CompileError

# The TorchScript exporter's newest opset in torch 2.13: Gelu and LayerNormalization come out as single ops.
OPSET = 20


def input_names(count: int) -> list[str]:
    return [f"input_{i}" for i in range(count)]


def to_onnx(module: torch.nn.Module, args: Sequence[torch.Tensor], outputs: Sequence[str]) -> onnx.ModelProto:
    """`module(*args)` as an ONNX model with inputs input_0.. and the given output names, weights as
    initializers; the module runs in eval mode while it is traced (the exporter's default). A module the exporter
    refuses raises NCC_TORCH with the exporter's reason, which names the aten operator."""
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings(), _without_fast_path():
            warnings.simplefilter("ignore", DeprecationWarning)  # the deprecated exporter is chosen, see above
            torch.onnx.export(_Positional(module), tuple(args), buffer, dynamo=False, opset_version=OPSET,
                              input_names=input_names(len(args)), output_names=list(outputs))
    except Exception as e:  # noqa: BLE001 - the exporter raises many types; each is a model it cannot export
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CompileError("NCC_TORCH", f"torch.onnx cannot export the module: {reason}") from e
    return onnx.load_from_string(buffer.getvalue())


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
