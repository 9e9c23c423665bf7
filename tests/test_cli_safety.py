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
    from isa import files

    def interrupting_rename(src: str, dst: str) -> None:
        """The temporary file is complete; the signal comes before it takes the bundle's name."""
        interrupt()
        for _ in range(1000):  # the signal handler runs between bytecodes
            pass

    handler = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(files, "_rename_into_place", interrupting_rename)
    assert main(["compile", MODEL, "-o", f"{tmp}/m.neff", "--no-cache"]) == status
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert f"NCC_INTERRUPTED: {says}" in err
    assert os.listdir(tmp) == []
    assert signal.getsignal(signal.SIGTERM) == handler  # main() puts the caller's handler back


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_held_over_the_rename_lets_the_command_finish(tmp, capsys, monkeypatch, signum):
    """A signal that comes while the bundle takes its name is held until the renames are done (isa/files.py); the
    command's output is then in place, so the command finishes and says so (status 0, its summary), ignoring the
    signal, where it reported "no output was written" beside the bundle (seen in the signal test, SIGHUP 0.3 s)."""
    import threading

    from isa import files

    renamed = os.rename

    def signalled_rename(src: str, dst: str) -> None:
        renamed(src, dst)
        if dst.endswith("m.neff"):  # to the main thread, which holds it over the renames (a signal to the process
            signal.pthread_kill(threading.main_thread().ident, signum)  # may land in another thread's lap)
            for _ in range(1000):
                pass

    monkeypatch.setattr(files.os, "rename", signalled_rename)
    assert main(["compile", MODEL, "-o", f"{tmp}/m.neff", "--no-cache"]) == 0
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert "NCC_INTERRUPTED" not in err and "compiled " in err, err
    assert os.listdir(tmp) == ["m.neff"]


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
            (["compile", MODEL, "-o", f"{tmp}/a_folder.neff", "--no-cache"], 2,
             f"NCC_USAGE: -o {tmp}/a_folder.neff: a directory, not a regular file"),
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


# ---- issue 21: no output, log file or cache write replaces or appends to an input or a special file; every file
# read is refused at once unless it is a regular file ----

def _external_model(folder: str) -> tuple[str, str]:
    """mlp_odd with its weights in an external data file beside it: (model, weights)."""
    import onnx

    model = onnx.load(MODEL)
    path = os.path.join(folder, "ext.onnx")
    onnx.save(model, path, save_as_external_data=True, location="ext.data", size_threshold=0)
    return path, os.path.join(folder, "ext.data")


def _within(seconds: float, fn):  # type: ignore[no-untyped-def]
    """fn()'s result, or a failure if it has not returned in `seconds` (a read that blocks on a FIFO)."""
    import threading

    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert result, f"no answer within {seconds} s: blocked on a special file"
    return result[0]


def test_compile_onto_its_external_data_is_refused(tmp, capsys):
    model, weights = _external_model(tmp)
    before = _bytes(weights)
    assert main(["compile", model, "-o", weights, "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "NCC_USAGE" in err and "is not a bundle: refusing to replace it" in err and len(err.splitlines()) == 1
    assert _bytes(weights) == before
    assert main(["-q", "compile", model, "-o", f"{tmp}/m.neff", "--no-cache"]) == 0  # it still compiles


def test_outputs_onto_devices_fifos_and_directories_are_refused(tmp, capsys):
    os.mkfifo(f"{tmp}/fifo")
    os.symlink("/dev/full", f"{tmp}/null")  # a link to a device: a wrong answer replaces the link, not the device
    os.mkdir(f"{tmp}/dir")
    neff = f"{tmp}/m.neff"
    assert main(["-q", "compile", MODEL, "-o", neff, "--no-cache"]) == 0
    np.savez(f"{tmp}/in.npz", x=np.zeros((3, 100), np.float32))
    for target in (f"{tmp}/fifo", f"{tmp}/null", f"{tmp}/dir"):
        for argv in (["compile", MODEL, "-o", target, "--no-cache"], ["run", neff, "--inputs", f"{tmp}/in.npz",
                     "--outputs", target], ["profile", neff, "--json", target], ["info", neff, "--logfile", target]):
            assert _within(30, lambda: main(argv)) == 2, argv
            err = capsys.readouterr().err
            assert "NCC_USAGE" in err and "not a regular file" in err and len(err.splitlines()) == 1, err
    assert os.path.islink(f"{tmp}/null") and os.path.isdir(f"{tmp}/dir")
    import stat
    assert stat.S_ISFIFO(os.stat(f"{tmp}/fifo").st_mode)


def test_a_bundle_write_refuses_a_device_from_python_too(tmp):
    import neuronx_cc_lite

    os.symlink("/dev/full", f"{tmp}/null")
    with pytest.raises(ValueError, match="a character device, not a regular file"):
        neuronx_cc_lite.compile(MODEL, output=f"{tmp}/null", cache=False)
    assert os.path.islink(f"{tmp}/null")


def test_the_log_file_never_appends_to_an_input_or_an_output(tmp, capsys):
    model, weights = _external_model(tmp)
    neff = f"{tmp}/m.neff"
    assert main(["-q", "compile", model, "-o", neff, "--no-cache"]) == 0
    np.savez(f"{tmp}/in.npz", x=np.zeros((3, 100), np.float32))
    with open(f"{tmp}/m.s", "w") as f:
        assert main(["-q", "disasm", neff]) == 0
        f.write(capsys.readouterr().out)
    inputs = (model, weights, neff, f"{tmp}/in.npz", f"{tmp}/m.s")
    before = [_bytes(p) for p in inputs]
    for argv, log in ((["compile", model, "-o", f"{tmp}/o.neff"], model),
                      (["compile", model, "-o", f"{tmp}/o.neff"], weights),
                      (["check", model], weights),
                      (["compile", model, "-o", f"{tmp}/o.neff"], f"{tmp}/o.neff"),
                      (["run", neff, "--inputs", f"{tmp}/in.npz"], neff),
                      (["run", neff, "--inputs", f"{tmp}/in.npz"], f"{tmp}/in.npz"),
                      (["asm", f"{tmp}/m.s", "-o", f"{tmp}/o.neff"], f"{tmp}/m.s"),
                      (["run", neff, "--outputs", f"{tmp}/out.npz"], f"{tmp}/out.npz")):
        assert main([*argv, "--logfile", log]) == 2, (argv, log)
        err = capsys.readouterr().err
        assert "NCC_USAGE" in err and ("would destroy" in err or "name the same file" in err), err
    assert [_bytes(p) for p in inputs] == before
    assert not os.path.exists(f"{tmp}/o.neff") and not os.path.exists(f"{tmp}/out.npz")


def test_run_outputs_onto_each_other_are_refused(tmp, capsys):
    neff = f"{tmp}/m.neff"
    assert main(["-q", "compile", MODEL, "-o", neff, "--no-cache"]) == 0
    np.savez(f"{tmp}/in.npz", x=np.zeros((3, 100), np.float32))
    assert main(["run", neff, "--inputs", f"{tmp}/in.npz", "--outputs", f"{tmp}/o", "--profile", f"{tmp}/o"]) == 2
    assert "--outputs and --profile name the same file" in capsys.readouterr().err


@pytest.mark.parametrize("what", ["model", "external data", "bundle", "inputs", "input", "listing", "info"])
@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_special_file_given_to_read_is_refused_at_once(tmp, capsys, what, special):
    neff = f"{tmp}/m.neff"
    assert main(["-q", "compile", MODEL, "-o", neff, "--no-cache"]) == 0
    path = f"{tmp}/special"
    if special == "fifo":
        os.mkfifo(path)
    else:
        os.symlink(special, path)
    if what == "external data":
        model, weights = _external_model(tmp)
        os.unlink(weights)
        os.rename(path, weights)  # the weights file is the FIFO, or a link to /dev/zero
    argv = {"model": ["compile", path, "-o", f"{tmp}/o.neff"],
            "external data": ["compile", f"{tmp}/ext.onnx", "-o", f"{tmp}/o.neff"],
            "bundle": ["run", path], "inputs": ["run", neff, "--inputs", path],
            "input": ["run", neff, "--input", f"x={path}"], "listing": ["asm", path, "-o", f"{tmp}/o.neff"],
            "info": ["info", path]}[what]
    status = _within(30, lambda: main(argv))
    err = capsys.readouterr().err
    assert status in (1, 2) and len(err.strip().splitlines()) == 1, err
    assert ("not a regular file" in err or "not a file beside the model" in err), err
    assert not os.path.exists(f"{tmp}/o.neff")


def _wait_for_handlers(pid: int) -> None:
    """Until process `pid` catches SIGTERM (the entry point's first act), as /proc/PID/status's SigCgt shows."""
    import time

    for _ in range(1000):
        with open(f"/proc/{pid}/status") as f:
            caught = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
        if caught >> (signal.SIGTERM - 1) & 1:
            return
        time.sleep(0.005)
    raise AssertionError("the command never set its signal handlers")


@pytest.mark.parametrize("signum, delay", [(signal.SIGINT, 0.0), (signal.SIGINT, 0.4), (signal.SIGTERM, 0.0),
                                           (signal.SIGTERM, 0.8), (signal.SIGHUP, 0.3)])
def test_a_signal_at_any_point_of_a_command_is_one_coded_line(tmp, signum, delay):
    """The command is signalled while it starts (modules loading, arguments parsed) or works: one coded line, the
    shell's status for the signal, no traceback, no file left in the output's folder."""
    import subprocess
    import sys
    import time

    out = os.path.join(tmp, "out")
    os.mkdir(out)
    command = [sys.executable, "-m", "neuronx_cc_lite", "compile", MODEL, "-o", f"{out}/m.neff", "--no-cache"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    _wait_for_handlers(process.pid)  # the interpreter's own start-up comes before any code of ours can run
    time.sleep(delay)
    process.send_signal(signum)
    err = process.communicate(timeout=120)[1]
    if process.returncode == 0:  # finished before the signal came: nothing to check but the bundle
        assert os.listdir(out) == ["m.neff"]
        return
    assert process.returncode == 128 + signum, (process.returncode, err)
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        "neuronx-cc-lite: error: NCC_INTERRUPTED: "), err
    assert os.listdir(out) == []


@pytest.fixture
def hangups_default():
    """SIGHUP at its default disposition for a test that hangs itself up: a suite started under nohup inherits it
    ignored, which the command respects (it installs no handler for an ignored signal)."""
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, before)


def _signalled_inside_an_import(*args: object) -> int:
    """As numpy's import does with the exception a signal raises inside it: its own ImportError instead."""
    import time

    from neuronx_cc_lite import interrupts

    try:
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)
    except interrupts.Interrupted:
        raise ImportError("numpy._core.multiarray failed to import") from None
    raise AssertionError("the signal never came")


@pytest.mark.parametrize("where", ["starting", "loading", "entry point"])
def test_a_signal_an_import_turned_into_an_import_error_is_still_the_coded_line(tmp, capsys, monkeypatch, where,
                                                                              hangups_default):
    """SIGHUP while numpy loaded (a loaded machine, 0.3 s into a compile) came out as numpy's ImportError traceback
    with status 1."""
    import neuronx_cc_lite.cli as cli
    from neuronx_cc_lite import interrupts

    if where == "starting":
        monkeypatch.setattr(cli, "_main", _signalled_inside_an_import)
        status = cli.main(["info", MODEL])
    elif where == "loading":  # inside a command, where other exceptions are NCC_INTERNAL
        monkeypatch.setattr(cli, "cmd_info", _signalled_inside_an_import)
        status = cli.main(["info", MODEL])
    else:
        monkeypatch.setattr(cli, "main", _signalled_inside_an_import)
        status = interrupts.main(["info", MODEL])
    said = capsys.readouterr().err.strip().splitlines()
    assert status == 129 and said[-1] == "neuronx-cc-lite: error: NCC_INTERRUPTED: hung up (SIGHUP); no output was " \
        "written", said
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL  # the handlers before are back


def test_a_full_disk_is_one_coded_line_with_nothing_left(tmp, capsys, monkeypatch):
    """No space left on device while the cache entry and the bundle are written."""
    from isa import files

    real_fdopen = os.fdopen
    monkeypatch.setattr(files.os, "fdopen", lambda fd, mode="r", *a, **k: _FullFile(real_fdopen(fd, mode, *a, **k))
                        if "w" in mode else real_fdopen(fd, mode, *a, **k))
    out = os.path.join(tmp, "out")
    os.mkdir(out)
    status = main(["compile", MODEL, "-o", f"{out}/m.neff", "--cache-dir", f"{tmp}/cache"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and err[-1] == f"neuronx-cc-lite: error: NCC_IO: {out}/m.neff: No space left on device", err
    assert any("cannot write the compile cache entry" in line for line in err)  # a warning: the cache is optional
    assert "Traceback" not in "\n".join(err)
    assert os.listdir(out) == [] and not [f for _, _, fs in os.walk(f"{tmp}/cache") for f in fs]


class _FullFile:
    """A file whose writes fail as on a full disk."""

    def __init__(self, f) -> None:  # type: ignore[no-untyped-def]
        self.f = f

    def write(self, data) -> int:  # type: ignore[no-untyped-def]
        import errno

        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self.f, name)

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
        self.f.close()


def test_a_log_file_on_a_full_disk_is_one_warning(tmp, capsys, monkeypatch):
    import errno
    import logging

    def full(self, record):  # type: ignore[no-untyped-def]
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            self.handleError(record)

    monkeypatch.setattr(logging.FileHandler, "emit", full)
    assert main(["compile", MODEL, "-o", f"{tmp}/m.neff", "--no-cache", "--logfile", f"{tmp}/log"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("cannot write the log file") == 1, err


def test_a_signal_during_an_import_is_raised_once_the_import_has_ended(tmp, monkeypatch, hangups_default):
    """An exception raised inside a compiled module's initialisation aborts the process (onnx's, SIGTERM 0.78 s
    into a compile: SIGABRT): a signal that comes during an import is raised after it, where the program imported
    the module, and the module is whole."""
    import importlib
    import sys
    import time

    from neuronx_cc_lite import interrupts

    with open(os.path.join(tmp, "slow_module.py"), "w") as f:
        f.write("import os, signal, time\nos.kill(os.getpid(), signal.SIGHUP)\n"
                "deadline = time.monotonic() + 0.3\nwhile time.monotonic() < deadline:\n    pass\nWHOLE = True\n")
    monkeypatch.syspath_prepend(tmp)
    with pytest.raises(interrupts.Interrupted) as raised:
        with interrupts.handled():
            importlib.import_module("slow_module")
            time.sleep(5)  # the timer raises it here, after the import
    assert raised.value.signum == signal.SIGHUP
    assert sys.modules["slow_module"].WHOLE
    assert "slow_module" not in "".join(__import__("traceback").format_tb(raised.value.__traceback__))
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL and signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    del sys.modules["slow_module"]


def _closed_under_a_signal(*args: object) -> int:
    """A read whose file a signal's unwinding closed fails on its own (EBADF) and says so as the model's load."""
    import time

    from neuronx_cc_lite.errors import CompileError

    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    finally:
        raise CompileError("NCC_ONNX_LOAD", "cannot read m.onnx: Bad file descriptor")


def test_an_error_the_unwinding_of_a_signal_causes_is_the_signal(tmp, capsys, monkeypatch):
    """SIGTERM 0.6 s into a compile, while the model was read, came out as NCC_ONNX_LOAD with status 1: whatever
    fails after the signal, the command ends with its coded line and status."""
    import neuronx_cc_lite.cli as cli

    monkeypatch.setattr(cli, "cmd_info", _closed_under_a_signal)
    status = cli.main(["info", MODEL])
    said = capsys.readouterr().err.strip().splitlines()
    assert status == 143 and said[-1] == "neuronx-cc-lite: error: NCC_INTERRUPTED: terminated by SIGTERM; no output " \
        "was written", said


def test_a_signal_after_the_command_has_ended_leaves_its_status():
    """The process's command (`interrupts.command`) ignores the signals once it has ended: one that comes while the
    interpreter shuts down (collecting a compile's objects can take longer than a small compile) does not turn
    the status of a command that wrote its output into the signal's. Before: -15."""
    import subprocess
    import sys

    code = ("import os, signal, sys\n"
            "from neuronx_cc_lite.interrupts import command\n"
            "status = command()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "sys.exit(status)\n")
    done = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("neuronx-cc-lite ") and done.stderr == "", done
