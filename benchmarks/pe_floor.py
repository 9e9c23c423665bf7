"""How fast a batch-1 convolution network can run on the chip model, whatever the schedule, for the ways of
computing its depthwise layers this project knows: the least TensorE (and VectorE) time its convolutions need,
the dependent instructions of its squeeze-and-excitation blocks and of its classifier that nothing else can
overlap, and the DMA latency before the input arrives and after the output is ready. The arithmetic behind the
README's account of MobileNetV3 (issue 17's 2.0x goal).

    .venv/bin/python benchmarks/pe_floor.py [NAME ...] [--exporter dynamo|torchscript] [--target T]

NAME is a family of benchmarks/exports.py (mobilenet_v3 by default) or an ONNX file. Per model, in bf16 and
fp32 (a matmul pass each fp32 instruction takes four of, CHIP.md):
- depthwise convolutions, the channels on the partitions: an output pixel's column through PE does at most one
  useful multiply-add per partition (each partition holds one input value of that pixel's window; PE sums across
  partitions, and a depthwise output reads one channel), so PE needs at least MACs / 128 columns; VectorE can
  take taps too, one scalar_tensor_tensor per tap and 128 channels (its scalar, the tap's weight, is one per
  partition), each at its cost by the cost model, fixed costs included (isa/costs.py; the accumulator in PSUM,
  one input a cycle); a layer shared between the two takes at least PE's time and VectorE's for all of it
  combined as two servers of one divisible job (1 / (1/PE + 1/VectorE)). GpSimdE shares VectorE's SBUF port;
  ScalarE cannot accumulate. With a diagonal stationary per tap and 128 channels, as lower/depthwise.py lays
  them out (bands of rows for 64 channels or fewer), PE takes taps x channel tiles x max(64, columns) cycles
  (`diagonal`). With a channel's input rows on the partitions instead (`_rows_cycles`: a banded stationary per
  kernel column), a partition's value feeds several outputs of a column, which MACs / 128 does not bound: the
  floor takes, layer by layer, the shorter of the two (PE's rows beside VectorE's taps, two servers again). Some
  other arrangement could do better still: this is a floor over the arrangements above, not over every program;
- every other convolution and Gemm: its multiply-adds over the full 128 x 128 array, or for one row (a squeeze,
  a classifier) at least min(64 x output blocks, outputs) cycles per 128 input features (a matmul costs
  max(min(64, M), N) cycles);
- a squeeze-and-excitation block (a global mean, a 1x1 convolution, its activation, another, HardSigmoid or
  Sigmoid, the gate's Mul): every later instruction needs its gate and the gate needs every depthwise output, so
  from the last depthwise tap to the next block's first, dependent instructions run one after another on ScalarE and
  VectorE while PE has nothing else to do: the depthwise output's activation (a HardSwish takes two: ScalarE
  has no function for it and VectorE's one-instruction forms hold one scalar operation beside the product), the
  mean (trn1's VectorE reduces only beside a scalar operation), the first activation and the HardSigmoid (each
  PE result leaves PSUM before a matmul reads it; the clamp rides with the scaling), the gate's scaling (of the
  projection's weights), the projection's evacuation, and the next expansion's activation (two for a HardSwish)
  (`se_steps`), each at least a dependent one-element instruction's cost (isa/costs.py) and a hand-off;
- after the last block, a classifier's chain (`_tail_steps`): the global mean, each matmul's result leaving PSUM
  through its activation, the output's too (a DMA reads no PSUM), each needing the whole of the one before;
- the input's load and the output's store: nothing computes before the input's first data arrives, a DMA
  latency after the start, and the output is stored a DMA latency after its last result.
PE work adds up (one engine), and the chains and latencies add to it: their sum is a floor under the latency of
any schedule of those arrangements, which the goal (2.0x the roofline in bf16, 2.5x in fp32) is set against.

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


# what a convolution's or a matmul's result may pass through as it leaves PSUM (_activation_steps)
ACTIVATIONS = ("HardSwish", "Relu", "Clip", "HardSigmoid", "Sigmoid", "Tanh")


def _activation_steps(op: str) -> int:
    """Dependent ScalarE/VectorE instructions a conv's output takes to leave PSUM through `op` (its reader): a
    HardSwish two, any other activation (or none, a plain evacuation) one."""
    return 2 if op == "HardSwish" else 1


def _readers(model) -> dict[str, list]:  # type: ignore[no-untyped-def]
    found: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            found.setdefault(i, []).append(n)
    return found


def _gate_chains(model) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    """Per squeeze-and-excitation block (a HardSigmoid gate, or a Sigmoid one: EfficientNet's), its dependent steps
    (module docstring): SE_STEPS, the activation of what the mean reads, and where the gate scales a projection,
    its evacuation and the activation of the next convolution (the expansion) after it, through a residual Add;
    and the tensor the last of them writes (where _tail_steps goes on from)."""
    nodes = list(model.graph.node)
    producer = {o: n for n in nodes for o in n.output}
    readers = _readers(model)

    def only_reader(name: str, *ops: str):  # type: ignore[no-untyped-def]
        found = readers.get(name, [])
        return found[0] if len(found) == 1 and found[0].op_type in ops else None

    def is_gate(node) -> bool:  # type: ignore[no-untyped-def]
        """A HardSigmoid, or a Sigmoid whose Mul scales something else (EfficientNet's gates; a SiLU's Sigmoid
        scales its own input)."""
        if node.op_type == "HardSigmoid":
            return True
        mul = only_reader(node.output[0], "Mul")
        return node.op_type == "Sigmoid" and mul is not None and node.input[0] not in mul.input

    chains = []
    for gate in (n for n in nodes if is_gate(n)):
        steps, end = SE_STEPS, gate.output[0]
        mul = only_reader(gate.output[0], "Mul")
        if mul is None:
            chains.append((steps, end))
            continue
        gated = next(i for i in mul.input if i != gate.output[0])  # what the mean and the gate read
        source = producer.get(gated)
        steps += _activation_steps(source.op_type if source is not None else "")
        end = mul.output[0]
        projection = only_reader(mul.output[0], "Conv")
        if projection is not None:
            steps += 1
            out = end = projection.output[0]
            add = only_reader(out, "Add")
            # (a residual sum is read by the next expansion and by the next residual Add)
            convs = [r for r in readers.get(add.output[0] if add is not None else out, []) if r.op_type == "Conv"]
            expansion = convs[0] if len(convs) == 1 else None
            if expansion is not None:
                after = readers.get(expansion.output[0], [])
                steps += _activation_steps(after[0].op_type if len(after) == 1 else "")
                end = after[0].output[0] if len(after) == 1 and after[0].op_type in ACTIVATIONS else \
                    expansion.output[0]
        chains.append((steps, end))
    return chains


def _se_steps(model) -> list[int]:  # type: ignore[no-untyped-def]
    """Per squeeze-and-excitation block, its dependent steps (_gate_chains)."""
    return [steps for steps, _ in _gate_chains(model)]


def _tail_steps(model, chains: list[tuple[int, str]] | None = None) -> int:  # type: ignore[no-untyped-def]
    """Dependent ScalarE/VectorE instructions from the last squeeze-and-excitation block's steps to the output, when
    what follows is one chain of a global mean, matmuls and their activations (a classifier): the mean one (it
    needs every element of what it reads), each matmul's result leaving PSUM through its activation
    (_activation_steps), the output's too (a DMA reads no PSUM), each reading the whole of the one before (a
    product of one row: nothing pipelines). 0 where the way from there to the output is anything else. `chains`:
    the model's _gate_chains, where the caller has them."""
    chains = _gate_chains(model) if chains is None else chains
    if not chains:
        return 0
    readers, outputs = _readers(model), {o.name for o in model.graph.output}
    name, steps = chains[-1][1], 0
    while name not in outputs:
        found = readers.get(name, [])
        if len(found) != 1:
            return 0
        node = found[0]
        if node.op_type in ("ReduceMean", "GlobalAveragePool"):
            steps += 1
        elif node.op_type in ("Gemm", "MatMul", "Conv"):
            after = readers.get(node.output[0], [])
            activation = after[0] if len(after) == 1 and after[0].op_type in ACTIVATIONS else None
            steps += _activation_steps(activation.op_type if activation is not None else "")
            node = activation or node
        elif node.op_type not in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
            return 0
        name = node.output[0]
    return steps


def _rows_cycles(node, w: list[int], y: list[int], pmax: int) -> float:  # type: ignore[no-untyped-def]
    """PE cycles (bf16) of a depthwise convolution with each channel's input rows on the partitions instead of its
    channels: g channels' rows a tile (the input rows a channel's outputs read, and its output rows, each at most
    pmax / g), for each kernel column a matmul whose stationary holds each channel's kernel as a band (output row
    r reads input rows r * stride + ky) and whose moving operand is the rows read at that column, over a row's
    outputs: ceil(C / g) x kernel width x max(64, output columns) cycles. A partition then holds one input value
    that several of a column's outputs read (one per kernel row), where with the channels on the partitions it
    holds one that one output reads: the floor's MACs / 128 does not bound this. inf where no channel's rows fit,
    or the convolution is not 2-D."""
    if len(w) != 4:
        return math.inf
    attrs = {a.name: list(a.ints) for a in node.attribute}
    stride = (attrs.get("strides") or [1])[0]
    dilation = (attrs.get("dilations") or [1])[0]
    span = (y[2] - 1) * stride + (w[2] - 1) * dilation + 1  # input rows a channel's outputs read
    g = min(pmax // span, pmax // y[2])
    if g < 1:
        return math.inf
    return y[0] * -(-w[0] // g) * w[3] * max(64, y[3])


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
    rows_or_shared = {"bf16": 0.0, "fp32": 0.0}  # each layer the shorter of that and _rows_cycles', ns
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
                rows = _rows_cycles(n, w, y, pmax)
                for cast, dtype, passes in (("bf16", DType.bf16, 1), ("fp32", DType.fp32, 4)):
                    pe = passes * work / ghz
                    vector = taps * -(-w[0] * bands // pmax) * vector_tap_ns(-(-columns // bands), dtype)
                    shared[cast] += 1 / (1 / pe + 1 / vector)
                    # (VectorE's taps, channels on partitions, beside PE's with rows on them: two servers too)
                    rows_or_shared[cast] += min(1 / (1 / pe + 1 / vector), 1 / (ghz / (passes * rows) + 1 / vector))
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
    chains = _gate_chains(model)
    se_steps, tail = [steps for steps, _ in chains], _tail_steps(model, chains)
    return {**{f"depthwise_{cast}_us": ns / 1000 for cast, ns in shared.items()},
            **{f"depthwise_rows_{cast}_us": ns / 1000 for cast, ns in rows_or_shared.items()},
            "depthwise_diagonal_us": diagonal / ghz / 1000,
            "other_us": other / ghz / 1000, "squeezes": len(se_steps), "se_steps": sum(se_steps),
            "step_ns": step_ns, "se_chain_us": sum(se_steps) * step_ns / 1000,
            "tail_steps": tail, "tail_us": tail * step_ns / 1000,
            "io_us": 2 * target.dma_latency_ns / 1000}


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
        print(f"  after the last gate: {f['tail_steps']} dependent instructions to the output = {f['tail_us']:.1f} us; "
              f"the input's load and the output's store, a DMA latency each: {f['io_us']:.1f} us")
        print(f"  a depthwise layer with its channels' rows on the partitions where that takes less: at least "
              f"{f['depthwise_rows_bf16_us']:.1f} us in bf16, {f['depthwise_rows_fp32_us']:.1f} in fp32")
        for cast, passes in (("bf16", 1), ("fp32", 4)):
            fixed = passes * f["other_us"] + f["se_chain_us"] + f["tail_us"] + f["io_us"]
            low, rows = f[f"depthwise_{cast}_us"] + fixed, f[f"depthwise_rows_{cast}_us"] + fixed
            lowered = passes * f["depthwise_diagonal_us"] + fixed
            print(f"  {cast}: floor {low:.1f} us ({rows:.1f} with rows on the partitions where shorter); with the "
                  f"depthwise taps as diagonals {lowered:.1f} us")
        chain = lowering_chain(path, args.target)
        print(f"  this compiler's lowering: a dependency chain of {chain['bf16']:.1f} us in bf16, "
              f"{chain['fp32']:.1f} in fp32 (no schedule of it is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
