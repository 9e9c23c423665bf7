"""Time compile cache misses and hits on the command line, for BERT-base (benchmarks/cases.py's `bert_base`: 438 MB
of weights) and bert12 (hidden 256, 12 layers), each saved with its weights in an external data file as torch.onnx
exports it. Per model: the miss (compile, store the entry, copy it to -o), the first hit (the entry just written is
checked in full: its payload's sha256), then hits that trust the entry's identity, written to an existing output
(replacing it) and to a new one. Times are the wall time of `neuronx-cc-lite compile MODEL -o OUT` (process start
and imports included; best and all of --repeat), with the CPU time of the best; the load average is printed with them
because the machine they are measured on is shared, and so is the command's floor at that load (`--version`).

    .venv/bin/python benchmarks/cache_hit.py [--repeat N] [--models bert_base,bert12]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import onnx  # noqa: E402

from benchmarks.cases import bert12, bert_base  # noqa: E402
from neuronx_cc_lite import cache  # noqa: E402

MODELS = {"bert_base": lambda: bert_base(False), "bert12": bert12}
COMMAND = os.path.join(os.path.dirname(sys.executable), "neuronx-cc-lite")


def timed(argv: list[str]) -> tuple[float, float]:
    """The wall time and the CPU time (user + system) of a command run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def best(runs: list[tuple[float, float]]) -> str:
    wall, cpu = min(runs)
    return f"{wall:.2f} s ({cpu:.2f} s CPU; all: {', '.join(f'{w:.2f}' for w, _ in runs)} s)"


def load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def bench(name: str, repeat: int, tmp: str) -> None:
    model, directory = os.path.join(tmp, f"{name}.onnx"), os.path.join(tmp, "cache")
    onnx.save(MODELS[name](), model, save_as_external_data=True, location=f"{name}.onnx.data")
    weights = os.path.getsize(model + ".data")
    time.sleep(cache.TRUST_AFTER)  # a model file is older than that, as a user's are: its digest is remembered
    compile_ = [COMMAND, "compile", model, "--cache-dir", directory, "-q", "-o"]
    same, fresh = os.path.join(tmp, f"{name}.neff"), os.path.join(tmp, f"{name}-new.neff")
    miss = timed([*compile_, same])
    time.sleep(cache.TRUST_AFTER)  # an entry is trusted by its identity once it has been unchanged that long
    first = timed([*compile_, same])
    hits = [timed([*compile_, same]) for _ in range(repeat)]
    fresh_hits = []
    for _ in range(repeat):
        if os.path.exists(fresh):
            os.unlink(fresh)
        fresh_hits.append(timed([*compile_, fresh]))
    floor = [timed([COMMAND, "--version"]) for _ in range(repeat)]
    print(f"{name} ({weights / 1e6:.0f} MB of weights in {os.path.basename(model)}.data), {load()}:\n"
          f"  the command's floor (--version):          {best(floor)}\n"
          f"  miss (compile, store, copy to -o):        {best([miss])}\n"
          f"  first hit (the new entry hashed in full): {best([first])}\n"
          f"  hit, -o replacing the last output:        {best(hits)}\n"
          f"  hit, -o a new file:                       {best(fresh_hits)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="hits to time of each kind")
    parser.add_argument("--models", default="bert_base,bert12", help="which of: " + ", ".join(MODELS))
    args = parser.parse_args(argv)
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            bench(name, args.repeat, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
