"""Nothing is lost by mistake: outputs that would overwrite inputs are refused, bundles get the user's umask,
and Ctrl-C or SIGTERM leave no temporary file behind and exit with a coded line (issue 9)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from isa import bundle as bundle_format
from neuronx_cc_lite.cli import main
from tests.conftest import MODELS_DIR

MODEL = os.path.join(MODELS_DIR, "mlp_odd.onnx")


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_compile_onto_its_own_model_is_refused(tmp, capsys):
    model = f"{tmp}/m.onnx"
    with open(model, "wb") as f:
        f.write(_bytes(MODEL))
    os.symlink(model, f"{tmp}/link.onnx")
    for output in (model, f"{tmp}/link.onnx", f"{tmp}/./m.onnx"):
        assert main(["compile", model, "-o", output, "--no-cache"]) == 2
        assert "NCC_USAGE" in capsys.readouterr().err
    assert _bytes(model) == _bytes(MODEL)


def test_run_onto_its_own_bundle_or_inputs_is_refused(tmp, capsys):
    neff = f"{tmp}/m.neff"
    assert main(["-q", "compile", MODEL, "-o", neff, "--no-cache"]) == 0
    np.savez(f"{tmp}/in.npz", x=np.zeros((3, 100), np.float32))
    before = _bytes(neff), _bytes(f"{tmp}/in.npz")
    for flag, target in (("--outputs", neff), ("--outputs", f"{tmp}/in.npz"), ("--profile", neff)):
        assert main(["run", neff, "--inputs", f"{tmp}/in.npz", flag, target]) == 2
        assert "would destroy the input" in capsys.readouterr().err
    assert (_bytes(neff), _bytes(f"{tmp}/in.npz")) == before


def test_a_bundle_is_created_with_the_users_umask(tmp):
    old = os.umask(0o027)
    try:
        assert main(["-q", "compile", MODEL, "-o", f"{tmp}/m.neff", "--no-cache"]) == 0
    finally:
        os.umask(old)
    assert os.stat(f"{tmp}/m.neff").st_mode & 0o777 == 0o640


def _raise(error: BaseException) -> None:
    raise error


@pytest.mark.parametrize("interrupt, status, says", [
    (lambda: os.kill(os.getpid(), signal.SIGTERM), 143, "terminated by SIGTERM"),
    (lambda: _raise(KeyboardInterrupt()), 130, "interrupted (Ctrl-C)"),
])
def test_an_interrupted_write_leaves_nothing_behind(tmp, capsys, monkeypatch, interrupt, status, says):
    def interrupting_replace(src: str, dst: str) -> None:
        """The temporary file is complete; the signal comes before it takes the bundle's name."""
        interrupt()
        for _ in range(1000):  # the signal handler runs between bytecodes
            pass

    handler = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(bundle_format.os, "replace", interrupting_replace)
    assert main(["compile", MODEL, "-o", f"{tmp}/m.neff", "--no-cache"]) == status
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert f"NCC_INTERRUPTED: {says}" in err
    assert os.listdir(tmp) == []
    assert signal.getsignal(signal.SIGTERM) == handler  # main() puts the caller's handler back


def _npz_declaring(path: str, name: str, shape: tuple[int, ...]) -> None:
    """An .npz whose member's header declares `shape` but holds a few bytes of data."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.npy", header.getvalue() + b"\0" * 16)  # the header writer writes the magic too


def test_npz_inputs_are_checked_before_their_data_is_read(tmp, capsys):
    neff = f"{tmp}/m.neff"
    assert main(["-q", "compile", MODEL, "-o", neff, "--no-cache"]) == 0
    _npz_declaring(f"{tmp}/huge.npz", "x", (10**6, 10**6))
    np.save(f"{tmp}/x.npy", np.zeros((3, 100), np.float32))
    np.savez(f"{tmp}/other.npz", z=np.zeros(3, np.float32))
    for path, code, says in ((f"{tmp}/huge.npz", "NRT_INPUT: ", "input 'x': shape [1000000, 1000000], expected [3, 100]"),
                       (f"{tmp}/x.npy", "NCC_USAGE: ", "not an .npz archive (an .npy file holds one array"),
                       (f"{tmp}/other.npz", "NRT_INPUT: ", "unknown input(s) z (the model takes x)")):
        assert main(["run", neff, "--inputs", path]) == (2 if code == "NCC_USAGE: " else 1)
        err = capsys.readouterr().err
        assert code in err and says in err and len(err.strip().splitlines()) == 1, err


def test_compile_without_output_writes_the_models_name_here(tmp, capsys, monkeypatch):
    """As neuronx-cc writes file.neff without --output: MODEL.neff in the working directory. A file of that name
    that is not a bundle is the user's and is refused; a bundle there (an earlier compile's) is replaced."""
    monkeypatch.chdir(tmp)
    assert main(["-q", "compile", MODEL, "--no-cache"]) == 0
    assert os.listdir(tmp) == ["mlp_odd.neff"]
    assert bundle_format.read("mlp_odd.neff").target == "trn1"
    assert main(["-q", "compile", MODEL, "--no-cache", "--target", "inf2"]) == 0  # replaces its own bundle
    assert bundle_format.read("mlp_odd.neff").target == "inf2"
    os.unlink("mlp_odd.neff")
    with open("mlp_odd.neff", "w") as f:
        f.write("my notes")
    capsys.readouterr()
    assert main(["compile", MODEL, "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "NCC_USAGE: mlp_odd.neff exists and is not a bundle: give the output file with -o" in err
    assert _bytes("mlp_odd.neff") == b"my notes" and os.listdir(tmp) == ["mlp_odd.neff"]


def test_file_errors_name_the_users_file(tmp, capsys):
    """A missing inputs file is missing (not "not an .npz archive"); an output that cannot be written is named as
    given, never by our temporary file, and before any work; an input of the wrong type names its file."""
    neff = f"{tmp}/m.neff"
    assert main(["-q", "compile", MODEL, "-o", neff, "--no-cache"]) == 0
    os.mkdir(f"{tmp}/a_folder.neff")
    np.savez(f"{tmp}/f64.npz", x=np.zeros((3, 100)))
    np.save(f"{tmp}/f64.npy", np.zeros((3, 100)))
    np.savez(f"{tmp}/in.npz", x=np.zeros((3, 100), np.float32))
    for argv, status, says in (
            (["run", neff, "--inputs", f"{tmp}/missing.npz"], 1,
             f"NCC_IO: {tmp}/missing.npz: No such file or directory"),
            (["compile", MODEL, "-o", f"{tmp}/no/such/m.neff", "--no-cache"], 1,
             f"NCC_IO: {tmp}/no/such/m.neff: No such file or directory (its folder does not exist)"),
            (["compile", MODEL, "-o", f"{tmp}/a_folder.neff", "--no-cache"], 1,
             f"NCC_IO: {tmp}/a_folder.neff: Is a directory"),
            (["run", neff, "--inputs", f"{tmp}/in.npz", "--outputs", f"{tmp}/no/o.npz"], 1,
             f"NCC_IO: {tmp}/no/o.npz: "),
            (["run", neff, "--inputs", f"{tmp}/f64.npz"], 1,
             f"NRT_INPUT: {tmp}/f64.npz: input 'x': dtype float64, expected float32 (save it with "
             ".astype(np.float32))"),
            (["run", neff, "--input", f"x={tmp}/f64.npy"], 1, f"NRT_INPUT: {tmp}/f64.npy: input 'x': dtype float64")):
        before = sorted(os.listdir(tmp))
        assert main(argv) == status, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
        assert ".neff-" not in err and ".partial" not in err and "import:" not in err  # no compile ran
        assert sorted(os.listdir(tmp)) == before
    with pytest.MonkeyPatch.context() as patch:  # a write that fails after it began: a full disk
        patch.setattr(bundle_format, "_write_archive", lambda b, out: _raise(OSError(28, "No space left on device")))
        assert main(["compile", MODEL, "-o", f"{tmp}/full.neff", "--no-cache"]) == 1
    assert f"NCC_IO: {tmp}/full.neff: No space left on device\n" in capsys.readouterr().err
    assert not any(name.startswith(".neff-") or name == "full.neff" for name in os.listdir(tmp))
