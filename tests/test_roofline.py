"""No model in models/ and no benchmark case runs faster than its roofline, and no run moves bytes across HBM
faster than the chip's HBM bandwidth: the cost model, the simulator and the roofline (runtime/profile.py) keep
to the chip's figures (isa/target.py), whatever the compiler emits."""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.cases import CASES, Case
from isa.bundle import Bundle, HbmTensorInfo, Stream, TensorInfo
from isa.instructions import make
from isa.target import get_target
from isa.tensor_kind import TensorKind
import runtime
from runtime.profile import roofline
from neuronx_cc_lite.compiler import Options
from neuronx_cc_lite.reference import bundle_inputs
from runtime.profile import Summary, summarize, summary_text
from tests.conftest import MODELS_DIR, compile_to_model
from tests.runtime.helpers import hbm, sbuf

MODELS = sorted(glob.glob(os.path.join(MODELS_DIR, "*.onnx")))
CASTS = {"fp32": {}, "matmult": {"auto_cast": "matmult", "auto_cast_type": "bf16"}}


def profiled(proto: onnx.ModelProto, options: Options, tmp: str) -> Summary:
    model = compile_to_model(proto, tmp, options)
    model.run(bundle_inputs(model.bundle), trace=True)
    return summarize(model)


def assert_within_the_chip(s: Summary, options: Options) -> None:
    target = get_target(options.target)
    peak = target.pe_tflops(options.auto_cast_type if options.auto_cast != "none" else "fp32")
    assert s.peak_tflops == pytest.approx(peak)
    compute_us = s.model_flops / (peak * 1e6)
    # one pass through the DMA engines moves a byte read and a byte written (an HBM-to-HBM copy); HBM carries both
    read, written, copies = s.roofline_read_bytes, s.roofline_written_bytes, s.roofline_copy_bytes
    memory_us = max(max(read, written, read + written - copies) / target.core_dma_gbps,
                    (read + written) / target.hbm_gbps) / 1000
    assert s.roofline_us == pytest.approx(max(compute_us, memory_us))
    assert s.latency_us >= s.roofline_us, f"{s.latency_us} us, under the roofline of {s.roofline_us} us"
    assert s.dma_hbm_bytes / (s.latency_us * 1000) <= target.hbm_gbps
    assert s.hbm_peak_gbps <= target.hbm_gbps * (1 + 1e-9)


@pytest.mark.parametrize("cast", CASTS)
@pytest.mark.parametrize("path", MODELS, ids=os.path.basename)
def test_models_run_no_faster_than_their_roofline(tmp, path, cast):
    options = Options(**CASTS[cast])
    assert_within_the_chip(profiled(onnx.load(path), options, tmp), options)


def _case_param(case: Case):  # type: ignore[no-untyped-def]
    return pytest.param(case, id=case.name, marks=[pytest.mark.slow] if case.large else [])


@pytest.mark.parametrize("case", [_case_param(c) for c in CASES])
def test_benchmark_cases_run_no_faster_than_their_roofline(tmp, case):
    options = Options(**case.options)  # type: ignore[arg-type]
    s = profiled(case.build(), options, tmp)
    assert_within_the_chip(s, options)
    assert s.roofline_bytes > 0


# ---- no listing beats it: random DMA programs, HBM to HBM and through SBUF, on every queue and SP ------------

@st.composite
def _listings(draw: st.DrawFn) -> Bundle:
    """A program that writes every row of y [rows, cols] from x, a block of rows at a time: copied from HBM to
    HBM, or loaded into SBUF on one stream and stored from there on another (a semaphore between them); and some
    extra loads of x that nothing uses. Streams are drawn from the 16 queues and SP."""
    rows = draw(st.integers(1, 96))
    cols = draw(st.sampled_from([16, 64, 512, 2048]))
    streams = [f"DMA{q}" for q in range(16)] + ["SP"]
    x_at, y_at = 0, rows * cols * 4
    cuts = sorted(draw(st.sets(st.integers(1, rows - 1), max_size=min(15, rows - 1)))) if rows > 1 else []
    program: dict[str, list] = {}
    for k, (r0, r1) in enumerate(zip([0, *cuts], [*cuts, rows])):
        n = r1 - r0
        src, dst = hbm(x_at + r0 * cols * 4, n, cols), hbm(y_at + r0 * cols * 4, n, cols)
        if draw(st.booleans()):
            program.setdefault(draw(st.sampled_from(streams)), []).append(make("dma_copy", dst=dst, src=src))
        else:
            tile = sbuf(n, cols, 0)
            program.setdefault(draw(st.sampled_from(streams)), []).append(
                make("dma_copy", dst=tile, src=src, signal=k))
            program.setdefault(draw(st.sampled_from(streams)), []).append(
                make("dma_copy", dst=dst, src=tile, waits=((k, 1),)))
    for _ in range(draw(st.integers(0, 4))):
        n = draw(st.integers(1, rows))
        program.setdefault(draw(st.sampled_from(streams)), []).append(
            make("dma_copy", dst=sbuf(n, cols, 0), src=hbm(x_at, n, cols)))
    size = rows * cols * 4
    # a store into the SBUF tile of another block would race; every block's tile is the same rows, so order them:
    # the loads of the same stream run in order, and each store waits for its own load only (tiles may be
    # overwritten by a later load before an earlier store: the values do not matter here, only the time)
    return Bundle("trn1", 2 * size + 4096, [TensorInfo.whole("x", (rows, cols), "float32", "fp32", x_at)],
                  [TensorInfo.whole("y", (rows, cols), "float32", "fp32", y_at)],
                  [{name: Stream(instrs, [""] * len(instrs)) for name, instrs in program.items()}],
                  hbm_tensors=[HbmTensorInfo("x", TensorKind.INPUT, x_at, size),
                               HbmTensorInfo("y", TensorKind.OUTPUT, y_at, size)])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_listings())
def test_no_listing_beats_the_roofline(b):
    target = get_target(b.target)
    line = roofline(b, target)
    assert line.written_bytes == b.hbm_tensors[1].size
    assert line.memory_ns >= max(line.read_bytes, line.written_bytes) / target.core_dma_gbps
    model = runtime.load(b)
    model.run({"x": np.zeros(b.inputs[0].shape, np.float32)})
    assert model.last_run.elapsed_ns >= line.ns * (1 - 1e-9)


def test_a_copy_from_hbm_to_hbm_counts_each_byte_once_through_the_engines():
    """Concat-like: a [4096, 512] input copied to the output on all 16 queues. The engines move each byte once
    (read and written in one pass), so the roofline is the bytes over the core's DMA rate, not twice them; the
    run takes at least that."""
    rows, cols = 4096, 512
    size = rows * cols * 4
    block = rows // 16
    program = {f"DMA{q}": [make("dma_copy", dst=hbm(size + q * block * cols * 4, 128, block * cols // 128),
                                src=hbm(q * block * cols * 4, 128, block * cols // 128))] for q in range(16)}
    b = Bundle("trn1", 2 * size, [TensorInfo.whole("x", (rows, cols), "float32", "fp32", 0)],
               [TensorInfo.whole("y", (rows, cols), "float32", "fp32", size)],
               [{name: Stream(instrs, [""]) for name, instrs in program.items()}],
               hbm_tensors=[HbmTensorInfo("x", TensorKind.INPUT, 0, size),
                            HbmTensorInfo("y", TensorKind.OUTPUT, size, size)])
    target = get_target("trn1")
    line = roofline(b, target)
    assert line.memory_ns == pytest.approx(size / target.core_dma_gbps)
    model = runtime.load(b)
    model.run({"x": np.zeros((rows, cols), np.float32)})
    assert line.ns <= model.last_run.elapsed_ns <= 1.05 * line.ns + target.dma_latency_ns


def test_only_outputs_copied_from_inputs_may_skip_sbuf():
    """A Concat of two inputs is all copies (one pass each through the engines, HBM to HBM); an Add's output is
    computed, so its inputs are read into SBUF and its output written from it: R + W passes."""
    from onnx import TensorProto, helper

    from neuronx_cc_lite.compiler import compile_model
    from tests.conftest import make_model

    shape = [256, 512]
    both = {"a": (shape, TensorProto.FLOAT), "b": (shape, TensorProto.FLOAT)}
    concat = make_model([helper.make_node("Concat", ["a", "b"], ["y"], axis=0)], both,
                        {"y": ([512, 512], TensorProto.FLOAT)})
    add = make_model([helper.make_node("Add", ["a", "b"], ["y"])], both, {"y": (shape, TensorProto.FLOAT)})
    target = get_target("trn1")
    nbytes = 256 * 512 * 4
    c = roofline(compile_model(concat), target)
    assert (c.read_bytes, c.written_bytes, c.copy_bytes) == (2 * nbytes, 2 * nbytes, 2 * nbytes)
    assert c.memory_ns == pytest.approx(2 * nbytes / target.core_dma_gbps)
    a = roofline(compile_model(add), target)
    assert (a.read_bytes, a.written_bytes, a.copy_bytes) == (2 * nbytes, nbytes, 0)
    assert a.memory_ns == pytest.approx(3 * nbytes / target.core_dma_gbps)


def test_a_depthwise_weight_counts_its_data_not_its_zeros():
    """A depthwise convolution's weights are laid out as diagonal blocks, mostly zeros; the roofline needs only
    the model's own weights (it counted the blocks, 128 times as many bytes, and flattered MobileNet's ratio)."""
    from onnx import TensorProto, helper
    from neuronx_cc_lite.compiler import compile_model
    from tests.conftest import make_model

    c = 128
    w = np.random.default_rng(0).standard_normal((c, 1, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=c, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    model = make_model([node], {"x": ([1, c, 28, 28], TensorProto.FLOAT)}, {"y": ([1, c, 28, 28], TensorProto.FLOAT)},
                       {"w": w})
    bundle = compile_model(model)
    line = roofline(bundle, get_target("trn1"))
    activations = 2 * c * 28 * 28 * 4
    assert line.read_bytes <= c * 28 * 28 * 4 + w.nbytes
    assert line.min_bytes <= activations + w.nbytes


def test_a_sharded_bundle_is_judged_a_rank_at_a_time(tmp):
    """Its ranks run side by side, so the whole model's FLOPs at one core's peak bounds nothing: the roofline takes
    the busiest rank's (a quarter of the model's, or a little more) and one rank's bytes, and the run stays above
    it; the summary says it is a rank's."""
    proto = onnx.load(os.path.join(MODELS_DIR, "bert_modern.onnx"))
    options = Options(tp=4, auto_cast="matmult", auto_cast_type="bf16")
    model = compile_to_model(proto, tmp, options)
    model.run(bundle_inputs(model.bundle), trace=True)
    s = summarize(model)
    whole, ranks = model.bundle.stats["model_flops"], model.bundle.stats["rank_flops"]
    assert s.model_flops == max(ranks) < 0.3 * whole and s.ranks == 4
    assert s.roofline_compute_us == pytest.approx(max(ranks) / (s.peak_tflops * 1e6))
    assert s.latency_us >= s.roofline_us
    one = profiled(proto, Options(auto_cast="matmult", auto_cast_type="bf16"), tmp)
    assert one.roofline_read_bytes > s.roofline_read_bytes  # a rank reads a share of the weights
    assert "bound a rank" in summary_text(s) and "a rank" not in summary_text(one).split("\n")[2]
