"""A single weight over 2 GB: a model y = x @ W with one [K, N] fp32 MatMul weight (an LM head's shape: K the hidden
size, N the vocabulary) in ONNX external data, compiled in one child process and loaded and run in another, each
process's peak resident memory (VmHWM), wall time and CPU time printed beside the weight's size.

    .venv/bin/python benchmarks/big_weight.py [--k 4096] [--n 134400] [--batch 2] [--json OUT.json]

The defaults make a 2.2 GB weight (4096 x 134400 fp32). The peak is the child's own (VmHWM: ru_maxrss would carry
over the parent's RSS across exec), measured from the process's start, interpreter and imports included; the
baseline (its RSS once the compiler and runtime are imported) is printed too. The answer is checked against numpy
(the weight read from its file a slice of columns at a time, so the check adds little to the parent's memory).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
from onnx import TensorProto, external_data_helper, helper, save  # noqa: E402

# the child: imports what a compile or a run needs, notes its RSS, does the phase, prints the RSS and its peak (KiB)
WORKER = """
import json, os, resource, sys, time
import numpy as np
import onnx.checker, onnx.shape_inference
import neuronx_cc_lite, neuronx_cc_lite.compiler, runtime

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

folder, phase = sys.argv[1], sys.argv[2]
baseline = status("VmRSS")
start = time.perf_counter()
if phase == "compile":
    neuronx_cc_lite.compile(os.path.join(folder, "model.onnx"), output=os.path.join(folder, "model.neff"),
                            cache=False)
else:
    model = runtime.load(os.path.join(folder, "model.neff"))
    np.save(os.path.join(folder, "y.npy"), model.run({"x": np.load(os.path.join(folder, "x.npy"))})["y"])
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"baseline_kib": baseline, "peak_kib": status("VmHWM"), "seconds": time.perf_counter() - start,
                  "cpu_seconds": usage.ru_utime + usage.ru_stime}))
"""


def build(folder: str, k: int, n: int, batch: int) -> int:
    """Write model.onnx (y = x @ W), W's bytes in weights.data (written a block of rows at a time, so the parent never
    holds the whole weight) and x.npy; returns the weight's bytes."""
    rng = np.random.default_rng(0)
    scale = np.float32(3.4 / np.sqrt(k))
    with open(os.path.join(folder, "weights.data"), "wb") as f:
        for row in range(0, k, 256):
            block = rng.random((min(256, k - row), n), dtype=np.float32)
            block -= np.float32(0.5)
            block *= scale
            f.write(block.data)
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[k, n], raw_data=b"")
    external_data_helper.set_external_data(w, "weights.data", offset=0, length=k * n * 4)
    w.ClearField("raw_data")  # the bytes are in the file only
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "big_weight",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, n])], [w])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), os.path.join(folder, "model.onnx"))
    np.save(os.path.join(folder, "x.npy"), rng.standard_normal((batch, k), dtype=np.float32))
    return k * n * 4


def reference(folder: str, k: int, n: int) -> np.ndarray:
    """x @ W in float64, W read from its file in slices of columns."""
    x = np.load(os.path.join(folder, "x.npy")).astype(np.float64)
    w = np.memmap(os.path.join(folder, "weights.data"), np.float32, "r", shape=(k, n))
    step = max(1, (64 << 20) // (4 * k))
    return np.concatenate([x @ np.asarray(w[:, c:c + step], np.float64) for c in range(0, n, step)], axis=1)


def phase(folder: str, name: str) -> dict[str, float]:
    """Run WORKER's `name` phase in a fresh process; its json line."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", WORKER, folder, name], capture_output=True, text=True, env=env,
                          cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"the {name} phase failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(folder: str, k: int, n: int, batch: int) -> dict[str, object]:
    """Build, compile and run in `folder`; the weight's bytes, each phase's figures and the largest error against
    numpy relative to the answer's RMS."""
    weight = build(folder, k, n, batch)
    compiled = phase(folder, "compile")
    ran = phase(folder, "run")
    y = np.load(os.path.join(folder, "y.npy"))
    expected = reference(folder, k, n)
    error = float(np.max(np.abs(y - expected)) / np.sqrt(np.mean(expected ** 2)))
    return {"k": k, "n": n, "batch": batch, "weight_bytes": weight, "compile": compiled, "run": ran,
            "max_error_over_rms": error}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=4096, help="the weight's rows (the MatMul's contraction)")
    p.add_argument("--n", type=int, default=134400, help="the weight's columns")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--json", metavar="OUT.json")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        result = measure(folder, args.k, args.n, args.batch)
        result["seconds"] = time.perf_counter() - start
    weight = result["weight_bytes"]
    print(f"one [{args.k}, {args.n}] fp32 weight, {weight / 1e9:.2f} GB; error {result['max_error_over_rms']:.1e} "
          f"of the answer's RMS")
    for name in ("compile", "run"):
        r = result[name]
        print(f"  {name:8} peak {r['peak_kib'] * 1024 / 1e9:5.2f} GB ({r['peak_kib'] * 1024 / weight:.2f}x the weight; "
              f"{r['baseline_kib'] * 1024 / 1e9:.2f} GB after imports), {r['seconds']:.1f} s "
              f"({r['cpu_seconds']:.1f} s of CPU, imports included)")
    print(f"  total {result['seconds']:.0f} s (model written, compiled, run, checked)")
    if args.json:
        with open(args.json, "x") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
