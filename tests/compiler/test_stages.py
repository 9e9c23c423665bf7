"""The stages after lowering (codegen/stages.py): a listed pipeline whose tile program can be dumped after any
stage and stopped at, verified after each stage with the stage named on a fault."""

from __future__ import annotations

import subprocess
import sys

import pytest

from isa.instructions import OPS
from isa.operand import Engine
from neuronx_cc_lite.codegen import stages as stages_module
from neuronx_cc_lite.codegen.stages import STAGE_NAMES, Stage, StopAfter
from neuronx_cc_lite.compiler import Options, compile_model
from neuronx_cc_lite.errors import CompileError
from tests.conftest import ROOT

MODEL = "models/mlp_small.onnx"


def test_every_stage_can_be_dumped_in_order():
    seen: list[tuple[str, str]] = []
    compile_model(f"{ROOT}/{MODEL}", Options(dump_ir_after=frozenset(STAGE_NAMES)),
                  dump=lambda name, text: seen.append((name, text)))
    assert [name for name, _ in seen] == STAGE_NAMES  # mlp_small is lowered once: one dump per stage
    text = dict(seen)
    assert " q" not in text["split-transfers"] and " q0 dma_copy" in text["schedule"]  # queues chosen by schedule
    assert "@ ?" in text["lowering"] and "hbm" in text["hbm-layout"]


def test_stop_after_a_stage_gives_its_tile_program():
    with pytest.raises(StopAfter) as stop:
        compile_model(f"{ROOT}/{MODEL}", Options(stop_after="split-transfers"))
    assert stop.value.text.startswith("// ") and "dma_copy" in stop.value.text


def test_the_command_line_stops_after_a_stage():
    done = subprocess.run([sys.executable, "-m", "neuronx_cc_lite", "compile", MODEL, "--stop-after", "hbm-layout"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "hbm " in done.stdout and "@ ?" not in done.stdout.split("hbm ", 1)[1]  # every HBM tensor placed


def test_a_fault_names_the_stage_that_made_it(monkeypatch):
    def broken(program, optimize):  # puts an instruction on an engine its row does not allow
        first = program.instrs[0]
        first.engine = next(e for e in Engine if e not in OPS[first.op].engines)
        return ""

    monkeypatch.setitem(stages_module._BY_NAME, "dedupe-loads", Stage("dedupe-loads", "broken", broken, 2))
    with pytest.raises(CompileError) as caught:
        compile_model(f"{ROOT}/{MODEL}", Options())
    assert caught.value.code == "NCC_VERIFY" and "dedupe-loads" in str(caught.value)
