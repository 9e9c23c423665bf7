"""Weight loads may be taken beyond the scheduler's lookahead while SBUF has room (codegen/schedule.py,
PREFETCH_REACH): a network's later weights are queued while its early layers run, rather than behind the loads
those layers make when the schedule reaches them (ResNet-50 bf16 on trn1: 413 -> 384 us)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

import neuronx_cc_lite.codegen.schedule as schedule
from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.tile.program import HbmAccess
from tests.conftest import assert_close, make_model, run_both


def chain_then_matmul(links: int) -> object:
    """`links` small elementwise operators in a row, then a MatMul with a 2 MiB weight."""
    rng = np.random.default_rng(0)
    nodes, weights, x = [], {}, "x"
    for k in range(links):
        weights[f"c{k}"] = np.float32(1.0 + (k % 3) * 1e-3).reshape(1)
        nodes.append(helper.make_node("Mul" if k % 2 else "Add", [x, f"c{k}"], [f"t{k}"]))
        x = f"t{k}"
    weights["w"] = (rng.standard_normal((64, 8192)) / 8).astype(np.float32)
    nodes.append(helper.make_node("MatMul", [x, "w"], ["y"]))
    return make_model(nodes, {"x": ([4, 64], TensorProto.FLOAT)}, {"y": ([4, 8192], TensorProto.FLOAT)}, weights)


def scheduled_order(model, reach: int, monkeypatch) -> list:
    """The instructions in the order the scheduler took them, with a lookahead of 16 (and no second schedule on
    the short road)."""
    taken = []
    real = schedule.schedule

    def spy(program, *args, **kwargs):
        result = real(program, *args, **kwargs)
        taken[:] = list(program.instrs)
        return result

    monkeypatch.setattr(schedule, "schedule", spy)
    monkeypatch.setattr(schedule, "LOOKAHEAD", 16)
    monkeypatch.setattr(schedule, "SECOND_OPINION_MIN", 10 ** 9)
    monkeypatch.setattr(schedule, "PREFETCH_REACH", reach)
    compile_model(model)
    return taken


def lead(order: list) -> int:
    """How many chain instructions were taken after the first load of the MatMul's weight."""
    first_weight = next(k for k, p in enumerate(order) if p.node.startswith("MatMul") and
                        isinstance(p.args.get("src"), HbmAccess) and p.args["src"].tensor.kind == "weight")
    return sum(1 for p in order[first_weight:] if p.node.startswith(("Add", "Mul_")))


def test_weights_are_taken_while_a_chain_of_small_operators_runs(monkeypatch, tmp):
    model, reach = chain_then_matmul(200), schedule.PREFETCH_REACH
    assert lead(scheduled_order(model, 1, monkeypatch)) < 16  # within the lookahead: no prefetch
    assert lead(scheduled_order(model, reach, monkeypatch)) > 64  # (16 x 8 instructions ahead)
    monkeypatch.undo()
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-4)
