"""Every command and snippet in the README runs as written and exits 0 (issue 20).

The README's runnable blocks are fenced: ```sh blocks run in bash (errexit, pipefail) and ```python blocks in the
project's Python, in order, in one scratch directory that sees the checkout's `models/`, `benchmarks/` and `.venv/`
as a clone does, with the virtual environment first on the PATH (as `source .venv/bin/activate` puts it) and no
threading variables set. ```text blocks are usage synopses and output: each synopsis line's options must be ones
its command takes. An indented (unfenced) block may hold tables, never a command: a command there would go
untested.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
# What a scratch directory shares with the checkout: the paths the README's commands name.
SHARED = ("models", "benchmarks", "scripts", ".venv")
# Blocks that take longer than the default suite allows, by a line they contain: they run in the slow tier.
SLOW = ("bash scripts/demo.sh", "benchmarks/sim_threads.py", "benchmarks/anchors.py", "benchmarks/families.py",
        "benchmarks/calibration.py", "benchmarks/small_pieces.py",
        "models/decoders.py", "decoders/llama_tiny.onnx", "benchmarks/llama_serving.py", "llama3_tiny.onnx",
        "benchmarks/big_weight.py", "benchmarks/pe_floor.py", "benchmarks/architectures.py",
        "benchmarks/tp_exports.py")
# Blocks that are not run here, with the reason.
NOT_RUN = {"bash scripts/test.sh": "the default suite, which holds this test"}
# Blocks that must run where the checkout is: the scripts find the checkout from their own path.
IN_CHECKOUT = ("bash scripts/",)
COMMAND = re.compile(r"^(neuronx-cc-lite|bash|python|mpiexec|\.venv/)\b")


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int  # of the opening fence, 1-based

    @property
    def slow(self) -> bool:
        return any(marker in self.text for marker in SLOW)

    @property
    def not_run(self) -> str | None:
        return next((why for marker, why in NOT_RUN.items() if marker in self.text), None)

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.language})"


def readme_blocks() -> list[Block]:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    blocks = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S):
        blocks.append(Block(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1))
    return blocks


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("VIRTUAL_ENV", None)
    return env


def _scratch(tmp_path) -> str:
    for name in SHARED:
        if os.path.exists(os.path.join(ROOT, name)):
            os.symlink(os.path.join(ROOT, name), os.path.join(tmp_path, name))
    return str(tmp_path)


def run_block(block: Block, cwd: str, timeout: float) -> subprocess.CompletedProcess[str]:
    if block.language == "sh":
        command = ["bash", "-euo", "pipefail", "-c", block.text]
    else:
        command = [sys.executable, "-c", block.text]
    if any(marker in block.text for marker in IN_CHECKOUT):
        cwd = ROOT
    return subprocess.run(command, cwd=cwd, env=_environment(), capture_output=True, text=True, timeout=timeout)


def _check(block: Block, result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, (f"{block} exited {result.returncode}:\n{block.text}\n--- stdout\n"
                                    f"{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")
    assert "Traceback" not in result.stderr, f"{block}:\n{result.stderr[-3000:]}"


def _runnable(slow: bool) -> list[Block]:
    return [b for b in readme_blocks() if b.language in ("sh", "python") and not b.not_run and b.slow == slow]


def test_the_readme_has_runnable_blocks():
    """The extraction finds what the README shows (so that a change of format cannot make the next tests vacuous)."""
    blocks = readme_blocks()
    assert {b.language for b in blocks} >= {"sh", "python", "text"}
    assert any("bash scripts/demo.sh" in b.text for b in blocks)
    assert len(_runnable(slow=False)) >= 3


def test_no_command_hides_in_an_unfenced_block():
    """Indented blocks are output and tables; a command in one would not be run by these tests."""
    with open(README, encoding="utf-8") as f:
        text = re.sub(r"^```\w*\n.*?^```$", "", f.read(), flags=re.M | re.S)
    hidden = [line.strip() for line in text.splitlines() if line.startswith("    ") and COMMAND.match(line.strip())]
    assert not hidden, f"commands outside fenced sh blocks: {hidden}"


def test_the_quick_blocks_run_as_written(tmp_path):
    """In order, in one scratch directory: a later block may use the files an earlier one wrote."""
    cwd = _scratch(tmp_path)
    for block in _runnable(slow=False):
        _check(block, run_block(block, cwd, timeout=300))


@pytest.mark.slow
def test_the_slow_blocks_run_as_written(tmp_path):
    cwd = _scratch(tmp_path)
    for block in _runnable(slow=True):
        result = run_block(block, cwd, timeout=1800)
        _check(block, result)
        if "bash scripts/demo.sh" in block.text:  # the demo ends with real Tensor-engine instructions
            listing = result.stdout[result.stdout.index("PE (Tensor engine) listing"):]
            assert len(re.findall(r"^ +\d+  nc_(matmul|transpose) ", listing, re.M)) >= 10, listing


def _synopsis_lines() -> list[tuple[str, str]]:
    """(command, options text) per command of the README's synopsis: its continuation lines joined."""
    lines: list[tuple[str, str]] = []
    for block in readme_blocks():
        if block.language != "text":
            continue
        for line in block.text.splitlines():
            body = line.split("#", 1)[0]
            if body.startswith("neuronx-cc-lite "):
                lines.append((body.split()[1], body))
            elif body.startswith(" ") and lines and body.strip().startswith("["):
                lines[-1] = (lines[-1][0], lines[-1][1] + " " + body)
    return lines


def test_the_synopsis_names_only_options_its_commands_take(capsys):
    from neuronx_cc_lite.cli import main

    lines = _synopsis_lines()
    assert {command for command, _ in lines} >= {"compile", "run", "profile", "check", "disasm", "asm", "info"}
    for command, text in lines:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        help_text = capsys.readouterr().out
        for option in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text):
            option = re.sub(r"^-O\d$", "-O", option)
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text), \
                f"the README's synopsis gives {command} {option}, which its --help does not list"
