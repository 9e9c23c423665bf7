"""The fuzzing tier (issues 9 and 21): 2,350 seeded hostile inputs over the bundle container, the manifest, the
streams, the listing grammar, npz inputs, ONNX files, compile cache entries and special files given as paths
(tests/fuzz/mutators.py). Each must end in a correct run or one
coded line, within 10 s and a 3 GiB address space (tests/fuzz/worker.py runs each category in a subprocess under
those limits). Seeds that once failed stay in REGRESSIONS, run before the fresh ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

CASES = {"bundle": 500, "manifest": 500, "stream": 400, "listing": 300, "npz": 150, "onnx": 200,
         "cache": 150, "files": 150}  # the last two: issue 21's compile cache entries and special files
# category -> seeds that found a bug once (kept so that it stays fixed)
REGRESSIONS: dict[str, list[int]] = {}


def test_the_tier_holds_at_least_2000_cases():
    assert sum(CASES.values()) >= 2000


@pytest.mark.parametrize("category", sorted(CASES))
def test_hostile_inputs_end_in_a_run_or_a_coded_line(category):
    seeds = [str(s) for s in REGRESSIONS.get(category, [])]
    result = subprocess.run([sys.executable, "-m", "tests.fuzz.worker", category, "0", str(CASES[category]), *seeds],
                            cwd=ROOT, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    failures = [line for line in lines if "failure" in line]
    assert not failures, f"{len(failures)} failing case(s), first: " + "; ".join(
        f"seed {f['seed']}: {f['failure']}" for f in failures[:5])
    outcomes = lines[-1]["outcomes"]
    assert sum(outcomes.values()) == CASES[category] + len(seeds)
    # the cases reach deep: into runs and into more than one kind of refusal, not one early check
    assert len(outcomes) >= 2, outcomes
