"""Run a range of seeds of one fuzz category in this process under a memory limit, each case under a time limit;
print one JSON line per failure ({"category", "seed", "failure"}), then one with the count of each outcome
({"outcomes": {"ran": n, "NRT_LOAD": n, ...}}).

    python -m tests.fuzz.worker CATEGORY FIRST_SEED COUNT [SEED ...]

Run by tests/test_fuzz_tier.py in a subprocess, so that the address-space limit (RLIMIT_AS) binds only the
cases: a case that would allocate past it fails with MemoryError, which is a failure like any other.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import sys
import tempfile

MEMORY_LIMIT = 3 << 30  # bytes of address space for the whole worker (imports included: about 1.3 GB)
CASE_SECONDS = 10


class _TooLong(BaseException):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _TooLong()


def main(argv: list[str]) -> int:
    category, first, count, *extra = argv
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, root)
    from isa import bundle as bundle_format
    from neuronx_cc_lite.compiler import Options, compile_model
    from neuronx_cc_lite.errors import CompileError
    from tests.fuzz.mutators import CASES, CODED, Base, coded_or_failure

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    signal.signal(signal.SIGALRM, _alarm)
    with open(os.path.join(root, "models", "mlp_small.onnx"), "rb") as f:
        model_bytes = f.read()
    tmp = tempfile.mkdtemp(prefix="fuzz-")
    bundle = compile_model(os.path.join(root, "models", "mlp_small.onnx"), Options())
    bundle_format.write(bundle, f"{tmp}/base.neff")
    base = Base(bundle, model_bytes, tmp)
    seeds = [int(s) for s in extra] + list(range(int(first), int(first) + int(count)))
    outcomes: dict[str, int] = {}
    for seed in seeds:
        failure, outcome = None, "ran"
        signal.alarm(CASE_SECONDS)
        try:
            outcome = CASES[category](base, random.Random(f"{category}-{seed}")) or "ran"
        except (*CODED, CompileError) as e:
            failure, outcome = coded_or_failure(e), e.code
        except _TooLong:
            failure = f"took more than {CASE_SECONDS} s"
        except MemoryError:
            failure = f"ran out of its {MEMORY_LIMIT >> 30} GiB"
        except Exception as e:  # noqa: BLE001 - anything else is what the fuzzer looks for
            failure = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            signal.alarm(0)
        if failure:
            print(json.dumps({"category": category, "seed": seed, "failure": failure}), flush=True)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(json.dumps({"outcomes": outcomes}), flush=True)  # what the cases ended in: runs and which codes
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
