"""The files an ONNX model is made of: the model file, and the external data files its tensors name.

An external data location is a path relative to the model's directory. One that is absolute or leads outside that
directory (`..`, a symbolic link out of it) is refused, and so is one that is not a regular file (isa/files.py: a
FIFO would block, /dev/zero never end). The frontend reads the data through `external_path`, the compile cache
hashes the same files, and the command line refuses an output that is one of them.
"""

from __future__ import annotations

import os

import onnx
from onnx import external_data_helper

from isa.files import read_regular
from neuronx_cc_lite.errors import CompileError

MAX_MODEL_BYTES = 2 << 30  # protobuf refuses a message over 2 GiB: a larger model keeps its weights external


def read_model(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """The ModelProto in `path`, its external data not loaded; NCC_ONNX_LOAD for a file that is missing, not a
    regular file, too large or not ONNX."""
    try:
        data = read_regular(path, MAX_MODEL_BYTES)
    except FileNotFoundError:
        raise CompileError("NCC_ONNX_LOAD", f"no such file: {path}") from None
    except OSError as e:
        raise CompileError("NCC_ONNX_LOAD", f"cannot read {path}: {e.strerror or e}") from None
    return parse_model(data, path)


def parse_model(data: bytes, path: str | os.PathLike[str]) -> onnx.ModelProto:
    """The ModelProto of a file's bytes (NCC_ONNX_LOAD if they are not one)."""
    try:
        return onnx.ModelProto.FromString(data)
    except Exception as e:  # protobuf raises several unrelated types for a malformed file
        raise CompileError("NCC_ONNX_LOAD", f"cannot parse {path} as an ONNX model: {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else 'malformed protobuf'}") from None


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The model's tensors (initializers, and tensors in attributes) whose data is in external files."""
    return [t for t in external_data_helper._get_all_tensors(model) if external_data_helper.uses_external_data(t)]


def external_info(tensor: onnx.TensorProto) -> external_data_helper.ExternalDataInfo:
    try:
        return external_data_helper.ExternalDataInfo(tensor)
    except ValueError as e:  # an offset or length that is not a count
        raise CompileError("NCC_ONNX_INVALID", f"tensor {tensor.name!r}: {e}") from None


def external_path(base_dir: str, tensor: onnx.TensorProto) -> str:
    """The real path of the file holding `tensor`'s external data, checked to be beside the model."""
    location = external_info(tensor).location
    root = os.path.realpath(base_dir)
    if not location or "\0" in location or os.path.isabs(location):
        raise CompileError("NCC_ONNX_INVALID", f"tensor {tensor.name!r}: external data {location!r} is not a file "
                           "beside the model")
    path = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, path]) != root or path == root:
        raise CompileError("NCC_ONNX_INVALID", f"tensor {tensor.name!r}: external data {location!r} is not a file "
                           "beside the model")
    return path


def external_paths(model: onnx.ModelProto, base_dir: str) -> list[str]:
    """The external data files of a model, each once, sorted."""
    return sorted({external_path(base_dir, t) for t in external_tensors(model)})
