"""How fast a batch-1 convolution network can run on the chip model, whatever the compiler does: the least
TensorE time its convolutions need, and the dependent instructions of its squeeze-and-excitation blocks that
nothing else can overlap. The arithmetic behind the README's account of MobileNetV3 (issue 17's 2.0x goal).

    .venv/bin/python benchmarks/pe_floor.py [NAME ...] [--exporter dynamo|torchscript] [--target T]

NAME is a family of benchmarks/exports.py (mobilenet_v3 by default) or an ONNX file. Per model, in bf16 and
fp32 (a matmul pass each fp32 instruction takes four of, CHIP.md):
- depthwise convolutions: on PE an output pixel's column through the array does at most one useful multiply-add
  per partition (each partition holds one input value of that pixel's window; PE sums across partitions, and a
  depthwise output reads one channel), so PE needs at least MACs / 128 columns; VectorE can take taps too, one
  scalar_tensor_tensor per tap and 128 channels (its scalar, the tap's weight, is one per partition), each at its
  cost by the cost model, fixed costs included (isa/costs.py; the accumulator in PSUM, one input a cycle); a layer
  shared between the two takes at least PE's time and VectorE's for all of it combined as two servers of one
  divisible job (1 / (1/PE + 1/VectorE)). GpSimdE shares VectorE's SBUF port; ScalarE cannot accumulate. With a
  diagonal stationary per tap and 128 channels, as lower/depthwise.py lays them out (bands of rows for 64
  channels or fewer), PE takes taps x channel tiles x max(64, columns) cycles (`diagonal`);
- every other convolution and Gemm: its multiply-adds over the full 128 x 128 array, or for one row (a squeeze,
  a classifier) at least min(64 x output blocks, outputs) cycles per 128 input features (a matmul costs
  max(min(64, M), N) cycles);
- a squeeze-and-excitation block (a global mean, a 1x1 convolution, its activation, another, HardSigmoid, the
  gate's Mul): every later instruction needs its gate and the gate needs every depthwise output, so from the
  last depthwise tap to the next block's first, dependent instructions run one after another on ScalarE and
  VectorE while PE has nothing else to do: the depthwise output's activation (a HardSwish takes two: ScalarE
  has no function for it and VectorE's one-instruction forms hold one scalar operation beside the product), the
  mean (trn1's VectorE reduces only beside a scalar operation), the first activation and the HardSigmoid (each
  PE result leaves PSUM before a matmul reads it; the clamp rides with the scaling), the gate's scaling (of the
  projection's weights), the projection's evacuation, and the next expansion's activation (two for a HardSwish)
  (`se_steps`), each at least a dependent one-element instruction's cost (isa/costs.py) and a hand-off.
PE work adds up (one engine), and the squeeze-and-excitation chains add to it: their sum is a floor under the
latency of any schedule, which the goal (2.0x the roofline in bf16, 2.5x in fp32) is set against.

Then this compiler's own lowering of the model: the longest chain of dependent instructions in its tile program
(codegen/schedule.py dependency_chain_ns), each at its cost on the fastest engine that can run it and a hand-off
between engines. No schedule of that program is faster, however free the engines: a goal below it needs a
lowering with a shorter chain, not a better schedule.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# a squeeze-and-excitation block's dependent steps whatever its neighbours: the mean, the first activation, the
# HardSigmoid, the gate's scaling (the activations around it add theirs: _se_steps)
SE_STEPS = 4


def _activation_steps(op: str) -> int:
    """Dependent ScalarE/VectorE instructions a conv's output takes to leave PSUM through `op` (its reader): a
    HardSwish two, any other activation (or none, a plain evacuation) one."""
    return 2 if op == "HardSwish" else 1


def _se_steps(model) -> list[int]:  # type: ignore[no-untyped-def]
    """Per squeeze-and-excitation block (a HardSigmoid gate), its dependent steps (module docstring): SE_STEPS, the
    activation of what the mean reads, and where the gate scales a projection, its evacuation and the activation
    of the next convolution (the expansion) after it, through a residual Add."""
    nodes = list(model.graph.node)
    producer = {o: n for n in nodes for o in n.output}
    readers: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            readers.setdefault(i, []).append(n)

    def only_reader(name: str, *ops: str):  # type: ignore[no-untyped-def]
        found = readers.get(name, [])
        return found[0] if len(found) == 1 and found[0].op_type in ops else None

    counts = []
    for gate in (n for n in nodes if n.op_type == "HardSigmoid"):
        steps = SE_STEPS
        mul = only_reader(gate.output[0], "Mul")
        if mul is None:
            counts.append(steps)
            continue
        gated = next(i for i in mul.input if i != gate.output[0])  # what the mean and the gate read
        source = producer.get(gated)
        steps += _activation_steps(source.op_type if source is not None else "")
        projection = only_reader(mul.output[0], "Conv")
        if projection is not None:
            steps += 1
            out = projection.output[0]
            add = only_reader(out, "Add")
            # (a residual sum is read by the next expansion and by the next residual Add)
            convs = [r for r in readers.get(add.output[0] if add is not None else out, []) if r.op_type == "Conv"]
            expansion = convs[0] if len(convs) == 1 else None
            if expansion is not None:
                after = readers.get(expansion.output[0], [])
                steps += _activation_steps(after[0].op_type if len(after) == 1 else "")
        counts.append(steps)
    return counts


def _shapes(model) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(model)
    found = {i.name: list(i.dims) for i in inferred.graph.initializer}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        found[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    return found


def floor(path: str, target_name: str) -> dict[str, float]:
    import onnx

    from isa.dtypes import DType
    from isa.costs import duration_ns
    from isa.instructions import make
    from isa.functions import ActFunc, AluOp
    from isa.operand import Engine, Mem, Operand
    from isa.target import get_target

    target = get_target(target_name)
    pmax, ghz = target.partitions, target.pe_ghz
    model = onnx.load(path)
    shapes = _shapes(model)

    def vector_tap_ns(columns: int, dtype: DType) -> float:
        """One tap over 128 channels on VectorE: x * w + acc, the accumulator in PSUM."""
        x = Operand(Mem.SBUF, dtype, 0, pmax, 0, ((columns, 1),))
        acc = Operand(Mem.PSUM, DType.fp32, 0, pmax, 0, ((columns, 1),))
        weight = Operand(Mem.SBUF, DType.fp32, 0, pmax, 0, ((1, 1),))
        tap = make("scalar_tensor_tensor", dst=acc, src=x, op0=AluOp.multiply, scalar=weight, op1=AluOp.add, b=acc)
        return duration_ns(tap, Engine.DVE, target)

    shared = {"bf16": 0.0, "fp32": 0.0}  # depthwise layers on PE and VectorE together, ns
    diagonal = other = 0.0  # PE cycles at the bf16 rate
    for n in model.graph.node:
        if n.op_type == "Conv":
            w, y = shapes[n.input[1]], shapes[n.output[0]]
            group = next((a.i for a in n.attribute if a.name == "group"), 1)
            taps, columns = math.prod(w[2:]), math.prod(y[2:]) * y[0]
            if group > 1 and w[1] == 1 and w[0] == group:  # depthwise
                work = w[0] * taps * columns / pmax  # multiply-adds a partition: PE's columns at the least
                bands = pmax // w[0] if w[0] <= pmax // 2 else 1
                diagonal += -(-w[0] // pmax) * taps * max(64, -(-columns // bands))
                for cast, dtype, passes in (("bf16", DType.bf16, 1), ("fp32", DType.fp32, 4)):
                    pe = passes * work / ghz
                    vector = taps * -(-w[0] * bands // pmax) * vector_tap_ns(-(-columns // bands), dtype)
                    shared[cast] += 1 / (1 / pe + 1 / vector)
            elif columns == 1:
                other += -(-w[1] * group * taps // pmax) * min(64 * -(-w[0] // pmax), w[0])
            else:
                other += w[0] * w[1] * taps * columns / (pmax * pmax)
        elif n.op_type in ("Gemm", "MatMul"):
            w = shapes[n.input[1]]
            trans = any(a.name == "transB" and a.i for a in n.attribute)
            k, m = (w[1], w[0]) if trans else (w[0], w[1])
            other += -(-k // pmax) * min(64 * -(-m // pmax), m)
    one = Operand(Mem.SBUF, DType.fp32, 0, pmax, 0, ((1, 1),))
    step_ns = duration_ns(make("activation", dst=one, src=one, func=ActFunc.relu, scale=1.0), Engine.ACT, target,
                          dependent=True) + target.semaphore_handoff_ns
    se_steps = _se_steps(model)
    return {**{f"depthwise_{cast}_us": ns / 1000 for cast, ns in shared.items()},
            "depthwise_diagonal_us": diagonal / ghz / 1000,
            "other_us": other / ghz / 1000, "squeezes": len(se_steps), "se_steps": sum(se_steps),
            "step_ns": step_ns, "se_chain_us": sum(se_steps) * step_ns / 1000}


def lowering_chain(path: str, target_name: str) -> dict[str, float]:
    """The dependency chain of this compiler's tile program for the model, in us, in bf16 (auto-cast) and fp32."""
    from isa.target import get_target
    from neuronx_cc_lite.codegen.schedule import dependency_chain_ns
    from neuronx_cc_lite.compiler import Options, compile_rank, prepare

    found = {}
    for cast, casting in (("bf16", {"auto_cast": "matmult", "auto_cast_type": "bf16"}), ("fp32", {})):
        options = Options(target=target_name, **casting)
        rank = compile_rank(prepare(path, options, None), options, get_target(target_name))
        found[cast] = dependency_chain_ns(rank.program) / 1000
    return found


def main(argv: list[str] | None = None) -> int:
    from benchmarks.exports import EXPORTERS, FAMILIES, export

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="families or ONNX files (default: mobilenet_v3)")
    parser.add_argument("--exporter", choices=EXPORTERS, default="dynamo")
    parser.add_argument("--target", default="trn1")
    args = parser.parse_args(argv)
    for name in args.names or ["mobilenet_v3"]:
        path = export(name, args.exporter) if name in FAMILIES else name
        f = floor(path, args.target)
        print(f"{os.path.basename(path)} on {args.target}:")
        print(f"  depthwise: at least {f['depthwise_bf16_us']:.1f} us in bf16, {f['depthwise_fp32_us']:.1f} in fp32 "
              f"(PE and VectorE sharing the taps); on PE as diagonals (lower/depthwise.py) "
              f"{f['depthwise_diagonal_us']:.1f} / {4 * f['depthwise_diagonal_us']:.1f}")
        print(f"  other matmuls: at least {f['other_us']:.1f} us in bf16, {4 * f['other_us']:.1f} in fp32")
        print(f"  squeeze-and-excitation: {f['squeezes']} blocks, {f['se_steps']} dependent instructions x "
              f"{f['step_ns']:.0f} ns = {f['se_chain_us']:.1f} us")
        for cast, passes in (("bf16", 1), ("fp32", 4)):
            low = f[f"depthwise_{cast}_us"] + passes * f["other_us"] + f["se_chain_us"]
            lowered = passes * (f["depthwise_diagonal_us"] + f["other_us"]) + f["se_chain_us"]
            print(f"  {cast}: floor {low:.1f} us; with the depthwise taps as diagonals {lowered:.1f} us")
        chain = lowering_chain(path, args.target)
        print(f"  this compiler's lowering: a dependency chain of {chain['bf16']:.1f} us in bf16, "
              f"{chain['fp32']:.1f} in fp32 (no schedule of it is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
