"""The cache rewrite's refusals (generate/kv_cache.py, generate/layout.py): each names what does not fit."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.generate.generator import Generator


def growing_decoder(position_ids: bool, extends_past: bool = True) -> onnx.ModelProto:
    """present = Concat(past, new) over a dynamic past axis (or, not extending it, Concat(new, new)); logits from
    the present keys' sum."""
    n = helper.make_node
    nodes = [n("Gather", ["embed", "input_ids"], ["e"]), n("Unsqueeze", ["e", "one"], ["k"]),
             *[n("Concat", [f"past_key_values.0.{kv}" if extends_past else "k", "k"], [f"present.0.{kv}"], axis=2)
               for kv in ("key", "value")],
             n("ReduceSum", ["present.0.key", "two"], ["s"], keepdims=0), n("MatMul", ["s", "out"], ["logits"])]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "t"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "total"]),
              *[helper.make_tensor_value_info(f"past_key_values.0.{kv}", TensorProto.FLOAT, [1, 1, "past", 4])
                for kv in ("key", "value")]]
    if position_ids:
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "t"]))
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "t", 8]),
               *[helper.make_tensor_value_info(f"present.0.{kv}", TensorProto.FLOAT, [1, 1, "total", 4])
                 for kv in ("key", "value")]]
    weights = {"embed": np.ones((8, 4), np.float32), "out": np.ones((4, 8), np.float32),
               "one": np.array([1], np.int64), "two": np.array([2], np.int64)}
    graph = helper.make_graph(nodes, "growing", inputs, outputs, [numpy_helper.from_array(v, k)
                                                                   for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _generate(tmp: str, model: onnx.ModelProto) -> None:
    path = os.path.join(tmp, "m.onnx")
    onnx.save(model, path)
    Generator(path, max_length=16, cache=False).generate([1, 2], 2)


def test_positions_from_the_past_length_are_refused(tmp):
    with pytest.raises(CompileError, match="takes no position_ids") as e:
        _generate(tmp, growing_decoder(position_ids=False))
    assert e.value.code == "NCC_GENERATE"


def test_a_present_that_is_not_the_past_extended_is_refused(tmp):
    with pytest.raises(CompileError, match="not a Concat of past_key_values.0.key") as e:
        _generate(tmp, growing_decoder(position_ids=True, extends_past=False))
    assert e.value.code == "NCC_GENERATE"
