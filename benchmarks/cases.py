"""The benchmark cases: models built in memory with seeded weights (nothing downloaded, nothing committed), plus
every model in models/. Each case is a model and the compile options it is measured with.

- gemm_2048_bf16: y = x @ W, x [2048, 2048] an input, W [2048, 2048] a weight, --auto-cast matmult (bf16).
- gemm_1024_fp32: the same at 1024, in fp32.
- add_4096: a + b, both [4096, 4096] fp32 inputs (memory-bound).
- bert12_fp32 / bert12_bf16: a BERT encoder, 12 layers, hidden 256, 4 heads, FFN 1024, seq 128, batch 1, the
  modern export form (LayerNormalization, Gelu), fp32 and --auto-cast matmult.
- resnet18_bf16: torchvision's ResNet-18 at 224x224, --auto-cast matmult.

`bert_base` (BERT-base: 12 layers, hidden 768, 12 heads, FFN 3072, seq 128, vocab 30522, 440 MB of weights) is
no case (simulating it takes minutes): benchmarks/compile_time.py times its compile.
"""

from __future__ import annotations

import glob
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")


def _model_builders():  # type: ignore[no-untyped-def]
    """The build scripts of models/ import their sibling `common`: they run with models/ on the path."""
    if MODELS not in sys.path:
        sys.path.insert(0, MODELS)
    import build_cnn
    import build_transformers

    return build_cnn, build_transformers


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], onnx.ModelProto]
    options: dict[str, object] = field(default_factory=dict)  # compile options (compiler.Options fields)
    large: bool = False  # minutes to simulate or to run the reference: left out of quick runs


def _one_node_model(name: str, op: str, inputs: dict[str, tuple[int, ...]], weights: dict[str, np.ndarray],
                    out_shape: tuple[int, ...]) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node(op, [*inputs, *weights], ["y"], name=f"/{op}")], name,
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def gemm(n: int, seed: int = 0) -> onnx.ModelProto:
    w = (np.random.default_rng(seed).standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    return _one_node_model(f"gemm_{n}", "MatMul", {"x": (n, n)}, {"W": w}, (n, n))


def add(n: int) -> onnx.ModelProto:
    return _one_node_model(f"add_{n}", "Add", {"a": (n, n), "b": (n, n)}, {}, (n, n))


def bert12() -> onnx.ModelProto:
    return bert_layers(12)


def bert_layers(layers: int, hidden: int = 256, seq: int = 128) -> onnx.ModelProto:
    """The benchmark's encoder with `layers` layers (1 for compile-time scaling): hidden 256, seq 128, heads of
    64, an FFN 4x as wide, unless told otherwise."""
    _, transformers = _model_builders()
    sizes = transformers.Sizes(batch=1, seq=seq, vocab=1000, max_pos=seq, hidden=hidden, heads=hidden // 64,
                               ffn=4 * hidden, layers=layers)
    return transformers.bert(legacy=False, sizes=sizes)


def bert_base(legacy: bool = False) -> onnx.ModelProto:
    """BERT-base as transformers configures bert-base-uncased, batch 1, seq 128 (the modern export form unless
    `legacy`)."""
    _, transformers = _model_builders()
    sizes = transformers.Sizes(batch=1, seq=128, vocab=30522, max_pos=512, hidden=768, heads=12, ffn=3072,
                               layers=12)
    return transformers.bert(legacy=legacy, sizes=sizes)


def chain(n: int) -> onnx.ModelProto:
    """A chain of `n` elementwise nodes (Neg and Relu in turn) over a [1, 64] tensor: compile time per node."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu" if k % 2 else "Neg", [f"t{k}"], [f"t{k + 1}"]) for k in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [1, 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def resnet18() -> onnx.ModelProto:
    cnn, _ = _model_builders()
    return cnn.resnet18()


BF16 = {"auto_cast": "matmult", "auto_cast_type": "bf16"}

CASES: list[Case] = [
    Case("gemm_2048_bf16", lambda: gemm(2048), BF16, large=True),
    Case("gemm_1024_fp32", lambda: gemm(1024)),
    Case("add_4096", lambda: add(4096), large=True),
    Case("bert12_fp32", bert12, large=True),
    Case("bert12_bf16", bert12, BF16, large=True),
    Case("resnet18_bf16", resnet18, BF16, large=True),
]


def model_cases() -> list[Case]:
    """Every model in models/, in fp32."""
    return [Case(os.path.splitext(os.path.basename(path))[0], lambda path=path: onnx.load(path))
            for path in sorted(glob.glob(os.path.join(MODELS, "*.onnx")))]
