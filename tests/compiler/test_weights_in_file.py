"""The weights inside an ONNX file are left in it (neuronx_cc_lite/weights_in_file.py): the model is parsed without
them and each large one is a read-only view of a memory map of the file. The reference is onnx's own parse."""

from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import neuronx_cc_lite
from isa import bundle as bundle_format
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.frontend import import_file, read_model_mapping_weights
from neuronx_cc_lite.model_files import read_model
from neuronx_cc_lite.weights_in_file import WireError, split_weights


def mlp() -> onnx.ModelProto:
    """Two MatMuls with large weights in the file, a small bias, a bf16 weight, an int4 table (a packed type,
    never viewed) and a Constant node."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 48)).astype(np.float32), "w1")
    w2 = helper.make_tensor("w2", TensorProto.BFLOAT16, [48, 32],
                            rng.standard_normal((48, 32)).astype(ml_dtypes.bfloat16).tobytes(), raw=True)
    b = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")
    packed = helper.make_tensor("packed", TensorProto.INT4, [2048], rng.integers(-8, 8, 2048))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Cast", ["w2"], ["w2f"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["h", "w2f"], ["y0"]),
             helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32([0.5]))),
             helper.make_node("Mul", ["y0", "c"], ["y1"]),
             helper.make_node("Add", ["y1", "b"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], [w1, w2, b, packed])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    return path


def test_the_large_weights_are_views_of_the_file_and_the_rest_as_onnx_parses_it(saved):
    model, inside = read_model_mapping_weights(saved)
    assert sorted(inside) == ["w1", "w2"]  # b is small, packed's int4 bytes are not its array as it lies
    reference = onnx.load(saved)
    for init, ref in zip(model.graph.initializer, reference.graph.initializer):
        expected = numpy_helper.to_array(ref)
        if init.name in inside:
            value = inside[init.name]
            assert not value.flags.owndata and not value.flags.writeable  # a view of the map, not a copy
            assert not init.HasField("raw_data")
        else:
            value = numpy_helper.to_array(init)
        assert value.dtype == expected.dtype and np.array_equal(value, expected), init.name
        if init.name in inside:
            init.raw_data = ref.raw_data
    assert model == reference  # every other field as the parser reads it


def test_a_model_compiles_from_its_file_to_the_bundle_of_the_parsed_model(saved):
    from_file = bundle_format.to_bytes(neuronx_cc_lite.compile(str(saved), cache=False))
    from_proto = bundle_format.to_bytes(neuronx_cc_lite.compile(onnx.load(saved), cache=False))
    assert hashlib.sha256(from_file).digest() == hashlib.sha256(from_proto).digest()
    graph = import_file(saved)
    assert not graph.tensors["w1"].value.flags.owndata


def test_a_name_given_twice_keeps_its_bytes_in_the_message(tmp_path):
    model = mlp()
    model.graph.initializer.append(model.graph.initializer[0])
    onnx.save(model, tmp_path / "twice.onnx")
    parsed, inside = read_model_mapping_weights(tmp_path / "twice.onnx")
    assert "w1" not in inside and restored(parsed, inside) == onnx.load(tmp_path / "twice.onnx")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=4),
       truncate=st.booleans())
def test_damaged_bytes_read_as_the_plain_parse_reads_them(tmp_path, cuts, truncate):
    """Bytes changed here and there (or the file cut short at the first): the same model as read_model, or the
    same NCC_ONNX_LOAD; the walk never fails in any other way."""
    data = bytearray(mlp().SerializeToString())
    for where, byte in cuts:
        data[where % len(data)] = byte
    if truncate:
        del data[cuts[0][0] % len(data):]
    path = tmp_path / "damaged.onnx"
    path.write_bytes(bytes(data))
    try:
        expected = read_model(path)
    except CompileError as e:
        with pytest.raises(CompileError) as got:
            read_model_mapping_weights(path)
        assert got.value.code == e.code == "NCC_ONNX_LOAD"
        return
    assert restored(*read_model_mapping_weights(path)) == expected


def restored(model: onnx.ModelProto, inside: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The model with the weights left in its file put back as raw_data."""
    for init in model.graph.initializer:
        if init.name in inside:
            init.raw_data = inside[init.name].tobytes()
    return model


def test_the_walk_refuses_what_it_cannot_follow():
    with pytest.raises(WireError):
        split_weights(b"\x3a\xff\xff\xff")  # field 7, a length past the end
    with pytest.raises(WireError):
        split_weights(b"\x0b")  # a group's start
    assert split_weights(b"") == (b"", [])
