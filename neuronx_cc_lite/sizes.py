"""Sizes checked before any work is spent on them: a graph whose tensors cannot fit the chip's HBM is refused at
once, naming the tensor, instead of after minutes of lowering tiles for it (an input of 10**12 elements)."""

from __future__ import annotations

import numpy as np

from isa.target import Target
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph


def check_fits_hbm(graph: Graph, target: Target) -> None:
    """Every tensor alone, and the inputs, outputs and weights together, within one chip's HBM (NCC_HBM_FULL)."""
    resident = set(graph.inputs) | set(graph.outputs)
    total = 0
    for t in graph.tensors.values():
        if t.shape is None or t.dtype is None:
            continue
        nbytes = t.size * np.dtype(t.dtype).itemsize
        if nbytes > target.hbm_bytes:
            raise CompileError("NCC_HBM_FULL", f"tensor {t.name!r} ({list(t.shape)} {np.dtype(t.dtype).name}) needs "
                               f"{nbytes} bytes; a {target.name} chip has {target.hbm_bytes} bytes of HBM")
        if t.is_constant or t.name in resident:
            total += nbytes
    if total > target.hbm_bytes:
        raise CompileError("NCC_HBM_FULL", f"the model's inputs, outputs and weights need {total} bytes; a "
                           f"{target.name} chip has {target.hbm_bytes} bytes of HBM")
