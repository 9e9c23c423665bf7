"""What an op lowering works with: the graph, the program being built, and an HBM view per tensor.

Graph inputs and outputs get HBM tensors of their own; constants become weight tensors the first time a lowering
reads them; every other result gets a scratch tensor, unless its op only makes a view of another tensor.
"""

from __future__ import annotations

from typing import Callable

import ml_dtypes
import numpy as np

from isa.dtypes import DType
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node, Tensor
from neuronx_cc_lite.lower.hbm import HbmView
from neuronx_cc_lite.lower.program import Program

# ONNX element types the device holds, and the device type each is held in. The engines have no 64-bit types:
# float64 is computed in fp32 (as neuronx-cc does) and int64 (indices, shapes) held as int32, the runtime
# converting at the model's inputs and outputs; bool is uint8.
_DEVICE_TYPES = {
    np.dtype(np.float32): DType.fp32,
    np.dtype(np.float64): DType.fp32,
    np.dtype(np.float16): DType.fp16,
    np.dtype(np.int32): DType.int32,
    np.dtype(np.int64): DType.int32,
    np.dtype(np.int16): DType.int16,
    np.dtype(np.int8): DType.int8,
    np.dtype(np.uint8): DType.uint8,
    np.dtype(np.uint16): DType.uint16,
    np.dtype(np.uint32): DType.uint32,
    np.dtype(np.bool_): DType.uint8,
}


def device_dtype(dtype: np.dtype) -> DType | None:
    dtype = np.dtype(dtype)
    if dtype in _DEVICE_TYPES:
        return _DEVICE_TYPES[dtype]
    try:
        return DType.from_numpy(dtype)  # bf16 and the fp8 types, through ml_dtypes
    except ValueError:
        return None


class LowerCtx:
    def __init__(self, graph: Graph, program: Program, internal_dtype: DType | None = None) -> None:
        self.graph = graph
        self.program = program
        self.internal_dtype = internal_dtype  # auto-cast all: how fp32 tensors inside the model are held
        self.views: dict[str, HbmView] = {}
        self.output_owner: dict[int, str] = {}  # id(HbmTensor) -> the graph output it was made for
        for name in graph.inputs:
            t = graph.tensors[name]
            dtype = self.dtype(name)
            tensor = program.hbm_tensor(name, t.size * dtype.size, "input")
            self.views[name] = HbmView.whole(tensor, dtype, t.shape)

    def dtype(self, name: str) -> DType:
        t = self.graph.tensors[name]
        dtype = device_dtype(t.dtype)
        if dtype is None:
            raise CompileError("NCC_UNSUPPORTED_DTYPE", f"tensor {name!r} has element type {t.dtype}, which the "
                               "device does not hold")
        inside = name not in self.graph.inputs and name not in self.graph.outputs
        if self.internal_dtype is not None and dtype is DType.fp32 and inside:
            return self.internal_dtype
        return dtype

    def shape(self, name: str) -> tuple[int, ...]:
        return self.graph.tensors[name].shape

    def view(self, name: str) -> HbmView:
        """The HBM view of a tensor a lowering reads."""
        if name not in self.views:
            t = self.graph.tensors[name]
            assert t.is_constant, f"{name} read before it was computed"
            dtype = self.dtype(name)
            data = np.ascontiguousarray(self._narrowed(t.value, dtype)).tobytes()
            tensor = self.program.hbm_tensor(name, len(data), "weight", data)
            self.views[name] = HbmView.whole(tensor, dtype, t.shape)
        return self.views[name]

    @staticmethod
    def _narrowed(value: np.ndarray, dtype: DType) -> np.ndarray:
        """A float constant in its device type. When auto-cast narrows it, finite values beyond the new type's
        range saturate to its largest value instead of becoming inf or NaN: exporters write "minus infinity" in
        masks as float32's lowest value, which must stay the lowest value of the narrow type."""
        if dtype.is_float and value.dtype.kind == "f" and dtype is not DType.fp32:
            top = float(ml_dtypes.finfo(dtype.np).max)
            value = np.where(np.isfinite(value), np.clip(value, -top, top), value)
        return value.astype(dtype.np)

    def constant(self, name: str, value: np.ndarray) -> str:
        """Add a constant the lowering computed (a mask, an index table) to the graph; returns its name."""
        value = np.asarray(value)
        self.graph.tensors[name] = Tensor(name, tuple(value.shape), value.dtype, value)
        return name

    def output(self, name: str) -> HbmView:
        """A fresh, contiguous HBM tensor for a result a lowering computes."""
        t = self.graph.tensors[name]
        dtype = self.dtype(name)
        kind = "output" if name in self.graph.outputs else "scratch"
        tensor = self.program.hbm_tensor(name, t.size * dtype.size, kind)
        if kind == "output":
            self.output_owner[id(tensor)] = name
        view = HbmView.whole(tensor, dtype, t.shape)
        self.views[name] = view
        return view

    def alias(self, name: str, view: HbmView) -> None:
        """Record that a result is a view of data already in HBM (Reshape, Identity, ...)."""
        self.views[name] = view

    def materialize_outputs(self) -> None:
        """Every graph output must own a contiguous HBM tensor: copy those that are views of something else."""
        for name in self.graph.outputs:
            view = self.view(name)
            owned = self.output_owner.get(id(view.tensor)) == name
            if owned and view.is_contiguous and view.offset == 0:
                continue
            self.program.node = f"output {name}"
            source = view
            target = self.output(name)
            self.program.dma(target, source)


Lower = Callable[[LowerCtx, Node], None]
Check = Callable[[Node, Graph], "str | None"]
