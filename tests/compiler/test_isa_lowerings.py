"""The lowerings that use nki.isa's selection, scan, select, shuffle, gather and partition-reduce instructions:
each picks its instruction where the chip model puts it ahead (the listing shows it), falls back where it does
not, and training-mode Dropout keeps its statistics. Their values against onnxruntime are op_cases' (test_ops)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import runtime
from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.errors import UnsupportedError
from tests.compiler.one_node import one_node, streams
from tests.compiler.op_cases import CASES
from tests.conftest import compile_to_model, make_model

BY_ID = {c.id: c for c in CASES}


def _uses(case_id: str) -> set[str]:
    return {m for ms in streams(BY_ID[case_id].model()[0]).values() for m in ms}


@pytest.mark.parametrize("case_id, engine_instrs", [
    ("TopK_k20_ties_and_infinities", {"max8", "nc_find_index8", "nc_match_replace8", "select_reduce"}),
    ("TopK_row_shorter_than_8", {"max8", "nc_find_index8"}),
    ("CumSum_long_exclusive", {"tensor_tensor_scan"}),  # a plain CumSum along rows runs on PE (cumsum_pe.py)
    ("CumProd_axis1_00", {"tensor_tensor_scan"}),
    ("Gather_shuffle", {"nc_stream_shuffle"}),
    ("Gather_local", {"local_gather"}),
    ("Gather_local_runs_of_4", {"local_gather"}),
    ("Trilu_upper_40_rows", {"affine_select"}),
    ("ReduceSum_leading_axis", {"tensor_partition_reduce"}),
    ("ReduceMean_leading_axes", {"tensor_partition_reduce"}),
    ("ReduceMax_leading_axis", {"tensor_partition_reduce"}),
])
def test_the_lowering_uses_its_instruction(case_id, engine_instrs):
    used = _uses(case_id)
    assert engine_instrs <= used, engine_instrs - used
    assert "dma_gather" not in used  # the on-chip gathers replace the indirect DMA


@pytest.mark.parametrize("case_id, instr", [
    ("Gather_const", "nc_stream_shuffle"),  # 4 indices: the indirect DMA is cheaper
    ("Trilu", "affine_select"),  # 7-row matrices: the mask keeps every partition busy
    ("ReduceSum_long_rows", "tensor_partition_reduce"),  # reduces the last axis
])
def test_small_cases_keep_the_cheaper_lowering(case_id, instr):
    assert instr not in _uses(case_id)


def _dropout(ratio: float, seed: int | None, shape: tuple[int, ...]):
    attrs = {} if seed is None else {"seed": seed}
    node = helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"], **attrs)
    return make_model([node], {"x": (list(shape), TensorProto.FLOAT)},
                      {"y": (list(shape), TensorProto.FLOAT), "mask": (list(shape), TensorProto.BOOL)},
                      {"ratio": np.array(ratio, np.float32), "training": np.array(True)}, opset=13)


def test_training_dropout_drops_at_the_ratio_and_scales_what_it_keeps(tmp):
    ratio, shape = 0.3, (200, 300)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    model = compile_to_model(_dropout(ratio, 7, shape), tmp)
    y, mask = (model.run({"x": x})[k] for k in ("y", "mask"))
    assert mask.dtype == np.bool_
    # 60,000 draws: the kept fraction within 5 standard deviations of 1 - ratio
    assert abs(mask.mean() - (1 - ratio)) < 5 * np.sqrt(ratio * (1 - ratio) / mask.size)
    np.testing.assert_allclose(y, np.where(mask, x / (1 - ratio), 0), rtol=1e-6)
    again = model.run({"x": x})
    np.testing.assert_array_equal(again["mask"], mask)  # the seed fixes the draws
    assert {"dropout"} <= {m for ms in streams(_dropout(ratio, 7, shape)).values() for m in ms}


def test_training_dropout_draws_follow_the_seed():
    x = np.ones((64, 64), np.float32)
    masks = [runtime.Model(compile_model(_dropout(0.5, seed, (64, 64)))).run({"x": x})["mask"] for seed in (1, 2)]
    assert (masks[0] != masks[1]).mean() > 0.3  # independent draws differ in about half the places


def test_training_dropout_with_ratio_one_is_refused():
    with pytest.raises(UnsupportedError, match=r"ratio 1.0 \(0 <= ratio < 1\)"):
        compile_model(_dropout(1.0, None, (4, 4)))


def test_trilu_on_int32_keeps_the_mask():
    model = one_node("Trilu", {"x": ([2, 40, 40], TensorProto.INT32)})
    assert "affine_select" not in {m for ms in streams(model).values() for m in ms}


def test_a_mean_over_tokens_read_through_a_transpose_reduces_down_the_partitions(tmp):
    """Swin's pooling: its [1, 49, 256] tokens transposed to [1, 256, 49], given an axis, then averaged over the
    last two: in memory the reduced tokens are the outer axis, so each token's row loads as it lies onto a
    partition and GpSimdE reduces down them, where moving the tokens to the end read a feature at a time (12,544
    pieces of 4 bytes). A mean over a [C, H, W] tensor's rows and columns keeps its channels on partitions."""
    from neuronx_cc_lite.compiler import Options
    from neuronx_cc_lite.reference import onnxruntime_outputs, seeded_inputs
    from runtime.profile import small_pieces_by_node
    from tests.conftest import assert_close

    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Unsqueeze", ["t", "axis"], ["u"]),
             helper.make_node("ReduceMean", ["u", "axes"], ["y"], keepdims=1)]
    model = make_model(nodes, {"x": ([1, 49, 256], TensorProto.FLOAT)}, {"y": ([1, 256, 1, 1], TensorProto.FLOAT)},
                       {"axis": np.array([2], np.int64), "axes": np.array([2, 3], np.int64)}, opset=18)
    bundle = compile_model(model, Options())
    assert "tensor_partition_reduce" in {m for ms in streams(model).values() for m in ms}
    assert sum(small_pieces_by_node(bundle).values()) == 0
    compiled = compile_to_model(model, tmp)
    inputs = seeded_inputs(compiled.inputs)
    assert_close(compiled.run(inputs), onnxruntime_outputs(model, inputs), rtol=1e-5)
    spatial = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)
    image = make_model([spatial], {"x": ([1, 256, 7, 7], TensorProto.FLOAT)},
                       {"y": ([1, 256, 1, 1], TensorProto.FLOAT)}, {"axes": np.array([2, 3], np.int64)}, opset=18)
    assert "tensor_partition_reduce" not in {m for ms in streams(image).values() for m in ms}
