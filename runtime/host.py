"""Partitioned bundles (compiled with `--fallback host`): chip parts on the simulated chip, host parts on the CPU.

    model = runtime.load("detector.neff")        # a PartitionedModel when the bundle has parts
    outputs = model.run({"image": x})            # the parts in order, each fed what it reads
    model.last_run.parts                         # per part: where it ran, its time, the bytes it moved

A chip part is a bundle of its own, loaded and run as any (runtime/model.py). A host part is an ONNX model run by
onnxruntime, imported only when a bundle has a host part (`pip install 'neuronx-cc-lite[host]'`): a bundle without
one never loads it, and the runtime imports neither onnx nor the compiler in any case.

Time, per inference: each chip part costs its simulated latency plus what the runtime adds to a launch (the
target's launch figure, and copying the part's inputs to the device and its outputs back over the host link:
Target.host_overhead_us); each host part costs the time onnxruntime took on this machine's CPU, measured. The
sum is the end-to-end latency; `transfers` are the bytes that crossed between host and device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from isa import bundle as bundle_format
from isa.target import TARGETS, Target
from runtime.errors import LoadError, NeuronRuntimeError
from runtime.model import Model, check_inputs
from runtime.ranks import InProcess


class HostError(NeuronRuntimeError):
    """onnxruntime failed to run a host part."""

    code = "NRT_HOST"


@dataclass
class PartRun:
    kind: str  # "chip" or "host"
    start_ns: float  # from the start of the inference
    ns: float  # a chip part: device latency + launch and copies; a host part: onnxruntime's wall time
    device_ns: float = 0.0  # a chip part's simulated latency
    bytes_in: int = 0  # copied to the device (a chip part's inputs)
    bytes_out: int = 0  # copied back (its outputs)
    instructions: int = 0


@dataclass
class PartitionedRun:
    """What RunStats gives of a plain run, for all parts: elapsed_ns is the end-to-end time (device, host and the
    copies between them)."""

    elapsed_ns: float = 0.0
    instructions: int = 0
    parts: list[PartRun] = field(default_factory=list)
    trace: list[Any] = field(default_factory=list)

    @property
    def device_ns(self) -> float:
        return sum(p.device_ns for p in self.parts)

    @property
    def host_ns(self) -> float:
        return sum(p.ns for p in self.parts if p.kind == "host")

    @property
    def transfer_bytes(self) -> int:
        return sum(p.bytes_in + p.bytes_out for p in self.parts)


class HostPart:
    """A host part, loaded into an onnxruntime session (one thread: the measured time is one core's)."""

    def __init__(self, index: int, part: bundle_format.Part) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise LoadError(f"part {index} of the bundle runs on the host with onnxruntime, which is not installed: "
                            "pip install 'neuronx-cc-lite[host]'") from None
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        try:
            self.session = onnxruntime.InferenceSession(part.onnx, options, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own types for a model it refuses
            raise LoadError(f"part {index} (host): onnxruntime cannot load it: {_first_line(e)}") from None
        self.index, self.part = index, part
        self.last_run = None

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            values = self.session.run(self.part.outputs, feeds)
        except Exception as e:  # onnxruntime's errors on values it cannot take (an index out of range)
            raise HostError(f"part {self.index} (host: {', '.join(self.part.ops)}): {_first_line(e)}") from None
        return dict(zip(self.part.outputs, values))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class PartitionedModel:
    """A partitioned bundle, loaded: `run` and `last_run` as a Model has them (in this process only)."""

    def __init__(self, b: bundle_format.Bundle, collective_algorithm: str = "auto") -> None:
        check_partitioned(b)
        self.bundle = b
        self.host = InProcess()
        try:
            self.target: Target = TARGETS[b.target]
        except KeyError:
            raise LoadError(f"bundle is for target {b.target!r}, which this runtime does not model") from None
        self.parts: list[Model | HostPart] = [
            Model(p.bundle, collective_algorithm) if p.bundle is not None else HostPart(k, p)
            for k, p in enumerate(b.parts)]
        self.last_run: PartitionedRun | None = None

    @property
    def inputs(self) -> list[bundle_format.TensorInfo]:
        return self.bundle.inputs

    @property
    def outputs(self) -> list[bundle_format.TensorInfo]:
        return self.bundle.outputs

    @property
    def chip_models(self) -> list[Model]:
        return [m for m in self.parts if isinstance(m, Model)]

    @property
    def simulator(self) -> Any:
        """Every chip part's streams as one simulator's (what the progress line polls)."""
        return _Streams([s for m in self.chip_models for s in m.simulator.streams])

    def check_inputs(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The inputs in the model's order, each of its name, shape and type (InputError otherwise)."""
        return check_inputs(self.inputs, inputs)

    def run(self, inputs: Mapping[str, np.ndarray], policy: str = "clock", seed: int = 0, trace: bool = False,
            check_races: bool = False) -> dict[str, np.ndarray]:
        values: dict[str, np.ndarray] = dict(zip((i.name for i in self.inputs), self.check_inputs(inputs)))
        stats = PartitionedRun()
        for k, (part, model) in enumerate(zip(self.bundle.parts, self.parts)):
            feeds = {name: values[name] for name in part.inputs}
            if isinstance(model, HostPart):
                start = time.perf_counter()
                made = model.run(feeds)
                stats.parts.append(PartRun("host", stats.elapsed_ns, (time.perf_counter() - start) * 1e9))
            else:
                made = model.run(feeds, policy, seed, trace, check_races)
                device = model.last_run.elapsed_ns
                moved = _nbytes(feeds.values()), _nbytes(made.values())
                launch = self.target.host_overhead_us(sum(moved)) * 1000
                stats.parts.append(PartRun("chip", stats.elapsed_ns, device + launch, device, *moved,
                                           model.last_run.instructions))
                stats.instructions += model.last_run.instructions
            missing = [name for name in part.outputs if name not in made]
            if missing:
                raise HostError(f"part {k} did not make {', '.join(missing)}")
            values.update(made)
            stats.elapsed_ns += stats.parts[-1].ns
        self.last_run = stats
        return {info.name: values[info.name] for info in self.outputs}


def _nbytes(arrays: Any) -> int:
    return sum(int(np.asarray(a).nbytes) for a in arrays)


@dataclass
class _Streams:
    streams: list[Any]


def check_partitioned(b: bundle_format.Bundle) -> None:
    """Every part reads what the model's inputs and earlier parts make (the bundle reader checked the names);
    here, that a chip part's inputs are what the chip program takes."""
    for k, p in enumerate(b.parts):
        if p.bundle is not None and sorted(i.name for i in p.bundle.inputs) != sorted(p.inputs):
            raise LoadError(f"part {k}: the chip program takes {', '.join(i.name for i in p.bundle.inputs)}, the "
                            f"manifest feeds it {', '.join(p.inputs)}")
