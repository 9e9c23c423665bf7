"""Hand-written bundles for runtime tests: a few instructions around HBM input and output tensors."""

from __future__ import annotations

import numpy as np

from isa.bundle import Bundle, Stream, TensorInfo
from isa.dtypes import DType
from isa.instructions import Instruction
from isa.operand import Mem, Operand
import runtime

HBM_SIZE = 1 << 20


def hbm(offset: int, rows: int, cols: int, dtype: DType = DType.fp32) -> Operand:
    return Operand(Mem.HBM, dtype, 0, rows, offset, ((cols, 1),), cols)


def sbuf(rows: int, cols: int, offset: int = 0, dtype: DType = DType.fp32) -> Operand:
    return Operand(Mem.SBUF, dtype, 0, rows, offset, ((cols, 1),))


def psum(rows: int, cols: int, offset: int = 0) -> Operand:
    return Operand(Mem.PSUM, DType.fp32, 0, rows, offset, ((cols, 1),))


def model(streams: dict[str, list[Instruction]], inputs: dict[str, tuple[int, tuple[int, ...]]],
          outputs: dict[str, tuple[int, tuple[int, ...]]], dtype: str = "float32") -> runtime.Model:
    """A model whose inputs and outputs sit at the given HBM offsets."""
    device = DType.from_numpy(np.dtype(dtype)).name
    b = Bundle("trn1", HBM_SIZE,
               [TensorInfo.whole(k, shape, dtype, device, off) for k, (off, shape) in inputs.items()],
               [TensorInfo.whole(k, shape, dtype, device, off) for k, (off, shape) in outputs.items()],
               [{name: Stream(list(instrs), [""] * len(instrs)) for name, instrs in streams.items()}])
    return runtime.Model(b)
