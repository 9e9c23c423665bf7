"""A persistent compile cache: bundles keyed by the model's bytes, the options and the compiler's own source.

The directory is `--cache-dir`, else $NEURONX_CC_LITE_CACHE, else $XDG_CACHE_HOME/neuronx-cc-lite (by default
~/.cache/neuronx-cc-lite). An entry is a bundle file, written atomically (bundle.write: a temporary file renamed
into place), so concurrent writers of one key leave one whole entry and a reader never sees half of one. An entry
is read with the same checks as any bundle (its digest covers every member), and one that fails them is removed
and rebuilt. The key includes a digest of the compiler's sources, not only its version: a changed compiler never
returns an old bundle.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from typing import Callable

import onnx

from isa import bundle as bundle_format
from isa.bundle import Bundle
from isa.errors import IsaError

ENV = "NEURONX_CC_LITE_CACHE"
log = logging.getLogger(__name__)


def default_dir() -> str:
    if os.environ.get(ENV):
        return os.environ[ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "neuronx-cc-lite")


@functools.lru_cache(maxsize=1)
def compiler_digest() -> str:
    """The compiler's and the bundle format's Python sources, hashed once per process."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for package in ("neuronx_cc_lite", "isa"):
        for folder, dirs, files in sorted(os.walk(os.path.join(root, package))):
            dirs.sort()
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def _model_digest(model: str | os.PathLike[str] | onnx.ModelProto) -> str:
    """The model's bytes: the file's (and those of the external data files it names), or the proto's."""
    h = hashlib.sha256()
    if isinstance(model, onnx.ModelProto):
        h.update(model.SerializeToString(deterministic=True))
        return h.hexdigest()
    path = os.fspath(model)
    with open(path, "rb") as f:
        data = f.read()
    h.update(data)
    proto = onnx.ModelProto.FromString(data)  # external data is not loaded: only its locations are wanted
    locations = sorted({entry.value for init in proto.graph.initializer
                        if init.data_location == onnx.TensorProto.EXTERNAL
                        for entry in init.external_data if entry.key == "location"})
    for location in locations:
        h.update(location.encode())
        with open(os.path.join(os.path.dirname(path), location), "rb") as f:
            for piece in iter(lambda: f.read(1 << 20), b""):  # a piece at a time: a large model's weights are
                h.update(piece)  # never in memory
    return h.hexdigest()


def key(model: str | os.PathLike[str] | onnx.ModelProto, flags: dict[str, object]) -> str:
    text = json.dumps({"compiler": compiler_digest(), "flags": flags, "model": _model_digest(model)},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _entry(directory: str, k: str) -> str:
    return os.path.join(directory, k[:2], f"{k}.neff")


def lookup(directory: str, k: str) -> Bundle | None:
    path = _entry(directory, k)
    if not os.path.exists(path):
        return None
    try:
        return bundle_format.read(path)
    except IsaError as e:  # truncated or corrupted: drop it, the caller compiles again
        log.warning(f"discarding a broken compile cache entry {path}: {e}")
        try:
            os.unlink(path)
        except OSError:
            pass
        return None


def store(directory: str, k: str, bundle: Bundle) -> None:
    path = _entry(directory, k)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        bundle_format.write(bundle, path)
    except OSError as e:  # a cache that cannot be written costs speed, never the compile
        log.warning(f"cannot write the compile cache entry {path}: {e.strerror}")


def cached(model: str | os.PathLike[str] | onnx.ModelProto, flags: dict[str, object], directory: str | None,
           build: Callable[[], Bundle]) -> Bundle:
    """The cached bundle for (model, flags), else `build()`, stored. `directory` None: no cache."""
    if directory is None:
        return build()
    try:
        k = key(model, flags)
    except Exception:  # noqa: BLE001 - a file that cannot be read or parsed: compiling it gives the coded error
        return build()
    hit = lookup(directory, k)
    if hit is not None:
        log.debug(f"compile cache hit {_entry(directory, k)}")
        return hit
    bundle = build()
    store(directory, k, bundle)
    return bundle
