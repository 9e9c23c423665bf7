"""Loading a bundle and running it.

    model = runtime.load("mlp.neff")
    outputs = model.run({"x": x})

Loading verifies the bundle (header, hash, format version, target), checks where its ranks and tensors live
(runtime/layout.py), validates every instruction against the target's limits, sizes each rank's memories to what
its program touches, places the weights in each rank's simulated HBM (once: no run reads the file again, and no
instruction may write over them), and turns every instruction into a ready-to-run closure over numpy views of its
operands (a collective into what its group needs to run it, with its time from the collective cost model). A run
clears the memories but the weights and the device state, writes each input to every placement of it, runs the
engines of every rank and assembles each output from its placements; runs of one model take turns. The device
state (runtime/state.py: a KV cache) stays in HBM from run to run, shared with the models loaded with the same
`state=`; `last_io` counts the bytes a run copied between host and device.
"""

from __future__ import annotations

import bisect
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from isa import bundle as bundle_format
from isa.collectives import Topology, instruction_cost
from isa.costs import dma_cost, ports, stream_durations
from isa.dtypes import DType, not_held, numpy_type
from isa.errors import IsaError
from isa.instructions import Instruction
from isa.operand import Engine, Mem, Operand
from isa.streams import StreamId
from isa.target import TARGETS, Target
from isa.validate import problems
from runtime.collectives import COLLECTIVE_HANDLERS, CollectiveArgs, CollectiveOp, Combine, size_problem
from runtime.errors import AccessError, InputError, LoadError, NeuronRuntimeError
from runtime.layout import check_placements, check_ranks, piece, piece_bytes, piece_shape
from runtime.memory import RankMemories
from runtime.races import Access, RaceChecker
from runtime.ranks import InProcess, MpiRanks
from runtime.semantics import HANDLERS, convert, snapshot, write_to
from runtime.simulator import Op, RunStats, Simulator, StreamState
from runtime.state import DeviceState
from runtime.threads import one_blas_thread

ALGORITHMS = ("auto", "ring", "rdh", "hierarchical", "mesh")


@dataclass(frozen=True)
class IoBytes:
    """The bytes one run copied between host and device (as the device holds them): its inputs in, its outputs
    out. The device state moves only when asked (DeviceState.read/write)."""

    to_device: int = 0
    to_host: int = 0


class Model:
    def __init__(self, b: bundle_format.Bundle, collective_algorithm: str = "auto",
                 host: InProcess | MpiRanks | None = None, state: DeviceState | None = None,
                 on_progress: bundle_format.Progress = bundle_format.no_progress) -> None:
        if collective_algorithm not in ALGORITHMS:
            raise ValueError(f"collective algorithm {collective_algorithm!r}: one of {', '.join(ALGORITHMS)}")
        if b.flags.get("weights") == "declared":  # compiled from shapes alone (neuronx_cc_lite/declared.py)
            raise LoadError("the bundle was compiled from declared weights (shapes without values): it can be timed "
                            "(info, profile), not run")
        self.bundle = b
        self.host = host or InProcess()  # where the ranks run (runtime/ranks.py)
        self.target = _target(b)
        self.topology = check_ranks(b, self.target)
        check_placements(b)
        self.collective_algorithm = collective_algorithm
        self._bounds = _integer_bounds(b)
        engines = {(rank, name): stream_engine(name, self.target) for rank, streams in enumerate(b.cores)
                   for name in streams}
        total = sum(len(stream.instructions) for streams in b.cores for stream in streams.values())
        self._validate(engines, lambda done: on_progress("checking instructions", done, total))
        self.memory = RankMemories(self.target, self._hbm_reach())
        self.state = state if state is not None else DeviceState(self.host.local)
        self._bind_state()
        self.last_io = IoBytes()
        for info in self.outputs:  # what the program leaves unwritten of an output reads as UNWRITTEN
            for p in info.placements:
                if self.host.local(p.rank):
                    self.memory.touch(p.rank, p.hbm_offset, p.hbm_offset + piece_bytes(info, p))
        self.last_run: RunStats | None = None
        self._turn = threading.Lock()  # one run at a time on the one set of memories
        streams, done = [], 0
        for rank, rank_streams in enumerate(b.cores):
            for name, stream in rank_streams.items():
                durations = stream_durations(stream.instructions, engines[rank, name], self.target)
                ops = []
                for i, (instr, node, ns) in enumerate(zip(stream.instructions, stream.nodes, durations)):
                    ops.append(self._load_op(instr, engines[rank, name], rank, name, i, node, ns))
                    on_progress("preparing instructions", done + i, total)
                done += len(ops)
                streams.append(StreamState(rank, name, ops, self.topology.chip_of(rank)))
        self._place_weights(on_progress)
        chips = max(self.topology.chip_of(r) for r in range(self.ranks)) + 1
        self.simulator = Simulator(streams, self.target, self.ranks, chips, b.groups)

    @property
    def ranks(self) -> int:
        return len(self.bundle.cores)

    @property
    def inputs(self) -> list[bundle_format.TensorInfo]:
        return self.bundle.inputs

    @property
    def outputs(self) -> list[bundle_format.TensorInfo]:
        return self.bundle.outputs

    def _validate(self, engines: dict[tuple[int, str], Engine], checked: Callable[[int], None]) -> None:
        """Every instruction against the target's limits; every collective against its group. `checked(n)`: n
        instructions have been."""
        b = self.bundle
        done = 0
        for (rank, name), engine in engines.items():
            stream = b.cores[rank][name]
            for i, (instr, node) in enumerate(zip(stream.instructions, stream.nodes)):
                checked(done + i)
                found = problems(instr, engine, self.target, b.hbm_size)
                if not found and instr.spec.collective:
                    found = _group_problems(instr, rank, b.groups)
                if found:
                    raise LoadError(f"invalid instruction at {_where(instr, rank, name, i, node)}: "
                                    f"{'; '.join(found)}")
            done += len(stream.instructions)

    def _place_weights(self, on_progress: bundle_format.Progress) -> None:
        """Copy the weights into HBM once, where every run finds them: a loaded model computes with the bundle it
        loaded, whatever later happens to its file (rewritten in place, truncated), and no run reads the file.
        No instruction may write into them (LoadError), so no run can change what the next one reads."""
        spans: dict[int, list[tuple[int, int]]] = {}
        total, done = sum(len(seg.data) for seg in self.bundle.weights), 0
        for seg in self.bundle.weights:
            on_progress("placing weight bytes", done, total)
            done += len(seg.data)
            if self.host.local(seg.rank) and len(seg.data):
                seg.copy_to(self.memory.hbm[seg.rank][seg.hbm_offset:seg.hbm_offset + len(seg.data)])
                self.memory.keep(seg.rank, seg.hbm_offset, seg.hbm_offset + len(seg.data))
                spans.setdefault(seg.rank, []).append((seg.hbm_offset, seg.hbm_offset + len(seg.data)))
        for rank, weights in spans.items():
            weights.sort()
            starts = [first for first, _ in weights]
            for name, stream in self.bundle.cores[rank].items():
                for i, (instr, node) in enumerate(zip(stream.instructions, stream.nodes)):
                    for o in instr.writes():
                        if o.mem is not Mem.HBM:
                            continue
                        first, end = o.byte_span()
                        k = bisect.bisect_right(starts, first) - 1
                        if any(a < end and first < b for a, b in weights[max(k, 0):k + 2]):
                            raise LoadError(f"invalid instruction at {_where(instr, rank, name, i, node)}: it "
                                            f"writes HBM [{first}, {end}), which holds weights")

    def _bind_state(self) -> None:
        """Declare the bundle's state tensors to the device state (zeros, or checked against a sharing model's) and
        bind each local piece where the program addresses it."""
        if not isinstance(self.state, DeviceState):
            raise TypeError(f"state must be a runtime.DeviceState (another model's .state), not "
                            f"{type(self.state).__name__}")
        for info in self.bundle.state:
            self.state.declare(info)
            for p in info.placements:
                if self.host.local(p.rank):
                    try:
                        self.memory.bind(p.rank, p.hbm_offset, self.state.piece_array(info.name, p))
                    except AccessError as e:
                        raise LoadError(f"state tensor {info.name!r} on rank {p.rank}: {e.args[0]}") from None

    def _hbm_reach(self) -> list[int]:
        """Per rank, where the last HBM byte any operand, weight or placement of it touches ends."""
        reach = [0] * self.ranks
        for rank, streams in enumerate(self.bundle.cores):
            for stream in streams.values():
                for instr in stream.instructions:
                    for o in (*instr.reads(), *instr.writes()):
                        if o.mem is Mem.HBM:
                            reach[rank] = max(reach[rank], o.byte_span()[1])
        for seg in self.bundle.weights:
            reach[seg.rank] = max(reach[seg.rank], seg.hbm_offset + len(seg.data))
        for info in (*self.inputs, *self.outputs, *self.bundle.state):
            for p in info.placements:
                reach[p.rank] = max(reach[p.rank], p.hbm_offset + piece_bytes(info, p))
        return [n if self.host.local(rank) else 0 for rank, n in enumerate(reach)]

    def _load_op(self, instr: Instruction, engine: Engine, rank: int, stream: str, index: int, node: str,
                 duration: float) -> Op:
        """The instruction as the simulator runs it; `duration` its cost in its stream (isa/costs.py)."""
        where = _where(instr, rank, stream, index, node)
        if not self.host.local(rank):  # another process computes this rank: here it only keeps time
            if instr.spec.collective:
                return Op(None, instr.waits, instr.signal, 0.0, instr.op, node,
                          collective=self._collective(instr, None, where))
            timed_by_dma = instr.spec.cycles is None
            return Op(_keep_time, instr.waits, instr.signal, duration, instr.op,
                      node, dma_cost(instr, self.target) if timed_by_dma else None, ports(instr, engine))
        try:
            views = {name: self.memory.view(value, rank) if isinstance(value, Operand) else value
                     for name, value in instr.args.items()}
            views.update({name: self.memory.view(o, rank) for name, (o, _) in instr.implicit_operands().items()})
        except AccessError as e:
            raise LoadError(f"invalid instruction at {where}: {e.args[0]}") from None
        if instr.spec.collective:
            return Op(None, instr.waits, instr.signal, 0.0, instr.op, node,
                      collective=self._collective(instr, views, where))
        if instr.op not in HANDLERS:
            raise LoadError(f"{where}: this runtime has no semantics for {instr.op}")
        timed_by_dma = instr.spec.cycles is None
        return Op(HANDLERS[instr.op](instr, views), instr.waits, instr.signal, duration, instr.op, node,
                  dma_cost(instr, self.target) if timed_by_dma else None, ports(instr, engine))

    def _collective(self, instr: Instruction, views: dict[str, np.ndarray] | None, where: str) -> CollectiveOp:
        """`views` None: a rank of another process, whose buffers the exchange brings and whose dst is not here."""
        members = self.bundle.groups[instr.args["group"]]
        semantics = COLLECTIVE_HANDLERS[instr.op]

        def combine(srcs: list[Any], n: int, args: CollectiveArgs) -> list[np.ndarray]:
            here = {rank: src for rank, src in zip(members, srcs) if self.host.local(rank)}
            return semantics(self.host.exchange(members, here), n, args)

        if views is None:
            return collective_op(instr, self.bundle.groups, self.topology, self.collective_algorithm, where,
                                 lambda: None, lambda flat: None, combine)
        read, store = snapshot(views["src"]), write_to(views["dst"])
        partitions = views["dst"].shape[0]
        return collective_op(instr, self.bundle.groups, self.topology, self.collective_algorithm, where,
                             lambda: read().reshape(-1), lambda flat: store(flat.reshape(partitions, -1)),
                             combine if self.host.processes > 1 else None)

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
        return RaceChecker(self.simulator.streams, accesses, self.target.semaphores, self.ranks)

    def _piece_view(self, info: bundle_format.TensorInfo, p: bundle_format.Placement) -> np.ndarray:
        dtype = DType[info.device_dtype].np
        shape = piece_shape(info, p)
        count = int(np.prod(shape, dtype=np.int64))
        return np.ndarray((count,), dtype=dtype, buffer=self.memory.hbm[p.rank], offset=p.hbm_offset).reshape(shape)

    def run(self, inputs: Mapping[str, np.ndarray], policy: str = "clock", seed: int = 0,
            trace: bool = False, check_races: bool = False) -> dict[str, np.ndarray]:
        """Run once. `policy` is "clock" (simulated time) or "random" (seeded random interleaving);
        `check_races` raises RaceError at the first two accesses no semaphore orders (slower). A model has one set
        of memories: runs from several threads (ExecutionQueues, direct calls) take turns."""
        return self.run_with_stats(inputs, policy, seed, trace, check_races)[0]

    def run_with_stats(self, inputs: Mapping[str, np.ndarray], policy: str = "clock", seed: int = 0,
                       trace: bool = False, check_races: bool = False) -> tuple[dict[str, np.ndarray], RunStats]:
        """`run`, and that run's RunStats (last_run may already be another thread's by the time it is read)."""
        outputs, stats, _ = self.run_with_io(inputs, policy, seed, trace, check_races)
        return outputs, stats

    def run_with_io(self, inputs: Mapping[str, np.ndarray], policy: str = "clock", seed: int = 0,
                    trace: bool = False, check_races: bool = False
                    ) -> tuple[dict[str, np.ndarray], RunStats, IoBytes]:
        """`run_with_stats`, and the bytes that run copied between host and device."""
        check_run_options(inputs, policy, seed)
        with self._turn:
            outputs = self._run(inputs, policy, seed, trace, check_races)
            assert self.last_run is not None
            return outputs, self.last_run, self.last_io

    def _run(self, inputs: Mapping[str, np.ndarray], policy: str, seed: int, trace: bool,
             check_races: bool) -> dict[str, np.ndarray]:
        arrays = self.check_inputs(inputs)
        mem = self.memory
        mem.clear()  # the weights, placed at load, and the device state stay
        to_device = 0
        for info, array in zip(self.inputs, arrays):
            for p in info.placements:
                if self.host.local(p.rank):
                    view = self._piece_view(info, p)
                    view[...] = convert(array[piece(info, p)], view.dtype)
                    to_device += view.nbytes
        if check_races and self.host.processes > 1:
            raise InputError("--check-races runs every rank in one process: run without mpiexec")
        checker = self._race_checker() if check_races else None
        with np.errstate(all="ignore"), one_blas_thread():
            try:
                self.last_run = self.simulator.run(policy, seed, trace, checker)
            except NeuronRuntimeError as e:
                self.host.abort(e)  # under MPI the other processes would wait for this one forever
                raise
        pieces = {(info.name, k): self._piece_view(info, p).astype(numpy_type(info.dtype))
                  for info in self.outputs for k, p in enumerate(info.placements) if self.host.local(p.rank)}
        self.last_io = IoBytes(to_device, sum(self._piece_view(info, p).nbytes for info in self.outputs
                                              for p in info.placements if self.host.local(p.rank)))
        gathered = self.host.gather_outputs(pieces)
        if gathered is None:  # a process other than the first of an MPI job: the first has the outputs
            return {}
        return {info.name: _assemble(info, gathered) for info in self.outputs}

    def check_inputs(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The inputs as the run will take them, in the bundle's order; InputError for missing, unknown, mis-shaped,
        mis-typed or out-of-bounds ones."""
        arrays = check_inputs(self.inputs, inputs)
        for info, array in zip(self.inputs, arrays):
            self._check_values(info, array)
        return arrays

    def _check_values(self, info: bundle_format.TensorInfo, array: np.ndarray) -> None:
        """An input value the bundle would not compute with as given is refused, not computed with: an int64 the
        device holds as int32 would wrap, a float64 past or below fp32's normal range (held as fp32) would become
        inf or lose its precision or become zero, and the compiler recorded the bound within which it computes
        with an integer input exactly (stats["integer_bounds"]: integers go through the engines' fp32)."""
        if array.dtype.kind not in "iuf" or array.size == 0:
            return
        bound = self._bounds.get(info.name)
        if bound is not None:
            outside = (array < bound[0]) | (array > bound[1])
            why = f"outside [{bound[0]}, {bound[1]}]: the bundle computes with it exactly only there (integers go " \
                  "through the engines' fp32)"
        else:
            held = DType[info.device_dtype]
            outside = not_held(array, held)
            if held.np.kind in "iu":
                limits = np.iinfo(held.np)
                why = f"outside [{limits.min}, {limits.max}]: the device holds it as {held.name}"
            else:
                why = "outside fp32's normal range (1.2e-38 to 3.4e38 in magnitude), which the device holds it in"
        if outside is not None and outside.any():
            at = tuple(int(i) for i in np.argwhere(outside)[0])
            raise InputError(f"input {info.name!r} holds {array[at]} at {list(at)}, {why}")


def check_inputs(infos: list[bundle_format.TensorInfo], inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The inputs as arrays in the model's order, each of its name, shape and type, or InputError saying what is
    wrong."""
    expected = {info.name for info in infos}
    missing = [name for name in expected if name not in inputs]
    unknown = [name for name in inputs if name not in expected]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing input(s) {', '.join(sorted(missing))}")
        if unknown:
            parts.append(f"unknown input(s) {', '.join(sorted(unknown))}")
        raise InputError("; ".join(parts) + f" (the model takes {', '.join(i.name for i in infos)})")
    arrays = []
    for info in infos:
        array = np.asarray(inputs[info.name])
        if array.shape != info.shape:
            raise InputError(f"input {info.name!r}: shape {list(array.shape)}, expected {list(info.shape)}")
        if array.dtype != numpy_type(info.dtype):
            raise InputError(f"input {info.name!r}: dtype {array.dtype}, expected {info.dtype}")
        arrays.append(array)
    return arrays


POLICIES = ("clock", "random")


def check_run_options(inputs: Any, policy: Any, seed: Any) -> None:
    """TypeError or ValueError naming the argument, for a call that could not mean anything."""
    if not isinstance(inputs, Mapping):
        raise TypeError(f"inputs must be a mapping of input name to array (a dict), not {type(inputs).__name__}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"seed must be an integer, not {type(seed).__name__}")


def _integer_bounds(b: bundle_format.Bundle) -> dict[str, tuple[int, int]]:
    """stats["integer_bounds"]: {input: [low, high]}, checked (a hand-made bundle may hold anything there)."""
    found = b.stats.get("integer_bounds", {}) if isinstance(b.stats, dict) else {}
    names = {info.name for info in b.inputs}
    if not isinstance(found, dict) or not all(
            name in names and isinstance(v, list) and len(v) == 2 and all(type(n) is int for n in v) and v[0] <= v[1]
            for name, v in found.items()):
        raise LoadError("the manifest's stats.integer_bounds is not {input: [low, high]} for inputs of the bundle")
    return {name: (v[0], v[1]) for name, v in found.items()}


def _assemble(info: bundle_format.TensorInfo, pieces: dict[tuple[str, int], np.ndarray]) -> np.ndarray:
    """An output from its placements' pieces; where they overlap, the first listed is read."""
    first = pieces[info.name, 0]
    if first.shape == info.shape:
        return first
    out = np.empty(info.shape, numpy_type(info.dtype))
    for k in reversed(range(len(info.placements))):
        out[piece(info, info.placements[k])] = pieces[info.name, k]
    return out


def _keep_time() -> Callable[[], None]:
    """The issue of an instruction another process computes: nothing to read, nothing to write."""
    return _nothing


def _nothing() -> None:
    return None


def collective_op(instr: Instruction, groups: list[tuple[int, ...]], topo: Topology, algorithm: str, where: str,
                  read: Callable[[], Any], write: Callable[[Any], None], combine: Combine | None = None
                  ) -> CollectiveOp:
    """A rank's collective with its cost: the collective cost model's time and links for the whole collective on
    its group (nbytes: the larger of src and dst on one rank). `combine` defaults to the collective's semantics."""
    args = CollectiveArgs.of(instr)
    try:
        cost = instruction_cost(instr, groups, topo, algorithm)
    except ValueError as e:
        raise LoadError(f"{where}: {e}") from None
    return CollectiveOp(instr.args["group"], args, cost.ns, tuple(sorted(cost.links)), cost.algorithm, read, write,
                        combine or COLLECTIVE_HANDLERS[instr.op])


def _group_problems(instr: Instruction, rank: int, groups: list[tuple[int, ...]]) -> list[str]:
    g = instr.args["group"]
    if not 0 <= g < len(groups):
        return [f"group {g}; the bundle has {len(groups)} replica group(s)"]
    if rank not in groups[g]:
        return [f"rank {rank} is not in group {g} ({', '.join(map(str, groups[g]))})"]
    found = size_problem(CollectiveArgs.of(instr), len(groups[g]))
    return [found] if found else []


def _where(instr: Instruction, rank: int, stream: str, index: int, node: str) -> str:
    return f"core {rank} {stream} #{index} {instr.op}" + (f" (node {node})" if node else "")


def _target(b: bundle_format.Bundle) -> Target:
    try:
        return TARGETS[b.target]
    except KeyError:
        raise LoadError(f"bundle is for target {b.target!r}, which this runtime does not model "
                        f"(known: {', '.join(TARGETS)})") from None


def stream_engine(name: str, target: Target) -> Engine:
    """The engine of stream `name` on a core of `target`; LoadError for a name no stream of it has."""
    try:
        stream = StreamId.parse(name)
    except ValueError as e:
        raise LoadError(str(e)) from None
    if stream.queue is not None and stream.queue >= target.dma_queues:
        raise LoadError(f"stream {name}: a {target.name} core has {target.dma_queues} DMA queues")
    return stream.engine


def load(source: str | os.PathLike[str] | bundle_format.Bundle, collective_algorithm: str = "auto",
         host: InProcess | MpiRanks | None = None, state: DeviceState | None = None,
         on_progress: bundle_format.Progress = bundle_format.no_progress) -> Model:
    """Load a bundle file, or a Bundle made in this process (as `neuronx_cc_lite.compile` returns it), which goes
    through the same encoding and checks as a file; a truncated, corrupted, foreign or invalid bundle raises
    LoadError. `collective_algorithm` (auto, ring, rdh, hierarchical) is what the collective cost model times the
    collectives by; `host` is where the ranks run (runtime/ranks.py: in this process by default, or spread over
    an MPI job's processes). `state`: another model's `.state`, to share its device state (a prefill and a decode
    bundle sharing one KV cache); by default the model gets state of its own, zeroed. `on_progress(what, done,
    total)` is told how far the load has come as it checks the file's hash, decodes, checks and prepares the
    instructions and places the weights (BERT-base's 16,849 instructions and 438 MB take seconds)."""
    try:
        if isinstance(source, bundle_format.Bundle):
            b = bundle_format.from_bytes(bundle_format.to_bytes(source))
        else:
            b = bundle_format.read(source, on_progress)
    except IsaError as e:
        raise LoadError(e.args[0] if e.args else type(e).__name__) from None
    if b.parts:  # compiled with --fallback host: chip and host parts (runtime/host.py)
        if host is not None and host.processes > 1:
            raise LoadError("a bundle with host parts runs in one process: run it without mpiexec")
        if state is not None:
            raise LoadError("a bundle with host parts keeps no device state: load it without state=")
        from runtime.host import PartitionedModel

        return PartitionedModel(b, collective_algorithm)  # type: ignore[return-value]
    return Model(b, collective_algorithm, host, state, on_progress)
