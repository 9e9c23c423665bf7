#!/usr/bin/env python
r"""ONNX's own backend tests (onnx.backend.test) through neuronx_cc_lite.backend: compile -> bundle file -> simulated
chip, compared by onnx's BackendTest with each test's own rtol/atol.

    python scripts/conformance.py                       # every node test
    python scripts/conformance.py --pattern '^test_(relu|gemm_\w+)_cpu$'
    python scripts/conformance.py --models              # also the simple / pytorch-converted / pytorch-operator models
    python scripts/conformance.py --json results.json --list-failures

Each test (CPU device only) ends as one of:
    passed    compiled, ran, and matched the reference
    failed    compatible with the compiler but gave a wrong answer, or the compiler / runtime crashed on it
              (an internal error, a Python exception, a compile error after the analysis accepted the model)
    skipped   not supported: the compiler refuses it as unsupported (backend.is_compatible is False)
    excluded  listed in EXCLUDE below (never run)
    errored   the test harness itself failed, outside the compiler and the runtime

The exit status is 0 only when no compatible test failed or errored.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
import unittest
import warnings
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Tests that must not run: a regex, searched in the test name without its device suffix ("test_relu"), and why.
# Keep this nearly empty: a test that fails on a supported op is a bug to report, never a reason to exclude it.
EXCLUDE: list[tuple[str, str]] = [
    (r"^test_bernoulli", "stochastic op: the expected output is one draw of numpy's random generator"),
    (r"^test_training_dropout(_default|_mask|_default_mask)?$",
     "Dropout in training mode with a non-zero ratio: the expected mask is one draw of numpy's random generator"),
    (r"^test_dft_inverse(_opset19)?$",
     "the expected output is numpy's complex64 FFT, 1.9e-7 from an exact 0 (-7e-16 in float64) where the test's "
     "atol is 1e-7: an exact answer (ours, 0) fails it"),
]

KINDS = {  # kind for load_model_tests -> BackendTest category
    "node": "OnnxBackendNodeModelTest",
    "simple": "OnnxBackendSimpleModelTest",
    "pytorch-converted": "OnnxBackendPyTorchConvertedModelTest",
    "pytorch-operator": "OnnxBackendPyTorchOperatorModelTest",
}
MODEL_KINDS = ("simple", "pytorch-converted", "pytorch-operator")

OUR_PACKAGES = tuple(os.path.join(ROOT, p) + os.sep for p in ("neuronx_cc_lite", "runtime", "isa"))


@dataclass
class Record:
    name: str  # the ONNX test name, without the device suffix
    kind: str
    op: str
    outcome: str  # passed | failed | skipped | excluded | errored
    reason: str = ""  # one line
    detail: str = ""  # the full message and the innermost frames, for failures
    seconds: float = 0.0
    folded: bool = False  # passed, but the op under test was evaluated at compile time (no device instruction)
    specialized: bool = False  # passed with some inputs built into the bundle as constants (see backend.py)


@dataclass
class Report:
    records: list[Record] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, outcome: str) -> int:
        return sum(r.outcome == outcome for r in self.records)

    @property
    def counts(self) -> dict[str, int]:
        return {k: self.count(k) for k in ("passed", "failed", "skipped", "excluded", "errored")}

    @property
    def ok(self) -> bool:
        return self.count("failed") == 0 and self.count("errored") == 0

    def of(self, outcome: str) -> list[Record]:
        return [r for r in self.records if r.outcome == outcome]

    def per_op(self) -> dict[str, Counter]:
        table: dict[str, Counter] = defaultdict(Counter)
        for r in self.records:
            table[r.op][r.outcome] += 1
        return dict(sorted(table.items(), key=lambda kv: kv[0].lower()))


# ---------------------------------------------------------------------------------------------------------------
# Which op a test exercises

def _op_label(model: Any, name: str, single_ops: dict[str, str]) -> str:
    ops = [n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.node]
    distinct = sorted(set(ops))
    if len(distinct) == 1:
        return distinct[0]
    twin = re.sub(r"_expanded(_ver\d+)?$", "", name)
    if twin != name and twin in single_ops:
        return f"{single_ops[twin]} (expanded)"
    if not ops:
        return "(no node)"
    return "+".join(distinct) if len(distinct) <= 3 else f"{len(distinct)} ops"


def _test_models(kinds: Iterable[str]) -> dict[str, tuple[str, Any]]:
    """test name -> (kind, ModelProto or None)."""
    import onnx
    from onnx.backend.test.loader import load_model_tests

    models: dict[str, tuple[str, Any]] = {}
    for kind in kinds:
        for case in load_model_tests(kind=kind):
            model = case.model
            if model is None and case.model_dir and os.path.exists(os.path.join(case.model_dir, "model.onnx")):
                model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
            models[case.name] = (kind, model)
    return models


def _labels(models: dict[str, tuple[str, Any]]) -> dict[str, str]:
    single = {}
    for name, (_, model) in models.items():
        if model is not None and len({n.op_type for n in model.graph.node}) == 1:
            single[name] = model.graph.node[0].op_type
    return {name: _op_label(model, name, single) if model is not None else "(model not stored)"
            for name, (_, model) in models.items()}


# ---------------------------------------------------------------------------------------------------------------
# Classifying an outcome

def _first_line(text: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _comparison_summary(message: str) -> str:
    """np.testing's multi-line mismatch report, on one line (with the first mismatched elements, when listed)."""
    keep = []
    lines = [ln.strip() for ln in message.splitlines()]
    for i, ln in enumerate(lines):
        if ln.startswith(("Not equal", "Mismatched elements", "Max absolute", "Max relative", "Arrays are not",
                          "(shapes", "x and y nan", "Output ", "Items are not equal", "x and y +inf",
                          "x and y -inf")):
            keep.append(ln)
        elif ln.startswith("Mismatch at indices"):
            shown = [x for x in lines[i + 1:i + 4] if x.startswith("[")]
            keep.append("first mismatches " + ", ".join(shown))
    return "; ".join(keep) if keep else _first_line(message)


def _frames(tb: Any) -> list[traceback.FrameSummary]:
    return list(traceback.extract_tb(tb))


def _phase(frames: list[traceback.FrameSummary]) -> str:
    names = [(os.path.basename(f.filename), f.name) for f in frames]
    if ("__init__.py", "assert_similar_outputs") in names:
        return "compare"
    backend = [fn for file, fn in names if file == "backend.py"]
    if "run" in backend:
        return "run"
    if "prepare" in backend:
        return "compile"
    return "harness"


def _innermost_ours(frames: list[traceback.FrameSummary]) -> traceback.FrameSummary | None:
    ours = [f for f in frames if f.filename.startswith(OUR_PACKAGES)]
    return ours[-1] if ours else None


def _where(frame: traceback.FrameSummary | None) -> str:
    if frame is None:
        return ""
    return f" [at {os.path.relpath(frame.filename, ROOT)}:{frame.lineno} in {frame.name}]"


def classify(err: tuple[type[BaseException], BaseException, Any]) -> tuple[str, str, str]:
    """(outcome, one-line reason, detail) for an exception a test raised."""
    from neuronx_cc_lite.errors import CompileError
    from runtime.errors import NeuronRuntimeError

    etype, exc, tb = err
    frames = _frames(tb)
    phase = _phase(frames)
    inner = _innermost_ours(frames)
    detail = "".join(traceback.format_exception_only(etype, exc)).strip() + "\n" + "".join(
        traceback.format_list(frames[-6:])).rstrip()
    if phase == "compare" and isinstance(exc, AssertionError):
        return "failed", f"wrong answer: {_comparison_summary(str(exc))}", detail
    if isinstance(exc, CompileError):
        what = "internal compiler error" if exc.code == "NCC_INTERNAL" else \
            "compile error after the analysis accepted the model"
        return "failed", f"{what}: {_first_line(str(exc))}{_where(inner)}", detail
    if isinstance(exc, NeuronRuntimeError):
        return "failed", f"runtime error: {_first_line(str(exc))}{_where(inner)}", detail
    if phase in ("compile", "run") or inner is not None:
        message = _first_line(str(exc)) or "(no message)"
        return "failed", f"crash in {phase}: {etype.__name__}: {message}{_where(inner)}", detail
    if phase == "compare":  # e.g. the backend returned the wrong number or type of outputs
        return "failed", f"wrong outputs: {etype.__name__}: {_first_line(str(exc))}", detail
    return "errored", f"harness error: {etype.__name__}: {_first_line(str(exc))}", detail


class _Result(unittest.TestResult):
    def __init__(self, on_record: Any) -> None:
        super().__init__()
        self.on_record = on_record
        self._start = 0.0

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().startTest(test)
        self._start = time.perf_counter()

    def _name(self, test: unittest.TestCase) -> str:
        return re.sub(r"_cpu$", "", test._testMethodName)

    def _elapsed(self) -> float:
        return time.perf_counter() - self._start

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addSuccess(test)
        self.on_record(self._name(test), "passed", "", "", self._elapsed())

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self.on_record(self._name(test), "skipped", _first_line(reason), "", self._elapsed())

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)
        self.on_record(self._name(test), *classify(err), self._elapsed())

    def addError(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addError(test, err)
        self.on_record(self._name(test), *classify(err), self._elapsed())

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addExpectedFailure(test, err)
        self.on_record(self._name(test), *classify(err), self._elapsed())

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addUnexpectedSuccess(test)
        self.on_record(self._name(test), "passed", "", "", self._elapsed())


# ---------------------------------------------------------------------------------------------------------------
# Running

def excluded(name: str) -> str | None:
    """Why a test (named without its device suffix) must not run, or None."""
    return next((reason for regex, reason in EXCLUDE if re.search(regex, name)), None)


def build_suite(kinds: Iterable[str], pattern: str | None = None) -> tuple[unittest.TestSuite, dict[str, str]]:
    """The CPU tests of the given kinds that match `pattern` (searched in the name with its device suffix, e.g.
    "test_relu_cpu", as BackendTest.include does): a unittest suite of those to run, and {name: reason} for the
    selected ones that EXCLUDE keeps from running."""
    import onnx.backend.test

    import neuronx_cc_lite.backend as backend

    bt = onnx.backend.test.BackendTest(backend, __name__)
    if pattern:
        bt.include(pattern)
    selected = re.compile(pattern) if pattern else None
    cases = bt.test_cases
    suite = unittest.TestSuite()
    skipped: dict[str, str] = {}
    for kind in kinds:
        case = cases[KINDS[kind]]
        for name in sorted(n for n in dir(case) if n.startswith("test_") and n.endswith("_cpu")):
            if selected is not None and not selected.search(name):
                continue
            bare = name[:-len("_cpu")]
            why = excluded(bare)
            if why is not None:
                skipped[bare] = why
            else:
                suite.addTest(case(name))
    return suite, skipped


def run_conformance(kinds: Iterable[str] = ("node",), pattern: str | None = None,
                    progress: bool = False) -> Report:
    """Run the selected ONNX backend tests through neuronx_cc_lite.backend; return every test's outcome."""
    import neuronx_cc_lite.backend as backend

    kinds = tuple(kinds)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown kind(s) {sorted(unknown)}; kinds: {', '.join(KINDS)}")
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the test-case generators warn about the overflows they test
        suite, excluded_tests = build_suite(kinds, pattern)
        models = _test_models(kinds)
    labels = _labels(models)
    report = Report()
    for name, why in excluded_tests.items():
        report.records.append(Record(name, models.get(name, ("?", None))[0], labels.get(name, "?"), "excluded",
                                     f"excluded: {why}"))
    total = suite.countTestCases() + len(excluded_tests)

    def on_record(name: str, outcome: str, reason: str, detail: str, seconds: float) -> None:
        kind, model = models.get(name, ("?", None))
        folded = specialized = False
        if outcome == "skipped" and model is not None and reason == "Not compatible with backend":
            reason = _first_line(backend.analyze(model).reason) or reason  # the model tests ask is_compatible
        if outcome == "passed" and model is not None:
            specialized = bool(backend._parameters(model)) and not backend.analyze(model).compatible
            folded = not specialized and not backend.analyze(model).device_ops  # all evaluated at compile time
        report.records.append(Record(name, kind, labels.get(name, "?"), outcome, reason, detail, seconds, folded,
                                     specialized))
        if progress:
            done = len(report.records)
            mark = {"passed": ".", "failed": "F", "skipped": "s", "excluded": "x", "errored": "E"}[outcome]
            sys.stderr.write(mark if done % 100 else f"{mark} {done}/{total}\n")
            sys.stderr.flush()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        suite.run(_Result(on_record))
    if progress:
        sys.stderr.write("\n")
    report.seconds = time.perf_counter() - start
    return report


# ---------------------------------------------------------------------------------------------------------------
# Printing

def format_report(report: Report, details: bool = False) -> str:
    c = report.counts
    lines = [f"ONNX backend tests through neuronx-cc-lite: {len(report.records)} tests in {report.seconds:.1f} s",
             f"  passed   {c['passed']}",
             f"  failed   {c['failed']}   (compatible, but a wrong answer or a crash)",
             f"  skipped  {c['skipped']}   (not supported by the compiler)",
             f"  errored  {c['errored']}   (harness errors)",
             f"  excluded {c['excluded']}   (EXCLUDE list)"]
    specialized = [r for r in report.records if r.specialized]
    if specialized:
        lines.append(f"  ({len(specialized)} of the passes compile with inputs the compiler needs at compile time "
                     "(shapes, axes, pads) built in from the test's values)")
    folded = [r for r in report.records if r.folded]
    if folded:
        lines.append(f"  ({len(folded)} of the passes never reach the device: the pass pipeline folds the whole "
                     f"model at compile time: {', '.join(r.name for r in folded)})")
    bad = report.of("failed") + report.of("errored")
    if bad:
        lines.append("")
        lines.append(f"Failures ({len(bad)}):")
        width = max(len(r.name) for r in bad)
        for r in bad:
            lines.append(f"  {r.name:<{width}}  {r.outcome.upper()}: {r.reason}")
            if details and r.detail:
                lines.extend("      " + ln for ln in r.detail.splitlines())
    lines.append("")
    lines.append("Per op:")
    table = report.per_op()
    width = max((len(op) for op in table), default=2)
    lines.append(f"  {'op':<{width}}  pass  fail  skip  excl  why skipped (the first reason)")
    for op, counts in table.items():
        reasons = [r.reason for r in report.records if r.op == op and r.outcome == "skipped"] or \
            [r.reason for r in report.records if r.op == op and r.outcome == "excluded"]
        why = re.sub(r"^NCC_UNSUPPORTED: 1 unsupported node\(s\): '[^']*' \([^)]*\): ", "", reasons[0]) if reasons else ""
        fail = counts["failed"] + counts["errored"]
        lines.append(f"  {op:<{width}}  {counts['passed']:>4}  {fail:>4}  {counts['skipped']:>4}  "
                     f"{counts['excluded']:>4}  {why[:110]}".rstrip())
    return "\n".join(lines)


def to_json(report: Report) -> dict[str, Any]:
    return {"counts": report.counts, "seconds": round(report.seconds, 2),
            "per_op": {op: dict(c) for op, c in report.per_op().items()},
            "exclude": [{"pattern": p, "reason": r} for p, r in EXCLUDE],
            "tests": [asdict(r) for r in report.records]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pattern", metavar="REGEX",
                        help="run only the tests whose name matches this regex, searched (as BackendTest.include "
                        "does) in the name with its device suffix: '^test_gemm_', '^test_relu_cpu$'")
    parser.add_argument("--models", action="store_true",
                        help="also run the model tests: " + ", ".join(MODEL_KINDS))
    parser.add_argument("--kinds", help="comma-separated kinds to run instead (node, " + ", ".join(MODEL_KINDS)
                        + ")")
    parser.add_argument("--list-failures", action="store_true",
                        help="under each failure, print its full message and innermost stack frames")
    parser.add_argument("--json", metavar="PATH", help="write every test's outcome, and the counts, to PATH")
    parser.add_argument("--progress", action="store_true", help="print a mark per test on stderr")
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",") if args.kinds else ["node", *(MODEL_KINDS if args.models else ())]
    report = run_conformance(kinds, args.pattern, progress=args.progress)
    print(format_report(report, details=args.list_failures))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(report), f, indent=1)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
