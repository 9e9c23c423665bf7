"""Ordering comes from semaphores: strip the waits from a compiled bundle and the run goes wrong."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from isa import bundle as bundle_format
from isa.dtypes import DType
from isa.instructions import make
from isa.operand import Mem, Operand
from neuronx_cc_lite.codegen.sync import synchronize
from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.reference import onnxruntime_outputs, seeded_inputs
import runtime
from tests.conftest import MODELS_DIR, gemm_model


def _strip_waits(b: bundle_format.Bundle) -> int:
    stripped = 0
    for core in b.cores:
        for stream in core.values():
            for instr in stream.instructions:
                stripped += len(instr.waits)
                instr.waits = ()
    return stripped


@pytest.mark.parametrize("model", [gemm_model(129, 300, 513, trans_b=True),
                                   onnx.load(os.path.join(MODELS_DIR, "mlp_odd.onnx"))], ids=["gemm", "mlp_odd"])
@pytest.mark.parametrize("policy, seed", [("clock", 0), ("random", 1)])
def test_without_waits_the_answer_is_wrong(tmp, model, policy, seed):
    b = compile_model(model)
    inputs = seeded_inputs(b.inputs)
    expected = onnxruntime_outputs(model, inputs)
    assert _strip_waits(b) > 0
    path = os.path.join(tmp, "stripped.neff")
    bundle_format.write(b, path)
    outputs = runtime.load(path).run(inputs, policy=policy, seed=seed)
    wrong = [name for name, value in outputs.items()
             if np.isnan(value).any() or not np.allclose(value, expected[name], rtol=1e-3, atol=1e-3)]
    assert wrong, "stripping every semaphore wait changed nothing: ordering came from somewhere else"


@pytest.mark.parametrize("path", sorted(p for p in os.listdir(MODELS_DIR) if p.endswith(".onnx")))
def test_compiled_models_have_no_race(tmp, path):
    """Every pair of accesses to the same bytes from two engines, one a write, is ordered by semaphores."""
    b = compile_model(onnx.load(os.path.join(MODELS_DIR, path)))
    bundle_format.write(b, os.path.join(tmp, "m.neff"))
    model = runtime.load(os.path.join(tmp, "m.neff"))
    model.run(seeded_inputs(b.inputs), check_races=True)


def test_the_race_checker_sees_stripped_waits(tmp):
    b = compile_model(gemm_model(129, 300, 513, trans_b=True))
    _strip_waits(b)
    bundle_format.write(b, os.path.join(tmp, "m.neff"))
    with pytest.raises(runtime.RaceError, match="with no semaphore ordering the two"):
        runtime.load(os.path.join(tmp, "m.neff")).run(seeded_inputs(b.inputs), check_races=True)


def test_every_cross_engine_wait_is_needed_somewhere(tmp):
    """Not a vacuous pass: the compiled bundle has waits on several engines."""
    b = compile_model(gemm_model(129, 300, 513, trans_b=True))
    waiting = {name for name, s in b.cores[0].items() if any(i.waits for i in s.instructions)}
    assert {"PE", "ACT"} <= waiting and any(name.startswith("DMA") for name in waiting)


def test_a_scatter_waits_for_a_write_anywhere_in_its_table():
    """The scatter's row operand is row 0 of the table; a copy into row 3 on another queue overlaps only the
    whole table, which the scatter writes implicitly: the sync pass must still order the two."""
    f32, i32 = DType.fp32, DType.int32
    write_row_3 = make("dma_copy", dst=Operand(Mem.HBM, f32, 0, 1, 3 * 32, ((8, 1),)),
                       src=Operand(Mem.SBUF, f32, 0, 1, 0, ((8, 1),)))
    scatter = make("dma_scatter", dst=Operand(Mem.HBM, f32, 0, 1, 0, ((8, 1),)),
                   src=Operand(Mem.SBUF, f32, 0, 2, 64, ((8, 1),)),
                   index=Operand(Mem.SBUF, i32, 0, 2, 128, ((1, 1),)), rows=4, row_stride=8)
    synchronize([(0, write_row_3), (1, scatter)], 2)
    assert write_row_3.signal == 0 and scatter.waits == ((0, 1),)
