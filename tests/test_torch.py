"""The PyTorch front door (neuronx_cc_lite/pytorch/): `trace` and the torch.compile backend on a small CNN and a
small transformer block, each checked against eager PyTorch, the independent reference. torch is imported
plainly: the test command installs the [torch] extra, so a missing torch is a failure, not a skip."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import neuronx_cc_lite
import neuronx_cc_lite.torch_backend  # noqa: F401 - registers backend="neuronx_cc_lite"
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.pytorch import chip
from neuronx_cc_lite.pytorch.dynamo import backend
from runtime.errors import InputError

# the exporter traces nn.MultiheadAttention's checks of its input shapes, and torch warns that the trace holds
# them constant: true of every trace, which is for the traced shapes only
pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# fp32 on both sides: the chip sums in other orders than PyTorch's CPU kernels (tiles of 128 on PE, PSUM
# accumulation), so results differ by a few ulps of the partial sums, well inside these
RTOL, ATOL = 1e-4, 1e-5


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class TwoHeads(nn.Module):
    """A tuple of outputs, and dropout that eval mode turns off."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 6)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.dropout(self.linear(x))
        return torch.relu(h), h * y


class Det(nn.Module):
    """Det: an ONNX operator the compiler does not have."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.det(x) * 2


def _model(seed: int, module: nn.Module) -> nn.Module:
    torch.manual_seed(seed)
    return module.eval()


def _batch_norm_statistics(model: nn.Module) -> nn.Module:
    """Running statistics away from the initial 0 and 1, so that folding batch norm is tested."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    return model


@pytest.fixture(scope="module")
def cnn() -> nn.Module:
    return _batch_norm_statistics(_model(0, SmallCNN()))


@pytest.fixture(scope="module")
def transformer() -> nn.Module:
    return _model(1, nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, activation="gelu",
                                                batch_first=True))


MODELS = {"cnn": (2, 3, 16, 16), "transformer": (2, 8, 32)}


def _inputs(name: str, seed: int) -> torch.Tensor:
    return torch.randn(*MODELS[name], generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def traced(cnn: nn.Module, transformer: nn.Module) -> dict[str, neuronx_cc_lite.pytorch.TracedModule]:
    # under no_grad nn.TransformerEncoderLayer would take its fused fast path, which no exporter can export:
    # trace turns it off while it exports
    with torch.no_grad():
        return {"cnn": neuronx_cc_lite.trace(cnn, _inputs("cnn", 0)),
                "transformer": neuronx_cc_lite.trace(transformer, (_inputs("transformer", 0),))}


class ChipRuns(list):
    """The inputs (name: shape) of every run on the simulated chip, proof that a result did not come from eager;
    `flags` the compile options of the bundle of each run."""

    flags: list[dict[str, object]]


@pytest.fixture
def chip_runs(monkeypatch: pytest.MonkeyPatch) -> ChipRuns:
    runs = ChipRuns()
    runs.flags = []
    run = chip.OnChip.run

    def spy(self: chip.OnChip, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        runs.append({name: tuple(t.shape) for name, t in inputs.items()})
        runs.flags.append(self.model.bundle.flags)
        return run(self, inputs)

    monkeypatch.setattr(chip.OnChip, "run", spy)
    return runs


@pytest.fixture
def fresh_dynamo() -> None:
    """Each test's graphs are compiled by its own torch.compile, not found in dynamo's cache of an earlier test."""
    torch._dynamo.reset()


def _eager(model: nn.Module, *args: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(*args)


@pytest.mark.parametrize("name", MODELS)
def test_trace_matches_eager(name, traced, cnn, transformer, chip_runs):
    model = {"cnn": cnn, "transformer": transformer}[name]
    for seed in (0, 1):  # the example input and another: the input reaches the chip, it is not baked in
        x = _inputs(name, seed)
        out = traced[name](x)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
        torch.testing.assert_close(out, _eager(model, x), rtol=RTOL, atol=ATOL)
    assert chip_runs == [{"input_0": MODELS[name]}] * 2


def test_trace_keeps_a_tuple_and_the_module_mode(tmp_path):
    model = _model(2, TwoHeads()).train()
    x, y = torch.randn(4, 8), torch.randn(4, 6)
    traced = neuronx_cc_lite.trace(model, (x, y), optimize=1)
    assert traced.bundle.flags["optimize"] == 1  # the compile options reach the compiler
    assert model.training  # left as it was
    out = traced(x, y)
    expected = _eager(model.eval(), x, y)  # traced in eval mode: no dropout
    assert isinstance(out, tuple) and len(out) == 2
    for ours, ref in zip(out, expected):
        torch.testing.assert_close(ours, ref, rtol=RTOL, atol=ATOL)

    path = tmp_path / "two_heads.neff"
    traced.save(path)
    loaded = neuronx_cc_lite.load_traced(path)
    again = loaded(x, y)
    assert isinstance(again, tuple) and all(torch.equal(a, b) for a, b in zip(again, out))


def test_a_saved_trace_loads_and_runs_alone(traced, tmp_path):
    path = tmp_path / "cnn.neff"
    traced["cnn"].save(path)
    loaded = neuronx_cc_lite.load_traced(path)
    x = _inputs("cnn", 3)
    out = loaded(x)
    assert isinstance(out, torch.Tensor) and torch.equal(out, traced["cnn"](x))
    assert loaded.bundle.inputs[0].shape == MODELS["cnn"] and loaded.model.last_run.elapsed_ns > 0


def test_a_trace_refuses_other_shapes_and_dtypes(traced):
    cnn = traced["cnn"]
    with pytest.raises(InputError, match=r"input 0: float32\[1, 3, 16, 16\], traced with float32\[2, 3, 16, 16\]"):
        cnn(torch.randn(1, 3, 16, 16))
    with pytest.raises(InputError, match=r"input 0: float64\[2, 3, 16, 16\], traced with float32") as error:
        cnn(torch.randn(*MODELS["cnn"], dtype=torch.float64))
    assert str(error.value).startswith("NRT_INPUT: ")
    with pytest.raises(InputError, match=r"takes 1 tensor\(s\) \(float32\[2, 3, 16, 16\]\), got 2"):
        cnn(_inputs("cnn", 0), _inputs("cnn", 0))


def test_trace_names_what_it_cannot_compile_or_return():
    with pytest.raises(CompileError, match="Det") as error:
        neuronx_cc_lite.trace(Det(), torch.rand(4, 4))
    assert error.value.code == "NCC_UNSUPPORTED"

    class ReturnsList(nn.Module):
        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            return [x + 1]

    with pytest.raises(CompileError, match="returns list") as error:
        neuronx_cc_lite.trace(ReturnsList(), torch.rand(4, 4))
    assert error.value.code == "NCC_TORCH"


@pytest.mark.parametrize("name", MODELS)
def test_torch_compile_matches_eager(name, cnn, transformer, chip_runs, fresh_dynamo, caplog):
    model = {"cnn": cnn, "transformer": transformer}[name]
    compiled = torch.compile(model, backend="neuronx_cc_lite")
    # with grad enabled (the default), as under no_grad dynamo would capture the transformer's fused fast path
    # (see test_torch_compile_falls_back_to_eager_on_what_it_cannot_export)
    for seed in (0, 1):
        x = _inputs(name, seed)
        torch.testing.assert_close(compiled(x).detach(), _eager(model, x), rtol=RTOL, atol=ATOL)
    # the parameters and buffers were baked into the bundle: its one input is the user's
    assert chip_runs == [{"input_0": MODELS[name]}] * 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_torch_compile_follows_new_weights_and_shapes(chip_runs, fresh_dynamo):
    model = _model(3, TwoHeads())
    compiled = torch.compile(model, backend="neuronx_cc_lite", options={"optimize": 1})
    x, y = torch.randn(4, 8), torch.randn(4, 6)
    for ours, ref in zip(compiled(x, y), _eager(model, x, y)):
        torch.testing.assert_close(ours, ref, rtol=RTOL, atol=ATOL)
    with torch.no_grad():  # in place, as an optimizer step writes: the graph and its guards stay the same
        model.linear.weight.mul_(-2)
    for ours, ref in zip(compiled(x, y), _eager(model, x, y)):
        torch.testing.assert_close(ours, ref, rtol=RTOL, atol=ATOL)
    x, y = torch.randn(3, 8), torch.randn(3, 6)  # dynamo hands over a graph with a dynamic batch now
    for ours, ref in zip(compiled(x, y), _eager(model, x, y)):
        torch.testing.assert_close(ours, ref, rtol=RTOL, atol=ATOL)
    assert [run["input_0"][0] for run in chip_runs] == [4, 4, 3]
    assert all(flags["optimize"] == 1 for flags in chip_runs.flags)


class DetBetween(nn.Module):
    """Two linear layers with an operator the compiler does not have (Det) between them."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(16, 16)
        self.second = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.first(x))
        return torch.relu(self.second(h * torch.linalg.det(h.reshape(-1, 4, 4)).unsqueeze(1)))


def test_torch_compile_runs_what_it_supports_on_the_chip_and_the_rest_on_the_cpu(chip_runs, fresh_dynamo, caplog):
    """As torch-neuronx's partitioner: one unsupported operator does not send the whole graph to eager."""
    model = _model(4, DetBetween())
    compiled = torch.compile(model, backend="neuronx_cc_lite")
    for seed in (0, 1):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(compiled(x).detach(), _eager(model, x), rtol=RTOL, atol=ATOL)
    # per call: the first linear and tanh on the chip, det on the CPU, the rest on the chip
    assert chip_runs == [{"input_0": (8, 16)}, {"input_0": (8,), "input_1": (8, 16)}] * 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "is split: 1 operator(s) run on the CPU (linalg_det), the rest in 2 part(s) on the chip; NCC_UNSUPPORTED" \
        in warnings[0] and "(Det)" in warnings[0]


def test_torch_compile_falls_back_to_eager_on_what_it_cannot_export(transformer, chip_runs, fresh_dynamo, caplog,
                                                                     capfd):
    x = _inputs("transformer", 0)
    with torch.no_grad():  # dynamo captures the fused fast-path kernel, which no exporter can export
        out = torch.compile(transformer, backend="neuronx_cc_lite")(x)
    torch.testing.assert_close(out, _eager(transformer, x), rtol=RTOL, atol=ATOL)
    assert not chip_runs
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "runs eagerly: NCC_TORCH" in warnings[0]
    assert "aten::_transformer_encoder_layer_fwd" in warnings[0]
    printed = capfd.readouterr()
    assert "Torch IR graph" not in printed.out + printed.err  # the exporter's dump of its IR, kept back


def test_torch_compile_follows_a_rebound_parameter(chip_runs, fresh_dynamo):
    """`param.data = t` keeps the Parameter and its version counter: the backend sees the new data and recompiles."""
    model = _model(5, nn.Linear(8, 4))
    compiled = torch.compile(model, backend="neuronx_cc_lite")
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(x).detach(), _eager(model, x), rtol=RTOL, atol=ATOL)
    model.weight.data = torch.randn(4, 8, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(compiled(x).detach(), _eager(model, x), rtol=RTOL, atol=ATOL)
    assert len(chip_runs) == 2


@pytest.mark.parametrize("options, code", [({"auto_cast": "bogus"}, "NCC_OPTION"),
                                           ({"auto_cast_type": "tf32"}, "NCC_OPTION"),
                                           ({"optimize": 7}, "NCC_OPTION"),
                                           ({"target": "trn9"}, "NCC_TARGET")])
def test_bad_option_values_are_refused(options, code, fresh_dynamo):
    """Not a silent run in eager: the backend refuses them when dynamo hands it a graph, trace before it exports."""
    with pytest.raises(CompileError) as error:
        backend(torch.fx.symbolic_trace(Det()), [torch.rand(2)], options=options)
    assert error.value.code == code
    with pytest.raises(Exception, match=code):
        torch.compile(nn.Linear(4, 4), backend="neuronx_cc_lite", options=options)(torch.rand(2, 4))
    with pytest.raises(CompileError) as error:
        neuronx_cc_lite.trace(nn.Linear(4, 4), torch.rand(2, 4), **options)
    assert error.value.code == code


class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # a data-dependent branch: the trace keeps the one the example took
            return x * 2
        return x - 1


def test_trace_warns_when_it_bakes_in_a_branch():
    from neuronx_cc_lite.pytorch.export import BakedValueWarning

    x = torch.full((4, 4), 2.0)
    with pytest.warns(BakedValueWarning, match="the branch they took, for every input") as caught:
        traced = neuronx_cc_lite.trace(Branchy(), x)
    assert [os.path.basename(w.filename) for w in caught if w.category is BakedValueWarning] == ["test_torch.py"]
    torch.testing.assert_close(traced(x), Branchy()(x))
    assert not torch.allclose(traced(-x), Branchy()(-x))  # what the warning is about: -4 where eager gives -3


def test_trace_refuses_a_model_output_object_with_the_return_dict_hint():
    class ModelOutput(dict):
        """What a transformers model returns by default: a dict of tensors with to_tuple()."""

        def to_tuple(self) -> tuple[torch.Tensor, ...]:
            return tuple(self.values())

    class LikeTransformers(nn.Module):
        def forward(self, x: torch.Tensor) -> ModelOutput:
            return ModelOutput(last_hidden_state=x + 1)

    with pytest.raises(CompileError, match=r"returns ModelOutput; a transformers model returns a tuple when called "
                                           r"with return_dict=False") as error:
        neuronx_cc_lite.trace(LikeTransformers(), torch.rand(2, 3))
    assert error.value.code == "NCC_TORCH"


def test_the_backend_refuses_unknown_options():
    with pytest.raises(TypeError, match="unknown option.*auto_cats.*known: target"):
        backend(torch.fx.symbolic_trace(Det()), [torch.rand(2)], options={"auto_cats": "all"})


def test_neuronx_cc_lite_imports_without_torch():
    """Importing the package never imports torch; without torch, trace says which extra to install."""
    script = ("import sys; sys.modules['torch'] = None\n"  # what `import torch` finds when torch is not installed
              "import neuronx_cc_lite\n"
              "from neuronx_cc_lite.errors import CompileError\n"
              "try:\n"
              "    neuronx_cc_lite.trace(object(), ())\n"
              "except CompileError as e:\n"
              "    print(e)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ("NCC_TORCH: the PyTorch front door needs torch: "
                                     "pip install 'neuronx-cc-lite[torch]'")
    imported = subprocess.run([sys.executable, "-c", "import sys, neuronx_cc_lite; print('torch' in sys.modules)"],
                              cwd=ROOT, capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "False"
