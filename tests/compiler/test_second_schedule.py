"""A program of SECOND_OPINION_MIN instructions or more is scheduled twice, reaching far and on the short road
(codegen/schedule.py schedule_within_memory), and keeps the schedule whose estimated end comes first: its order,
engines, queues and tile places exactly, whichever of the two was made last."""

from __future__ import annotations

import pytest

import neuronx_cc_lite.codegen.schedule as schedule
from neuronx_cc_lite.compiler import compile_model
from tests.compiler.test_prefetch import chain_then_matmul
from tests.conftest import assert_close, run_both


def _state(program) -> tuple:
    return (list(program.instrs), [(p.engine, p.queue) for p in program.instrs],
            [(t.name, t.offset) for t in program.tiles])


@pytest.mark.parametrize("first_wins", [True, False], ids=["far-reach-kept", "short-road-kept"])
def test_the_schedule_estimated_to_end_first_is_kept(monkeypatch, tmp, first_wins):
    made, kept = [], []
    real_fit, real_within = schedule._fit, schedule.schedule_within_memory

    def fit(program, *given):  # the real schedule, its estimate made to lose where the other should win
        found = real_fit(program, *given)
        made.append(_state(program))
        loses = (len(made) == 1) != first_wins
        return None if found is None else found + (1e9 if loses else 0.0)

    def within(program):
        fitted = real_within(program)
        kept.append(_state(program))
        return fitted

    monkeypatch.setattr(schedule, "_fit", fit)
    monkeypatch.setattr(schedule, "schedule_within_memory", within)
    monkeypatch.setattr(schedule, "SECOND_OPINION_MIN", 1)
    monkeypatch.setattr(schedule, "LOOKAHEAD", 16)  # (so that the two roads order the chain differently)
    model = chain_then_matmul(200)
    compile_model(model)
    assert len(made) == 2 and made[0] != made[1]
    assert kept == [made[0] if first_wins else made[1]]
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-4)


def test_a_short_program_is_scheduled_once(monkeypatch):
    calls = []
    real_fit = schedule._fit
    monkeypatch.setattr(schedule, "_fit", lambda *a: calls.append(1) or real_fit(*a))
    compile_model(chain_then_matmul(20))
    assert len(calls) == 1
