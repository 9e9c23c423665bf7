"""Loading a bundle and running it.

    model = runtime.load("mlp.neff")
    outputs = model.run({"x": x})

Loading verifies the bundle (header, hash, format version, target), validates every instruction against the
target's limits, places the weights in simulated HBM, and turns every instruction into a ready-to-run closure over
numpy views of its operands. A run binds the inputs, clears SBUF and PSUM, runs the engines and reads the outputs.
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from isa import bundle as bundle_format
from isa.costs import dma_cost, duration_ns, ports
from isa.dtypes import DType
from isa.errors import IsaError
from isa.instructions import Instruction
from isa.operand import Engine, Operand, stream_engine
from isa.target import TARGETS, Target
from isa.validate import problems
from runtime.errors import AccessError, InputError, LoadError
from runtime.memory import UNWRITTEN, ChipMemory
from runtime.races import Access, RaceChecker
from runtime.semantics import HANDLERS, convert
from runtime.simulator import Op, RunStats, Simulator, StreamState


class Model:
    def __init__(self, b: bundle_format.Bundle) -> None:
        self.bundle = b
        self.target = _target(b)
        self._check_layout()
        self.memory = ChipMemory(self.target, b.hbm_size, len(b.cores))
        self.last_run: RunStats | None = None
        streams = []
        for core, core_streams in enumerate(b.cores):
            for name, stream in core_streams.items():
                engine = _engine(name, self.target)
                ops = [self._load_op(instr, engine, core, name, i, node)
                       for i, (instr, node) in enumerate(zip(stream.instructions, stream.nodes))]
                streams.append(StreamState(core, name, ops))
        self.simulator = Simulator(streams, self.target.semaphores, len(b.cores), self.target.dma_queue_gbps,
                                   self.target.hbm_gbps)

    @property
    def inputs(self) -> list[bundle_format.TensorInfo]:
        return self.bundle.inputs

    @property
    def outputs(self) -> list[bundle_format.TensorInfo]:
        return self.bundle.outputs

    def _check_layout(self) -> None:
        b, t = self.bundle, self.target
        if not 0 < len(b.cores) <= t.cores_per_chip:
            raise LoadError(f"bundle uses {len(b.cores)} cores; a {t.name} chip has {t.cores_per_chip}")
        if not 0 <= b.hbm_size <= t.hbm_bytes:
            raise LoadError(f"bundle needs {b.hbm_size} bytes of HBM; a {t.name} chip has {t.hbm_bytes}")
        for info in (*b.inputs, *b.outputs):
            end = info.hbm_offset + _nbytes(info)
            if info.hbm_offset < 0 or end > b.hbm_size:
                raise LoadError(f"tensor {info.name!r} at HBM [{info.hbm_offset}, {end}) lies outside the "
                                f"bundle's {b.hbm_size} bytes")
        for seg in b.weights:
            if seg.hbm_offset < 0 or seg.hbm_offset + len(seg.data) > b.hbm_size:
                raise LoadError(f"weight segment at HBM offset {seg.hbm_offset} lies outside HBM")

    def _load_op(self, instr: Instruction, engine: Engine, core: int, stream: str, index: int, node: str) -> Op:
        where = f"core {core} {stream} #{index} {instr.op}" + (f" (node {node})" if node else "")
        found = problems(instr, engine, self.target, self.bundle.hbm_size)
        if found:
            raise LoadError(f"invalid instruction at {where}: {'; '.join(found)}")
        try:
            views = {name: self.memory.view(value, core) if isinstance(value, Operand) else value
                     for name, value in instr.args.items()}
            if instr.spec.implicit_reads:
                views.update({name: self.memory.view(o, core)
                              for name, o in instr.spec.implicit_reads(instr).items()})
        except AccessError as e:
            raise LoadError(f"invalid instruction at {where}: {e.args[0]}") from None
        if instr.op not in HANDLERS:
            raise LoadError(f"{where}: this runtime has no semantics for {instr.op}")
        timed_by_dma = instr.spec.cycles is None
        return Op(HANDLERS[instr.op](instr, views), instr.waits, instr.signal,
                  duration_ns(instr, engine, self.target), instr.op, node,
                  dma_cost(instr, self.target) if timed_by_dma else None, ports(instr, engine))

    def _race_checker(self) -> RaceChecker:
        accesses = []
        for state in self.simulator.streams:
            stream = self.bundle.cores[state.core][state.name]
            per_instr = []
            for instr in stream.instructions:
                per_instr.append([Access(*self.memory.footprint(o, state.core), writes)
                                  for operands, writes in ((instr.reads(), False), (instr.writes(), True))
                                  for o in operands])
            accesses.append(per_instr)
        return RaceChecker(self.simulator.streams, accesses, self.target.semaphores, len(self.bundle.cores))

    def _hbm_view(self, info: bundle_format.TensorInfo) -> np.ndarray:
        dtype = DType[info.device_dtype].np
        count = int(np.prod(info.shape, dtype=np.int64))
        return np.ndarray((count,), dtype=dtype, buffer=self.memory.hbm, offset=info.hbm_offset).reshape(info.shape)

    def run(self, inputs: Mapping[str, np.ndarray], policy: str = "clock", seed: int = 0,
            trace: bool = False, check_races: bool = False) -> dict[str, np.ndarray]:
        """Run once. `policy` is "clock" (simulated time) or "random" (seeded random interleaving);
        `check_races` raises RaceError at the first two accesses no semaphore orders (slower)."""
        arrays = self._check_inputs(inputs)
        mem = self.memory
        mem.hbm.fill(UNWRITTEN)
        for seg in self.bundle.weights:
            mem.hbm[seg.hbm_offset:seg.hbm_offset + len(seg.data)] = np.frombuffer(seg.data, np.uint8)
        mem.clear_on_chip()
        for info, array in zip(self.inputs, arrays):
            view = self._hbm_view(info)
            view[...] = convert(array, view.dtype)
        checker = self._race_checker() if check_races else None
        with np.errstate(all="ignore"):
            self.last_run = self.simulator.run(policy, seed, trace, checker)
        return {info.name: self._hbm_view(info).astype(np.dtype(info.dtype)) for info in self.outputs}

    def _check_inputs(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        expected = {info.name for info in self.inputs}
        missing = [name for name in expected if name not in inputs]
        unknown = [name for name in inputs if name not in expected]
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing input(s) {', '.join(sorted(missing))}")
            if unknown:
                parts.append(f"unknown input(s) {', '.join(sorted(unknown))}")
            raise InputError("; ".join(parts) + f" (the model takes {', '.join(i.name for i in self.inputs)})")
        arrays = []
        for info in self.inputs:
            array = np.asarray(inputs[info.name])
            if array.shape != info.shape:
                raise InputError(f"input {info.name!r}: shape {list(array.shape)}, expected {list(info.shape)}")
            if array.dtype != np.dtype(info.dtype):
                raise InputError(f"input {info.name!r}: dtype {array.dtype}, expected {info.dtype}")
            arrays.append(array)
        return arrays


def _nbytes(info: bundle_format.TensorInfo) -> int:
    return int(np.prod(info.shape, dtype=np.int64)) * DType[info.device_dtype].size


def _target(b: bundle_format.Bundle) -> Target:
    try:
        return TARGETS[b.target]
    except KeyError:
        raise LoadError(f"bundle is for target {b.target!r}, which this runtime does not model "
                        f"(known: {', '.join(TARGETS)})") from None


def _engine(name: str, target: Target) -> Engine:
    try:
        engine = stream_engine(name)
    except ValueError as e:
        raise LoadError(str(e)) from None
    if name.startswith("DMA") and int(name[3:]) >= target.dma_queues:
        raise LoadError(f"stream {name}: a {target.name} core has {target.dma_queues} DMA queues")
    return engine


def load(source: str | os.PathLike[str] | bundle_format.Bundle) -> Model:
    """Load a bundle file, or a Bundle made in this process (as `neuronx_cc_lite.compile` returns it), which goes
    through the same encoding and checks as a file; a truncated, corrupted, foreign or invalid bundle raises
    LoadError."""
    try:
        if isinstance(source, bundle_format.Bundle):
            b = bundle_format.from_bytes(bundle_format.to_bytes(source))
        else:
            b = bundle_format.read(source)
    except IsaError as e:
        raise LoadError(e.args[0] if e.args else type(e).__name__) from None
    return Model(b)
