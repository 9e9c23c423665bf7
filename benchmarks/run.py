"""Measure the compiler's code: for each case, simulated latency against the roofline, MFU, MBU, engine shares,
compile time, and the simulator's host time per inference next to onnxruntime's (one thread each). Every run is
also checked against onnxruntime, so a fast wrong answer shows.

    .venv/bin/python benchmarks/run.py                  # every case (several minutes)
    .venv/bin/python benchmarks/run.py --quick          # the small cases and models/ only
    .venv/bin/python benchmarks/run.py bert12_bf16 add_4096 --json out.json

The figures are ratios measured in one run on this machine: latency / roofline from the cost model (isa/costs.py),
host times from the wall clock.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

# No threading variables: the simulator sets BLAS to one thread itself (runtime/threads.py), as a user's run gets
# it; onnxruntime's session is given one thread below.
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import runtime  # noqa: E402
from benchmarks.cases import CASES, Case, bert_layers, model_cases  # noqa: E402
from isa import bundle as bundle_format  # noqa: E402
from neuronx_cc_lite.compiler import Options, compile_model  # noqa: E402
from neuronx_cc_lite.reference import bundle_inputs, error_over_rms, onnxruntime_session  # noqa: E402
from runtime.profile import summarize  # noqa: E402


@dataclass
class Row:
    case: str
    latency_us: float
    roofline_us: float
    bound: str
    ratio: float
    mfu: float
    mbu: float
    pe: float
    act: float
    dve: float
    pool: float
    dma: float
    dma_queues: int
    compile_s: float
    sim_ms: float  # simulator host time per inference
    ort_ms: float  # onnxruntime, one thread
    err: float  # max |error| / rms of the reference, over the outputs


def _best_of(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(case: Case, repeat: int = 2) -> Row:
    proto = case.build()
    options = Options(**case.options)  # type: ignore[arg-type]
    start = time.perf_counter()
    b = compile_model(proto, options)
    compile_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{case.name}.neff")
        bundle_format.write(b, path)
        model = runtime.load(path)
    inputs = bundle_inputs(b)
    actual = model.run(inputs, trace=True)
    s = summarize(model)
    sim = _best_of(lambda: model.run(inputs), repeat)
    session = onnxruntime_session(proto, threads=1)
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(names, inputs)))
    ort = _best_of(lambda: session.run(names, inputs), max(repeat, 3))
    err = max(error_over_rms(actual[k], expected[k]) for k in names)
    e = s.engines
    return Row(case.name, s.latency_us, s.roofline_us, s.bound, s.ratio, s.mfu, s.mbu, e.get("PE", 0.0),
               e.get("ACT", 0.0), e.get("DVE", 0.0), e.get("POOL", 0.0), e.get("DMA", 0.0), s.dma_queues_used,
               compile_s, sim * 1000, ort * 1000, err)


def compile_scaling(repeat: int = 3) -> tuple[float, float]:
    """Best-of compile times of the encoder at 1 and at 12 layers (fp32): compile time must stay linear."""
    times = []
    for layers in (1, 12):
        proto = bert_layers(layers)
        times.append(_best_of(lambda: compile_model(proto, Options()), repeat))
    return times[0], times[1]


HEADER = (f"{'case':<16} {'latency us':>11} {'roofline us':>11} {'ratio':>6} {'MFU':>5} {'MBU':>5}  "
          f"{'PE':>4} {'ACT':>4} {'DVE':>4} {'POOL':>4} {'DMA':>4} {'q':>2}  {'compile s':>9} {'sim ms':>8} "
          f"{'ORT ms':>7} {'sim/ORT':>7} {'err/rms':>8}")


def format_row(r: Row) -> str:
    return (f"{r.case:<16} {r.latency_us:>11.1f} {r.roofline_us:>11.1f} {r.ratio:>6.2f} {r.mfu:>5.0%} "
            f"{r.mbu:>5.0%}  {r.pe:>4.0%} {r.act:>4.0%} {r.dve:>4.0%} {r.pool:>4.0%} {r.dma:>4.0%} "
            f"{r.dma_queues:>2}  {r.compile_s:>9.2f} {r.sim_ms:>8.1f} {r.ort_ms:>7.2f} "
            f"{r.sim_ms / max(r.ort_ms, 1e-9):>7.1f} {r.err:>8.1e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help="case names (default: every case and every model in models/)")
    parser.add_argument("--quick", action="store_true", help="leave out the large cases")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    every = CASES + model_cases()
    known = {c.name: c for c in every}
    unknown = [n for n in args.cases if n not in known]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(known)}")
    chosen = [known[n] for n in args.cases] if args.cases else [c for c in every if not (args.quick and c.large)]
    print("engines: share of the run each was active (DMA: mean over the 16 queues; q: queues used); MBU: bytes "
          "across HBM / (time x one core's DMA bandwidth)")
    print(HEADER)
    rows = []
    for case in chosen:
        row = measure(case)
        rows.append(row)
        print(format_row(row), flush=True)
    if any(c.name.startswith("bert12") for c in chosen):
        one, twelve = compile_scaling()
        print(f"compile time of the encoder: {one:.2f} s at 1 layer, {twelve:.2f} s at 12 ({twelve / one:.1f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
