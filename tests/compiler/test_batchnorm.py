"""BatchNormalization lowered on its own (not after a Conv or Gemm) against onnxruntime: constant statistics
folded to a per-channel scale and shift at compile time, or statistics given at run time."""

from __future__ import annotations

import numpy as np
import pytest

from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.errors import UnsupportedError
from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.compiler.one_node import F32, check, one_node, streams
from tests.conftest import assert_close, compile_to_model

STATS = ("scale", "bias", "mean", "var")


def statistics(c: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = {k: rng.standard_normal(c).astype(np.float32) for k in STATS}
    values["var"] = rng.random(c).astype(np.float32) + 0.25
    return values


def batchnorm(shape: list[int], runtime: bool = False, **attrs: object):
    if runtime:
        inputs = {"x": (shape, F32), **{k: ([shape[1]], F32) for k in STATS}}
        return one_node("BatchNormalization", inputs, **attrs)
    return one_node("BatchNormalization", {"x": (shape, F32)}, statistics(shape[1]), **attrs)


SHAPES = [[2, 3, 7, 9], [2, 130, 5], [4, 130], [1, 3, 100, 90], [2, 2, 3, 4, 5]]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_batchnorm_with_constant_statistics(tmp, shape):
    check(batchnorm(shape, epsilon=1e-3), tmp)


@pytest.mark.parametrize("shape", SHAPES[:3], ids=str)
def test_batchnorm_with_runtime_statistics(tmp, shape):
    model = batchnorm(shape, runtime=True)
    compiled = compile_to_model(model, tmp)
    feeds = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32), **statistics(shape[1])}
    assert_close(compiled.run(feeds), onnxruntime_outputs(model, feeds), rtol=1e-4)


def test_batchnorm_engines():
    """A multiply-add per tile (on whichever engine the scheduler gives it); run-time statistics take their
    reciprocal square root on ACT (after the one-element activation that loads its table: preload-act-table)."""
    engines = streams(batchnorm([2, 3, 7, 9]))
    compute = {op for name, ops in engines.items() if name != "DMA" for op in ops}
    assert compute == {"tensor_scalar"} and "PE" not in engines
    runtime_stats = streams(batchnorm([2, 3, 7, 9], runtime=True))
    assert [op for op in runtime_stats["ACT"] if op == "activation"] == ["activation", "activation"]


def test_training_mode_is_refused():
    model = one_node("BatchNormalization", {"x": ([2, 3, 4, 4], F32)}, statistics(3),
                     outputs=("y", "running_mean", "running_var"), ranks=(4, 1, 1), opset=15, training_mode=1)
    with pytest.raises(UnsupportedError, match="training_mode=1"):
        compile_model(model)
