"""A compiled bundle on the simulated chip, fed and read as torch tensors."""

from __future__ import annotations

from typing import Mapping

import torch

import runtime
from isa.bundle import Bundle


class OnChip:
    """`runtime.load(bundle)` with torch tensors in and out, by ONNX name."""

    def __init__(self, bundle: Bundle | str) -> None:
        self.model = runtime.load(bundle)

    def run(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # detach: the chip computes values only, so its outputs carry no autograd history
        arrays = {name: t.detach().cpu().numpy() for name, t in inputs.items()}
        # the runtime assembles each output into an array of its own, so the tensors share memory with nothing
        return {name: torch.from_numpy(a) for name, a in self.model.run(arrays).items()}
