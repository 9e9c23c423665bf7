"""onnx's bundled `light` models (ResNet50, SqueezeNet, VGG19, ...: the real architectures at 224x224, with
their weights replaced by constant fills) compile, run on the simulated chip and match onnxruntime. The larger
ones run in the slow tier."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from neuronx_cc_lite.reference import onnxruntime_outputs, seeded_inputs
from tests.conftest import assert_close, compile_to_model

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
DEFAULT_TIER = ["squeezenet", "shufflenet", "resnet50", "inception_v1"]
SLOW_TIER = ["inception_v2", "densenet121", "bvlc_alexnet", "zfnet512", "vgg19"]


def _check(tmp: str, name: str) -> None:
    model = onnx.load(os.path.join(LIGHT, f"light_{name}.onnx"))
    compiled = compile_to_model(model, tmp)
    inputs = seeded_inputs(compiled.inputs)
    ours, ref = compiled.run(inputs), onnxruntime_outputs(model, inputs)
    for value in ref.values():
        assert np.isfinite(value).all()
    assert_close(ours, ref, rtol=1e-4)


def test_every_light_model_is_listed():
    present = {f[len("light_"):-len(".onnx")] for f in os.listdir(LIGHT) if f.endswith(".onnx")}
    assert present == set(DEFAULT_TIER + SLOW_TIER)


@pytest.mark.parametrize("name", DEFAULT_TIER)
def test_light_model(tmp, name):
    _check(tmp, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_TIER)
def test_light_model_slow_tier(tmp, name):
    _check(tmp, name)
