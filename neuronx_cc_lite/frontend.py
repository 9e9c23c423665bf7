"""ONNX model -> graph IR.

Loads the file, pins the input shapes the user gave and makes the inputs given a value constants, runs the ONNX
checker and shape inference, and imports nodes, initializers and Constant nodes. A file's large weights are not
read into the protobuf: each becomes a read-only view of a memory map of the file that holds it, its external data
file (so a model over protobuf's 2 GB compiles) or the model's file itself (weights_in_file.py), so a model's
weights are never in memory twice, and lowering gives the pages back once it has laid a weight out
(`release_mapped_weights`). Shapes that inference could not
settle stay None here; the fold_constants pass settles those that depend on shape arithmetic, and the verifier
before lowering insists every shape is static.
"""

from __future__ import annotations

import math
import mmap
import os
import sys
import weakref
from collections import Counter
from typing import Any, Mapping

import numpy as np
import onnx
import onnx.version_converter
from onnx import external_data_helper, helper, numpy_helper

from isa.files import open_regular
from neuronx_cc_lite.declared import declared, no_data
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.model_files import MAX_MODEL_BYTES, external_info, external_path, external_tensors, parse_model, \
    read_model
from neuronx_cc_lite.weights_in_file import split_weights
from neuronx_cc_lite.ir import Graph, Node, Tensor


def load_model(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """The model with its external data read in."""
    model = read_model(path)
    _load_external_data(model, os.path.dirname(os.path.abspath(path)))
    return model


def _load_external_data(model: onnx.ModelProto, base_dir: str, but: frozenset[str] = frozenset()) -> None:
    """Read the external data of the model's tensors into them, `but` for those named."""
    for tensor in external_tensors(model):
        if tensor.name not in but:
            _load_external(tensor, base_dir)


def read_model_mapping_weights(path: str | os.PathLike[str]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model in `path`, parsed without the raw_data of its large initializers (weights_in_file.py), and
    those initializers by name, each a read-only view of a memory map of the file; the raw_data of any other
    initializer is put back in its message. A file the walk cannot follow, or one not mapped (empty, past the size
    a model may have), is read whole by `read_model`, which names its problem."""
    try:
        with open_regular(path) as f:
            if os.fstat(f.fileno()).st_size > MAX_MODEL_BYTES:
                return read_model(path), {}
            whole = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        stripped, spans = split_weights(whole)
    except (OSError, ValueError):  # ValueError: an empty file (mmap), or WireError
        return read_model(path), {}
    weights: dict[str, np.ndarray] = {}
    try:
        model = parse_model(stripped, path)
        inits = model.graph.initializer
        if len(spans) != len(inits):  # (the parser agreeing with the walk is what lets the spans be trusted)
            return read_model(path), {}
        names = Counter(i.name for i in inits)
        for init, span in zip(inits, spans):
            if span is None:
                continue
            offset, length = span
            dtype = _as_it_lies(init, length)
            if dtype is not None and names[init.name] == 1:
                weights[init.name] = np.frombuffer(whole, dtype, length // dtype.itemsize, offset).reshape(
                    tuple(init.dims))
            else:  # as the parser would have read it
                init.raw_data = whole[offset:offset + length]
    finally:
        if weights:
            _MAPS.add(whole)
        else:
            whole.close()
    return model, weights


def _raw_is_the_array(init: onnx.TensorProto) -> bool:
    """Whether the initializer's raw_data, if any, is its array's bytes as they lie on this machine."""
    return init.data_type in _MAPPABLE_TYPES and sys.byteorder == "little" and not init.HasField("segment")


def _as_it_lies(init: onnx.TensorProto, length: int) -> np.dtype | None:
    """The array type whose elements are the `length` bytes of a large initializer's raw_data as they lie (as
    numpy_helper.to_array reads them), or None (a small one, a packed type, a tensor in segments, a byte count
    that is not its dims')."""
    if not _raw_is_the_array(init) or init.data_location == onnx.TensorProto.EXTERNAL or \
            math.prod(init.dims) <= ELEMENTS_CHECKED_AS_TYPES:
        return None
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
    return dtype if length == math.prod(init.dims) * dtype.itemsize else None


def _external_span(tensor: onnx.TensorProto, size: int) -> tuple[int, int]:
    """(offset, length) of a tensor's bytes in its external data file of `size` bytes, checked to lie inside it
    and to hold the tensor (a length or a file far larger than the tensor is never read whole)."""
    info = external_info(tensor)
    offset = info.offset or 0
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)) \
        if tensor.data_type in _MAPPABLE_TYPES else None
    needed = math.prod(tensor.dims) * dtype.itemsize if dtype is not None else None
    length = info.length if info.length is not None else (needed if needed is not None else size - offset)
    if offset + length > size or (needed is not None and length != needed):
        raise CompileError("NCC_ONNX_INVALID", f"tensor {tensor.name!r}: its external data ({info.location!r}, "
                           f"offset {offset}, length {info.length}) does not hold {math.prod(tensor.dims)} "
                           f"{dtype or ''} elements ({size} bytes in the file)".replace("  ", " "))
    return offset, length


def _load_external(tensor: onnx.TensorProto, base_dir: str) -> None:
    """Read a tensor's external data into it (as onnx's loader does, from a regular file beside the model only)."""
    path = external_path(base_dir, tensor)
    try:
        with open_regular(path) as f:
            offset, length = _external_span(tensor, os.fstat(f.fileno()).st_size)
            f.seek(offset)
            tensor.raw_data = f.read(length)
    except OSError as e:
        raise CompileError("NCC_ONNX_LOAD", f"tensor {tensor.name!r}: cannot read its external data {path}: "
                           f"{e.strerror or e}") from None
    tensor.data_location = onnx.TensorProto.DEFAULT
    del tensor.external_data[:]


# ONNX types whose bytes, in external data or raw_data, are the numpy array's bytes (little-endian, one element after
# another: numpy_helper.to_array reads them with np.frombuffer as they lie; not the packed 2-, 4- and 6-bit types,
# not strings)
_MAPPABLE_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                             onnx.TensorProto.BFLOAT16, onnx.TensorProto.INT8, onnx.TensorProto.INT16,
                             onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT8,
                             onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64,
                             onnx.TensorProto.BOOL})

# the memory maps weights are views of, to give their pages back; weak, so a map goes with its last weight
_MAPS: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()


def _mappable(init: onnx.TensorProto) -> bool:
    return (external_data_helper.uses_external_data(init) and init.data_type in _MAPPABLE_TYPES
            and math.prod(init.dims) > ELEMENTS_CHECKED_AS_TYPES)


def _mapped(init: onnx.TensorProto, base_dir: str, maps: dict[str, mmap.mmap]) -> np.ndarray:
    """The external initializer as a read-only view of a memory map of its file (`maps`: by path, one each)."""
    path = external_path(base_dir, init)
    if path not in maps:
        try:
            with open_regular(path) as f:
                maps[path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:  # ValueError: an empty file
            raise CompileError("NCC_ONNX_LOAD", f"initializer {init.name!r}: cannot read its external data "
                               f"{path}: {getattr(e, 'strerror', None) or e}") from None
        _MAPS.add(maps[path])
    offset, length = _external_span(init, len(maps[path]))
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
    return np.frombuffer(maps[path], dtype, length // dtype.itemsize, offset).reshape(tuple(init.dims))


def release_mapped_weights() -> None:
    """Give back the pages of the mapped weights read so far: they are read from the page cache again if needed.
    Lowering calls it after each node, so a weight's source and its laid-out copy are not both kept."""
    for m in list(_MAPS):
        m.madvise(mmap.MADV_DONTNEED)


def attr_value(a: onnx.AttributeProto) -> Any:
    value = helper.get_attribute_value(a)
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8", "replace") for v in value]
    if isinstance(value, list):
        return tuple(value)
    return value


def _learned(value: np.ndarray) -> bool:
    """Whether a constant of the model is one of its parameters (Tensor.learned): floats, more than one of them."""
    floating = value.dtype.kind == "f" or value.dtype.name.startswith(("bfloat16", "float8"))
    return floating and value.size > 1


def _type_of(vi: onnx.ValueInfoProto) -> tuple[tuple[int, ...] | None, np.dtype | None]:
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or t.elem_type == 0:
        return None, None
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
    if not t.HasField("shape"):
        return None, dtype
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value"):
            return None, dtype
        dims.append(int(d.dim_value))
    return tuple(dims), dtype


def _pin_inputs(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> None:
    by_name = {vi.name: vi for vi in model.graph.input}
    for name, shape in shapes.items():
        if name not in by_name:
            raise CompileError("NCC_INPUT_SHAPE", f"an input shape is given for {name!r}, which is not a model "
                               f"input (inputs: {', '.join(by_name)})")
        dims = by_name[name].type.tensor_type.shape.dim
        if len(dims) not in (0, len(shape)):
            raise CompileError("NCC_INPUT_SHAPE", f"input {name!r} has rank {len(dims)}, its given shape has "
                               f"{len(shape)} dimensions")
        del dims[:]
        for n in shape:
            dims.add().dim_value = n


def input_value_arrays(model: onnx.ModelProto, values: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The values given for inputs (numbers, bools, nested lists) as arrays of each input's declared type and
    shape (3 for a [1] input), checked: what the compiler builds in and what a reference run is fed."""
    inits = {i.name for i in model.graph.initializer}
    by_name = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
    arrays = {}
    for name, given in values.items():
        if name not in by_name:
            raise CompileError("NCC_OPTION", f"an input value (--input-value, input_values=) is given for {name!r}, "
                               f"which is not a model input (inputs: {', '.join(by_name)})")
        shape, dtype = _type_of(by_name[name])
        declared = [d.dim_value if d.HasField("dim_value") else None for d in by_name[name].type.tensor_type.shape.dim]
        value = np.asarray(given)
        exact = dtype is not None and (dtype.kind == "f" or np.array_equal(value.astype(dtype), value))
        if dtype is None or value.dtype.kind not in "biuf" or not exact:
            raise CompileError("NCC_OPTION", f"the value given for input {name!r} ({given!r}) is not a {dtype} "
                               "tensor")
        value = value.astype(dtype)
        if shape is not None and value.size == math.prod(shape):
            value = value.reshape(shape)
        if value.ndim != len(declared) or any(d is not None and d != n for d, n in zip(declared, value.shape)):
            raise CompileError("NCC_OPTION", f"the value given for input {name!r} has shape {list(value.shape)}; "
                               f"the input's is {[d if d is not None else '?' for d in declared]}")
        arrays[name] = value
    return arrays


def _pin_values(model: onnx.ModelProto, values: Mapping[str, Any]) -> None:
    """Make each input given a value an initializer holding it, so that what it decides (an If's condition, a
    Loop's trip count) folds."""
    for name, value in input_value_arrays(model, values).items():
        model.graph.input.remove(next(vi for vi in model.graph.input if vi.name == name))
        model.graph.initializer.append(numpy_helper.from_array(value, name))


# Initializers with more elements than this go around the checker and shape inference as typed graph inputs: both
# serialise the whole model (and inference parses it back), yet need only the weights' types; small ones stay, as
# data propagation reads their values (a Reshape's shape)
ELEMENTS_CHECKED_AS_TYPES = 1024


def _weights_apart(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    """A copy of the model (never change the caller's) with its large initializers, and the large values of its
    Constant nodes (data propagation would hold each element as a Python object: 128 MB of constants took 4 GB
    and 18 s), declared as typed inputs; and those tensors, named as the graph reads them."""
    large = [i for i in model.graph.initializer if math.prod(i.dims) > ELEMENTS_CHECKED_AS_TYPES or no_data(i)]
    constants = {n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
                 for a in n.attribute if a.name == "value" and math.prod(a.t.dims) > ELEMENTS_CHECKED_AS_TYPES}
    for name, value in constants.items():
        tensor = onnx.TensorProto()
        tensor.CopyFrom(value)
        tensor.name = name
        large.append(tensor)
    names = {i.name for i in large}
    # the copy is made field by field, leaving the large tensors out: copying the whole model first copies them
    light = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            _copy_field(light, field, value)
    for field, value in model.graph.ListFields():
        if field.name == "initializer":
            light.graph.initializer.extend(i for i in value if i.name not in names)
        elif field.name == "node":
            light.graph.node.extend(n for n in value if not (n.op_type == "Constant" and n.output[0] in constants))
        else:
            _copy_field(light.graph, field, value)
    declared = {vi.name for vi in light.graph.input}
    light.graph.input.extend(helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
                             for i in large if i.name not in declared)
    return light, large


def _copy_field(message: Any, field: Any, value: Any) -> None:
    """Set `field` of `message` to a copy of `value` (a field of another message of the same type)."""
    if hasattr(value, "CopyFrom"):
        getattr(message, field.name).CopyFrom(value)
    elif hasattr(value, "extend"):  # a repeated field
        getattr(message, field.name).extend(value)
    else:
        setattr(message, field.name, value)


# onnx's data propagation holds every element of a 1-D tensor as a Python object, whatever its type: an Add of
# two 16M-element vectors takes 12 s and GBs. It is worth it for shape arithmetic, whose vectors are short.
ELEMENTS_PROPAGATED = 1 << 16


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference, with data propagation (a Shape -> Gather -> Concat -> Reshape chain's values) unless the
    model has a long 1-D tensor; then without, and fold-constants settles what is computed from constants."""
    plain = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    g = plain.graph
    for vi in (*g.input, *g.value_info, *g.output):
        dims = vi.type.tensor_type.shape.dim
        if len(dims) == 1 and dims[0].HasField("dim_value") and dims[0].dim_value > ELEMENTS_PROPAGATED:
            return plain
    return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)



def _raw_bytes(init: onnx.TensorProto) -> bytes:
    """The initializer's raw_data, taken from the message once (each access copies it: 439 MB for BERT-base)."""
    return init.raw_data if init.HasField("raw_data") else b""


def _weight(init: onnx.TensorProto, raw: bytes) -> np.ndarray:
    """The initializer as an array; `raw`: its raw_data, already taken (_raw_bytes), which the array then views
    where to_array would read it as it lies, so that the weights are not copied out of the message twice."""
    try:
        if raw and _raw_is_the_array(init):
            dtype = helper.tensor_dtype_to_np_dtype(init.data_type)
            return np.frombuffer(raw, dtype=dtype).reshape(tuple(init.dims))
        return numpy_helper.to_array(init)
    except Exception as e:  # a payload that does not match its dims or type
        raise CompileError("NCC_ONNX_INVALID", f"initializer {init.name!r} cannot be read: "
                           f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None


def import_file(path: str | os.PathLike[str], input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                input_values: Mapping[str, Any] | None = None) -> Graph:
    """The graph of an ONNX file, its large weights mapped, not read: those in external data files and those
    inside the file."""
    model, inside = read_model_mapping_weights(path)
    base_dir = os.path.dirname(os.path.abspath(path))
    _load_external_data(model, base_dir, frozenset(i.name for i in model.graph.initializer if _mappable(i)))
    return import_model(model, input_shapes, input_values, base_dir, inside)


def import_model(model: onnx.ModelProto, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                 input_values: Mapping[str, Any] | None = None, base_dir: str | None = None,
                 inside: Mapping[str, np.ndarray] | None = None) -> Graph:
    """`base_dir`: where the files of weights still in external data are; `inside`: the initializers whose data
    was left in the model's file, by name (both from `import_file`)."""
    inside = inside or {}
    model, large = _weights_apart(model)
    if input_shapes:
        _pin_inputs(model, input_shapes)
    if input_values:
        _pin_values(model, input_values)
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise CompileError("NCC_ONNX_INVALID", f"the ONNX checker rejects the model: "
                           f"{str(e).strip().splitlines()[0]}") from None
    try:
        model = _infer_shapes(model)
    except Exception as e:
        raise CompileError("NCC_SHAPE_INFERENCE", f"ONNX shape inference fails: "
                           f"{str(e).strip().splitlines()[0]}") from None
    g = model.graph
    for vi in (*g.input, *g.output, *g.value_info):
        kind = vi.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):
            raise CompileError("NCC_UNSUPPORTED_TYPE", f"value {vi.name!r} is a {kind.replace('_type', '')}; only "
                               "tensors are supported")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset > onnx.defs.onnx_opset_version():
        raise CompileError("NCC_UNSUPPORTED", f"the model imports opset {opset} of the ONNX domain; this compiler "
                           f"knows opsets up to {onnx.defs.onnx_opset_version()}: export it for an older one")
    _check_names(g)
    tensors: dict[str, Tensor] = {}
    maps: dict[str, mmap.mmap] = {}
    for init in (*g.initializer, *large):
        raw = _raw_bytes(init)
        if init.name in inside:
            value = inside[init.name]
        elif no_data(init, raw):  # declared, not present: its shape and type (neuronx_cc_lite/declared.py)
            value = declared(tuple(init.dims), helper.tensor_dtype_to_np_dtype(init.data_type))
        else:
            value = _mapped(init, base_dir, maps) if base_dir is not None and _mappable(init) else _weight(init, raw)
        tensors[init.name] = Tensor(init.name, tuple(value.shape), value.dtype, value, _learned(value))
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.name in tensors:
            continue
        shape, dtype = _type_of(vi)
        tensors[vi.name] = Tensor(vi.name, shape, dtype)  # type: ignore[arg-type]
    weights = {i.name for i in (*g.initializer, *large)}
    inputs = [vi.name for vi in g.input if vi.name not in weights]
    for name in inputs:
        t = tensors[name]
        if t.shape is None:
            raise CompileError("NCC_SHAPE_DYNAMIC", f"input {name!r} has a dynamic shape; pin it with --input-shape "
                               f"{name}=D0,D1,... (from Python: input_shapes={{{name!r}: (D0, D1, ...)}})")
    nodes = []
    for index, n in enumerate(g.node):
        name = (n.name or f"{n.op_type}_{index}").replace("\n", " ")
        attrs = {a.name: attr_value(a) for a in n.attribute}
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            value = _constant_value(attrs, name)
            tensors[n.output[0]] = Tensor(n.output[0], tuple(value.shape), value.dtype, value, _learned(value))
            continue
        for out in n.output:
            tensors.setdefault(out, Tensor(out, None, None))  # type: ignore[arg-type]
        nodes.append(Node(n.op_type, name, list(n.input), list(n.output), attrs, n.domain))
    return Graph(g.name or "main", nodes, tensors, inputs, [o.name for o in g.output], opset,
                 {n.name: n.op for n in nodes})


# The opset a model of an older one is converted up to (onnx.version_converter) when the compiler refuses some of its
# nodes as written: Upsample becomes Resize, TopK-1's attribute k an input, Sum-6 broadcasts as Sum-8 does
CONVERT_TO = 17


def converted_up(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model in opset CONVERT_TO, or None when it is not older or the converter cannot take it."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), CONVERT_TO)
    if opset >= CONVERT_TO:
        return None
    try:
        converted = onnx.version_converter.convert_version(model, CONVERT_TO)
        onnx.checker.check_model(converted)
    except Exception:  # noqa: BLE001 - the converter has no adapter for some op: keep the model as it is
        return None
    if opset < 11:  # Resize-10 and Upsample sample at x / scale: the converter leaves Resize-11's half_pixel default
        for node in converted.graph.node:
            given = {a.name for a in node.attribute}
            if node.op_type == "Resize" and "coordinate_transformation_mode" not in given:
                node.attribute.append(helper.make_attribute("coordinate_transformation_mode", "asymmetric"))
                if "nearest_mode" not in given:
                    node.attribute.append(helper.make_attribute("nearest_mode", "floor"))
    return converted


def _check_names(g: onnx.GraphProto) -> None:
    """Protobuf hands back a name that is not valid UTF-8 as bytes: refuse it here, naming where it is."""
    named = [(f"graph {kind}", vi.name) for kind, vis in (("input", g.input), ("output", g.output))
             for vi in vis] + [("initializer", init.name) for init in g.initializer]
    for index, n in enumerate(g.node):
        named += [(f"node #{index}", n.name), (f"node #{index} op type", n.op_type)]
        named += [(f"node #{index} input", v) for v in n.input] + [(f"node #{index} output", v) for v in n.output]
    for where, value in named:
        if isinstance(value, bytes):
            raise CompileError("NCC_ONNX_INVALID", f"the name of {where} is not valid UTF-8: {value[:60]!r}")


def _constant_value(attrs: dict[str, Any], name: str) -> np.ndarray:
    for key, cast in (("value", None), ("value_float", np.float32), ("value_int", np.int64),
                      ("value_floats", np.float32), ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key]) if cast is None else np.asarray(attrs[key], dtype=cast)
    raise CompileError("NCC_UNSUPPORTED", f"Constant with attributes {sorted(attrs)} is not supported", name,
                       "Constant")
