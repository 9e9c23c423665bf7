"""Time the compile of BERT-base (12 layers, hidden 768, seq 128; benchmarks/cases.py's `bert_base`) from a file,
as `neuronx-cc-lite compile bert.onnx` does it: the model is built and saved first, then compiled without the
compile cache, best of `--repeat`. Each compile's row gives its wall and CPU seconds (the machine may be shared:
CPU seconds vary less) and the seconds of each phase (writing the bundle file is what the phases leave out).

    .venv/bin/python benchmarks/compile_time.py                 # the modern export form
    .venv/bin/python benchmarks/compile_time.py --legacy        # the decomposed LayerNorm/GELU form
    .venv/bin/python benchmarks/compile_time.py --profile out.prof   # cProfile of one compile
    .venv/bin/python benchmarks/compile_time.py --chain 10000,20000,40000,100000   # elementwise chains instead

A chain (benchmarks/cases.py's `chain`: Neg and Relu in turn over [1, 64]) is compiled from memory; its row gives
the best wall and CPU seconds and the CPU microseconds per node, whose growth with the node count shows any
super-linear part (the machine is shared: CPU seconds vary less than wall seconds).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import onnx  # noqa: E402

import neuronx_cc_lite  # noqa: E402
from neuronx_cc_lite import progress  # noqa: E402
from benchmarks.cases import bert_base, chain  # noqa: E402


def compile_seconds(path: str, output: str) -> tuple[float, float, dict[str, float]]:
    """Wall seconds, CPU seconds and the phases' seconds of one compile."""
    wall, cpu = time.perf_counter(), time.process_time()
    with progress.timed() as phases:
        neuronx_cc_lite.compile(path, output=output, cache=False)
    return time.perf_counter() - wall, time.process_time() - cpu, phases


def chain_rows(sizes: list[int], repeat: int) -> None:
    print(f"{'nodes':>8} {'wall s':>8} {'CPU s':>8} {'CPU us/node':>12}")
    for n in sizes:
        model = chain(n)
        best_wall = best_cpu = float("inf")
        for _ in range(repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            neuronx_cc_lite.compile(model, cache=False)
            best_wall = min(best_wall, time.perf_counter() - wall)
            best_cpu = min(best_cpu, time.process_time() - cpu)
        print(f"{n:>8} {best_wall:>8.1f} {best_cpu:>8.1f} {1e6 * best_cpu / n:>12.0f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--legacy", action="store_true", help="the legacy export form (opset 13, decomposed ops)")
    parser.add_argument("--repeat", type=int, default=3, help="compiles to take the best of")
    parser.add_argument("--profile", metavar="FILE", help="cProfile one compile into FILE and print its top costs")
    parser.add_argument("--chain", metavar="N,N,...", help="time elementwise chains of these node counts instead")
    args = parser.parse_args(argv)
    if args.chain:
        chain_rows([int(n) for n in args.chain.split(",")], args.repeat)
        return 0
    logging.basicConfig(level=logging.INFO, format="  %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        path, output = os.path.join(tmp, "bert_base.onnx"), os.path.join(tmp, "bert_base.neff")
        onnx.save(bert_base(args.legacy), path)
        print(f"BERT-base ({'legacy' if args.legacy else 'modern'} form): {os.path.getsize(path) / 1e6:.0f} MB")
        if args.profile:
            import cProfile
            import pstats

            cProfile.runctx("compile_seconds(path, output)", globals(), locals(), args.profile)
            pstats.Stats(args.profile).sort_stats("cumulative").print_stats(40)
            pstats.Stats(args.profile).sort_stats("tottime").print_stats(25)
            return 0
        walls, cpus = [], []
        for _ in range(args.repeat):
            wall, cpu, phases = compile_seconds(path, output)
            walls.append(wall)
            cpus.append(cpu)
            print(f"compile: {wall:.2f} s ({cpu:.2f} s CPU): " +
                  ", ".join(f"{name} {seconds:.2f}" for name, seconds in phases.items()), flush=True)
        print(f"best of {len(walls)}: {min(walls):.2f} s ({min(cpus):.2f} s CPU); "
              f"bundle {os.path.getsize(output) / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
