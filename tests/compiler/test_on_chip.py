"""Values kept on chip (codegen/on_chip.py): a graph output copied from a tensor that got an SBUF home reads the
home (the ONNX node tests that end in a Reshape of a result failed with "never placed" before)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.precision import error_bound
from neuronx_cc_lite.reference import error_over_rms, onnxruntime_outputs, seeded_inputs
from tests.conftest import assert_close, compile_to_model, make_model, run_both


def _matches_onnxruntime(model, tmp, options):  # type: ignore[no-untyped-def]
    """Under auto-cast within the documented bf16 bound of onnxruntime's output; compiled in fp32, to the last bits."""
    compiled = compile_to_model(model, tmp, options)
    inputs = seeded_inputs(compiled.inputs)
    assert error_over_rms(compiled.run(inputs)["y"], onnxruntime_outputs(model, inputs)["y"]) <= \
        error_bound("matmult", "bf16")
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-4)


@pytest.mark.parametrize("shape, to", [((2, 3), [6]), ((4, 8, 16), [32, 16]), ((1,), [])])
def test_a_reshaped_result_is_a_graph_output(tmp, shape, to):
    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                        helper.make_node("Reshape", ["r", "s"], ["y"], name="reshape")],
                       {"x": (list(shape), TensorProto.FLOAT)}, {"y": (to, TensorProto.FLOAT)},
                       {"s": np.array(to, dtype=np.int64)})
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=0)


def test_a_pooled_vector_reaches_the_classifier_on_chip(tmp):
    """A CNN's head: global average pool, Flatten, Gemm. The pool writes its result with the channels on
    partitions, which is K on partitions for the Gemm: the classifier reads it where it lies. (It used to be
    stored to HBM one element per partition and turned back on PE: 64 transfers of 64 bytes in a row at the end
    of ResNet-50, 35 us of its 448.)"""
    from isa.operand import Mem
    from neuronx_cc_lite.compiler import Options, compile_model

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((40, 512)) / 20).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    model = make_model([helper.make_node("ReduceMean", ["x"], ["p"], axes=[2, 3], keepdims=1),
                        helper.make_node("Flatten", ["p"], ["f"], axis=1),
                        helper.make_node("Gemm", ["f", "w", "b"], ["y"], transB=1)],
                       {"x": ([1, 512, 7, 7], TensorProto.FLOAT)}, {"y": ([1, 40], TensorProto.FLOAT)},
                       {"w": w, "b": b})
    for options in (None, Options(auto_cast="matmult")):
        bundle = compile_model(model, options)
        stored = [i for core in bundle.cores for s in core.values() for i, node in zip(s.instructions, s.nodes)
                  if node.startswith("ReduceMean") and i.op == "dma_copy" and i.args["dst"].mem is Mem.HBM]
        turned = [i for core in bundle.cores for s in core.values() for i in s.instructions if i.op == "nc_transpose"]
        assert not stored and not turned, (len(stored), len(turned))
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-4)


def _hard_swish_then_convs(residual: bool) -> object:
    """Conv -> HardSwish -> 1x1 Conv (-> + the HardSwish's output, read in fp32)."""
    rng = np.random.default_rng(5)
    weights = {"w1": rng.standard_normal((32, 32, 3, 3)).astype(np.float32) * 0.2,
               "w2": rng.standard_normal((32, 32, 1, 1)).astype(np.float32) * 0.2}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["h"]),
             helper.make_node("Conv", ["h", "w2"], ["y" if not residual else "p"])]
    if residual:
        nodes.append(helper.make_node("Add", ["p", "h"], ["y"]))
    return make_model(nodes, {"x": ([1, 32, 12, 12], TensorProto.FLOAT)}, {"y": ([1, 32, 12, 12], TensorProto.FLOAT)},
                      weights)


@pytest.mark.parametrize("residual", [False, True], ids=["matmul-only", "also-added"])
def test_a_home_read_only_by_matmuls_holds_their_type(tmp, residual):
    """Under auto-cast a tensor every reader loads in bf16 (a convolution's moving operand) lives in bf16: its
    producer writes bf16 and no copy converts it on each load, the same values (one rounding of the same fp32
    result); lowering holds it in bf16 already (layout.only_multiplied), so keep-on-chip has none to narrow. One
    also read in fp32 (a residual) keeps fp32, and its producer writes the convolution's bf16 copy itself, a second
    time (codegen/second_writes.py): no copy either."""
    from neuronx_cc_lite.compiler import Options, compile_model
    from neuronx_cc_lite.reference import onnxruntime_outputs, seeded_inputs
    from tests.compiler.one_node import bf16_operands
    from tests.conftest import compile_to_model

    options = Options(auto_cast="matmult", auto_cast_type="bf16")
    model = _hard_swish_then_convs(residual)
    bundle = compile_model(model, options)
    copies = [i for s in bundle.cores[0].values() for i in s.instructions if i.op == "tensor_copy"]
    narrowed = bundle.stats["narrowed_on_chip"]
    assert (narrowed, len(copies)) == (0, 0)
    _matches_onnxruntime(model, tmp, options)


def test_a_global_mean_is_one_scalar_engine_pass(tmp):
    """ReduceMean over a row that fits one tile: x / n with its row sums on ScalarE (activation's reduce), one
    instruction on a squeeze-and-excitation's dependent chain where a VectorE sum and a scaling were two."""
    from neuronx_cc_lite.compiler import compile_model

    model = make_model([helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=1)],
                       {"x": ([1, 48, 14, 14], TensorProto.FLOAT)}, {"y": ([1, 48, 1, 1], TensorProto.FLOAT)})
    engines = {name: [i.op for i in s.instructions] for name, s in compile_model(model).cores[0].items()}
    assert engines["ACT"] == ["activation"] and "DVE" not in engines
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-6)


@pytest.mark.parametrize("expanded", [96, 200])
def test_a_gate_over_more_channels_than_partitions_is_written_in_its_home(tmp, expanded):
    """Under auto-cast a squeeze-and-excitation gate over 200 channels is one [128, 2] tile on chip (its epilogue,
    HardSigmoid, reads one PSUM bank for both output tiles), a column for each 128 channels as its home lays them
    out too: the tile becomes that home (two stores, one place), and no copy runs between the gate and the
    projection it scales (two did, on the chain of every such block)."""
    from isa.operand import Mem
    from neuronx_cc_lite.compiler import Options, compile_model

    rng = np.random.default_rng(4)
    e = expanded
    weights = {"w": rng.standard_normal((e, 8, 1, 1)).astype(np.float32),
               "w2": rng.standard_normal((16, e, 1, 1)).astype(np.float32),
               "w3": (rng.standard_normal((e, 16, 1, 1)) * 3).astype(np.float32),
               "b3": rng.standard_normal(e).astype(np.float32),
               "w4": rng.standard_normal((8, e, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], name="expand"),
             helper.make_node("GlobalAveragePool", ["h"], ["p"], name="pool"),
             helper.make_node("Conv", ["p", "w2"], ["s"], name="squeeze"),
             helper.make_node("Relu", ["s"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w3", "b3"], ["c3"], name="gate"),
             helper.make_node("HardSigmoid", ["c3"], ["g"], alpha=1 / 6, beta=0.5, name="hard_sigmoid"),
             helper.make_node("Mul", ["h", "g"], ["m"], name="scale"),
             helper.make_node("Conv", ["m", "w4"], ["y"], name="project")]
    model = make_model(nodes, {"x": ([1, 8, 5, 6], TensorProto.FLOAT)}, {"y": ([1, 8, 5, 6], TensorProto.FLOAT)},
                       weights)
    options = Options(auto_cast="matmult", auto_cast_type="bf16")
    streams = compile_model(model, options).cores[0]
    on_chip = [i for s in streams.values() for i, node in zip(s.instructions, s.nodes) if node == "gate" and
               all(o.mem is not Mem.HBM for _, o in i.operands())]  # (its weights' loads read HBM)
    assert [i.op for i in on_chip if i.op in ("tensor_copy", "dma_copy")] == []
    _matches_onnxruntime(model, tmp, options)


def test_rows_of_one_channel_map_to_one_partition_of_its_home():
    """A transfer of a channel's image rows (a row each) from a home with a channel a partition reads that one
    partition, its rows as one run: what a depthwise convolution with its rows on the partitions fans out
    (lower/row_depthwise.py). Rows that step across channels map as before; a transposing read still does not."""
    from isa.dtypes import DType
    from isa.operand import Mem
    from isa.tensor_kind import TensorKind
    from neuronx_cc_lite.tile.homes import Layout, home_access
    from neuronx_cc_lite.tile.hbm import HbmTensor
    from neuronx_cc_lite.tile.program import HbmAccess, Tile

    c, h, w = 6, 5, 7
    tensor = HbmTensor("x", c * h * w * 4, TensorKind.SCRATCH, DType.fp32)
    layout = Layout(1, c, h * w)  # [C, H x W]: a channel a partition
    home = Tile(Mem.SBUF, c, h * w, DType.fp32, "x@home")
    rows = HbmAccess(tensor, DType.fp32, h, w, 2 * h * w, ((w, 1),))  # channel 2's rows, one a partition
    mapped = home_access(layout, rows, home, 128)
    assert (mapped.first, mapped.partitions, mapped.offset, mapped.dims) == (2, 1, 0, ((h * w, 1),))
    channels = HbmAccess(tensor, DType.fp32, 3, h * w, h * w, ((h * w, 1),))  # channels 1..3, whole
    assert (home_access(layout, channels, home, 128).first, home_access(layout, channels, home, 128).partitions) \
        == (1, 3)
    transposing = HbmAccess(tensor, DType.fp32, h * w, 1, 0, ((c, h * w),))  # a pixel a partition
    assert home_access(layout, transposing, home, 128) is None
