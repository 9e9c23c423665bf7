"""Drop one semaphore wait at a time from every model in models/ and ask the race checker.

Each variant is judged three ways:
- the race checker (one run under the clock policy with check_races);
- a static oracle, apart from the checker: happens-before as reachability over program order and
  signal -> wait edges, and every pair of instructions of two streams whose element starts meet, one writing;
  the variant races when some such pair is ordered neither way;
- the answers under the clock policy and two random interleavings, against the synchronised program's (a run
  that fails under one of them, as a gather of indices not yet written does, counts as a changed answer).
The checker must agree with the oracle on every variant, and every variant whose answer changes must be flagged.
A dropped wait the oracle finds redundant (it orders no conflicting pair; the compiler orders at tile
granularity) is the only kind allowed to pass.

The default suite takes every SAMPLE_EVERY-th wait of each model (every second such under --auto-cast matmult),
from a seeded start; `-m slow` takes them all.
"""

from __future__ import annotations

import functools
import glob
import os
import random
from collections import deque
from dataclasses import dataclass

import numpy as np
import onnx
import pytest

from neuronx_cc_lite.compiler import Options, compile_model
from neuronx_cc_lite.reference import seeded_inputs
import runtime
from tests.conftest import MODELS_DIR

MODELS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(MODELS_DIR, "*.onnx")))
OPTIONS = {"default": Options(), "matmult": Options(auto_cast="matmult")}
SCHEDULES = [("clock", 0), ("random", 1), ("random", 2)]
SAMPLE_EVERY = 12


@dataclass
class Case:
    model: runtime.Model
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]  # the synchronised program's answer
    conflicts: np.ndarray  # (pairs, 2) instruction ids: two streams, the same element start, one writes
    waits: list[tuple[int, int, int]]  # (stream, instruction, which wait) of every wait in the program


@functools.cache
def _case(name: str, options: str) -> Case:
    b = compile_model(onnx.load(os.path.join(MODELS_DIR, name)), OPTIONS[options])
    m = runtime.Model(b)
    inputs = seeded_inputs(b.inputs)
    waits = [(k, pc, w) for k, s in enumerate(m.simulator.streams) for pc, op in enumerate(s.ops)
             for w in range(len(op.waits))]
    return Case(m, inputs, m.run(inputs), _conflicts(m), waits)


def _conflicts(m: runtime.Model) -> np.ndarray:
    """Pairs of instructions of different streams touching a common element start, at least one writing."""
    streams = m.simulator.streams
    lengths = [len(s.ops) for s in streams]
    first = np.cumsum([0] + lengths)
    stream_of = np.repeat(np.arange(len(streams)), lengths)
    by_memory: dict[tuple[str, int], list[tuple[np.ndarray, int, bool]]] = {}
    for k, per_instr in enumerate(m._race_checker().accesses):
        for pc, accesses in enumerate(per_instr):
            for a in accesses:
                by_memory.setdefault(a.key, []).append((np.unique(a.at), int(first[k]) + pc, a.writes))
    pairs = [np.zeros((0, 2), np.int64)]
    for parts in by_memory.values():
        addr = np.concatenate([at for at, _, _ in parts])
        gid = np.concatenate([np.full(at.size, g) for at, g, _ in parts])
        writes = np.concatenate([np.full(at.size, w) for at, _, w in parts])
        order = np.lexsort((gid, addr))
        addr, gid, writes = addr[order], gid[order], writes[order]
        for d in range(1, addr.size):  # sorted by address: entries d apart share it only if those < d apart do
            same = addr[d:] == addr[:-d]
            if not same.any():
                break
            a, b = gid[:-d][same], gid[d:][same]
            keep = (writes[:-d] | writes[d:])[same] & (stream_of[a] != stream_of[b])
            pairs.append(np.stack([a[keep], b[keep]], axis=1))
    return np.unique(np.concatenate(pairs), axis=0)


def _ancestors(streams: list) -> list[int]:
    """For each instruction (numbered stream after stream), the set of instructions that happen before it in
    every schedule, as a bit set: its stream's earlier instructions, and for each wait `s >= v` the increment of
    each signalling stream that every schedule reaching v must contain (v minus the other streams' totals)."""
    first = np.cumsum([0] + [len(s.ops) for s in streams]).tolist()
    signals: dict[tuple[int, int], dict[int, list[int]]] = {}
    for k, s in enumerate(streams):
        for pc, op in enumerate(s.ops):
            if op.signal is not None:
                signals.setdefault((s.core, op.signal), {}).setdefault(k, []).append(first[k] + pc)
    preds: list[list[int]] = []
    for k, s in enumerate(streams):
        for pc, op in enumerate(s.ops):
            p = [first[k] + pc - 1] if pc else []
            for sem, value in op.waits:
                per = signals.get((s.core, sem), {})
                total = sum(len(ids) for ids in per.values())
                for ids in per.values():
                    sure = value - (total - len(ids))
                    if sure >= 1:
                        p.append(ids[sure - 1])
            preds.append(p)
    succs: list[list[int]] = [[] for _ in preds]
    for g, p in enumerate(preds):
        for q in p:
            succs[q].append(g)
    missing = [len(p) for p in preds]
    ready = deque(g for g, n in enumerate(missing) if n == 0)
    anc = [0] * len(preds)
    while ready:
        g = ready.popleft()
        for q in preds[g]:
            anc[g] |= anc[q] | (1 << q)
        for h in succs[g]:
            missing[h] -= 1
            if missing[h] == 0:
                ready.append(h)
    assert not any(missing), "the waits form a cycle: the program would deadlock"
    return anc


def _oracle_races(streams: list, conflicts: np.ndarray) -> bool:
    anc = _ancestors(streams)
    return any(not (anc[b] >> a & 1 or anc[a] >> b & 1) for a, b in conflicts.tolist())


def _flagged(case: Case) -> bool:
    try:
        case.model.run(case.inputs, check_races=True)
    except runtime.RaceError:
        return True
    return False


def _differs(case: Case) -> bool:
    """Whether some schedule changes the answer, or stops the run (a gather that reads its indices before they are
    written can find one outside the table: NRT_ACCESS)."""
    for policy, seed in SCHEDULES:
        try:
            out = case.model.run(case.inputs, policy=policy, seed=seed)
        except runtime.NeuronRuntimeError:
            return True
        if not all(np.array_equal(out[k], v, equal_nan=True) for k, v in case.expected.items()):
            return True
    return False


def _sweep(name: str, options: str, every: int) -> None:
    case = _case(name, options)
    streams = case.model.simulator.streams
    assert not _oracle_races(streams, case.conflicts) and not _flagged(case), "the compiled program races"
    start = random.Random(f"{name}/{options}").randrange(every)
    checked = 0
    for k, pc, w in case.waits[start::every]:
        op = streams[k].ops[pc]
        kept = op.waits
        op.waits = kept[:w] + kept[w + 1:]
        try:
            flagged, oracle, differs = _flagged(case), _oracle_races(streams, case.conflicts), _differs(case)
        finally:
            op.waits = kept
        where = f"{name} ({options}) core {streams[k].core} {streams[k].name} #{pc} {op.mnemonic} without {kept[w]}"
        assert flagged == oracle, f"{where}: checker says {flagged}, the static oracle {oracle}"
        assert flagged or not differs, f"{where}: the answer changes and no race is reported"
        checked += 1
    assert checked == len(range(start, len(case.waits), every))


@pytest.mark.parametrize("options", ["default", "matmult"])
@pytest.mark.parametrize("name", MODELS)
def test_sampled_dropped_waits_are_flagged(name, options):
    _sweep(name, options, SAMPLE_EVERY * (1 if options == "default" else 2))


@pytest.mark.slow
@pytest.mark.parametrize("options", ["default", "matmult"])
@pytest.mark.parametrize("name", MODELS)
def test_every_dropped_wait_is_flagged(name, options):
    _sweep(name, options, 1)
