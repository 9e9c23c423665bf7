"""Models that would cost the compiler minutes or crash it get one coded line at once (issue 9): a tensor larger
than the chip's HBM, a name that is not valid UTF-8, an opset newer than the compiler knows."""

from __future__ import annotations

import time

import onnx
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.cli import main


def _relu(path: str, shape: list[int], opset: int = 17, name: str = "relu") -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name=name)], "g", [x], [y])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()
    with open(path, "wb") as f:
        f.write(data.replace(b"@NM@", b"r\xff\xfeu"))  # protobuf refuses to write invalid UTF-8; same length


HUGE = ([10**6, 10**6], 17, "relu", "NCC_HBM_FULL",
        "tensor 'x' ([1000000, 1000000] float32) needs 4000000000000 bytes")
BAD_NAME = ([2, 3], 17, "@NM@", "NCC_ONNX_INVALID", r"the name of node #0 is not valid UTF-8: b'r\xff\xfeu'")
NEW_OPSET = ([2, 3], onnx.defs.onnx_opset_version() + 1, "relu", "NCC_UNSUPPORTED", "this compiler knows opsets up to")


# analyze lowers nothing, so a huge tensor costs it nothing: it only reports the ops
@pytest.mark.parametrize("command, case", [("compile", HUGE), ("compile", BAD_NAME), ("compile", NEW_OPSET),
                                           ("analyze", BAD_NAME), ("analyze", NEW_OPSET)])
def test_refused_at_once(tmp, capsys, command, case):
    shape, opset, name, code, says = case
    _relu(f"{tmp}/m.onnx", shape, opset, name)
    args = [command, f"{tmp}/m.onnx"] + (["-o", f"{tmp}/m.neff", "--no-cache"] if command == "compile" else [])
    start = time.perf_counter()
    assert main(args) == 1
    assert time.perf_counter() - start < 20
    err = capsys.readouterr().err
    assert err.startswith(f"neuronx-cc-lite: error: {code}: ") and says in err and err.count("\n") == 1, err


def test_data_propagation_is_skipped_for_long_vectors(monkeypatch):
    """onnx's data propagation holds each element of a 1-D tensor as a Python object (an Add of two 16M-element
    vectors: 12 s and GBs): a model with a long vector is inferred without it; shape arithmetic keeps it."""
    from neuronx_cc_lite import frontend

    calls: list[bool] = []
    real = onnx.shape_inference.infer_shapes

    def spy(model, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(bool(kwargs.get("data_prop")))
        return real(model, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", spy)
    for n, propagated in ((frontend.ELEMENTS_PROPAGATED + 1, False), (16, True)):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
        graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "g", [x], [y])
        calls.clear()
        frontend.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
        assert any(calls) == propagated, (n, calls)
