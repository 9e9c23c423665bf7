"""benchmarks/pe_floor.py, the floor under a batch-1 convolution network's latency that the README's account of
MobileNetV3 rests on: its arithmetic on a model small enough to count by hand."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from benchmarks.pe_floor import SE_STEPS, floor
from isa.target import get_target
from tests.conftest import make_model


def _squeeze_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((128, 1, 3, 3)).astype(np.float32),
               "w1": rng.standard_normal((32, 128, 1, 1)).astype(np.float32),
               "w2": rng.standard_normal((128, 32, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["d"], group=128, pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["d"], ["p"]),
             helper.make_node("Conv", ["p", "w1"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["e"]),
             helper.make_node("HardSigmoid", ["e"], ["g"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["d", "g"], ["y"])]
    return make_model(nodes, {"x": ([1, 128, 8, 8], TensorProto.FLOAT)}, {"y": ([1, 128, 8, 8], TensorProto.FLOAT)},
                      weights)


def test_the_floor_counts_a_depthwise_convolution_and_a_squeeze_as_written(tmp):
    """A 3x3 depthwise convolution over 128 channels at 8x8 (73,728 multiply-adds, 576 a partition) then a
    squeeze-and-excitation gate (a mean, two 1x1 convolutions, HardSigmoid, the Mul)."""
    path = os.path.join(tmp, "m.onnx")
    onnx.save(_squeeze_model(), path)
    target = get_target("trn1")
    f = floor(path, "trn1")
    assert f["depthwise_diagonal_us"] == pytest.approx(9 * 64 / target.pe_ghz / 1000)  # a tile, 9 taps, 64 columns
    # PE: 576 columns; VectorE: 9 taps of one tile, each one instruction over 64 elements (the accumulator in PSUM:
    # a cycle an element), small, so it pays the static overhead too; the two together as two servers
    pe = 576 / target.pe_ghz
    vector = 9 * (max(target.min_ii_cycles, 64 // target.dve_lanes) + target.access_start_cycles
                  + target.static_overhead_cycles) / target.dve_ghz
    assert f["depthwise_bf16_us"] == pytest.approx(1 / (1 / pe + 1 / vector) / 1000)
    # the squeeze (128 -> 32) and the excitation (32 -> 128) of one row: min(64 x output blocks, outputs) cycles
    assert f["other_us"] == pytest.approx((32 + 64) / target.pe_ghz / 1000)
    # the depthwise output's evacuation, then the mean, Relu, HardSigmoid and the gate's Mul
    assert f["squeezes"] == 1 and f["se_steps"] == SE_STEPS + 1
    assert f["se_chain_us"] == pytest.approx((SE_STEPS + 1) * f["step_ns"] / 1000)
    assert 0.1 < f["step_ns"] / 1000 < 0.5  # a dependent one-element instruction and a hand-off: ~0.2 us


def test_a_squeezes_steps_count_the_activations_around_it():
    """As MobileNetV3's blocks: the depthwise output through HardSwish (two steps), the gated projection (its
    evacuation), a residual Add, the next expansion through HardSwish (two): 4 + 2 + 1 + 2."""
    from benchmarks.pe_floor import _se_steps

    model = _squeeze_model()
    graph = model.graph
    rng = np.random.default_rng(1)
    graph.node[0].output[0] = "c"
    graph.node.insert(1, helper.make_node("HardSwish", ["c"], ["d"]))
    graph.node[-1].output[0] = "m"
    for name, shape in (("wp", (128, 128, 1, 1)), ("we", (256, 128, 1, 1))):
        graph.initializer.append(onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
    graph.node.extend([helper.make_node("Conv", ["m", "wp"], ["q"]), helper.make_node("Add", ["q", "x"], ["a"]),
                       helper.make_node("Conv", ["a", "we"], ["z"]), helper.make_node("HardSwish", ["z"], ["h"]),
                       helper.make_node("Add", ["a", "a"], ["y"])])  # (the residual sum read twice, as a block's)
    assert _se_steps(model) == [SE_STEPS + 2 + 1 + 2]
    graph.node[-2].op_type = "Relu"
    assert _se_steps(model) == [SE_STEPS + 2 + 1 + 1]


def test_the_dependency_chain_of_a_program_counted_by_hand():
    """A load, an activation on it and a store of the result, beside an activation on nothing they touch: the
    chain is the three in turn with their costs, the DMA latency of each transfer and two hand-offs; the
    instruction beside it adds nothing."""
    from isa.costs import dma_cost, duration_ns
    from isa.dtypes import DType
    from isa.functions import ActFunc
    from isa.operand import Engine
    from isa.tensor_kind import TensorKind
    from neuronx_cc_lite.codegen.schedule import dependency_chain_ns
    from neuronx_cc_lite.tile.program import HbmAccess, Program

    target = get_target("trn1")
    prog = Program(target)
    x, y = (prog.hbm_tensor(n, 128 * 256 * 4, kind, DType.fp32)
            for n, kind in (("x", TensorKind.INPUT), ("y", TensorKind.OUTPUT)))
    a, b, c = (prog.sbuf(128, 256, DType.fp32, n) for n in "abc")
    row = ((256, 1),)
    prog.emit("dma_copy", Engine.DMA, dst=a.ap(), src=HbmAccess(x, DType.fp32, 128, 256, 0, row))
    prog.emit("activation", Engine.ACT, dst=b.ap(), src=a.ap(), func=ActFunc.relu, scale=1.0)
    prog.emit("activation", Engine.ACT, dst=c.ap(), src=c.ap(), func=ActFunc.relu, scale=1.0)
    prog.emit("dma_copy", Engine.DMA, dst=HbmAccess(y, DType.fp32, 128, 256, 0, row), src=b.ap())
    load, act, _, store = (p.instruction(placed=False) for p in prog.instrs)
    expected = sum(dma_cost(t, target).engine_ns(target) + target.dma_latency_ns for t in (load, store)) + \
        duration_ns(act, Engine.ACT, target) + 2 * target.semaphore_handoff_ns
    assert dependency_chain_ns(prog) == pytest.approx(expected)


def test_no_run_beats_its_dependency_chain(tmp):
    """A small squeeze-and-excitation block compiled and run: the simulated latency is at least the chain."""
    from benchmarks.pe_floor import lowering_chain
    from neuronx_cc_lite.compiler import Options, compile_model
    from runtime.profile import timed_run

    path = os.path.join(tmp, "m.onnx")
    onnx.save(_squeeze_model(), path)
    chain = lowering_chain(path, "trn1")
    for cast, options in (("bf16", Options(auto_cast="matmult", auto_cast_type="bf16")), ("fp32", Options())):
        latency = timed_run(compile_model(path, options), get_target("trn1")).last_run.elapsed_ns / 1000
        assert 0.3 * latency < chain[cast] <= latency, (cast, chain[cast], latency)


def test_a_classifier_after_the_last_gate_and_the_dma_latencies_add_to_the_floor(tmp):
    """After the gate, a global mean, a Gemm through HardSwish and a Gemm to the output: the mean one dependent
    instruction, the HardSwish two, the last product's evacuation one (a DMA reads no PSUM); and the input's load
    and the output's store a DMA latency each."""
    from benchmarks.pe_floor import _tail_steps

    rng = np.random.default_rng(2)
    model = _squeeze_model()
    graph = model.graph
    graph.node[-1].output[0] = "m"
    for name, shape in (("g1", (128, 64)), ("g2", (64, 10))):
        graph.initializer.append(onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
    graph.node.extend([helper.make_node("GlobalAveragePool", ["m"], ["p2"]),
                       helper.make_node("Flatten", ["p2"], ["f"]),
                       helper.make_node("Gemm", ["f", "g1"], ["h"]), helper.make_node("HardSwish", ["h"], ["a"]),
                       helper.make_node("Gemm", ["a", "g2"], ["z"])])
    graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 10]))
    assert _tail_steps(model) == 1 + 2 + 1
    path = os.path.join(tmp, "m.onnx")
    onnx.save(model, path)
    f = floor(path, "trn1")
    assert f["tail_us"] == pytest.approx(4 * f["step_ns"] / 1000)
    assert f["io_us"] == pytest.approx(2 * get_target("trn1").dma_latency_ns / 1000)
    graph.node[-1].input[0] = "f"  # (the product reads the mean too: two readers, no single chain to count)
    assert _tail_steps(model) == 0


def test_a_depthwise_layer_with_rows_on_the_partitions_counted_by_hand():
    """88 channels, 3x3, stride 1, 28 x 28 outputs (MobileNetV3's third block): a channel's outputs read 30 input
    rows, so 4 channels' rows a tile (120 partitions, 112 output rows); 22 tiles x 3 kernel columns, each a matmul
    over a row's 28 outputs, at least 64 cycles: 4,224 cycles, where the diagonals take 9 x 784 = 7,056 and
    MACs / 128 is 4,851."""
    from benchmarks.pe_floor import _rows_cycles

    node = helper.make_node("Conv", ["x", "w"], ["y"], group=88, pads=[1, 1, 1, 1], strides=[1, 1])
    assert _rows_cycles(node, [88, 1, 3, 3], [1, 88, 28, 28], 128) == 22 * 3 * 64
    wide = helper.make_node("Conv", ["x", "w"], ["y"], group=8, pads=[1, 1, 1, 1], strides=[2, 2])
    assert _rows_cycles(wide, [8, 1, 3, 3], [1, 8, 100, 100], 128) == float("inf")  # 201 rows: none fit
    line = helper.make_node("Conv", ["x", "w"], ["y"], group=8, pads=[1, 1])
    assert _rows_cycles(line, [8, 1, 3], [1, 8, 50], 128) == float("inf")  # (a 1-D layer: not this arrangement)


def test_a_sigmoid_gate_counts_and_a_silus_sigmoid_does_not():
    """EfficientNet's squeeze-and-excitation gates are Sigmoids scaling the depthwise output; its SiLUs are x *
    Sigmoid(x), a Sigmoid scaling its own input: the former is a block, the latter an activation."""
    from benchmarks.pe_floor import _se_steps

    model = _squeeze_model()
    graph = model.graph
    gate = next(n for n in graph.node if n.op_type == "HardSigmoid")
    gate.op_type = "Sigmoid"
    del gate.attribute[:]
    assert _se_steps(model) == [SE_STEPS + 1]
    graph.node.extend([helper.make_node("Sigmoid", ["y"], ["sy"]), helper.make_node("Mul", ["y", "sy"], ["z"])])
    graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 128, 8, 8]))
    assert _se_steps(model) == [SE_STEPS + 1]  # (the SiLU's Sigmoid is not a gate)
