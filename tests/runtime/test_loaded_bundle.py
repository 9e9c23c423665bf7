"""A loaded model keeps computing the bundle it loaded (issue 21): its weights are placed in HBM once, at load, so
rewriting the bundle file in place changes nothing and truncating it kills nothing (the weights were re-read from
the file's memory map at every run: the new file's weights, or SIGBUS)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import neuronx_cc_lite
import runtime
from isa import bundle as bundle_format
from runtime.errors import LoadError


def _weights(factor: float) -> np.ndarray:
    return (factor * (1 + np.arange(4 * 512) % 3)).astype(np.float32).reshape(4, 512)


def _scale(factor: float):  # type: ignore[no-untyped-def]
    graph = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 512])],
                              [numpy_helper.from_array(_weights(factor), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return neuronx_cc_lite.compile(model, cache=False)


X = {"x": np.ones((4, 512), np.float32)}


@pytest.mark.parametrize("change", ["rewritten in place", "truncated"])
def test_a_loaded_model_computes_the_bundle_it_loaded(tmp, change):
    path = os.path.join(tmp, "m.neff")
    bundle_format.write(_scale(2.0), path)
    model = runtime.load(path)
    assert (model.run(X)["y"] == _weights(2.0)).all()
    other = bundle_format.to_bytes(_scale(5.0))
    assert len(other) == os.path.getsize(path)
    with open(path, "r+b") as f:
        if change == "rewritten in place":
            f.write(other)
        else:
            f.truncate(bundle_format.HEADER_SIZE)
    for _ in range(2):
        assert (model.run(X)["y"] == _weights(2.0)).all()


def test_an_instruction_writing_into_the_weights_is_refused_at_load():
    """Weights are placed once: a (hand-made) program that writes over them would change what the next run
    reads, so it is refused at load."""
    b = _scale(2.0)
    segment = b.weights[0]
    stream, k = next((s, k) for s in b.cores[0].values() for k, i in enumerate(s.instructions)
                     if any(o.mem.name == "HBM" for o in i.writes()))
    instr = stream.instructions[k]
    name = next(n for n, v in instr.args.items() if any(v is o for o in instr.writes()))
    moved = dataclasses.replace(instr.args[name], offset=segment.hbm_offset)
    stream.instructions[k] = dataclasses.replace(instr, args={**instr.args, name: moved})
    with pytest.raises(LoadError, match="which holds weights"):
        runtime.load(b)
