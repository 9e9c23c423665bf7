"""neuronx_cc_lite/progress.py: a status line on a terminal only, rewritten in place at most ten times a second and
erased at the end; the compile's phase timings at the info level."""

from __future__ import annotations

import io
import logging
import os
import re
import select
import time
from types import SimpleNamespace

import pytest

from neuronx_cc_lite import progress
from neuronx_cc_lite.cli import main
from tests.conftest import MODELS_DIR

MLP = os.path.join(MODELS_DIR, "mlp_small.onnx")
PHASES = ("import", "passes", "lowering", "scheduling", "allocation", "emit", "package")


class _Terminal(io.StringIO):
    """A stream that says it is a terminal, counting its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_nothing_is_shown_when_stderr_is_not_a_terminal(tmp, capsys):
    assert main(["compile", MLP, "-o", f"{tmp}/m.neff", "--no-cache"]) == 0
    assert main(["profile", f"{tmp}/m.neff"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    with progress.shown(logging.StreamHandler(io.StringIO())):
        assert progress._line is None  # no thread, and step() returns at once
        progress.step("lowering", 1, 2)


def test_a_terminal_sees_one_line_rewritten_in_place_and_erased():
    master, slave = os.openpty()
    stream = os.fdopen(slave, "w")
    handler = logging.StreamHandler(stream)
    log = logging.getLogger("tests.progress")
    log.addHandler(handler)
    log.propagate = False
    try:
        with progress.shown(handler, interval=0.02):
            for k in range(5):
                progress.step("lowering", k, 5, f"node{k}")
                time.sleep(0.05)
            log.warning("a message in between")
            time.sleep(0.05)
    finally:
        log.removeHandler(handler)
        stream.close()
    out = b""
    while select.select([master], [], [], 0.1)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other end is closed
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    text = out.decode()
    assert "\rlowering 4/5 (80%) node4\x1b[K" in text
    assert "\r\x1b[Ka message in between" in text  # the line makes way for the log record...
    assert text.endswith("\r\x1b[K")  # ...and is erased at the end
    assert text.count("a message in between") == 1


def test_updates_are_throttled():
    terminal = _Terminal()
    with progress.shown(logging.StreamHandler(terminal), interval=0.1):
        start = time.perf_counter()
        k = 0
        while time.perf_counter() - start < 0.35:
            progress.step("scheduling", k, None, "instructions")
            k += 1
    assert k > 1000
    assert 2 <= terminal.writes <= 5 + 1  # ten a second at most, and the erase
    assert terminal.getvalue().endswith("\r\x1b[K")


def test_a_simulation_is_polled():
    terminal = _Terminal()
    streams = [SimpleNamespace(pc=3, ops=[None] * 4), SimpleNamespace(pc=0, ops=[None] * 6)]
    model = SimpleNamespace(simulator=SimpleNamespace(streams=streams))
    with progress.shown(logging.StreamHandler(terminal), interval=0.01):
        with progress.simulating(model):
            time.sleep(0.1)
    assert "\rsimulating 3/10 (30%) instructions\x1b[K" in terminal.getvalue()


def test_phases_are_timed_and_added_up():
    with progress.timed() as seconds:
        for _ in range(2):
            with progress.phase("lowering"):
                time.sleep(0.01)
        with progress.phase("emit"):
            pass
    assert list(seconds) == ["lowering", "emit"] and seconds["lowering"] >= 0.02
    with progress.phase("outside"):  # no timed(): nothing recorded, nothing fails
        pass


def _timings(err: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+):\s+(\d+\.\d+) s$", err, re.M)}


def test_compile_logs_each_phase_at_info_and_not_with_q(tmp, capsys):
    assert main(["compile", MLP, "-o", f"{tmp}/a.neff", "--no-cache"]) == 0
    timings = _timings(capsys.readouterr().err)
    assert tuple(timings) == PHASES and all(s >= 0 for s in timings.values())
    assert main(["-q", "compile", MLP, "-o", f"{tmp}/b.neff", "--no-cache"]) == 0
    assert _timings(capsys.readouterr().err) == {}
    assert main(["compile", MLP, "-o", f"{tmp}/c.neff", "--no-cache", "--verbose", "warning"]) == 0
    assert _timings(capsys.readouterr().err) == {}


@pytest.mark.parametrize("level", ["-O1", "-O2"])
def test_every_optimisation_level_has_every_phase(tmp, capsys, level):
    assert main(["compile", MLP, "-o", f"{tmp}/m.neff", "--no-cache", level]) == 0
    assert tuple(_timings(capsys.readouterr().err)) == PHASES


def test_a_phase_inside_another_counts_for_itself_only():
    with progress.timed() as seconds:
        with progress.phase("scheduling"):
            time.sleep(0.02)
            with progress.phase("allocation"):
                time.sleep(0.05)
    assert list(seconds) == ["scheduling", "allocation"]
    assert 0.02 <= seconds["scheduling"] < 0.05 <= seconds["allocation"]


def test_work_that_knows_its_total_shows_the_share_and_the_time_left():
    assert progress.fraction(0, 5000, 0.0) == "0/5000 (0%)"
    assert progress.fraction(1200, 5000, 0.5) == "1200/5000 (24%)"  # under a second: no rate to go by yet
    assert progress.fraction(1200, 5000, 6.0) == "1200/5000 (24%, 19 s left)"
    assert progress.fraction(100, 5000, 6.0) == "100/5000 (2%, 4 min 54 s left)"
    assert progress.fraction(5000, 5000, 9.0) == "5000/5000 (100%)"


def test_a_long_simulation_shows_the_time_left(monkeypatch):
    terminal = _Terminal()
    streams = [SimpleNamespace(pc=250, ops=[None] * 1000)]
    model = SimpleNamespace(simulator=SimpleNamespace(streams=streams))
    clock = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    with progress.shown(logging.StreamHandler(terminal), interval=0.01):
        with progress.simulating(model):
            clock[0] += 6.0  # six seconds for a quarter: 18 to go
            deadline = time.monotonic() + 2
            while "left" not in terminal.getvalue() and time.monotonic() < deadline:
                time.sleep(0.01)
    assert "\rsimulating 250/1000 (25%, 18 s left) instructions\x1b[K" in terminal.getvalue()


def test_the_status_line_shows_at_once_while_the_command_loads(monkeypatch, tmp):
    """Before any phase: the command names itself while the compiler loads, and says when it looks up the cache."""
    terminal = _Terminal()
    seen = []
    monkeypatch.setattr(progress, "status", lambda text: seen.append(text))
    handler = logging.StreamHandler(terminal)
    monkeypatch.setattr(logging, "StreamHandler", lambda stream=None: handler)
    assert main(["-q", "compile", MLP, "-o", f"{tmp}/m.neff"]) == 0  # never a device: it would be replaced
    assert seen[:2] == ["compile: loading", "looking the model up in the compile cache"]


def test_the_first_status_comes_before_the_heavy_imports(tmp):
    """The line must show within a second of the start: checking the paths loads the bundle format (numpy and
    ml_dtypes, which took the first 2.3 s of a BERT-base compile under load), so the line is up before it."""
    import subprocess
    import sys

    code = ("import sys\nfrom neuronx_cc_lite import progress\nfrom neuronx_cc_lite.cli import main\nfirst = []\n"
            "def status(text):\n    first.append(sorted(m for m in ('numpy', 'onnx', 'ml_dtypes', 'isa.bundle') "
            "if m in sys.modules))\nprogress.status = status\nmain(sys.argv[1:])\n"
            "print('loaded at the first status:', first[0], file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code, "-q", "compile", MLP, "-o", f"{tmp}/m.neff", "--no-cache"],
                            capture_output=True, text=True, timeout=120)
    assert "loaded at the first status: []" in result.stderr, result.stderr


def test_a_status_set_after_the_first_tenth_of_a_second_is_drawn_at_once(monkeypatch):
    """Not left to the drawing thread, which an import holding the GIL keeps waiting; sooner, it waits its turn
    (work shorter than a tenth of a second shows nothing)."""
    terminal = _Terminal()
    with progress.shown(logging.StreamHandler(terminal), interval=60):  # the thread would not draw in this test
        monkeypatch.setattr(progress, "since_start", lambda: 0.01)
        progress.status("compile: loading")
        assert terminal.writes == 0
        monkeypatch.setattr(progress, "since_start", lambda: 0.5)
        progress.status("compile: loading")
        assert terminal.getvalue() == "\rcompile: loading\x1b[K"


def test_verbose_debug_logs_every_pass_and_stage_with_time_and_sizes(tmp, capsys):
    from neuronx_cc_lite.codegen.stages import STAGE_NAMES
    from neuronx_cc_lite.passes import PASS_NAMES

    assert main(["--verbose", "debug", "compile", MLP, "-o", f"{tmp}/m.neff", "--no-cache"]) == 0
    err = capsys.readouterr().err
    for name in PASS_NAMES:
        assert re.search(rf"^pass {name}: \d+\.\d{{3}} s, \d+ -> \d+ nodes, \d+ tensors$", err, re.M), name
    for stage in STAGE_NAMES:
        assert re.search(rf"^stage {stage}: \d+\.\d{{3}} s, \d+ instructions, \d+ tiles", err, re.M), stage
    assert re.search(r"^stage hbm-layout: .*, \d+ bytes of HBM", err, re.M)
    assert re.search(r"^stage emit: \d+\.\d{3} s, PE \d+, .*DMA \d+ instructions$", err, re.M)
    assert re.search(r"^import: \d+ nodes", err, re.M) and re.search(r"^package: 1 rank\(s\)", err, re.M)
    assert re.search(rf"^wrote {tmp}/m.neff: \d+ bytes", err, re.M)
    assert main(["compile", MLP, "-o", f"{tmp}/n.neff", "--no-cache"]) == 0
    assert "pass fold-constants" not in capsys.readouterr().err  # debug only


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["compile", "--help"], ["run", "--help"]])
def test_version_and_help_load_neither_numpy_nor_onnx(argv):
    """What made --version take 3 s: building the parser imported onnx (and with it ml_dtypes, a second)."""
    import subprocess
    import sys

    code = ("import sys\nfrom neuronx_cc_lite.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
            "    pass\nheavy = sorted(m for m in ('numpy', 'onnx', 'ml_dtypes', 'onnxruntime', 'runtime') if m in "
            "sys.modules)\nprint('loaded:', heavy, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert "loaded: []" in result.stderr, result.stderr


def test_loading_a_bundle_says_how_far_it_has_come(tmp, monkeypatch):
    """A BERT-base bundle took 12 s to load under "loading bert.neff" alone: the hash check, the decoding, the
    instruction checks and preparation, and the weights' placement each count to their total."""
    import numpy as np

    import runtime

    neff = f"{tmp}/m.neff"
    assert main(["-q", "compile", MLP, "-o", neff, "--no-cache"]) == 0
    calls: list[tuple[str, int, int]] = []
    model = runtime.load(neff, on_progress=lambda label, done, total: calls.append((label, done, total)))
    labels = list(dict.fromkeys(label for label, _, _ in calls))
    assert labels == ["checking bundle bytes", "decoding streams", "checking instructions", "preparing instructions",
                      "placing weight bytes"]
    for label in labels:
        counts = [(done, total) for name, done, total in calls if name == label]
        assert len({total for _, total in counts}) == 1 and counts[0][0] == 0
        assert all(a <= b < total for (a, _), (b, total) in zip(counts, counts[1:]))
    instructions = sum(len(s.instructions) for s in model.bundle.cores[0].values())
    assert ("preparing instructions", instructions - 1, instructions) in calls
    weights = sum(len(seg.data) for seg in model.bundle.weights)
    assert {total for label, _, total in calls if label == "placing weight bytes"} == {weights}

    seen: list[str] = []
    monkeypatch.setattr(progress, "step", lambda label, done, total=None, detail="": seen.append(label))
    np.savez(f"{tmp}/in.npz", input=np.ones((2, 1, 8, 8), np.float32))
    assert main(["-q", "run", neff, "--inputs", f"{tmp}/in.npz", "--outputs", f"{tmp}/out.npz"]) == 0
    assert list(dict.fromkeys(seen)) == labels  # the command line shows them
