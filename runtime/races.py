"""The race checker: reports two accesses to the same bytes, at least one a write, that no chain of semaphores
orders (DESIGN.md invariant 5).

Happens-before is tracked with vector clocks: each stream's clock counts its instructions; a semaphore keeps the
signalling stream's vector clock at each increment, and an instruction that waits for value v takes in the clock
of the v-th increment. Every byte an operand element starts at remembers its last writer and last reader; an
access races with them when its stream has not seen their clock. The answer does not depend on the order the
simulator picked, so one run under either policy finds every race the program has.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.errors import NeuronRuntimeError


class RaceError(NeuronRuntimeError):
    code = "NRT_RACE"


@dataclass
class Access:
    key: tuple[str, int]  # memory: ("HBM", 0), ("SBUF", core) or ("PSUM", core)
    at: np.ndarray  # flat byte index of each element
    writes: bool


class _Shadow:
    """Last writer and last reader (stream, clock) of every byte of one memory; -1: none."""

    def __init__(self, size: int) -> None:
        self.writer = np.full(size, -1, np.int32)
        self.write_clock = np.zeros(size, np.int64)
        self.reader = np.full(size, -1, np.int32)
        self.read_clock = np.zeros(size, np.int64)


class RaceChecker:
    def __init__(self, streams: list, accesses: list[list[list[Access]]], semaphores: int, cores: int) -> None:
        """`accesses[s][i]`: the accesses of instruction i of stream s (streams as the simulator lists them)."""
        self.streams = streams
        self.accesses = accesses
        self.index = {id(s): k for k, s in enumerate(streams)}
        n = len(streams)
        self.clocks = np.zeros((n, n), np.int64)  # row s: what stream s has seen of every stream
        self.signals: dict[tuple[int, int], list[np.ndarray]] = {}  # (core, sem) -> clock at each increment
        sizes: dict[tuple[str, int], int] = {}
        for per_stream in accesses:
            for per_instr in per_stream:
                for a in per_instr:
                    if a.at.size:
                        sizes[a.key] = max(sizes.get(a.key, 0), int(a.at.max()) + 1)
        self.shadow = {key: _Shadow(size) for key, size in sizes.items()}

    def issue(self, s: object, pc: int) -> None:
        k = self.index[id(s)]
        clock = self.clocks[k]
        op = s.ops[pc]  # type: ignore[attr-defined]
        for sem, value in op.waits:
            np.maximum(clock, self.signals[s.core, sem][value - 1], out=clock)  # type: ignore[attr-defined]
        clock[k] = pc + 1
        for a in self.accesses[k][pc]:
            sh = self.shadow[a.key]
            self._check(k, pc, a, sh.writer, sh.write_clock, "written")
            if a.writes:
                self._check(k, pc, a, sh.reader, sh.read_clock, "read")
                sh.writer[a.at], sh.write_clock[a.at] = k, pc + 1
                sh.reader[a.at] = -1
            else:
                sh.reader[a.at], sh.read_clock[a.at] = k, pc + 1

    def complete(self, s: object, pc: int) -> None:
        op = s.ops[pc]  # type: ignore[attr-defined]
        if op.signal is not None:
            self.signals.setdefault((s.core, op.signal), []).append(self.clocks[self.index[id(s)]].copy())  # type: ignore[attr-defined]

    def _check(self, k: int, pc: int, a: Access, who: np.ndarray, when: np.ndarray, verb: str) -> None:
        other = who[a.at]
        seen = self.clocks[k][np.maximum(other, 0)]
        bad = (other >= 0) & (other != k) & (seen < when[a.at])
        if not bad.any():
            return
        first = int(np.argmax(bad))
        j, their = int(other[first]), int(when[a.at][first]) - 1
        mine = self.streams[k]
        theirs = self.streams[j]
        kind = "writes" if a.writes else "reads"
        raise RaceError(f"{_name(mine, pc)} {kind} {a.key[0]} byte {int(a.at[first])} {verb} by "
                        f"{_name(theirs, their)} with no semaphore ordering the two")


def _name(s: object, pc: int) -> str:
    op = s.ops[pc]  # type: ignore[attr-defined]
    node = f" (node {op.node})" if op.node else ""
    return f"core {s.core} {s.name} #{pc} {op.mnemonic}{node}"  # type: ignore[attr-defined]
