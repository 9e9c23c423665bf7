"""The bundle manifest's schema, checked before any of it is used: every field's type and range, products of
dimensions computed in Python integers (an int64 product could wrap around and pass a bounds check), no NaN or
infinity, bounded nesting. A manifest that fails gets one BundleError naming the field.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from isa.dtypes import DType
from isa.errors import BundleError
from isa.limits import MAX_JSON_DEPTH, MAX_RANKS, MAX_TENSOR_DIMS, MAX_TENSOR_ELEMENTS
from isa.tensor_kind import TensorKind


def parse_json(data: bytes, what: str) -> Any:
    """JSON without NaN or Infinity (Python's json accepts them) and with bounded nesting."""
    def refuse(constant: str) -> Any:
        raise BundleError(f"{what}: {constant} is not a number a bundle may hold")

    try:
        value = json.loads(data, parse_constant=refuse)
    except RecursionError:
        raise BundleError(f"{what} nests too deeply") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BundleError(f"{what} is not JSON: {e}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise BundleError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def _depth(value: Any) -> int:
    """Nesting depth, without recursion (json.loads already refused what would overflow the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def _int(value: Any, where: str, low: int = 0, high: int = 1 << 62) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BundleError(f"manifest {where}: expected an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise BundleError(f"manifest {where}: {value} is outside [{low}, {high}]")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise BundleError(f"manifest {where}: expected a string, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise BundleError(f"manifest {where}: expected a list, got {type(value).__name__}")
    return value


def _object(value: Any, where: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise BundleError(f"manifest {where}: expected an object, got {type(value).__name__}")
    missing = [k for k in keys if k not in value]
    if missing:
        raise BundleError(f"manifest {where}: missing {', '.join(missing)}")
    return value


def _tensor(t: Any, where: str, ranks: int) -> None:
    t = _object(t, where, ("name", "shape", "dtype", "device_dtype", "placements"))
    _str(t["name"], f"{where}.name")
    shape = [_int(n, f"{where}.shape") for n in _list(t["shape"], f"{where}.shape")]
    if len(shape) > MAX_TENSOR_DIMS:
        raise BundleError(f"manifest {where}: {len(shape)} dimensions, at most {MAX_TENSOR_DIMS}")
    if math.prod(shape) > MAX_TENSOR_ELEMENTS:
        raise BundleError(f"manifest {where}: {math.prod(shape)} elements, at most {MAX_TENSOR_ELEMENTS}")
    try:
        np.dtype(_str(t["dtype"], f"{where}.dtype"))
    except TypeError:
        raise BundleError(f"manifest {where}.dtype: {t['dtype']!r} is not a numpy type") from None
    if _str(t["device_dtype"], f"{where}.device_dtype") not in DType.__members__:
        raise BundleError(f"manifest {where}.device_dtype: {t['device_dtype']!r} is not one of "
                            f"{', '.join(DType.__members__)}")
    placements = _list(t["placements"], f"{where}.placements")
    if not placements:
        raise BundleError(f"manifest {where}: no placement")
    for k, p in enumerate(placements):
        at = f"{where}.placements[{k}]"
        p = _object(p, at, ("rank", "hbm_offset", "axis", "start", "stop"))
        _int(p["rank"], f"{at}.rank", 0, ranks - 1)
        _int(p["hbm_offset"], f"{at}.hbm_offset")
        axis = _int(p["axis"], f"{at}.axis", 0, max(0, len(shape) - 1))
        extent = shape[axis] if shape else 1
        stop = _int(p["stop"], f"{at}.stop", 0, extent)
        _int(p["start"], f"{at}.start", 0, stop)


def check_manifest(m: Any) -> None:
    """Raise BundleError at the first field that is missing, of the wrong type or out of range."""
    m = _object(m, "", ("target", "hbm_size", "lnc", "groups", "inputs", "outputs", "weights", "cores",
                        "compiler", "flags"))
    _str(m["target"], "target")
    _int(m["hbm_size"], "hbm_size")
    _int(m["lnc"], "lnc", 1, 8)
    cores = _list(m["cores"], "cores")
    ranks = _int(len(cores), "cores (ranks)", 1, MAX_RANKS)
    for c, streams in enumerate(cores):
        for k, entry in enumerate(_list(streams, f"cores[{c}]")):
            entry = _object(entry, f"cores[{c}][{k}]", ("stream", "file"))
            _str(entry["stream"], f"cores[{c}][{k}].stream")
            _str(entry["file"], f"cores[{c}][{k}].file")
    for g, group in enumerate(_list(m["groups"], "groups")):
        members = [_int(r, f"groups[{g}]", 0, ranks - 1) for r in _list(group, f"groups[{g}]")]
        if not members or len(set(members)) != len(members):
            raise BundleError(f"manifest groups[{g}]: a replica group lists distinct ranks, at least one")
    for kind in ("inputs", "outputs", "state"):
        for k, t in enumerate(_list(m.get(kind, []), kind)):
            _tensor(t, f"{kind}[{k}]", ranks)
    names = [_str(t["name"], "state") for t in m.get("state", [])]
    if len(set(names)) != len(names):
        raise BundleError("manifest state: a state tensor is declared twice")
    for k, w in enumerate(_list(m["weights"], "weights")):
        w = _object(w, f"weights[{k}]", ("rank", "hbm_offset", "size"))
        _int(w["rank"], f"weights[{k}].rank", 0, ranks - 1)
        _int(w["hbm_offset"], f"weights[{k}].hbm_offset")
        _int(w["size"], f"weights[{k}].size")
    _str(m["compiler"], "compiler")
    _object(m["flags"], "flags", ())
    if "stats" in m:
        _object(m["stats"], "stats", ())
    for k, t in enumerate(_list(m.get("hbm_tensors", []), "hbm_tensors")):
        t = _object(t, f"hbm_tensors[{k}]", ("name", "kind", "hbm_offset", "size"))
        _str(t["name"], f"hbm_tensors[{k}].name")
        try:
            TensorKind.parse(_str(t["kind"], f"hbm_tensors[{k}].kind"))
        except ValueError as e:
            raise BundleError(f"manifest hbm_tensors[{k}].kind: {e}") from None
        _int(t["hbm_offset"], f"hbm_tensors[{k}].hbm_offset")
        _int(t["size"], f"hbm_tensors[{k}].size")


def check_parts_manifest(m: Any) -> None:
    """The manifest of a partitioned bundle: the model's inputs and outputs (a dimension known only at run time is
    null), and its parts in order, each reading only model inputs and earlier parts' outputs."""
    m = _object(m, "", ("target", "inputs", "outputs", "parts", "compiler", "flags", "stats"))
    _str(m["target"], "target")
    _str(m["compiler"], "compiler")
    _object(m["flags"], "flags", ())
    _object(m["stats"], "stats", ())
    known: set[str] = set()
    for kind in ("inputs", "outputs"):
        for k, t in enumerate(_list(m[kind], kind)):
            t = _object(t, f"{kind}[{k}]", ("name", "dtype", "shape"))
            _str(t["name"], f"{kind}[{k}].name")
            try:
                np.dtype(_str(t["dtype"], f"{kind}[{k}].dtype"))
            except TypeError:
                raise BundleError(f"manifest {kind}[{k}].dtype: {t['dtype']!r} is not a numpy type") from None
            if t["shape"] is None and kind == "outputs":  # a shape known only at run time, even its rank
                continue
            shape = _list(t["shape"], f"{kind}[{k}].shape")
            if len(shape) > MAX_TENSOR_DIMS:
                raise BundleError(f"manifest {kind}[{k}]: {len(shape)} dimensions, at most {MAX_TENSOR_DIMS}")
            for n in shape:
                if kind == "inputs" or n is not None:
                    _int(n, f"{kind}[{k}].shape", 0, MAX_TENSOR_ELEMENTS)
        if kind == "inputs":
            known = {t["name"] for t in m["inputs"]}
    parts = _list(m["parts"], "parts")
    if not parts:
        raise BundleError("manifest parts: a partitioned bundle has at least one part")
    for k, p in enumerate(parts):
        at = f"parts[{k}]"
        p = _object(p, at, ("kind", "file", "inputs", "outputs", "ops"))
        if p["kind"] not in ("chip", "host"):
            raise BundleError(f"manifest {at}.kind: {p['kind']!r} is neither chip nor host")
        _str(p["file"], f"{at}.file")
        for name in _list(p["inputs"], f"{at}.inputs"):
            if _str(name, f"{at}.inputs") not in known:
                raise BundleError(f"manifest {at}: input {name!r} is neither a model input nor an earlier part's "
                                  "output")
        known |= {_str(name, f"{at}.outputs") for name in _list(p["outputs"], f"{at}.outputs")}
        for op, count in _object(p["ops"], f"{at}.ops", ()).items():
            _int(count, f"{at}.ops[{op!r}]")
    for k, t in enumerate(m["outputs"]):
        if t["name"] not in known:
            raise BundleError(f"manifest outputs[{k}]: {t['name']!r} is made by no part")
