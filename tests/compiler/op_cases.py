"""One-node models for the operator suite: each case is an op, its attributes and its inputs; the outputs'
types come from ONNX shape inference and the reference values from onnxruntime."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


@dataclass
class Input:
    shape: tuple[int, ...]
    dtype: Any = np.float32
    kind: str = "normal"  # normal, positive, int:<low>:<high>, bool
    const: np.ndarray | None = None  # an initializer instead of a graph input
    fixed: np.ndarray | None = None  # a graph input fed with these values (edge cases the device must compute)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        if self.fixed is not None:
            return self.fixed
        if self.kind == "positive":
            return (np.abs(rng.standard_normal(self.shape)) + 0.1).astype(self.dtype)
        if self.kind == "bool":
            return rng.random(self.shape) < 0.5
        if self.kind.startswith("int"):
            _, low, high = self.kind.split(":")
            return rng.integers(int(low), int(high), self.shape).astype(self.dtype)
        return rng.standard_normal(self.shape).astype(self.dtype)


def const(value: Any, dtype: Any = None) -> Input:
    array = np.asarray(value, dtype=dtype)
    return Input(array.shape, array.dtype, const=array)


def fixed(value: Any, dtype: Any = None) -> Input:
    array = np.asarray(value, dtype=dtype)
    return Input(array.shape, array.dtype, fixed=array)


@dataclass
class Case:
    op: str
    inputs: list[Input | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    outputs: int = 1
    opset: int = 20
    name: str = ""

    @property
    def id(self) -> str:
        return self.name or self.op

    def model(self) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        rng = np.random.default_rng(zlib.crc32(self.id.encode()))
        names, graph_inputs, inits, feeds = [], [], [], {}
        for i, spec in enumerate(self.inputs):
            if spec is None:
                names.append("")
                continue
            name = f"in{i}"
            names.append(name)
            if spec.const is not None:
                inits.append(numpy_helper.from_array(spec.const, name))
                continue
            value = spec.sample(rng)
            feeds[name] = value
            graph_inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))
        outs = [f"out{i}" for i in range(self.outputs)]
        node = helper.make_node(self.op, names, outs, name=f"{self.op}_node", **self.attrs)
        graph = helper.make_graph([node], self.id, graph_inputs, [helper.make_tensor_value_info(o, 0, None)
                                                                  for o in outs], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8 if self.opset < 19 else 9
        return onnx.shape_inference.infer_shapes(model), feeds


F, I64, I32 = np.float32, np.int64, np.int32
ODD = (3, 130, 7)  # 130 rows: more than one partition tile


def unary(op: str, kind: str = "normal", **attrs: Any) -> Case:
    suffix = "".join(f"_{v}" for v in attrs.values())
    return Case(op, [Input(ODD, kind=kind)], attrs, name=f"{op}{suffix}")


CASES: list[Case] = [
    *[unary(op) for op in ("Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Abs", "Neg", "Sign", "Sin", "Atan",
                           "Softplus", "Mish", "Softsign", "HardSwish", "Selu", "Elu", "Celu")],
    *[unary(op, "positive") for op in ("Sqrt", "Reciprocal", "Log")],
    unary("LeakyRelu", alpha=0.2), unary("HardSigmoid", alpha=0.3, beta=0.4), unary("ThresholdedRelu", alpha=0.5),
    unary("Shrink", lambd=0.7, bias=0.2), unary("Gelu"), unary("Gelu", approximate="tanh"),
    Case("Clip", [Input(ODD), const(-0.5, F), const(0.8, F)], name="Clip_both"),
    Case("Clip", [Input(ODD), None, const(0.3, F)], name="Clip_max_only"),
    *[Case(op, [Input((2, 3, 4, 5)), Input((5,))], name=f"{op}_broadcast") for op in ("Add", "Sub", "Mul", "Div")],
    Case("Add", [Input((2, 1, 4, 1)), Input((1, 3, 1, 5))], name="Add_both_broadcast"),
    Case("Mul", [Input((129, 300)), const(0.125, F)], name="Mul_immediate"),
    Case("Sub", [const(1.0, F), Input((7, 9))], name="Sub_immediate_left"),
    Case("Add", [Input((5, 6), I64, "int:-100:100"), Input((6,), I64, "int:-100:100")], name="Add_int64"),
    *[unary(op) for op in ("Cos", "Tan", "Floor", "Ceil")],
    *[Case(op, [fixed([-1.5, -1.0, -0.25, 0.0, 0.5, 2.0, 3e7 + 0.5, -3e7, -np.inf, np.inf, np.nan], F)],
           name=f"{op}_edges") for op in ("Floor", "Ceil")],
    Case("Mod", [Input((6, 40)), Input((40,), kind="positive")], {"fmod": 1}, name="Mod_fmod_float"),
    Case("Mod", [fixed([[-4.5, 4.5, -1.0, 1.0, 0.0, 3.0]] * 2, F),
                 fixed([[2.0] * 6, [-2.0, -2.0, np.inf, -np.inf, 3.0, 0.0]], F)],
         opset=28, name="Mod_float_divisor_sign"),  # fmod=0 on floats: from opset 28
    *[Case("Mod", [Input((6, 40), t, "int:-50:50"), Input((40,), t, f"int:{lo}:{hi}")], name=f"Mod_{t.__name__}{lo}")
      for t in (I64, I32) for lo, hi in ((1, 9), (-9, -1))],
    Case("Mod", [Input((6, 40), I32, "int:-50:50"), const(np.int32(-7))], {"fmod": 1}, name="Mod_fmod_int"),
    Case("Div", [Input((6, 40), I64, "int:-50:50"), Input((40,), I64, "int:1:9")], name="Div_int64"),
    Case("Div", [const(np.int32(-37)), Input((5, 9), I32, "int:-9:-1")], name="Div_int32_const_dividend"),
    Case("Pow", [Input((4, 33), kind="positive"), Input((4, 33))], name="Pow_tensor"),
    Case("Pow", [Input((4, 33)), const(2.0, F)], name="Pow_square"),
    Case("Pow", [Input((4, 33)), const(3.0, F)], name="Pow_cube"),
    Case("Max", [Input((3, 4)), Input((4,)), Input((3, 1))], name="Max_variadic"),
    Case("Min", [Input((3, 4)), Input((3, 4))]), Case("Sum", [Input((3, 4)), Input((1,)), Input((3, 4))]),
    Case("Mean", [Input((3, 4)), Input((3, 4))]),
    Case("PRelu", [Input(ODD), Input((130, 1))]),
    *[Case(op, [Input((6, 40)), Input((40,))], name=op) for op in
      ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual")],
    Case("Equal", [Input((6, 40), I64, "int:0:3"), Input((6, 40), I64, "int:0:3")], name="Equal_int"),
    *[Case(op, [Input((6, 40), np.bool_, "bool"), Input((40,), np.bool_, "bool")]) for op in ("And", "Or", "Xor")],
    Case("Not", [Input((6, 40), np.bool_, "bool")]),
    Case("IsNaN", [const(np.array([1.0, np.nan, np.inf, -np.inf], F))]),
    Case("IsInf", [const(np.array([1.0, np.nan, np.inf, -np.inf], F))], {"detect_negative": 0}),
    Case("Where", [Input((3, 1, 40), np.bool_, "bool"), Input((5, 40)), Input((3, 5, 1))]),
    Case("Cast", [Input((5, 7))], {"to": TensorProto.FLOAT16}, name="Cast_to_fp16"),
    Case("Cast", [Input((5, 7), I64, "int:-5:5")], {"to": TensorProto.FLOAT}, name="Cast_int_to_float"),
    Case("Cast", [Input((5, 7))], {"to": TensorProto.BOOL}, name="Cast_to_bool"),
    Case("Cast", [Input((5, 7), np.bool_, "bool")], {"to": TensorProto.INT64}, name="Cast_bool_to_int"),
    *[Case(op, [Input((2, 9, 130)), const(axes, I64)], {"keepdims": k}, name=f"{op}_{'_'.join(map(str, axes))}_{k}")
      for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                 "ReduceLogSumExp")
      for axes, k in (([2], 1), ([0, 2], 0))],
    Case("ReduceProd", [Input((4, 6), kind="positive"), const([1], I64)]),
    Case("ReduceLogSum", [Input((4, 6), kind="positive"), const([0], I64)], {"keepdims": 0}),
    Case("ReduceSum", [Input((3, 5000)), const([1], I64)], name="ReduceSum_long_rows"),
    Case("ReduceMax", [Input((2, 3, 4)), const(np.zeros(0, I64))], name="ReduceMax_all"),
    Case("ArgMax", [Input((9, 30))], {"axis": 1}), Case("ArgMin", [Input((9, 30))], {"axis": 0, "keepdims": 0}),
    Case("ArgMax", [const(np.array([[1, 3, 3, 0], [2, 2, 1, 2]], F))], {"axis": 1, "select_last_index": 1},
         name="ArgMax_last"),
    *[Case(op, [Input((2, 130, 33))], {"axis": a}, name=f"{op}_axis{a}") for op in ("Softmax", "LogSoftmax")
      for a in (-1, 1)],
    Case("Softmax", [Input((4, 3, 5))], {"axis": 1}, opset=11, name="Softmax_opset11"),
    Case("Softmax", [Input((3, 9000))], name="Softmax_long_rows"),
    Case("LogSoftmax", [Input((3, 9000))], name="LogSoftmax_long_rows"),
    Case("LayerNormalization", [Input((3, 9000)), Input((9000,)), Input((9000,))], outputs=3,
         name="LayerNorm_long_rows"),
    Case("RMSNormalization", [Input((2, 5000)), Input((5000,))], opset=23, name="RMSNorm_long_rows"),
    Case("Hardmax", [const(np.array([[1, 3, 3, 0], [2, 2, 1, 5]], F))]),
    Case("LayerNormalization", [Input((2, 130, 48)), Input((48,)), Input((48,))], {"epsilon": 1e-5}),
    Case("LayerNormalization", [Input((2, 5, 6)), Input((5, 6))], {"axis": 1}, outputs=3, name="LayerNorm_stats"),
    Case("InstanceNormalization", [Input((2, 3, 5, 4)), Input((3,)), Input((3,))]),
    Case("LpNormalization", [Input((4, 7))], {"axis": 1, "p": 1}),
    Case("MatMul", [Input((2, 1, 7, 130)), Input((3, 130, 9))], name="MatMul_batch_broadcast"),
    Case("MatMul", [Input((130,)), Input((4, 130, 6))], name="MatMul_vector_batch"),
    *[Case("Einsum", [Input(a), Input(b)], {"equation": eq}, name=f"Einsum_{name}") for name, eq, a, b in (
        ("matmul", "ij,jk->ik", (7, 130), (130, 9)), ("batch", "bij,bjk->bik", (3, 5, 6), (3, 6, 4)),
        ("heads", "bhqd,bhkd->bhqk", (2, 3, 5, 8), (2, 3, 7, 8)), ("outer", "i,j->ij", (5,), (6,)),
        ("inner", "i,i->", (40,), (40,)), ("ellipsis", "...ij,...jk->...ik", (2, 3, 4, 5), (1, 3, 5, 2)),
        ("summed_alone", "ijk,jl->li", (4, 5, 6), (5, 3)), ("batched_dot", "bi,bi->b", (6, 33), (1, 33)))],
    *[Case("Einsum", [Input((3, 4, 5))], {"equation": eq}, name=f"Einsum_{name}") for name, eq in (
        ("transpose", "ijk->kij"), ("sum", "ijk->j"), ("implicit", "kji"))],
    Case("Transpose", [Input((2, 3, 130))], {"perm": (2, 0, 1)}),
    Case("Slice", [Input((20, 10, 5)), const([1, 0], I64), const([1000, 10], I64), const([0, 1], I64),
                   const([3, 4], I64)]),
    Case("Slice", [Input((20, 10)), const([-3], I64), const([-1], I64), const([0], I64)], name="Slice_negative"),
    Case("Slice", [Input((20, 10, 5)), const([20, 10, 4], I64), const([0, 0, 1], I64), const([0, 1, 2], I64),
                   const([-1, -3, -2], I64)], name="Slice_negative_steps"),
    Case("Slice", [Input((6, 150)), const([-1], I64), const([-1000], I64), const([1], I64), const([-1], I64)],
         name="Slice_reverse_last_axis"),
    Case("Expand", [Input((3, 1)), const([2, 3, 6], I64)]),
    Case("Tile", [Input((2, 3)), const([3, 2], I64)]),
    Case("Squeeze", [Input((3, 1, 5)), const([1], I64)]), Case("Unsqueeze", [Input((3, 5)), const([0, 3], I64)]),
    Case("Trilu", [Input((2, 7, 5)), const(1, I64)], {"upper": 0}),
    Case("Gather", [Input((40, 6)), Input((3, 4), I64, "int:-40:40")], {"axis": 0}, name="Gather_embedding"),
    Case("Gather", [Input((3, 200, 5)), Input((150,), I64, "int:0:200")], {"axis": 1}, name="Gather_axis1"),
    Case("Gather", [Input((5, 6)), const([1, 2, 3], I64)], {"axis": 1}, name="Gather_const_slice"),
    Case("Gather", [Input((5, 6)), const([[4, 0], [2, 2]], I64)], {"axis": 0}, name="Gather_const"),
    Case("GatherElements", [Input((4, 5)), const(np.array([[0, 4], [1, 2], [3, 3], [2, 0]]), I64)], {"axis": 1}),
    Case("GatherElements", [Input((4, 5)), Input((4, 7), I64, "int:-5:5")], {"axis": 1},
         name="GatherElements_runtime"),
    Case("GatherElements", [Input((6, 130, 3)), Input((2, 140, 3), I32, "int:-130:130")], {"axis": 1},
         name="GatherElements_runtime_rows"),
    Case("GatherElements", [Input((3, 4)), Input((5, 4), I64, "int:0:3")], {"axis": 0},
         name="GatherElements_runtime_axis0"),
    Case("GatherND", [Input((3, 4, 5)), const(np.array([[0, 1], [2, 3]]), I64)]),
    Case("OneHot", [Input((4, 130), I64, "int:-7:7"), const(7, I64), const([0.0, 2.5], F)], name="OneHot_last"),
    Case("OneHot", [Input((3, 5), I64, "int:-4:4"), const([4.0], F), const([-1, 3], I32)], {"axis": 1},
         name="OneHot_axis1_int"),  # (onnxruntime implements a few type combinations only)
    Case("OneHot", [Input((2, 3), kind="int:-6:6"), const(6.0, F), const([1.0, 0.0], F)], {"axis": 0},
         name="OneHot_float_indices_axis0"),
    *[Case("CumSum", [Input((3, 130, 37)), const(a, I64)], {"exclusive": e, "reverse": r},
           name=f"CumSum_axis{a}_{e}{r}") for a, e, r in ((1, 0, 0), (-1, 1, 0), (2, 0, 1), (0, 1, 1))],
    Case("CumSum", [Input((2, 5000)), const(1, I32)], {"reverse": 1}, name="CumSum_long_reverse"),
    Case("CumSum", [Input((4, 9000)), const(1, I32)], {"exclusive": 1}, name="CumSum_long_exclusive"),
    Case("CumSum", [Input((7, 9), I64, "int:-1000:1000"), const(0, I64)], name="CumSum_int64"),
    Case("TopK", [Input((3, 130, 20)), const([5], I64)], {"axis": 2}, outputs=2, name="TopK_largest"),
    Case("TopK", [Input((6, 17)), const([4], I64)], {"axis": 0, "largest": 0}, outputs=2, name="TopK_smallest_axis0"),
    Case("TopK", [fixed([[1.0, 3.0, 3.0, -np.inf, 3.0, -np.inf], [2.0, 2.0, 2.0, 2.0, 1.0, 0.0]], F),
                  const([5], I64)], outputs=2, name="TopK_ties_and_infinities"),
    Case("TopK", [Input((4, 9), I64, "int:-3:3"), const([6], I64)], {"largest": 0}, outputs=2, name="TopK_int64"),
    # more than one round of max8 (k > 8): ties across rounds, -inf and +inf in the rows, a row shorter than 8
    Case("TopK", [fixed(np.where(np.arange(5 * 40).reshape(5, 40) % 11 == 3, -np.inf,
                                 np.arange(5 * 40).reshape(5, 40) * 7 % 6 - 2.5), F), const([20], I64)],
         outputs=2, name="TopK_k20_ties_and_infinities"),
    Case("TopK", [fixed(np.where(np.arange(3 * 30).reshape(3, 30) % 7 == 1, np.inf,
                                 np.arange(3 * 30).reshape(3, 30) * 5 % 4), F), const([13], I64)],
         {"largest": 0, "axis": 1}, outputs=2, name="TopK_k13_smallest"),
    Case("TopK", [Input((4, 5)), const([3], I64)], outputs=2, name="TopK_row_shorter_than_8"),
    *[Case("CumProd", [Input((3, 40, 9), kind="positive"), const(a, I64)], {"exclusive": e, "reverse": r},
           opset=26, name=f"CumProd_axis{a}_{e}{r}") for a, e, r in ((1, 0, 0), (1, 1, 1), (-1, 0, 1))],
    Case("Trilu", [Input((3, 6, 9)), const(-2, I64)], {"upper": 1}, name="Trilu_upper_below_diagonal"),
    Case("Trilu", [Input((2, 40, 37)), const(3, I64)], {"upper": 1}, name="Trilu_upper_40_rows"),
    Case("Trilu", [Input((150, 20)), const(-4, I64)], {"upper": 0}, name="Trilu_lower_150_rows"),
    # constant Gathers on chip: many indices into a few short rows (stream shuffle), along an inner axis
    # (local_gather, one or four elements per index)
    Case("Gather", [Input((20, 8)), const(np.arange(100) * 7 % 20, I64)], {"axis": 0}, name="Gather_shuffle"),
    Case("Gather", [Input((3, 400)), const(np.arange(99)[::-1] * 3 - 100, I64)], {"axis": 1},
         name="Gather_local"),
    Case("Gather", [Input((300, 30, 4)), const([[29, 0, 3], [3, 17, -1]], I64)], {"axis": 1},
         name="Gather_local_runs_of_4"),
    # reductions over leading axes, down the partitions
    Case("ReduceSum", [Input((4, 300)), const([0], I64)], name="ReduceSum_leading_axis"),
    Case("ReduceMean", [Input((2, 3, 200)), const([0, 1], I64)], {"keepdims": 0}, name="ReduceMean_leading_axes"),
    Case("ReduceMax", [Input((16, 130)), const([-2], I64)], name="ReduceMax_leading_axis"),
    Case("DepthToSpace", [Input((1, 8, 2, 3))], {"blocksize": 2, "mode": "CRD"}),
    Case("SpaceToDepth", [Input((1, 2, 4, 6))], {"blocksize": 2}),
    Case("Dropout", [Input((5, 6))], outputs=2),
    Case("LRN", [Input((2, 150, 5, 7))], {"size": 5, "alpha": 0.01, "beta": 0.75, "bias": 2.0}),
    Case("Identity", [Input((5, 6))]),
    Case("Flatten", [Input((2, 3, 4))], {"axis": 2}),
]
