"""Sizes checked before any work is spent on them: a graph whose tensors cannot fit the chip's HBM is refused at
once, naming the tensor, instead of after minutes of lowering tiles for it (an input of 10**12 elements); so is an
operator that moves more data than a compile can cut into transfers in bounded time (a Relu over [1, 2^31]: 16 GiB
in about 524,000 DMA pieces of 32 KiB, ten minutes of compile)."""

from __future__ import annotations

import numpy as np

from isa.target import Target
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph


# Bytes one operator may read and write: 4 GiB is 131,072 DMA pieces of 32 KiB (codegen/transfers.py), about 25 s of
# CPU to compile (a Relu moving 1 GiB took 5.5 s). The largest operator of BERT-large (the dynamo export) moves 20 MB,
# of models/ 0.7 MB. neuronx-cc refuses programs of more than 5,000,000 instructions likewise ([XTP003], "Operators
# are too large").
MAX_OPERATOR_BYTES = 1 << 32
# Ops that only change how a tensor is viewed (lower/movement.py, tile/hbm.py): their readers move the data
VIEWS = frozenset({"Reshape", "Expand", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice"})
# Ops that read only the rows their indices name from their first input (a vocabulary table): their output counts
GATHERS = frozenset({"Gather", "GatherElements", "GatherND"})


def check_operator_sizes(graph: Graph) -> None:
    """Every operator that moves data reads and writes at most MAX_OPERATOR_BYTES (NCC_TOO_LARGE, naming it)."""
    for node in graph.nodes:
        if node.op in VIEWS:
            continue
        nbytes = 0
        read = node.inputs[1:] if node.op in GATHERS else node.inputs
        for name in (*read, *node.outputs):
            t = graph.tensors.get(name) if name else None
            if t is not None and t.shape is not None and t.dtype is not None:
                nbytes += t.size * np.dtype(t.dtype).itemsize
        if nbytes > MAX_OPERATOR_BYTES:
            raise CompileError("NCC_TOO_LARGE", f"reads and writes {nbytes} bytes; an operator may move at "
                               f"most {MAX_OPERATOR_BYTES} (4 GiB): split it (a smaller batch or sequence, --tp)",
                               node.name, node.op)


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
