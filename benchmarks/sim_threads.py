"""Time `neuronx-cc-lite run` of ResNet-18 (bf16 matmuls) and BERT-base (fp32) with no threading variables set,
as a user runs it, and with OPENBLAS_NUM_THREADS=1, as the benchmarks used to set it: the runtime chooses its own
BLAS threading (runtime/threads.py), so the two should be within noise of each other.

    .venv/bin/python benchmarks/sim_threads.py                  # both models, best of 3 each way
    .venv/bin/python benchmarks/sim_threads.py resnet18 --repeat 5

Each timing is the wall time of one `run` command in a fresh process (loading the bundle, placing the weights,
simulating, writing the outputs), the two settings alternating so that a busy spell of the machine hits both.
The models are compiled once (through the compile cache) into a scratch directory with seeded inputs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import onnx  # noqa: E402

import neuronx_cc_lite  # noqa: E402
from benchmarks.cases import BF16, bert_base, resnet18  # noqa: E402
from neuronx_cc_lite.reference import bundle_inputs  # noqa: E402

MODELS = {"resnet18": (resnet18, BF16), "bert_base": (bert_base, {})}
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
CLI = os.path.join(os.path.dirname(sys.executable), "neuronx-cc-lite")


def prepare(name: str, scratch: str) -> tuple[str, str]:
    """The bundle and an inputs file of `name`, in `scratch`."""
    build, options = MODELS[name]
    path, neff, inputs = (os.path.join(scratch, f"{name}{ext}") for ext in (".onnx", ".neff", ".npz"))
    onnx.save(build(), path)
    bundle = neuronx_cc_lite.compile(path, output=neff, **options)
    np.savez(inputs, **bundle_inputs(bundle, 0))
    return neff, inputs


def run_seconds(neff: str, inputs: str, out: str, one_thread: bool) -> float:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    if one_thread:
        env["OPENBLAS_NUM_THREADS"] = "1"
    start = time.perf_counter()
    subprocess.run([CLI, "-q", "run", neff, "--inputs", inputs, "--outputs", out], env=env, check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", metavar="MODEL", help=f"which models: {', '.join(MODELS)} (default: both)")
    parser.add_argument("--repeat", type=int, default=3, help="runs each way, the best taken")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(MODELS)}")
    args.models = args.models or list(MODELS)
    print(f"{'model':<12} {'no variables s':>15} {'OPENBLAS_NUM_THREADS=1 s':>25} {'ratio':>6}   "
          f"({os.cpu_count()} cores, best of {args.repeat})", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            neff, inputs = prepare(name, scratch)
            out = os.path.join(scratch, "out.npz")
            default, one = [], []
            for _ in range(args.repeat):
                default.append(run_seconds(neff, inputs, out, one_thread=False))
                one.append(run_seconds(neff, inputs, out, one_thread=True))
            print(f"{name:<12} {min(default):>15.2f} {min(one):>25.2f} {min(default) / min(one):>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
