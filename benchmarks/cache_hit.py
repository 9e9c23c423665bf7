"""Time compile cache misses and hits on the command line, for BERT-base (benchmarks/cases.py's `bert_base`: 438 MB
of weights) and bert12 (hidden 256, 12 layers), each saved with its weights in an external data file as torch.onnx
exports it. Per model: the miss (compile, store the entry, copy it to -o), the first hit straight after it (the
writer hashed the bundle as it wrote it and waited for the file system's clock to pass the file's last change, so
this hit trusts the entry's identity as the later ones do: no payload is hashed), then hits written to an existing
output (replacing it) and to a new one. Times are the wall time of `neuronx-cc-lite compile MODEL -o OUT` (process start
and imports included; best and all of --repeat), with the CPU time of the best; the load average is printed with them
because the machine they are measured on is shared, and so is the command's floor at that load (`--version`).

    .venv/bin/python benchmarks/cache_hit.py [--repeat N] [--models bert_base,bert12,PATH.onnx]

A PATH.onnx (an export of your own) is copied, with the external data files it names, into a temporary folder
first: nothing is written beside it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import onnx  # noqa: E402

from benchmarks.cases import bert12, bert_base  # noqa: E402

MODELS = {"bert_base": lambda: bert_base(False), "bert12": bert12}
COMMAND = os.path.join(os.path.dirname(sys.executable), "neuronx-cc-lite")


def timed(argv: list[str]) -> tuple[float, float, float]:
    """The wall time, the CPU time (user + system) and the system time of a command run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    system = after.ru_stime - before.ru_stime
    return wall, after.ru_utime - before.ru_utime + system, system


def best(runs: list[tuple[float, float, float]]) -> str:
    wall, cpu, system = min(runs)
    walls = ", ".join(f"{r[0]:.2f}" for r in runs)
    return f"{wall:.2f} s ({cpu:.2f} s CPU, {system:.2f} in the kernel; all: {walls} s)"


def load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def saved(name: str, tmp: str) -> tuple[str, int]:
    """The model `name` (one of MODELS, or the path of an .onnx file) saved or copied into `tmp`, with its external
    data; and the size of that data."""
    if name in MODELS:
        model = os.path.join(tmp, f"{name}.onnx")
        onnx.save(MODELS[name](), model, save_as_external_data=True, location=f"{name}.onnx.data")
        return model, os.path.getsize(model + ".data")
    from neuronx_cc_lite.model_files import external_paths

    model = os.path.join(tmp, os.path.basename(name))
    shutil.copyfile(name, model)
    data = external_paths(onnx.load(name, load_external_data=False), os.path.dirname(os.path.abspath(name)))
    for path in data:  # beside the model, as external_paths checks
        shutil.copyfile(path, os.path.join(tmp, os.path.basename(path)))
    return model, sum(os.path.getsize(path) for path in data)


def stored_state(directory: str) -> str:
    """Whether the miss left what the next hit needs to read nothing large: an entry whose .key trusts its identity,
    and a record of the model's digest."""
    trusted = []
    for path in glob.glob(os.path.join(directory, "*", "*.key")):
        with open(path) as f:
            trusted.append(json.load(f)["trusted"])
    records = glob.glob(os.path.join(directory, "files", "*.json"))
    return f"entries stored trusted: {trusted}, model digests remembered: {len(records)}"


def bench(name: str, repeat: int, tmp: str) -> None:
    model, weights = saved(name, tmp)
    directory = os.path.join(tmp, "cache")
    name = os.path.basename(model)[:-len(".onnx")]
    # no wait: the miss remembers the model's digest once the file system's clock has passed its save (a few ms)
    compile_ = [COMMAND, "compile", model, "--cache-dir", directory, "-q", "-o"]
    same, fresh = os.path.join(tmp, f"{name}.neff"), os.path.join(tmp, f"{name}-new.neff")
    miss = timed([*compile_, same])
    stored = stored_state(directory)
    first = timed([*compile_, same])  # at once: an entry is trusted from its store
    hits = [timed([*compile_, same]) for _ in range(repeat)]
    fresh_hits = []
    for _ in range(repeat):
        if os.path.exists(fresh):
            os.unlink(fresh)
        fresh_hits.append(timed([*compile_, fresh]))
    floor = [timed([COMMAND, "--version"]) for _ in range(repeat)]
    print(f"{name} ({weights / 1e6:.0f} MB of external weights), {load()}:\n"
          f"  the command's floor (--version):          {best(floor)}\n"
          f"  miss (compile, store, copy to -o):        {best([miss])}; {stored}\n"
          f"  first hit, straight after the miss:       {best([first])}\n"
          f"  hit, -o replacing the last output:        {best(hits)}\n"
          f"  hit, -o a new file:                       {best(fresh_hits)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="hits to time of each kind")
    parser.add_argument("--models", default="bert_base,bert12",
                        help="which of: " + ", ".join(MODELS) + ", or paths of .onnx files")
    args = parser.parse_args(argv)
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            bench(name, args.repeat, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
