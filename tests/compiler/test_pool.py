"""MaxPool, AveragePool, GlobalMaxPool and GlobalAveragePool against onnxruntime: kernels, strides, pads and
auto_pad, dilations, ceil_mode, count_include_pad, 1-D / 2-D / 3-D, channels past one tile, large images."""

from __future__ import annotations

import pytest
from onnx import TensorProto

from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.errors import UnsupportedError
from tests.compiler.one_node import F32, check, one_node, streams


def pool(op: str, shape: list[int], dtype: int = F32, **attrs: object):
    return one_node(op, {"x": (shape, dtype)}, opset=19, **attrs)


MAX = {
    "3x3": ([2, 3, 7, 9], dict(kernel_shape=[3, 3])),
    "ceil-130-channels": ([1, 130, 7, 9], dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1],
                                               ceil_mode=1)),
    "dilations": ([1, 3, 12, 11], dict(kernel_shape=[2, 3], dilations=[2, 2], strides=[1, 2])),
    "same-upper": ([1, 3, 12, 11], dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2])),
    "same-lower": ([2, 3, 7, 9], dict(kernel_shape=[2, 2], auto_pad="SAME_LOWER")),
    "1d": ([2, 3, 20], dict(kernel_shape=[4], strides=[3], pads=[1, 2])),
    "3d": ([1, 2, 5, 6, 7], dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[1, 1, 0, 0, 1, 1])),
    "many-blocks": ([1, 2, 100, 90], dict(kernel_shape=[3, 3])),
    # blocks side by side on the partitions (fewer rows than half of them): a stem pool, padded at both ends
    "stacked-stem": ([1, 32, 66, 300], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
}

AVERAGE = {
    "3x3": ([2, 3, 7, 9], dict(kernel_shape=[3, 3])),
    "pads-exclude": ([1, 3, 7, 9], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    "pads-include": ([1, 3, 7, 9], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)),
    "ceil-exclude": ([1, 130, 7, 9], dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1)),
    "ceil-include": ([1, 130, 7, 9], dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1,
                                          count_include_pad=1)),
    "dilations": ([1, 3, 12, 11], dict(kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 1, 1, 1])),
    "dilations-ceil-include": ([1, 3, 12, 11], dict(kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 1, 1, 1],
                                                    strides=[2, 2], ceil_mode=1, count_include_pad=1)),
    "same-lower": ([1, 3, 12, 11], dict(kernel_shape=[3, 3], auto_pad="SAME_LOWER", strides=[2, 2])),
    "stacked-include": ([1, 40, 64, 140], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)),
    "1d": ([2, 3, 20], dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    "3d": ([1, 2, 5, 6, 7], dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[1, 1, 0, 0, 1, 1])),
}


@pytest.mark.parametrize("shape, attrs", MAX.values(), ids=MAX.keys())
def test_max_pool(tmp, shape, attrs):
    check(pool("MaxPool", shape, **attrs), tmp)


def test_max_pool_of_bytes(tmp):
    check(pool("MaxPool", [1, 3, 7, 9], TensorProto.UINT8, kernel_shape=[2, 2], strides=[2, 2]), tmp)


@pytest.mark.parametrize("shape, attrs", AVERAGE.values(), ids=AVERAGE.keys())
def test_average_pool(tmp, shape, attrs):
    check(pool("AveragePool", shape, **attrs), tmp)


@pytest.mark.parametrize("op", ["GlobalMaxPool", "GlobalAveragePool"])
@pytest.mark.parametrize("shape", [[2, 3, 7, 9], [2, 130, 9], [1, 3, 100, 90]], ids=str)
def test_global_pool(tmp, op, shape):
    check(pool(op, shape), tmp)


def test_few_channels_share_the_partitions_between_blocks():
    """32 channels, 32 x 150 outputs over rows of 1,200 bytes: four blocks of rows side by side on 128 partitions,
    so each reduction pass covers them all (a quarter of the passes of one block at a time)."""
    bundle = compile_model(pool("MaxPool", [1, 32, 64, 300], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    reduces = [i for core in bundle.cores for s in core.values() for i in s.instructions if i.op == "tensor_reduce"]
    assert reduces and all(i.args["dst"].num_partitions == 128 for i in reduces)


def test_pooling_runs_on_the_vector_engine():
    """Window reductions on DVE, the -inf padding memset wherever the scheduler has room; no matmul."""
    engines = streams(pool("MaxPool", [1, 3, 7, 9], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    reductions = [op for op in engines["DVE"] if op != "memset"]
    assert reductions == ["tensor_reduce"] * 2  # one per spatial axis
    assert {op for e in ("DVE", "POOL") for op in engines.get(e, [])} == {"memset", "tensor_reduce"}
    assert "PE" not in engines
    averaged = streams(pool("AveragePool", [1, 3, 7, 9], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    assert [op for op in averaged["DVE"] if op != "memset"] == ["tensor_reduce", "tensor_reduce",
                                                                "tensor_tensor"]  # sums, then / tap counts


def test_max_pool_indices_are_refused():
    model = one_node("MaxPool", {"x": ([1, 1, 4, 4], F32)}, outputs=("y", "i"), kernel_shape=[2, 2])
    model.graph.output[1].type.tensor_type.elem_type = TensorProto.INT64
    with pytest.raises(UnsupportedError, match="the Indices output of MaxPool is not supported"):
        compile_model(model)


@pytest.mark.parametrize("op, shape, attrs", [
    # transformers' EfficientNet: AvgPool2d(1280, ceil_mode=True) over its last [7, 7] features
    ("AveragePool", [1, 8, 7, 7], dict(kernel_shape=[1280, 1280], strides=[1280, 1280], ceil_mode=1,
                                       count_include_pad=1)),
    ("AveragePool", [1, 130, 2, 3], dict(kernel_shape=[5, 5], strides=[5, 5], ceil_mode=1)),
    ("MaxPool", [2, 3, 4, 6], dict(kernel_shape=[4, 6])),
    ("MaxPool", [1, 3, 9], dict(kernel_shape=[16], ceil_mode=1, strides=[16])),
], ids=["efficientnet-pooler", "ceil-past-the-end", "window-is-the-input", "1d-ceil"])
def test_a_pool_whose_one_window_covers_the_input_is_a_global_pool(tmp, op, shape, attrs):
    """canonicalize makes it GlobalAveragePool or GlobalMaxPool (the window past the input counts only the input,
    as onnxruntime's): it was refused, the window being larger than the input."""
    from neuronx_cc_lite.compiler import Options, prepare

    model = pool(op, shape, **attrs)
    assert [n.op for n in prepare(model, Options(), None).nodes] == [f"Global{op}"]
    check(model, tmp)


def test_a_padded_pool_over_the_input_stays_a_pool(tmp):
    """With padding counted, a window over the whole input divides by more than the input's size: not global."""
    from neuronx_cc_lite.compiler import Options, prepare

    model = pool("AveragePool", [1, 4, 3, 3], kernel_shape=[5, 5], pads=[1, 1, 1, 1], count_include_pad=1)
    assert [n.op for n in prepare(model, Options(), None).nodes] == ["AveragePool"]
    check(model, tmp)
