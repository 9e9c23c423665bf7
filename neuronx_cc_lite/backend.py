"""An ONNX backend (`onnx.backend.base`) over the compiler and the simulated chip, so that ONNX's own backend test
suite runs against the project:

    import neuronx_cc_lite.backend as backend
    rep = backend.prepare(model)          # compile -> bundle file -> runtime.load
    outputs = rep.run([x, y])             # a namedtuple in the model's output order

`prepare` compiles the ModelProto, writes the bundle to a temporary file and loads it with `runtime.load`: the
runtime sees only the bundle file, as it would on a real machine.

`is_compatible` answers "would the compiler refuse this model as unsupported?" by running the frontend and the
pass pipeline and asking the lowering registry for unsupported nodes; any coded CompileError in that analysis
(unsupported op, attribute or dtype, dynamic shape, shape inference failure...) means not compatible. An internal
error (NCC_INTERNAL, a broken pass, a Python exception) is not an answer about support: the model counts as
compatible, so that compiling it fails loudly.

Inputs the compiler needs at compile time (a Reshape's shape, a reduction's axes, Pad's pads, and what decides
control flow: an If's condition, a Loop's trip count; ONNX's node tests often pass these as graph inputs) make a
model specialise: `prepare` returns a rep that compiles at its first `run`, with those inputs' values built into
the bundle as constants, and compiles again when a later run brings other values. Everything else about the run
is unchanged: the other inputs go to the device.

`prepare` of a model that is not compatible raises `NotCompatibleError`, which is both a CompileError and a
`unittest.SkipTest`: ONNX's node tests call `prepare` directly (without `is_compatible`), and an unsupported op
must come out of them as skipped, never as passed and never as failed.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import unittest
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

import runtime
from isa import bundle as bundle_format
from isa.target import get_target
from neuronx_cc_lite.compiler import Options, compile_model
from neuronx_cc_lite.compiler import prepare as prepare_graph
from neuronx_cc_lite.errors import CompileError, UnsupportedError
from neuronx_cc_lite.frontend import load_model
from neuronx_cc_lite.ir import upstream
from neuronx_cc_lite.ops.registry import compile_time_values, unsupported_nodes
from neuronx_cc_lite.passes.verify import verify

# Error codes that say the compiler is broken rather than that the model is unsupported: never a skip.
INTERNAL_CODES = frozenset({"NCC_INTERNAL", "NCC_VERIFY"})

# The keyword arguments of prepare/run_model/is_compatible: compile options; any other is refused (a misspelt
# option silently ignored would compile something else than asked)
_OPTION_KWARGS = ("target", "input_shapes", "auto_cast", "auto_cast_type", "optimize")


class NotCompatibleError(CompileError, unittest.SkipTest):
    """The compiler refuses the model as unsupported (the reason is the compiler's own error)."""

    def __init__(self, error: CompileError) -> None:
        super().__init__(error.code, error.message, error.node, error.op)
        self.error = error


@dataclass(frozen=True)
class Analysis:
    compatible: bool
    error: CompileError | None  # why not, when not compatible
    internal: BaseException | None = None  # an internal error met during the analysis (the model stays compatible)
    device_ops: tuple[str, ...] = ()  # op types left for the device after the pass pipeline (constant folding)

    @property
    def reason(self) -> str:
        return str(self.error) if self.error is not None else ""


_ANALYSES: dict[tuple[str, str, tuple[tuple[str, tuple[int, ...]], ...]], Analysis] = {}
_LOCK = threading.Lock()


def _options(kwargs: Mapping[str, Any]) -> Options:
    """Compile options from prepare's keyword arguments. An unknown target is the caller's error, raised (a
    CompileError NCC_TARGET, not a skip): it must not turn every test into "not compatible"."""
    unknown = sorted(set(kwargs) - set(_OPTION_KWARGS))
    if unknown:
        raise TypeError(f"unknown keyword argument(s) {', '.join(unknown)}; the backend takes "
                        f"{', '.join(_OPTION_KWARGS)}")
    known = {k: kwargs[k] for k in _OPTION_KWARGS if kwargs.get(k) is not None}
    if "input_shapes" in known:
        known["input_shapes"] = {k: tuple(v) for k, v in known["input_shapes"].items()}
    options = Options(**known)
    try:
        get_target(options.target)
    except KeyError as e:
        raise CompileError("NCC_TARGET", e.args[0]) from None
    return options


def _key(model: onnx.ModelProto, options: Options) -> tuple[str, str, tuple[tuple[str, tuple[int, ...]], ...]]:
    digest = hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()
    return digest, options.target, tuple(sorted(options.input_shapes.items()))


def analyze(model: onnx.ModelProto, options: Options | None = None) -> Analysis:
    """Would the compiler refuse the model as unsupported? Cached per (model, options)."""
    options = options or Options()
    key = _key(model, options)
    with _LOCK:
        if key in _ANALYSES:
            return _ANALYSES[key]
    result = _analyze(model, options)
    with _LOCK:
        _ANALYSES[key] = result
    return result


def _analyze(model: onnx.ModelProto, options: Options) -> Analysis:
    try:
        graph = prepare_graph(model, options)
        verify(graph, "the pass pipeline", require_static=True)  # what compile_graph insists on first
        unsupported = unsupported_nodes(graph)
        if unsupported:
            return Analysis(False, UnsupportedError(unsupported), device_ops=tuple(n.op for n in graph.nodes))
    except CompileError as e:
        if e.code in INTERNAL_CODES:
            return Analysis(True, None, e)
        return Analysis(False, e)
    except Exception as e:  # noqa: BLE001 - a crash is the compiler's bug, reported when prepare compiles
        return Analysis(True, None, e)
    return Analysis(True, None, device_ops=tuple(n.op for n in graph.nodes))


def clear_cache() -> None:
    with _LOCK:
        _ANALYSES.clear()


def _feeds(inputs: Any, names: list[str]) -> dict[str, np.ndarray]:
    """Inputs given as a dict, a list/tuple in input order, or one array, keyed by input name."""
    if isinstance(inputs, Mapping):
        return {name: np.asarray(value) for name, value in inputs.items()}
    if isinstance(inputs, np.ndarray):
        inputs = [inputs]
    values = list(inputs)
    if len(values) != len(names):
        raise ValueError(f"{len(values)} input(s) given; the model takes {len(names)} ({', '.join(names)})")
    return {name: np.asarray(value) for name, value in zip(names, values)}


class NeuronBackendRep(BackendRep):
    """A compiled model loaded on the simulated chip."""

    def __init__(self, model: runtime.Model, output_names: Sequence[str]) -> None:
        self.model = model
        self.input_names = [info.name for info in model.inputs]
        self.output_names = list(output_names)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """`inputs`: a list/tuple in the order of the model's (non-initializer) inputs, a single array for a
        one-input model, or a dict keyed by input name. Returns a namedtuple in the model's output order."""
        feeds = _feeds(inputs, self.input_names)
        run_kwargs = {k: kwargs[k] for k in ("policy", "seed") if k in kwargs}
        outputs = self.model.run(feeds, **run_kwargs)
        result = namedtupledict("Outputs", self.output_names)
        return result(*[outputs[name] for name in self.output_names])


# Ops whose outputs depend only on their input's shape: a value computed through them needs no input's values
SHAPE_READERS = frozenset({"Shape", "Size"})


def _parameters(model: onnx.ModelProto) -> list[str]:
    """The graph inputs some lowering or expansion needs as compile-time constants (directly or computed from them:
    a window's size through its Cast), and those that decide control flow (an If's condition, a Loop's trip count,
    as `--input-value` pins them; a Loop's first condition when it is an input), in input order."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [vi.name for vi in model.graph.input if vi.name not in inits]
    tensors = {vi.name for vi in model.graph.input if vi.name in inputs and vi.type.HasField("tensor_type")}
    needed = compile_time_values([(n.op_type, list(n.input)) for n in model.graph.node])
    found = _inputs_behind(sorted(needed), model.graph, tensors, SHAPE_READERS)
    deciding = [n.input[0] for n in model.graph.node if n.op_type in ("If", "Loop") and n.input]
    found |= _inputs_behind(deciding, model.graph, tensors)  # a sequence's length is no value to build in
    found |= {n.input[1] for n in model.graph.node if n.op_type == "Loop" and len(n.input) > 1} & tensors
    return [name for name in inputs if name in found]


def _inputs_behind(names: list[str], graph: onnx.GraphProto, inputs: set[str],
                   stop: frozenset[str] = frozenset()) -> set[str]:
    """The graph inputs the values `names` are computed from (not through the ops in `stop`)."""
    return upstream(graph, names, stop) & inputs


def _freeze(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    kept = [vi for vi in frozen.graph.input if vi.name not in values]
    del frozen.graph.input[:]
    frozen.graph.input.extend(kept)
    frozen.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), name) for name, v in values.items())
    return frozen


def _load(model: onnx.ModelProto, options: Options) -> runtime.Model:
    analysis = analyze(model, options)
    if not analysis.compatible:
        assert analysis.error is not None
        raise NotCompatibleError(analysis.error) from analysis.error
    b = compile_model(model, options)  # an error here, after the analysis accepted the model, is a bug
    with tempfile.TemporaryDirectory(prefix="ncc-backend-") as tmp:
        path = os.path.join(tmp, "model.neff")
        bundle_format.write(b, path)
        return runtime.load(path)


class SpecializingRep(BackendRep):
    """A model compiled at each run for the values of its compile-time inputs (cached per values)."""

    def __init__(self, model: onnx.ModelProto, options: Options, parameters: list[str]) -> None:
        self.model = model
        self.options = options
        self.parameters = parameters
        inits = {i.name for i in model.graph.initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self.compiled: dict[bytes, NeuronBackendRep] = {}

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        feeds = _feeds(inputs, self.input_names)
        values = {name: feeds.pop(name) for name in self.parameters}
        key = b"".join(v.dtype.str.encode() + str(v.shape).encode() + v.tobytes() for v in values.values())
        if key not in self.compiled:
            loaded = _load(_freeze(self.model, values), self.options)
            self.compiled[key] = NeuronBackendRep(loaded, self.output_names)
        return self.compiled[key].run(feeds, **kwargs)


class NeuronBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        if not cls.supports_device(device):
            return False
        return analyze(model, _options(kwargs)).compatible or bool(_parameters(model))

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> NeuronBackendRep:
        if not cls.supports_device(device):
            raise ValueError(f"device {device!r} is not supported (only CPU, the simulated chip)")
        if isinstance(model, (str, bytes, os.PathLike)):
            model = load_model(model) if not isinstance(model, bytes) else onnx.load_from_string(model)
        options = _options(kwargs)
        parameters = _parameters(model)
        if parameters and not analyze(model, options).compatible:
            return SpecializingRep(model, options, parameters)
        loaded = _load(model, options)
        return NeuronBackendRep(loaded, [info.name for info in loaded.outputs])

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node: it is wrapped in a one-node model (graph inputs = the node's non-empty inputs, in
        order) and goes through prepare. An unsupported node raises NotImplementedError."""
        default_domain = node.domain in ("", "ai.onnx")
        if default_domain:  # the base class checks the node against the default domain only
            super().run_node(node, inputs, device, outputs_info, **kwargs)
        if isinstance(inputs, Mapping):
            arrays = [np.asarray(inputs[name]) for name in node.input if name]
        else:
            arrays = [np.asarray(v) for v in (inputs if isinstance(inputs, (list, tuple)) else [inputs])]
        names = [name for name in node.input if name]
        if len(arrays) != len(names):
            raise ValueError(f"{len(arrays)} input(s) given; node {node.op_type} takes {len(names)}")
        graph_inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                        for name, a in zip(names, arrays)]
        graph_outputs = []
        for i, name in enumerate(o for o in node.output if o):
            if outputs_info is not None and i < len(outputs_info):
                dtype, shape = outputs_info[i]
                graph_outputs.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape))
            else:
                graph_outputs.append(onnx.ValueInfoProto(name=name))  # typed by shape inference below
        opset = kwargs.pop("opset_version", None) or onnx.defs.onnx_opset_version()
        imports = [helper.make_opsetid("", opset)]
        if not default_domain:
            try:
                version = onnx.defs.get_schema(node.op_type, domain=node.domain).since_version
            except onnx.defs.SchemaError:
                version = 1
            imports.append(helper.make_opsetid(node.domain, version))
        model = helper.make_model(helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs,
                                                    graph_outputs), opset_imports=imports)
        try:
            model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        except Exception:  # noqa: BLE001 - the untyped outputs then make prepare refuse the model, with the cause
            pass
        try:
            rep = cls.prepare(model, device, **kwargs)
        except NotCompatibleError as e:
            raise NotImplementedError(f"{node.op_type} is not supported by neuronx-cc-lite: {e}") from e
        return rep.run(arrays)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.split(":")[0].upper() == "CPU"


is_compatible = NeuronBackend.is_compatible
prepare = NeuronBackend.prepare
run_model = NeuronBackend.run_model
run_node = NeuronBackend.run_node
supports_device = NeuronBackend.supports_device
