"""ONNX's own node tests (onnx.backend.test) of the CNN operators, each compiled, written to a bundle file, loaded
by the runtime and run on the simulated chip, compared with the test's expected outputs at its rtol / atol.

Every test whose model the compiler accepts must pass; every other one must be refused with a coded reason
(CompileError), never crash. Tests refused only because an input the op needs at compile time (pads, scales,
sizes) arrives at run time are also run with that input frozen into the model, to check the lowering on the
test's own values.
"""

from __future__ import annotations

import os
import re
import warnings
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import runtime
from isa import bundle as bundle_format
from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.errors import CompileError

FAMILIES = {
    "Conv": r"basic_conv|conv_with",
    "ConvTranspose": r"convtranspose",
    "MaxPool": r"maxpool",
    "AveragePool": r"averagepool",
    "GlobalPool": r"global(average|max)pool",
    "BatchNormalization": r"batchnorm",
    "Pad": r"(constant|edge|reflect|wrap)_pad",
    "Concat": r"concat",
    "Split": r"split_(?!to_sequence)",
    "Resize": r"resize",
}
# What passes today as the models come (inputs at run time), and with the compile-time inputs frozen.
# The refusals: MaxPool's Indices output (2), BatchNormalization training_mode (2), and, as the models come,
# pads / roi / scales / sizes given at run time (every Pad and Resize test).
PASSED = {"Conv": 6, "ConvTranspose": 11, "MaxPool": 17, "AveragePool": 20, "GlobalPool": 4,
          "BatchNormalization": 2, "Pad": 0, "Concat": 12, "Split": 16, "Resize": 0}
PASSED_FROZEN = {**PASSED, "Pad": 6, "Resize": 39}
_RUN_TIME_INPUT = re.compile(r"input \d+ \('(\w+)'\) must be a compile-time constant")


def _family(name: str) -> str | None:
    return next((f for f, pattern in FAMILIES.items() if re.match(rf"test_({pattern})", name)), None)


def _freeze(model: onnx.ModelProto, values: dict[str, np.ndarray], names: set[str]) -> onnx.ModelProto:
    frozen = onnx.ModelProto.FromString(model.SerializeToString())
    kept = [vi for vi in frozen.graph.input if vi.name not in names]
    frozen.graph.initializer.extend(numpy_helper.from_array(values[n], n) for n in names)
    del frozen.graph.input[:]
    frozen.graph.input.extend(kept)
    return frozen


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], expected: list[np.ndarray], rtol: float,
         atol: float, path: str) -> tuple[str, str]:
    """("passed" | "refused" | "wrong" | "crashed", detail)."""
    try:
        b = compile_model(model)
    except CompileError as e:
        return "refused", str(e)
    except Exception as e:  # noqa: BLE001 - counted as a failure with its message
        return "crashed", f"{type(e).__name__}: {e}"
    bundle_format.write(b, path)
    outputs = runtime.load(path).run({k: v for k, v in feeds.items()
                                      if k in {vi.name for vi in model.graph.input}})
    for vi, want in zip(model.graph.output, expected):
        got = outputs[vi.name]
        if got.shape != want.shape or not np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                                                      atol=atol, equal_nan=True):
            return "wrong", vi.name
    return "passed", ""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str, str, str]]:
    """test name -> (family, outcome as the model comes, outcome with its run-time compile inputs frozen,
    detail of the last outcome)."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tests = [t for t in load_model_tests(kind="node") if _family(t.name)]
    path = os.path.join(tmp_path_factory.mktemp("node"), "model.neff")
    found = {}
    for t in tests:
        (inputs, expected), = t.data_sets
        feeds = dict(zip((vi.name for vi in t.model.graph.input), inputs))
        outcome, detail = _run(t.model, feeds, expected, t.rtol, t.atol, path)
        frozen, needed = outcome, set()
        while frozen == "refused" and (more := {m.group(1) for m in _RUN_TIME_INPUT.finditer(detail)} - needed):
            needed |= more
            frozen, detail = _run(_freeze(t.model, {k: np.asarray(v) for k, v in feeds.items()}, needed), feeds,
                                  expected, t.rtol, t.atol, path)
        found[t.name] = (_family(t.name), outcome, frozen, detail)
    return found


def test_every_accepted_node_test_passes(outcomes):
    bad = {name: o for name, o in outcomes.items() if {"wrong", "crashed"} & {o[1], o[2]}}
    assert not bad, bad


@pytest.mark.parametrize("family", FAMILIES)
def test_node_tests_pass(outcomes, family):
    mine = [o for o in outcomes.values() if o[0] == family]
    assert Counter(o[1] for o in mine)["passed"] >= PASSED[family]
    assert Counter(o[2] for o in mine)["passed"] >= PASSED_FROZEN[family]

