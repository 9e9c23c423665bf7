"""Every supported operator, one parameterised suite: compile a one-node model, run it on the simulated chip and
compare with onnxruntime."""

from __future__ import annotations

import pytest

from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.compiler.op_cases import CASES
from tests.conftest import assert_close, compile_to_model


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op_matches_onnxruntime(tmp, case):
    model, feeds = case.model()
    expected = onnxruntime_outputs(model, feeds)
    ours = compile_to_model(model, tmp).run(feeds, check_races=True)  # every hand-off ordered by a semaphore
    assert_close(ours, expected, rtol=1e-5)


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
