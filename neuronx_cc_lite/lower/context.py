"""What an op lowering works with: the graph, the program being built, and an HBM view per tensor.

Graph inputs and outputs get HBM tensors of their own; constants become weight tensors the first time a lowering
reads them; every other result gets a scratch tensor, unless its op only makes a view of another tensor. Device
state (Graph.state) is an input tensor of kind "state" that the program also writes: its next value is computed
into it in place where the op allows (`in_place`), else copied into it once every reader of the old value is done
(the dependencies on a written HBM tensor order that copy after them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from isa.dtypes import DType, not_held
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node, Tensor
from neuronx_cc_lite.lower.columns import ColumnPool
from neuronx_cc_lite.lower.layout import FeatureMajor, only_multiplied
from neuronx_cc_lite.declared import contiguous, is_declared
from neuronx_cc_lite.ops.dtypes import device_dtype
from neuronx_cc_lite.tile.hbm import HbmTensor, HbmView
from neuronx_cc_lite.tile.program import Program, Tile, TileAccess

if TYPE_CHECKING:
    from neuronx_cc_lite.lower.depthwise import BandWindows

class LowerCtx:
    def __init__(self, graph: Graph, program: Program, internal_dtype: DType | None = None,
                 by_rows: frozenset[str] | None = frozenset()) -> None:
        self.graph = graph
        self.program = program
        self.internal_dtype = internal_dtype  # auto-cast all: how fp32 tensors inside the model are held
        self.views: dict[str, HbmView] = {}
        self.consumers = graph.consumers()
        self.feature_major = FeatureMajor(graph, by_rows)  # results laid out with their last axis on partitions
        self.columns = ColumnPool(program)  # per-feature constants on partitions, loaded once
        # weights a lowering laid out at compile time (a matmul's K tiles), by key: the tensor and block offsets
        self.laid_out: dict[str, tuple[HbmTensor, list[int]]] = {}
        # activations turned on PE for a matmul (A^T of a row block), by what was turned: a tensor two matmuls read
        # (a gate and a projection of one input) is loaded and turned once
        self.turned: dict[tuple[object, ...], list[TileAccess]] = {}
        # depthwise windows their input's producer wrote (an image stem's bands, lower/banded_stem.py), by input
        # tensor: the bands' plan (depthwise.BandWindows), and the window of each (image, first output row of a
        # group of bands); the depthwise lowering takes that plan and reads them as they are
        self.windows: dict[str, tuple[BandWindows, dict[tuple[int, int], Tile]]] = {}
        # spatial means a producer computed as its epilogue ran (a banded depthwise convolution, lower/depthwise.py),
        # by the result of the ReduceMean (or GlobalAveragePool): [C, 1] fp32 on partitions 0..C-1, stored as it is
        self.means: dict[str, Tile] = {}
        self.output_owner: dict[int, str] = {}  # id(HbmTensor) -> the graph output it was made for
        self.next_state = {after: name for name, after in graph.state.items()}  # next value -> state input
        for name in graph.inputs:
            t = graph.tensors[name]
            dtype = self.dtype(name)
            kind = TensorKind.STATE if name in graph.state else TensorKind.INPUT
            tensor = program.hbm_tensor(name, t.size * dtype.size, kind, dtype)
            self.views[name] = HbmView.whole(tensor, dtype, t.shape)
        self.inputs = dict(self.views)  # where the inputs are written (an input that is an output gets a copy)

    def dtype(self, name: str) -> DType:
        t = self.graph.tensors[name]
        dtype = device_dtype(t.dtype)
        if dtype is None:
            raise CompileError("NCC_UNSUPPORTED_DTYPE", f"tensor {name!r} has element type {t.dtype}, which the "
                               "device does not hold")
        inside = name not in self.graph.inputs and name not in self.graph.outputs
        if self.internal_dtype is not None and dtype is DType.fp32 and inside:
            return self.internal_dtype
        narrow = self.program.matmul_dtype
        if narrow is not None and dtype is DType.fp32 and inside and not t.is_constant and \
                only_multiplied(self.graph, self.consumers, name):
            return narrow  # read only by matmuls, which would round it to the matmul type anyway
        return dtype

    def shape(self, name: str) -> tuple[int, ...]:
        return self.graph.tensors[name].shape

    def view(self, name: str) -> HbmView:
        """The HBM view of a tensor a lowering reads."""
        if name not in self.views:
            t = self.graph.tensors[name]
            assert t.is_constant, f"{name} read before it was computed"
            dtype = self.dtype(name)
            if not is_declared(t.value):  # a declared weight has no values to check
                self._check_held(name, t.value, dtype)
            data = contiguous(self.narrowed(t.value, dtype)).tobytes()
            tensor = self.program.hbm_tensor(name, len(data), TensorKind.WEIGHT, dtype, data)
            self.views[name] = HbmView.whole(tensor, dtype, t.shape)
        return self.views[name]

    def _check_held(self, name: str, value: np.ndarray, dtype: DType) -> None:
        """A constant the device would not hold as it is (an int64 past int32, a float64 outside fp32's normal
        range) is refused rather than wrapped, rounded to inf or flushed (neuronx-cc's NCC_ESFH002 refuses such
        64-bit constants too)."""
        outside = not_held(value, dtype)
        if outside is not None:
            at = tuple(int(i) for i in np.argwhere(outside)[0])
            raise CompileError("NCC_UNSUPPORTED", f"constant {name!r} (read by {self.program.node!r}) holds "
                               f"{value[at]} at {list(at)}, which the device cannot hold in {dtype.name}")

    @staticmethod
    def narrowed(value: np.ndarray, dtype: DType) -> np.ndarray:
        """A float constant in its device type. When auto-cast narrows it, finite values beyond the new type's
        range saturate to its largest value instead of becoming inf or NaN: exporters write "minus infinity" in
        masks as float32's lowest value, which must stay the lowest value of the narrow type."""
        if dtype.is_float and value.dtype.kind == "f" and dtype is not DType.fp32:
            top = float(ml_dtypes.finfo(dtype.np).max)
            value = np.where(np.isfinite(value), np.clip(value, -top, top), value)
        return value.astype(dtype.np, copy=False)  # its readers copy it out (to bytes): no copy of our own

    def constant(self, name: str, value: np.ndarray) -> str:
        """Add a constant the lowering computed (a mask, an index table) to the graph; returns its name."""
        value = np.asanyarray(value)  # a declared weight's pieces stay declared
        self.graph.tensors[name] = Tensor(name, tuple(value.shape), value.dtype, value)
        return name

    def reshaped(self, name: str, shape: tuple[int, ...]) -> str:
        """A new tensor name for `name` read with another shape of the same size (a size-1 axis inserted so that
        it broadcasts against a result), for lowerings that hand names to `elementwise`: a view when the data
        allows, else a contiguous copy."""
        new = f"{name}/as{'x'.join(map(str, shape))}"
        if new not in self.views:
            src = self.view(name)
            self.graph.tensors[new] = Tensor(new, tuple(shape), self.graph.tensors[name].dtype)
            view = src.reshape(tuple(shape))
            if view is None:
                view = self.output(new)
                self.program.dma(view.reshape(src.shape), src)  # type: ignore[union-attr]
            self.views[new] = view
        return new

    def output(self, name: str, partition_axes: tuple[int, int] | None = None,
               follow_transpose: bool = False) -> HbmView:
        """A fresh HBM tensor for a result a lowering computes, contiguous unless `follow_transpose` lets it be
        stored in the order of a Transpose that is its only reader (the heads of attention merged back: the
        Transpose and the Reshape after it then move nothing). `partition_axes` (first, last): the lowering puts
        axes first .. last - 1 on partitions (codegen/on_chip.py keeps the tensor on chip in that layout;
        elementwise consumers tile alike)."""
        t = self.graph.tensors[name]
        dtype = self.dtype(name)
        kind = TensorKind.OUTPUT if name in self.graph.outputs and name not in self.next_state else TensorKind.SCRATCH
        tensor = self.program.hbm_tensor(name, t.size * dtype.size, kind, dtype)
        perm = self._sole_transpose(name) if follow_transpose and kind is TensorKind.SCRATCH else None
        order = perm or tuple(range(len(t.shape)))
        stored = tuple(t.shape[p] for p in order)
        if partition_axes is not None:
            placed = sorted(order.index(a) for a in range(*partition_axes))
            if placed == list(range(placed[0], placed[-1] + 1)) if placed else True:
                first, last = (placed[0], placed[-1] + 1) if placed else (0, 0)
                tensor.layout = (math.prod(stored[:first]), math.prod(stored[first:last]),
                                 math.prod(stored[last:]))
        if kind is TensorKind.OUTPUT:
            self.output_owner[id(tensor)] = name
        view = HbmView.whole(tensor, dtype, stored).transpose(tuple(order.index(a) for a in range(len(order))))
        self.views[name] = view
        return view

    def _sole_transpose(self, name: str) -> tuple[int, ...] | None:
        users = self.consumers.get(name, [])
        if len(users) == 1 and users[0].op == "Transpose" and name not in self.graph.outputs:
            perm = users[0].attrs.get("perm")
            rank = len(self.graph.tensors[name].shape)
            return tuple(int(p) % rank for p in perm) if perm is not None else tuple(reversed(range(rank)))
        return None

    def partition_axes(self, name: str) -> tuple[int, int] | None:
        """The axes of a computed tensor its producer put on partitions, in the tensor's (possibly reshaped) shape:
        None when unknown. A view that is not all of the tensor (a Slice of a reshaped matmul result, RoPE's halves
        of each head) keeps the producer's rows when they lie along one of its axes, whole, and the producer had
        nothing outside them (its layout is rows x inner)."""
        view = self.views.get(name)
        if view is None or view.tensor.layout is None:
            return None
        outer, rows, inner = view.tensor.layout
        if view.offset or not view.is_contiguous or view.size * view.dtype.size != view.tensor.nbytes:
            if outer != 1 or rows <= 1 or view.offset >= inner:
                return None
            axis = next((k for k, (n, stride) in enumerate(zip(view.shape, view.strides))
                         if n == rows and stride == inner), None)
            if axis is None or any(n > 1 for n in view.shape[:axis]):
                return None
            return axis, axis + 1
        shape = view.shape
        firsts = [k for k in range(len(shape) + 1) if math.prod(shape[:k]) == outer]
        lasts = [k for k in range(len(shape) + 1) if math.prod(shape[k:]) == inner]
        for first in firsts:
            for last in lasts:
                if first <= last and math.prod(shape[first:last]) == rows:
                    return first, last
        return None

    def in_place(self, node: Node) -> HbmView | None:
        """The state input that `node` (a scatter: data in, data with rows written out) may write in place: its data
        input when that is device state whose next value is the node's result and which nothing else reads. The
        result is then that input's view, and the lowering writes only the rows that change."""
        data, out = node.inputs[0], node.outputs[0]
        if self.graph.state.get(data) != out or len(self.consumers.get(data, [])) != 1:
            return None
        view = self.views[data]
        self.views[out] = view
        return view

    def alias(self, name: str, view: HbmView) -> None:
        """Record that a result is a view of data already in HBM (Reshape, Identity, ...)."""
        self.views[name] = view

    def materialize_outputs(self) -> None:
        """Every graph output must own a contiguous HBM tensor: copy those that are views of something else. The next
        value of a state tensor goes into the state tensor, unless it was computed there."""
        for name in self.graph.outputs:
            self.program.node = f"output {name}"
            view = self.view(name)
            if name in self.next_state:
                state = self.views[self.next_state[name]]
                if view.tensor is not state.tensor or view.offset or not view.is_contiguous:
                    self.program.node = f"state {self.next_state[name]}"
                    self.program.dma(state, view)
                continue
            owned = self.output_owner.get(id(view.tensor)) == name
            if owned and view.is_contiguous and view.offset == 0:
                continue
            self.program.node = f"output {name}"
            source = view
            target = self.output(name)
            self.program.dma(target, source)
