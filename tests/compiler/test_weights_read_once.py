"""An initializer's raw_data is taken from the ONNX message once (each access copies it) and the weight's array views
those bytes (neuronx_cc_lite/frontend.py `_raw_bytes`, `_weight`): the same array numpy_helper.to_array gives."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from neuronx_cc_lite.declared import no_data
from neuronx_cc_lite.frontend import _raw_bytes, _weight

TYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.uint8, np.int16, np.uint16, np.int32,
         np.uint32, np.int64, np.uint64, np.bool_]


@pytest.mark.parametrize("dtype", TYPES, ids=lambda t: np.dtype(t).name)
def test_a_weight_views_the_bytes_taken_once_and_equals_to_array(dtype):
    rng = np.random.default_rng(0)
    value = (rng.standard_normal((3, 5)) * 50).astype(dtype)
    init = numpy_helper.from_array(value, "w")
    assert init.HasField("raw_data")
    raw = _raw_bytes(init)
    array = _weight(init, raw)
    expected = numpy_helper.to_array(init)
    assert array.dtype == expected.dtype and array.shape == expected.shape
    assert np.array_equal(array.view(np.uint8), expected.view(np.uint8))
    owner = array
    while isinstance(owner, np.ndarray):
        owner = owner.base
    assert owner is raw  # the array views the bytes taken once: no second copy
    assert not no_data(init, raw)


def test_declared_and_empty_initializers_keep_their_meaning():
    """No raw_data at all, or an empty one, over elements: declared (its shape and type, no data)."""
    declared = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4])
    empty = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4], raw_data=b"")
    assert not declared.HasField("raw_data") and empty.HasField("raw_data")
    for init in (declared, empty):
        assert no_data(init, _raw_bytes(init)) and no_data(init)
