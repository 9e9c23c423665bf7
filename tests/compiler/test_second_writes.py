"""second-writes (codegen/second_writes.py): a copy that converts a result for its reader becomes a second write by
the result's producer, with the same values, and only where the copy's reader is the result's first."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from onnx import TensorProto, helper

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from isa.target import get_target
from neuronx_cc_lite.codegen.second_writes import second_writes
from neuronx_cc_lite.compiler import Options
from neuronx_cc_lite.tile.program import Program
from tests.compiler.one_node import bf16_operands
from tests.conftest import make_model

F = TensorProto.FLOAT
BF16 = Options(auto_cast="matmult", auto_cast_type="bf16")


def _residual_block():
    """a = Conv(x) + b; the next Conv reads a (in bf16 under auto-cast), and so does an Add, in fp32, after it."""
    rng = np.random.default_rng(3)
    weights = {name: rng.standard_normal(shape).astype(np.float32)
               for name, shape in (("w", (24, 24, 1, 1)), ("b", (24,)), ("w2", (24, 24, 1, 1)), ("b2", (24,)))}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["a"]), helper.make_node("Conv", ["a", "w2", "b2"], ["c"]),
             helper.make_node("Add", ["a", "c"], ["y"])]
    return make_model(nodes, {"x": ([1, 24, 9, 10], F)}, {"y": ([1, 24, 9, 10], F)}, weights)


def _after(model, stage: str, options: Options) -> str:
    from neuronx_cc_lite.compiler import compile_model

    seen: dict[str, str] = {}
    compile_model(model, replace(options, dump_ir_after=frozenset({stage})),
                  dump=lambda name, text: seen.setdefault(name, text))
    return seen[stage]


def _ops(listing: str, node: str) -> list[str]:
    return [line.split()[2] for line in listing.splitlines() if line[:1] == " " and node in line]


def test_the_cast_for_the_next_convolution_becomes_a_second_write(tmp):
    from neuronx_cc_lite.reference import onnxruntime_outputs, seeded_inputs
    from tests.conftest import assert_close, compile_to_model

    model = _residual_block()
    before, after = _after(model, "dedupe-loads", BF16), _after(model, "second-writes", BF16)
    copies = _ops(before, "Conv_1").count("tensor_copy")  # (the second Conv's load of a, a cast to bf16)
    assert copies >= 1
    assert _ops(after, "Conv_1").count("tensor_copy") == 0
    first = _ops(before, "Conv_0")
    assert len(_ops(after, "Conv_0")) == len(first) + sum(op != "nc_matmul" and op != "dma_copy" for op in first)
    compiled = compile_to_model(model, tmp, BF16)
    inputs = seeded_inputs(compiled.inputs)
    # exact to the bf16 operands: one rounding of the same fp32 result, at the producer instead of at the load
    assert_close(compiled.run(inputs), onnxruntime_outputs(bf16_operands(model), inputs), rtol=1e-5)


def _program():
    prog = Program(get_target("trn1"))
    x = prog.sbuf(64, 32, DType.fp32, "x")
    home = prog.sbuf(64, 32, DType.fp32, "home")
    cast = prog.sbuf(64, 32, DType.bf16, "cast")
    return prog, x, home, cast


def _writer(prog, x, home):
    prog.emit("activation", Engine.ACT, dst=home.ap(), src=x.ap(), func=ActFunc.relu, scale=1.0)


def test_twins_go_before_their_writers_and_the_copy_goes():
    prog, x, home, cast = _program()
    _writer(prog, x, home)
    prog.emit("tensor_copy", Engine.DVE, dst=cast.ap(), src=home.ap())
    prog.emit("activation", Engine.ACT, dst=x.ap(), src=home.ap(), func=ActFunc.copy, scale=1.0)  # (read later)
    assert second_writes(prog) == 1
    ops = [(p.op, p.args["dst"].tile) for p in prog.instrs]
    assert ops == [("activation", cast), ("activation", home), ("activation", x)]


def test_a_tile_only_the_copy_reads_is_written_where_the_copy_wrote():
    """A squeeze's mean over one channel tile (an activation's row sums), copied into its column of a home in
    bf16: the activation sums into that column itself, and its scratch output stays."""
    prog, x, home, cast = _program()
    sums = prog.sbuf(64, 1, DType.fp32, "sums")
    columns = prog.sbuf(64, 4, DType.bf16, "columns")
    prog.emit("activation", Engine.ACT, dst=home.ap(), src=x.ap(), func=ActFunc.copy, scale=1.0, reduce=sums.ap())
    prog.emit("tensor_copy", Engine.DVE, dst=columns.ap(((1, 1),), 2), src=sums.ap())
    assert second_writes(prog) == 1
    (only,) = prog.instrs
    assert only.args["dst"].tile is home and only.args["reduce"].tile is columns and only.args["reduce"].offset == 2


def test_a_copy_of_half_a_tile_gets_the_writer_of_that_half():
    prog, x, home, cast = _program()
    for c0 in (0, 16):
        prog.emit("activation", Engine.ACT, dst=home.ap(((16, 1),), c0), src=x.ap(((16, 1),), c0),
                  func=ActFunc.relu, scale=1.0)
    half = prog.sbuf(64, 16, DType.bf16, "half")
    prog.emit("tensor_copy", Engine.DVE, dst=half.ap(), src=home.ap(((16, 1),), 16))
    prog.emit("activation", Engine.ACT, dst=x.ap(), src=home.ap(), func=ActFunc.copy, scale=1.0)
    assert second_writes(prog) == 1
    twin = prog.instrs[1]
    assert twin.args["dst"].tile is half and twin.args["dst"].offset == 0 and twin.args["src"].offset == 16


def test_left_alone():
    # read first by another instruction: the twin would lengthen that reader's chain
    prog, x, home, cast = _program()
    _writer(prog, x, home)
    prog.emit("activation", Engine.ACT, dst=x.ap(), src=home.ap(), func=ActFunc.copy, scale=1.0)
    prog.emit("tensor_copy", Engine.DVE, dst=cast.ap(), src=home.ap())
    assert second_writes(prog) == 0
    # the writer reads what it writes: its twin would read the written values
    prog, x, home, cast = _program()
    prog.emit("tensor_tensor", Engine.DVE, dst=home.ap(), a=home.ap(), b=x.ap(), op=AluOp.subtract)
    prog.emit("tensor_copy", Engine.DVE, dst=cast.ap(), src=home.ap())
    assert second_writes(prog) == 0
    # part of the copied run written by a DMA
    prog, x, home, cast = _program()
    prog.emit("activation", Engine.ACT, dst=home.ap(((16, 1),)), src=x.ap(((16, 1),)), func=ActFunc.relu, scale=1.0)
    prog.emit("dma_copy", Engine.DMA, dst=home.ap(((16, 1),), 16), src=x.ap(((16, 1),), 16))
    prog.emit("tensor_copy", Engine.DVE, dst=cast.ap(), src=home.ap())
    assert second_writes(prog) == 0
    # the copy's tile written by something else too
    prog, x, home, cast = _program()
    _writer(prog, x, home)
    prog.emit("tensor_copy", Engine.DVE, dst=cast.ap(), src=home.ap())
    prog.emit("activation", Engine.ACT, dst=cast.ap(), src=x.ap(), func=ActFunc.copy, scale=1.0)
    assert second_writes(prog) == 0
