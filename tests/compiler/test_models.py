"""Every model in models/ compiles, runs on the simulated chip and matches onnxruntime."""

from __future__ import annotations

import glob
import os

import onnx
import pytest

from tests.conftest import MODELS_DIR, assert_close, run_both

MODELS = sorted(glob.glob(os.path.join(MODELS_DIR, "*.onnx")))


def test_models_are_there():
    assert len(MODELS) >= 3


@pytest.mark.parametrize("path", MODELS, ids=os.path.basename)
def test_model_matches_onnxruntime(tmp, path):
    ours, ref = run_both(onnx.load(path), tmp)
    assert_close(ours, ref, rtol=1e-4)


@pytest.mark.parametrize("path", MODELS, ids=os.path.basename)
def test_model_is_right_under_random_interleaving(tmp, path):
    """The semaphores alone make the answer: random engine orders give the same outputs."""
    for seed in range(3):
        ours, ref = run_both(onnx.load(path), tmp, policy="random", seed=seed)
        assert_close(ours, ref, rtol=1e-4)


def test_committed_models_are_what_the_script_builds():
    """Each models/build_*.py script's build() gives, byte for byte, the .onnx files committed next to it, and
    every committed model comes from exactly one script."""
    import importlib.util
    import sys

    sys.path.insert(0, MODELS_DIR)  # the scripts import their shared helper as the folder's own module
    built: dict[str, str] = {}
    for script in sorted(glob.glob(os.path.join(MODELS_DIR, "build_*.py"))):
        stem = os.path.splitext(os.path.basename(script))[0]
        spec = importlib.util.spec_from_file_location(f"models_{stem}", script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the script runs
        spec.loader.exec_module(module)
        for name, model in module.build().items():
            assert name not in built, f"{name} is built by {built.get(name)} and {stem}"
            built[name] = stem
            with open(os.path.join(MODELS_DIR, f"{name}.onnx"), "rb") as f:
                assert f.read() == model.SerializeToString(), f"{name} (from {stem}.py)"
    exported = _exported()
    assert not set(built) & set(exported), "a model is both built and exported"
    assert sorted([*built, *exported]) == sorted(os.path.splitext(os.path.basename(p))[0] for p in MODELS)


def _exported() -> list[str]:
    """The models models/export_*.py scripts wrote with an exporter (not rerun: they need packages the project
    does not depend on), each with its external data committed beside it where it has one."""
    import ast

    names = []
    for script in sorted(glob.glob(os.path.join(MODELS_DIR, "export_*.py"))):
        with open(script) as f:
            tree = ast.parse(f.read())
        names += next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                      and any(getattr(t, "id", None) == "EXPORTS" for t in node.targets))
    for name in names:
        model = onnx.load(os.path.join(MODELS_DIR, f"{name}.onnx"), load_external_data=False)
        for init in model.graph.initializer:
            for entry in init.external_data:
                if entry.key == "location":
                    assert os.path.exists(os.path.join(MODELS_DIR, entry.value)), f"{name}: {entry.value}"
    return names
