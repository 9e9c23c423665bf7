"""The SHA-256 of the bundle bytes of every model in models/ and of BERT-base (benchmarks/cases.py's `bert_base`)
at tp 1 and 2 and with matmult auto-cast: a change meant only to make the compiler faster must leave every one of
them the same.

    .venv/bin/python benchmarks/bundle_hashes.py --save /tmp/before.json      # on the code before the change
    .venv/bin/python benchmarks/bundle_hashes.py --against /tmp/before.json   # after it: exit 1 if any differs

Each model compiles without the compile cache, with the defaults of `neuronx-cc-lite compile` (trn1).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import neuronx_cc_lite  # noqa: E402
from benchmarks.cases import bert_base  # noqa: E402
from isa import bundle as bundle_format  # noqa: E402


def cases() -> Iterator[tuple[str, Callable[[], Any], dict[str, Any]]]:
    """(name, model or path maker, compile options) for each bundle to hash."""
    for path in sorted(glob.glob(os.path.join(ROOT, "models", "*.onnx"))):
        yield os.path.basename(path), lambda path=path: path, {}
    yield "bert_base tp1", bert_base, {}
    yield "bert_base tp2", bert_base, {"tp": 2}
    yield "bert_base matmult", bert_base, {"auto_cast": "matmult"}


def hashes(only: str | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, model, options in cases():
        if only and only not in name:
            continue
        start = time.perf_counter()
        data = bundle_format.to_bytes(neuronx_cc_lite.compile(model(), cache=False, **options))
        found[name] = hashlib.sha256(data).hexdigest()
        print(f"{name:<28} {found[name][:16]}  {len(data) / 1e6:8.1f} MB  {time.perf_counter() - start:6.1f} s",
              flush=True)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--save", metavar="FILE", help="write the hashes to FILE (JSON); FILE must not exist")
    parser.add_argument("--against", metavar="FILE", help="compare with the hashes saved in FILE")
    parser.add_argument("--only", metavar="TEXT", help="only the cases whose name contains TEXT")
    args = parser.parse_args(argv)
    if args.save and os.path.lexists(args.save):
        parser.error(f"--save {args.save}: exists; not overwritten")
    expected = None
    if args.against:
        try:
            with open(args.against) as f:
                expected = json.load(f)
        except (OSError, ValueError) as e:
            parser.error(f"--against {args.against}: {e}")
    found = hashes(args.only)
    if args.save:
        with open(args.save, "x") as f:
            json.dump(found, f, indent=1)
    if expected is None:
        return 0
    differ = [name for name in found if expected.get(name) != found[name]]
    for name in differ:
        print(f"differs: {name}", file=sys.stderr)
    print(f"{len(found) - len(differ)} of {len(found)} bundles the same")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
