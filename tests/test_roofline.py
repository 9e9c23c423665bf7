"""No model in models/ and no benchmark case runs faster than its roofline, and no run moves bytes across HBM
faster than the chip's HBM bandwidth: the cost model, the simulator and the roofline (runtime/profile.py) keep
to the chip's figures (isa/target.py), whatever the compiler emits."""

from __future__ import annotations

import glob
import os

import onnx
import pytest

from benchmarks.cases import CASES, Case
from isa.target import get_target
from neuronx_cc_lite.compiler import Options
from neuronx_cc_lite.reference import bundle_inputs
from runtime.profile import Summary, summarize
from tests.conftest import MODELS_DIR, compile_to_model

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
    memory_us = s.roofline_bytes / (target.core_dma_gbps * 1000)
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
