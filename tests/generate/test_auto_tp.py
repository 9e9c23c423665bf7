"""--tp auto (generate/auto_tp.py): the degree whose decode step is fastest on the chip model, and why."""

from __future__ import annotations

import sys

import onnx

from isa.target import TARGETS
from neuronx_cc_lite.generate.auto_tp import candidates
from neuronx_cc_lite.generate.generator import Generator
from runtime.profile import host_overhead_us, timed_run
from tests.conftest import MODELS_DIR

sys.path.insert(0, MODELS_DIR)
from llama_shapes import CONFIGS, build  # noqa: E402


def test_candidates_are_what_one_instance_holds():
    assert candidates("trn1", None) == [1, 2, 4, 8, 16, 32]
    assert candidates("inf2", None) == [1, 2, 4, 8, 16, 24]
    assert candidates("trn2", 2) == [1, 2, 4, 8, 16, 32, 64]


def test_auto_picks_the_fastest_decode_step_and_says_why(tmp_path):
    """The tiny Llama: a decode step's work is a few microseconds, each all-reduce tens (nccom-test's fixed cost),
    so one rank wins; the generator then runs at that degree."""
    path = str(tmp_path / "llama.onnx")
    onnx.save(build(CONFIGS["llama3-tiny"], declared=False), path)
    g = Generator(path, max_length=16, target="trn1", tp="auto", cache_dir=str(tmp_path / "cache"))
    choice = g.tp_choice
    assert sorted(choice.step_us) == [1, 2, 4, 8, 16, 32] and not choice.skipped
    assert choice.tp == 1 == g.options["tp"]
    assert all(choice.step_us[1] < us for n, us in choice.step_us.items() if n > 1)
    two = g.bundle("decode", 1, True, tp=2)
    t = TARGETS["trn1"]
    assert choice.step_us[2] == timed_run(two, t).last_run.elapsed_ns / 1e3 + host_overhead_us(two, t)
    assert "--tp auto chose 1" in choice.why() and "32: " in choice.why()
    assert len(g.generate([1, 2, 3], 3).tokens) == 3
