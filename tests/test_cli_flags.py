"""What neuronx-cc users type: --framework, -O1/-O2/-O3, --model-type, --target trn1n, --workdir, --version,
-lnc/--logical-nc-config, the flags that change nothing here, defaults in --help, -q/--verbose/--logfile anywhere,
and coded one-line errors, each saying what to do instead, for what is refused."""

from __future__ import annotations

import argparse
import os

import pytest

import runtime
from isa import bundle as bundle_format
from neuronx_cc_lite import __version__
from neuronx_cc_lite.cli import build_parser, main
from tests.conftest import MODELS_DIR

MODEL = os.path.join(MODELS_DIR, "mlp_odd.onnx")


def _one_coded_line(err: str, code: str) -> None:
    assert err.count("\n") == 1 and err.startswith(f"neuronx-cc-lite: error: {code}"), err


def _usage_error(capsys, *argv: str) -> str:
    """Run a command line argparse refuses: exit status 2, one coded line; returns that line."""
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    _one_coded_line(err, "NCC_USAGE")
    return err


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_neuronx_cc_options_are_accepted_and_recorded(tmp):
    neff = f"{tmp}/a.neff"
    assert main(["-q", "compile", MODEL, "-o", neff, "--framework", "ONNX", "-O3", "--model-type", "transformer",
                 "--target", "trn1n", "--workdir", f"{tmp}/work"]) == 0
    flags = bundle_format.read(neff).flags
    assert (flags["target"], flags["optimize"], flags["model_type"]) == ("trn1", 2, "transformer")
    assert os.path.isdir(f"{tmp}/work")
    # -O3 is -O2 and trn1n is trn1: the same bytes as the plain spelling.
    assert main(["-q", "compile", MODEL, "-o", f"{tmp}/b.neff", "--optlevel", "2", "--target", "trn1",
                 "--model-type", "transformer", "--framework", "onnx"]) == 0
    assert _bytes(neff) == _bytes(f"{tmp}/b.neff")
    assert main(["-q", "compile", MODEL, "-o", f"{tmp}/c.neff", "-O1"]) == 0
    flags = bundle_format.read(f"{tmp}/c.neff").flags
    assert (flags["optimize"], flags["model_type"]) == (1, "generic")


@pytest.mark.parametrize("argv, expected", [
    (["compile", MODEL, "-o", "x.neff", "--framework", "XLA"], "argument --framework: 'XLA': neuronx-cc-lite "
                                                              "compiles ONNX models only"),
    (["check", MODEL, "--framework", "PYTORCH"], "argument --framework: 'PYTORCH'"),
    (["compile", MODEL, "-o", "x.neff", "-O4"], "argument -O/--optlevel: invalid choice: 4"),
    (["compile", MODEL, "-o", "x.neff", "--model-type", "cnn"], "argument --model-type: invalid choice: 'cnn'"),
    (["asm", "x.s"], "the following arguments are required: -o/--output"),
    (["run", "m.neff", "--verbose", "loud"], "argument --verbose: invalid choice: 'loud'"),
])
def test_refused_options_are_one_coded_usage_line(capsys, tmp, argv, expected):
    before = set(os.listdir(tmp))
    assert expected in _usage_error(capsys, *argv)
    assert set(os.listdir(tmp)) == before


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"neuronx-cc-lite {__version__}\n"


def test_help_shows_every_default(capsys):
    """Every option with a default that says something (not None, False or []) shows it in its command's help."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    checked = 0
    for name, command in [("", parser), *commands.items()]:
        with pytest.raises(SystemExit):
            main([name, "--help"] if name else ["--help"])
        text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
        for action in command._actions:
            if action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS):
                assert f"(default: {action.default})" in text, (name, action.option_strings)
                checked += 1
    assert checked >= 12
    assert "--target {inf2,trn1,trn1n,trn2} chip to compile for (trn1n is compiled as trn1) (default: trn1)" in \
        " ".join(_help(capsys, "compile").split())


def _help(capsys, command: str) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return capsys.readouterr().out


def test_disasm_rejects_unknown_engines_and_cores(tmp, capsys):
    neff = f"{tmp}/m.neff"
    main(["-q", "compile", MODEL, "-o", neff])
    capsys.readouterr()
    assert main(["disasm", neff, "--engine", "TPU"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    _one_coded_line(err, "NCC_USAGE: unknown engine TPU for --engine: a trn1 core has PE, ACT, DVE, POOL, SP, CC and "
                         "DMA0..DMA15")
    assert main(["disasm", neff, "--engine", "DMA16"]) == 2  # trn1 has 16 queues
    _one_coded_line(capsys.readouterr().err, "NCC_USAGE: unknown engine DMA16")
    assert main(["disasm", neff, "--core", "1"]) == 2
    _one_coded_line(capsys.readouterr().err, "NCC_USAGE: no core 1 for --core: the bundle has 1 core(s)")
    assert main(["disasm", neff, "--engine", "pe", "--no-data"]) == 0  # engine names in any case
    out = capsys.readouterr().out
    assert ".stream PE" in out and ".stream ACT" not in out


def test_logging_options_anywhere(tmp, capsys):
    neff, logfile = f"{tmp}/m.neff", f"{tmp}/log.txt"
    assert main(["compile", MODEL, "-o", neff]) == 0
    assert capsys.readouterr().err.splitlines()[-1].startswith("compiled ")  # the summary, at info (the default)
    assert main(["compile", MODEL, "-o", neff, "-q"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["compile", MODEL, "--verbose", "warning", "-o", neff]) == 0
    assert capsys.readouterr().err == ""
    assert main(["-q", "compile", MODEL, "-o", neff, "--verbose", "debug"]) == 0  # -q wins on the terminal
    assert capsys.readouterr().err == ""
    assert main(["compile", MODEL, "-o", neff, "--verbose", "debug", "--no-cache"]) == 0  # phases run
    assert any(line.startswith("import: ") for line in capsys.readouterr().err.splitlines())
    assert main(["compile", MODEL, "-o", neff, "-q", "--verbose", "debug", "--logfile", logfile, "--no-cache"]) == 0
    assert capsys.readouterr().err == ""  # -q quiets the terminal only
    with open(logfile) as f:
        lines = f.read().splitlines()
    assert any(" INFO neuronx_cc_lite.cli: import: " in line for line in lines)
    assert any(" INFO neuronx_cc_lite.cli: compiled " in line for line in lines)
    # A failure goes to both, and the log file is appended to.
    assert main(["--logfile", logfile, "run", f"{tmp}/missing.neff"]) == 1
    _one_coded_line(capsys.readouterr().err, "NRT_LOAD")
    with open(logfile) as f:
        more = f.read().splitlines()
    assert more[:len(lines)] == lines and " ERROR neuronx_cc_lite.cli: NRT_LOAD: " in more[-1]
    assert main(["list-operators", "--logfile", f"{tmp}/no/such/dir/log.txt"]) == 1
    _one_coded_line(capsys.readouterr().err, "NCC_IO: cannot open --logfile")


def test_workdir_takes_the_temporary_files(tmp, capsys, monkeypatch):
    """check compiles into a temporary bundle: with --workdir it is made there (and removed after)."""
    loaded = []
    real_load = runtime.load
    monkeypatch.setattr(runtime, "load", lambda path, **kw: loaded.append(str(path)) or real_load(path, **kw))
    work = f"{tmp}/work/deeper"
    assert main(["-q", "check", MODEL, "--workdir", work]) == 0
    assert "ok" in capsys.readouterr().out
    assert len(loaded) == 1 and os.path.commonpath([loaded[0], work]) == work
    assert os.listdir(work) == []


def test_neuronx_cc_flags_are_taken_with_their_meaning(tmp, capsys):
    """-lnc and --logical-nc-config are --lnc; unet-inference is a model type; flags asking for what is always done
    change no byte and say so; --verbose in capitals, WARN and critical; list-operators --framework."""
    main(["-q", "compile", MODEL, "-o", f"{tmp}/lnc1.neff", "--target", "trn2", "--lnc", "1", "--no-cache"])
    for spelling in ("-lnc", "--logical-nc-config"):
        assert main(["-q", "compile", MODEL, "-o", f"{tmp}/x.neff", "--target", "trn2", spelling, "1"]) == 0
        assert _bytes(f"{tmp}/x.neff") == _bytes(f"{tmp}/lnc1.neff")
    assert main(["-q", "compile", MODEL, "-o", f"{tmp}/u.neff", "--model-type", "unet-inference"]) == 0
    assert bundle_format.read(f"{tmp}/u.neff").flags["model_type"] == "unet-inference"
    main(["-q", "compile", MODEL, "-o", f"{tmp}/plain.neff"])
    capsys.readouterr()
    for flag, says in (("--enable-fast-loading-neuron-binaries", "always stored uncompressed"),
                       ("--enable-mixed-precision-accumulation", "PSUM accumulates in fp32")):
        assert main(["compile", MODEL, "-o", f"{tmp}/f.neff", flag]) == 0
        assert _bytes(f"{tmp}/f.neff") == _bytes(f"{tmp}/plain.neff")
        err = capsys.readouterr().err
        assert f"{flag}: always so here: " in err and says in err
    for level, quiet in (("WARN", True), ("Warning", True), ("critical", True), ("DEBUG", False), ("INFO", False)):
        assert main(["compile", MODEL, "-o", f"{tmp}/v.neff", "--verbose", level]) == 0
        assert (capsys.readouterr().err == "") == quiet, level
    assert main(["--verbose", "critical", "run", f"{tmp}/missing.neff"]) == 1
    assert capsys.readouterr().err == ""  # an error is below critical
    assert main(["list-operators", "--framework", "onnx"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split()[1] == "operators."
    assert "--framework: 'XLA': neuronx-cc-lite compiles ONNX models only" in _usage_error(
        capsys, "list-operators", "--framework", "XLA")


@pytest.mark.parametrize("argv, says", [
    (["--distribution-strategy", "llm-training"], "--distribution-strategy: neuronx-cc's training strategies "
                                                  "(llm-training, nemo, fsdp) do not apply: neuronx-cc-lite "
                                                  "compiles inference graphs and shards them with --tp N"),
    (["--distribution-strategy=fsdp"], "shards them with --tp N (tensor parallel) and --dp N (data parallel)"),
    (["--enable-saturate-infinity"], "--enable-saturate-infinity: not modelled: constants that auto-cast narrows "
                                     "already saturate"),
    (["--fast-math", "fp32-cast-matmult"], "--fast-math: that is neuron-cc's (Inf1) option; neuronx-cc and "
                                           "neuronx-cc-lite choose precision with --auto-cast"),
    (["--auto-cast-type", "tf32"], "argument --auto-cast-type: tf32 is not modelled: give bf16, fp16, fp8_e4m3 or "
                                   "fp8_e5m2"),
    (["--auto-cast-type", "TF32"], "tf32 is not modelled"),
])
@pytest.mark.parametrize("command", ["compile", "check"])
def test_refused_neuronx_cc_flags_say_what_to_do_instead(capsys, tmp, command, argv, says):
    assert says in _usage_error(capsys, command, MODEL, *(["-o", f"{tmp}/x.neff"] if command == "compile" else []),
                                *argv)
    assert os.listdir(tmp) == []
