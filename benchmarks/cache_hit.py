"""Time a compile cache hit for BERT-base (benchmarks/cases.py's `bert_base`, 438 MB of weights in the model file):
a miss (compile, store, write the output), then hits writing the same output, from Python and on the command line.
A hit checks an entry in full (its payload's sha256) until it has been checked once after it settled
(cache.TRUST_AFTER seconds after it was written); later hits trust its identity and read only its manifest and
streams, and write the output as a hard link to the entry.

    .venv/bin/python benchmarks/cache_hit.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import onnx  # noqa: E402

import neuronx_cc_lite  # noqa: E402
from benchmarks.cases import bert_base  # noqa: E402
from neuronx_cc_lite import cache  # noqa: E402


def seconds(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="hits to time")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model, output, directory = (os.path.join(tmp, name) for name in ("bert_base.onnx", "out.neff", "cache"))
        onnx.save(bert_base(False), model)
        time.sleep(cache.TRUST_AFTER)  # a file changed this recently is hashed at every compile
        compile_ = lambda: neuronx_cc_lite.compile(model, cache_dir=directory, output=output)  # noqa: E731
        print(f"BERT-base: {os.path.getsize(model) / 1e6:.0f} MB model, miss (compile + store + write): "
              f"{seconds(compile_):.2f} s", flush=True)
        time.sleep(cache.TRUST_AFTER)
        print(f"first hit (the entry checked in full): {seconds(compile_):.2f} s", flush=True)
        hits = [seconds(compile_) for _ in range(args.repeat)]
        print(f"hits from Python: {', '.join(f'{t:.2f}' for t in hits)} s (best {min(hits):.2f} s)", flush=True)
        # the command line records --model-type in the bundle: its own entry, missed once and checked once
        command = [os.path.join(os.path.dirname(sys.executable), "neuronx-cc-lite"), "compile", model, "-o", output,
                   "--cache-dir", directory, "-q"]
        subprocess.run(command, check=True)
        time.sleep(cache.TRUST_AFTER)
        subprocess.run(command, check=True)
        walls = [seconds(lambda: subprocess.run(command, check=True)) for _ in range(args.repeat)]
        print(f"hits on the command line (wall, process start and imports included): "
              f"{', '.join(f'{t:.2f}' for t in walls)} s (best {min(walls):.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
