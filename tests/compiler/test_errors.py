"""Bad input gets a coded one-line error naming the node or tensor, never a traceback."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import Options, compile_model
from neuronx_cc_lite.errors import CompileError, UnsupportedError
from tests.conftest import assert_close, make_model, run_both


def test_every_unsupported_node_is_named_grouped_by_operator():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["r"], name="ok_relu"),
         helper.make_node("Det", ["r"], ["a"], name="first_bad"),
         helper.make_node("Det", ["x"], ["b"], name="second_bad"),
         helper.make_node("MaxUnpool", ["x", "i"], ["c"], name="third_bad", kernel_shape=[2], strides=[2])],
        {"x": ([4, 3, 3], TensorProto.FLOAT), "i": ([4, 3, 3], TensorProto.INT64)},
        {"a": ([4], TensorProto.FLOAT), "b": ([4], TensorProto.FLOAT), "c": ([4, 3, 6], TensorProto.FLOAT)})
    with pytest.raises(UnsupportedError) as e:
        compile_model(model)
    assert [n for n, _, _ in e.value.nodes] == ["first_bad", "second_bad", "third_bad"]
    assert str(e.value) == (
        "NCC_UNSUPPORTED: 3 node(s) of 2 operator(s) the chip cannot run: Det x2 ('first_bad', 'second_bad'): "
        "operator Det is not supported | MaxUnpool x1 ('third_bad'): operator MaxUnpool is not supported; "
        "--fallback host runs them on the CPU")


def test_integer_arithmetic_is_refused_with_the_reason():
    model = make_model([helper.make_node("Div", ["a", "b"], ["y"], name="idiv")],
                       {"a": ([4], TensorProto.UINT32), "b": ([4], TensorProto.UINT32)},
                       {"y": ([4], TensorProto.UINT32)})
    with pytest.raises(UnsupportedError, match="'idiv' \\(Div\\): Div on uint32 is not supported"):
        compile_model(model)


def test_malformed_file(tmp):
    path = f"{tmp}/junk.onnx"
    with open(path, "wb") as f:
        f.write(b"\x08\x07this is not a protobuf\xff\xff\xff")
    with pytest.raises(CompileError, match="NCC_ONNX_LOAD"):
        compile_model(path)
    with pytest.raises(CompileError, match="NCC_ONNX_LOAD: no such file"):
        compile_model(f"{tmp}/missing.onnx")


def test_checker_failure_is_reported():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ([2], TensorProto.FLOAT)},
                       {"y": ([2], TensorProto.FLOAT)})
    model.graph.node[0].input.append("nowhere")
    with pytest.raises(CompileError, match="NCC_ONNX_INVALID|NCC_SHAPE_INFERENCE"):
        compile_model(model)


def test_dynamic_input_needs_a_pinned_shape(tmp):
    w = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": (["batch", 5], TensorProto.FLOAT)},
                       {"y": (["batch", 3], TensorProto.FLOAT)}, {"w": w})
    with pytest.raises(CompileError, match="NCC_SHAPE_DYNAMIC: input 'x'.*--input-shape x="):
        compile_model(model)
    ours, ref = run_both(model, tmp, options=Options(input_shapes={"x": (4, 5)}))
    assert ours["y"].shape == (4, 3)
    assert_close(ours, ref, rtol=1e-5)


def test_unknown_target():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ([2], TensorProto.FLOAT)},
                       {"y": ([2], TensorProto.FLOAT)})
    with pytest.raises(CompileError, match="NCC_TARGET: unknown target 'trn7'"):
        compile_model(model, Options(target="trn7"))


@pytest.mark.parametrize("elements", [16, 4096])  # checked by the ONNX checker; read apart from it (frontend.py)
def test_an_initializer_whose_payload_does_not_match_its_dims_is_named(elements):
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"], name="add")],
                       {"x": ([elements], TensorProto.FLOAT)}, {"y": ([elements], TensorProto.FLOAT)})
    weight = model.graph.initializer.add()
    weight.name, weight.data_type, weight.raw_data = "w", TensorProto.FLOAT, b"\0\0\0\0"  # 4 bytes, not 4 * elements
    weight.dims.append(elements)
    with pytest.raises(CompileError) as e:
        compile_model(model)
    assert e.value.code in ("NCC_ONNX_INVALID", "NCC_SHAPE_INFERENCE") and "\n" not in str(e.value)
    if elements > 1024:
        assert "'w'" in str(e.value)
