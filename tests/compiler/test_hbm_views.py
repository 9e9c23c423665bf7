"""HbmView.reshape of a strided view (tile/hbm.py `reshaped_strides`): a view where numpy's reshape would give
one, reading the same elements in the same order; None where numpy must copy."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from isa.dtypes import DType
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.tile import hbm as hbm_module
from neuronx_cc_lite.tile.hbm import HbmTensor, HbmView, reshaped_strides


def numpy_view_reshape(view: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """numpy's reshape without a copy, or None when it needs one."""
    out = view.view()
    try:
        out.shape = shape
    except AttributeError:  # "incompatible shape for in-place modification": numpy would copy
        return None
    return out


@st.composite
def views_and_shapes(draw):  # type: ignore[no-untyped-def]
    """A transposed, broadcast or sliced view of a small array, and a new shape of its size."""
    base = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=4)))
    a = np.arange(int(np.prod(base)), dtype=np.int64).reshape(base)
    view = a.transpose(draw(st.permutations(range(len(base)))))
    if draw(st.booleans()):  # a head broadcast to the query heads it serves: an axis of stride 0
        view = np.broadcast_to(view[:, None], (view.shape[0], draw(st.sampled_from([2, 4])), *view.shape[1:]))
    if draw(st.booleans()) and view.shape[-1] > 1:
        view = view[..., 1:]
    factors, n = [], view.size
    for p in (2, 2, 3, 2, 3):
        if n % p == 0 and draw(st.booleans()):
            factors.append(p)
            n //= p
    factors.append(n)
    shape = tuple(draw(st.permutations(factors)))
    if draw(st.booleans()):
        shape = shape[:1] + (1,) + shape[1:]
    return a, view, shape


@settings(max_examples=150, deadline=None)
@given(views_and_shapes())
def test_reshape_of_a_strided_view_reads_what_numpy_reads(case):  # type: ignore[no-untyped-def]
    a, view, shape = case
    item = a.itemsize
    strides = tuple(s // item for s in view.strides)
    offset = (view.__array_interface__["data"][0] - a.__array_interface__["data"][0]) // item
    hbm = HbmView(HbmTensor("t", a.nbytes, TensorKind.INPUT, DType.int32), DType.int32, view.shape, strides, offset)
    with mock.patch.object(hbm_module, "MIN_VIEW_RUN_BYTES", 0):  # these views' rows are a few bytes long
        got = hbm.reshape(shape)
    expected = numpy_view_reshape(view, shape)
    if got is None:  # a copy: only where numpy needs one too
        assert expected is None
        return
    assert got.shape == shape
    index = np.indices(shape).reshape(len(shape), -1) if shape else np.zeros((0, 1), np.int64)
    read = a.ravel()[got.offset + (np.asarray(got.strides)[:, None] * index).sum(axis=0)]
    np.testing.assert_array_equal(read, view.ravel())


def test_a_key_value_head_broadcast_to_its_query_heads_reshapes_in_place():
    """GQA's Expand + Reshape of the cache [1, 1, 1, T, d] -> [1, 1, 4, T, d] -> [1, 4, T, d]: no copy."""
    assert reshaped_strides((1, 1, 4, 256, 128), (0, 0, 0, 128, 1), (1, 4, 256, 128)) == (1, 0, 128, 1)
    assert reshaped_strides((2, 4, 8), (8, 0, 1), (8, 8)) is None  # two heads' rows cannot merge with stride 0


def test_a_view_of_short_rows_is_copied_once_instead():
    """A strided view whose contiguous runs are under 512 bytes is not reshaped in place: every reader would read
    it a few bytes a DMA piece (a GRU's gates sliced across time steps)."""
    t = HbmTensor("t", 4 * 64 * 256, TensorKind.SCRATCH, DType.fp32)
    short = HbmView(t, DType.fp32, (64, 16), (48, 1))  # 64-byte rows
    assert short.reshape((4, 16, 16)) is None
    long = HbmView(t, DType.fp32, (64, 128), (256, 1))  # 512-byte rows
    assert long.reshape((8, 8, 128)) is not None
