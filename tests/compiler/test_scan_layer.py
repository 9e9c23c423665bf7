"""A gated running sum as torch exports it (benchmarks/exports.py's scan family, smaller): two projections of one
input, sigmoid(x W1 + b1) * (x W2 + b2), a CumSum along the sequence, an output projection. What makes it fast:
the gate multiplies the second projection as its bank is read (fuse-epilogues: a MatMulEpilogue with a gate), the
CumSum runs feature-major (the features on partitions, the sequence in the free axis: VectorE scans it, and the
projections on both sides read and write that layout with no transpose), and the input is turned on PE once for
both projections. Each against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import Options
from neuronx_cc_lite.frontend import import_model
from neuronx_cc_lite.passes import run_pipeline
from tests.compiler.one_node import check, rng_weights, streams
from neuronx_cc_lite.precision import error_bound
from neuronx_cc_lite.reference import error_over_rms
from tests.conftest import make_model, run_both

F = TensorProto.FLOAT


def scan_layer(steps: int = 300, width: int = 96, out: str = "y") -> onnx.ModelProto:
    weights = rng_weights(0, w1=(width, width), w2=(width, width), w3=(width, width), b1=(width,), b2=(width,),
                          b3=(width,))
    weights = {k: v / np.float32(np.sqrt(width)) if k.startswith("w") else v for k, v in weights.items()}
    weights["axis"] = np.array(1, np.int64)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["g0"]), helper.make_node("Add", ["g0", "b1"], ["g1"]),
             helper.make_node("Sigmoid", ["g1"], ["g"]),
             helper.make_node("MatMul", ["x", "w2"], ["p0"]), helper.make_node("Add", ["p0", "b2"], ["p"]),
             helper.make_node("Mul", ["g", "p"], ["h"]),
             helper.make_node("CumSum", ["h", "axis"], ["c"]),
             helper.make_node("MatMul", ["c", "w3"], ["y0"], name="out"), helper.make_node("Add", ["y0", "b3"], ["y"])]
    if out == "h":  # the gated values are the output: stored by rows
        nodes = nodes[:6]
    return make_model(nodes, {"x": ([1, steps, width], F)}, {out: ([1, steps, width], F)}, weights)


def test_the_gate_joins_the_projection_it_multiplies():
    g = run_pipeline(import_model(scan_layer()))
    gated = [n for n in g.nodes if n.op == "MatMulEpilogue" and len(n.inputs) > 4 and n.inputs[4]]
    assert [(n.inputs[1], n.inputs[4]) for n in gated] == [("w2", "g")]
    assert "Mul" not in {n.op for n in g.nodes}


@pytest.mark.parametrize("steps,width", [(300, 96), (1100, 40), (130, 200)])
def test_a_scan_layer_matches(tmp, steps, width):
    """Feature-major through the gate and the scan: a sequence of several scan chunks and matmul column blocks,
    features over one partition block and over two."""
    model = scan_layer(steps, width)
    ran = streams(model)
    assert "tensor_tensor_scan" in ran["DVE"]
    check(model, tmp, rtol=1e-4)


def test_a_gated_projection_stored_by_rows_matches(tmp):
    """The gated values as the graph's output: the projection stays by rows, the gate read by rows too."""
    model = scan_layer(200, 48, out="h")
    assert "scalar_tensor_tensor" in streams(model)["DVE"]
    check(model, tmp, rtol=1e-4)


def test_the_input_is_turned_once_for_both_projections():
    """Both projections read x by rows: its A^T tiles are made once (2 x 300 rows: 3 row blocks, 1 K tile each)
    and the output projection reads the scan's result as it is, feature-major: three transposes in all."""
    ran = streams(scan_layer(300, 96))
    assert ran["PE"].count("nc_transpose") == 3


def test_a_scan_layer_under_auto_cast_within_the_documented_bound(tmp):
    """bf16 matmuls: the scan still sums fp32 values (its result is rounded to bf16 once, for the matmul)."""
    ours, ref = run_both(scan_layer(260, 64), tmp, options=Options(auto_cast="matmult"))
    assert error_over_rms(ours["y"], ref["y"]) <= error_bound("matmult", "bf16")


def _trace(model, options: Options | None = None):  # type: ignore[no-untyped-def]
    """(bundle, [(engine stream, mnemonic, node, start ns, end ns)]) of a timed run on trn1."""
    from isa.target import get_target
    from neuronx_cc_lite.compiler import compile_model
    from runtime.profile import timed_run

    bundle = compile_model(model, options)
    run = timed_run(bundle, get_target("trn1"), trace=True)
    ops = {(s.core, s.name): s.ops for s in run.simulator.streams}
    return bundle, [(e.stream, ops[e.core, e.stream][e.index].mnemonic, bundle.cores[0][e.stream].nodes[e.index],
                     e.start, e.end) for e in run.last_run.trace]


def test_the_output_projection_starts_while_the_scan_goes_on():
    """The gate's blocks, the scan's chunks and the output projection's row blocks interleave (the schedule does
    not queue a node's work behind all of the node it reads from): the scan starts before VectorE has gated the
    last block, the first output matmul starts before the last scan ends, and the first result is stored before
    then too."""
    _, events = _trace(scan_layer(1024, 256), Options(auto_cast="matmult"))
    scans = [e for e in events if e[1] == "tensor_tensor_scan"]
    gates = [e for e in events if e[1] == "scalar_tensor_tensor"]
    assert min(e[3] for e in scans) < max(e[4] for e in gates)
    out = [e for e in events if e[1] == "nc_matmul" and e[2] == "out"]
    stores = [e for e in events if e[0].startswith("DMA") and e[2] == "out" and e[3] > min(e[3] for e in out)]
    assert len(scans) == 2 * 4 and out and stores
    last_scan = max(e[4] for e in scans)
    assert min(e[3] for e in out) < last_scan
    assert min(e[3] for e in stores) < last_scan


def test_scalar_e_loads_the_sigmoid_table_before_the_gate_needs_it():
    """preload-act-table: ScalarE's first instruction is a one-element sigmoid, done before the Tensor engine has
    anything to do (it waits for the input's first rows); the gate's own sigmoids then find the table loaded."""
    bundle, events = _trace(scan_layer(300, 96))
    act = sorted((e for e in events if e[0] == "ACT"), key=lambda e: e[3])
    first = bundle.cores[0]["ACT"].instructions[0]
    assert first.op == "activation" and first.args["func"].name == "sigmoid"
    assert first.args["dst"].num_partitions == 1 and first.args["dst"].free_size == 1
    assert act[0][4] <= min(e[3] for e in events if e[0] == "PE")
