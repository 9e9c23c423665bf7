"""Seeded mutators: each turns a seed into one hostile input of its kind and tries it. A case passes when it ends
in a correct run or in one coded, one-line error; anything else (a traceback's exception, a multi-line message)
is returned as the failure text.

    bundle    bytes of one archive member flipped, overwritten, cut, repeated or grown; the archive re-signed with
              a correct hash, so the reader, the schema check, the decoder and the validator must hold
    manifest  one value anywhere in manifest.json replaced by a value of another type or range, re-signed
    stream    one field of one instruction set to another value within its encoding, re-encoded and re-signed
    listing   the disassembly edited (characters, numbers, lines, directives) and assembled
    npz       input archives with wrong names, shapes, dtypes, headers or bytes, given to `run --inputs`
    onnx      the model file with bytes flipped, or one attribute, type or dimension changed, compiled
    cache     a compile cache entry flipped, truncated, swapped for another valid bundle, unbound from its key or
              made a FIFO, a device or a directory (in place, its mtime put back): the next compile is the model's
    files     a FIFO, /dev/zero, /dev/full, a directory, an empty or missing file or a NUL byte in a path, given to
              a command where it reads or writes a file
    integers  one integer operator (arithmetic, extremes, division, casts, sums) on one integer type, given values
              near 2^24, 2^31 and the type's wrap-around: onnxruntime's bits, or a coded refusal (compile or run)
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import random
import sys
import zipfile
from typing import Any, Callable

import numpy as np

from isa import bundle as bundle_format
from isa.assembly import assemble, disassemble
from isa.bundle import HEADER, HEADER_SIZE
from isa.codec import decode_stream, encode_stream
from isa.errors import IsaError
from isa.operand import Operand
from runtime.errors import NeuronRuntimeError

CODED = (IsaError, NeuronRuntimeError)


def coded_or_failure(error: BaseException) -> str | None:
    """None for a coded one-line error; else what is wrong with it."""
    text = str(error)
    code = getattr(error, "code", None)
    if not isinstance(code, str) or not code.startswith(("NCC_", "NRT_")):
        return f"uncoded {type(error).__name__}: {text[:300]}"
    if "\n" in text:
        return f"multi-line {code}: {text[:300]!r}"
    return None


class Base:
    """What every mutator starts from: one small compiled model, as a bundle, its archive members and listing."""

    def __init__(self, bundle: bundle_format.Bundle, model_bytes: bytes, tmp: str) -> None:
        self.bundle = bundle
        data = bundle_format.to_bytes(bundle)
        with zipfile.ZipFile(io.BytesIO(data[HEADER_SIZE:])) as z:
            self.files = {name: z.read(name) for name in sorted(z.namelist())}
        self.listing = disassemble(bundle)
        self.model_bytes = model_bytes
        self.tmp = tmp


def signed(files: dict[str, bytes], ranks: int = 1) -> bytes:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        for name, content in files.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), content)
    payload = archive.getvalue()
    head = HEADER.pack(bundle_format.MAGIC, bundle_format.FORMAT_VERSION, HEADER_SIZE, ranks, len(payload),
                       hashlib.sha256(payload).digest(), b"trn1")
    return head.ljust(HEADER_SIZE, b"\0") + payload


def _load_and_run(data: bytes, rng: random.Random) -> None:
    """Load a bundle from bytes and, when it loads, run it on inputs of its declared shapes."""
    import runtime

    b = bundle_format.from_bytes(data)
    model = runtime.Model(b)
    inputs = {i.name: np.zeros(i.shape, np.dtype(i.dtype)) for i in model.inputs}
    model.run(inputs, policy=rng.choice(["clock", "random"]), seed=rng.randrange(100),
              check_races=rng.random() < 0.2)


def _mutate_bytes(content: bytes, rng: random.Random) -> bytes:
    out = bytearray(content)
    for _ in range(rng.randint(1, 4)):
        action = rng.choice(["flip", "byte", "cut", "repeat", "grow"])
        at = rng.randrange(len(out)) if out else 0
        if action == "flip" and out:
            out[at] ^= 1 << rng.randrange(8)
        elif action == "byte" and out:
            out[at] = rng.randrange(256)
        elif action == "cut":
            del out[at:]
        elif action == "repeat":
            out[at:at] = out[at:at + rng.randint(1, 64)]
        else:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return bytes(out)


def bundle_case(base: Base, rng: random.Random) -> None:
    name = rng.choice(list(base.files))
    _load_and_run(signed({**base.files, name: _mutate_bytes(base.files[name], rng)}), rng)


def _any_value(rng: random.Random) -> Any:
    return rng.choice([
        lambda: rng.choice([-1, 0, 1, 2, 3, 7, 2**31, 2**32 + 1, 2**63, -2**63, 10**30]),
        lambda: rng.choice([0.5, -0.0, 1e308, 3.0]),
        lambda: rng.choice(["", "fp32", "float32", "bf16", "x" * 300, "\u2028", "int64", "trn2"]),
        lambda: rng.choice([None, True, False]),
        lambda: [rng.randrange(-2, 5) for _ in range(rng.randrange(0, 4))],
        lambda: {"rank": rng.randrange(-1, 3)},
        lambda: [[[[1]]]],
    ])()


def _paths(value: Any, at: tuple = ()) -> list[tuple]:
    found = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, at + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, at + (i,))
    return found


def manifest_case(base: Base, rng: random.Random) -> None:
    manifest = json.loads(base.files["manifest.json"])
    path = rng.choice(_paths(manifest)[1:])
    holder = manifest
    for key in path[:-1]:
        holder = holder[key]
    if rng.random() < 0.15 and isinstance(holder, dict):
        del holder[path[-1]]
    else:
        holder[path[-1]] = _any_value(rng)
    _load_and_run(signed({**base.files, "manifest.json": json.dumps(manifest).encode()}), rng)


def _new_operand(o: Operand, rng: random.Random) -> Operand:
    field = rng.choice(["start_partition", "num_partitions", "offset", "dims", "partition_stride"])
    if field == "dims":
        dims = tuple((rng.choice([1, 2, 128, 2**20, 2**40]), rng.choice([0, 1, 4, -1, 2**40]))
                     for _ in range(rng.randint(0, 5)))
        return dataclasses.replace(o, dims=dims)
    limit = 255 if field in ("start_partition", "num_partitions") else 2**62
    return dataclasses.replace(o, **{field: rng.choice([0, 1, 63, 64, 127, 128, 129, 255, limit, 2**31])
                                     if field != "partition_stride" else rng.choice([0, 1, -1, 2**40])})


def stream_case(base: Base, rng: random.Random) -> None:
    name = rng.choice([n for n in base.files if n.startswith("core")])
    instrs = decode_stream(base.files[name])
    if not instrs:
        return
    i = rng.randrange(len(instrs))
    instr = instrs[i]
    choice = rng.random()
    if choice < 0.2:
        instr.waits = tuple((rng.randrange(0, 40), rng.choice([0, 1, 5, 2**32 - 1])) for _ in range(rng.randint(0, 3)))
    elif choice < 0.3:
        instr.signal = rng.choice([None, 0, 31, 32, 300])
    else:
        operands = [k for k, v in instr.args.items() if isinstance(v, Operand)]
        if not operands:
            return
        key = rng.choice(operands)
        instr.args[key] = _new_operand(instr.args[key], rng)
    try:
        encoded = encode_stream(instrs)
    except Exception:  # a value the encoding cannot hold: not a bundle anyone can write; draw again
        return
    _load_and_run(signed({**base.files, name: encoded}), rng)


def listing_case(base: Base, rng: random.Random) -> None:
    lines = base.listing.splitlines()
    for _ in range(rng.randint(1, 3)):
        k = rng.randrange(len(lines))
        line = lines[k]
        action = rng.choice(["char", "number", "drop", "repeat", "swap", "token"])
        if action == "char" and line:
            at = rng.randrange(len(line))
            lines[k] = line[:at] + rng.choice("{}[]:=@;, .\"x0-9\r\u2028") + line[at + 1:]
        elif action == "number":
            words = line.split(" ")
            digits = [j for j, w in enumerate(words) if any(c.isdigit() for c in w)]
            if digits:
                j = rng.choice(digits)
                words[j] = "".join(str(rng.choice([0, 1, 128, 2**40, -3])) if c.isdigit() else c
                                   for c in words[j])[:40]
                lines[k] = " ".join(words)
        elif action == "drop":
            del lines[k]
        elif action == "repeat":
            lines.insert(k, line)
        elif action == "swap":
            j = rng.randrange(len(lines))
            lines[k], lines[j] = lines[j], lines[k]
        else:
            lines.insert(k, rng.choice([".core 0", ".stream PE", ".data 0 0 4", ".end", ".bundle {}",
                                        "0  memset", ".input {}", "; comment", ".tensor []"]))
    b = assemble("\n".join(lines) + "\n", weights_from=base.bundle if rng.random() < 0.5 else None)
    _load_and_run(bundle_format.to_bytes(b), rng)


def npz_case(base: Base, rng: random.Random) -> str | None:
    from neuronx_cc_lite.cli import main

    path = f"{base.tmp}/in.npz"
    arrays: dict[str, np.ndarray] = {}
    for info in base.bundle.inputs:
        shape = list(info.shape)
        if rng.random() < 0.3 and shape:
            shape[rng.randrange(len(shape))] = rng.choice([0, 1, 3, 10**5])
        dtype = rng.choice([info.dtype, "float64", "int8", "bool", "complex64", "<U3"]) if rng.random() < 0.3 \
            else info.dtype
        arrays[info.name if rng.random() < 0.9 else rng.choice(["x", "", "a/b", "é"])] = \
            np.zeros([min(n, 64) for n in shape], dtype=dtype) if 10**5 not in shape else np.zeros(1, dtype)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    with open(path, "rb") as f:
        data = f.read()
    if rng.random() < 0.5:
        data = _mutate_bytes(data, rng)
    with open(path, "wb") as f:
        f.write(data)
    neff = f"{base.tmp}/base.neff"
    captured, real = io.StringIO(), sys.stderr
    sys.stderr = captured  # the command line logs to the stderr of the moment
    try:
        status = main(["-q", "run", neff, "--inputs", path, "--outputs", f"{base.tmp}/out.npz"])
    finally:
        sys.stderr = real
    said = captured.getvalue().strip()
    usage = said.startswith("neuronx-cc-lite: error: NCC_USAGE: ")  # exits 2, every other error 1
    if status != (0 if not said else 2 if usage else 1) or "NCC_INTERNAL" in said or said.count("\n") > 0:
        raise AssertionError(f"run exited {status}: {said[:300]!r}")
    return said.split(": ")[2] if status else None  # the error's code, or None for a run


def onnx_case(base: Base, rng: random.Random) -> None:
    import onnx

    from neuronx_cc_lite.compiler import Options, compile_model
    from neuronx_cc_lite.frontend import load_model

    if rng.random() < 0.5:
        data = _mutate_bytes(base.model_bytes, rng)
    else:
        model = onnx.load_from_string(base.model_bytes)
        node = rng.choice(list(model.graph.node))
        action = rng.choice(["attr", "dim", "type", "op", "input"])
        if action == "attr" and node.attribute:
            a = rng.choice(list(node.attribute))
            a.i, a.f = rng.choice([-1, 0, 2**40]), rng.choice([float("nan"), -1.0, 1e30])
            a.ints[:] = [rng.randrange(-3, 5) for _ in range(rng.randrange(0, 5))]
        elif action == "dim":
            vi = rng.choice(list(model.graph.input) + list(model.graph.output))
            dims = vi.type.tensor_type.shape.dim
            if dims:
                dims[rng.randrange(len(dims))].dim_value = rng.choice([0, 1, 7, 2**31])
        elif action == "type":
            rng.choice(list(model.graph.input) + list(model.graph.output)).type.tensor_type.elem_type = \
                rng.randrange(0, 30)
        elif action == "op":
            node.op_type = rng.choice(["NoSuchOp", "Loop", "If", "Relu", "Conv", ""])
        else:
            node.input.append(rng.choice(["", "missing", node.output[0]]))
        data = model.SerializeToString()
    path = f"{base.tmp}/m.onnx"
    with open(path, "wb") as f:
        f.write(data)
    compile_model(load_model(path), Options())


def _special(path: str, rng: random.Random) -> str:
    """Make `path` something that is not a regular file (or is an unusual one); returns what it made."""
    import os

    kind = rng.choice(["fifo", "zero", "full", "directory", "empty", "missing", "link to directory"])
    if kind == "fifo":
        os.mkfifo(path)
    elif kind in ("zero", "full"):
        os.symlink(f"/dev/{kind}", path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "empty":
        open(path, "wb").close()
    elif kind == "link to directory":
        os.symlink("/", path)
    return kind


def _fresh(path: str) -> None:
    import os
    import shutil

    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _variant(base: Base) -> bytes:
    """Another valid bundle of the same model (lowering order, -O1): what a swapped cache entry holds."""
    if not hasattr(base, "variant"):
        from neuronx_cc_lite.compiler import Options, compile_model

        base.variant = bundle_format.to_bytes(compile_model(f"{base.tmp}/cached.onnx", Options(optimize=1)))
    return base.variant  # type: ignore[no-any-return]


def cache_case(base: Base, rng: random.Random) -> str | None:
    """A compile cache entry damaged, swapped, unbound or made a special file: the next compile returns the
    model's own bundle (from the cache or compiled again), never another, and never hangs."""
    import os

    from neuronx_cc_lite import cache
    from neuronx_cc_lite.compiler import Options, compile_model

    model, directory = f"{base.tmp}/cached.onnx", f"{base.tmp}/cache"
    if not os.path.exists(model):
        with open(model, "wb") as f:
            f.write(base.model_bytes)
    _fresh(directory)
    builds: list[int] = []
    flags = Options().flags()

    def build() -> bundle_format.Bundle:
        builds.append(1)
        return compile_model(model, Options())

    want = bundle_format.to_bytes(cache.cached(model, flags, directory, build))
    (neff,) = [os.path.join(d, f) for d, _, fs in os.walk(directory) for f in fs if f.endswith(".neff")]
    target = neff if rng.random() < 0.6 else neff[:-5] + ".key"
    action = rng.choice(["flip", "truncate", "swap", "garbage", "special", "other key", "record"])
    st = os.stat(target)
    if action in ("flip", "truncate", "garbage"):
        with open(target, "rb") as f:
            data = f.read()
        data = (_mutate_bytes(data, rng) if action == "flip" else data[:rng.randrange(len(data) + 1)]
                if action == "truncate" else bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))
        with open(target, "r+b") as f:  # in place, the mtime put back
            f.write(data)
            f.truncate(len(data))
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif action == "swap":
        with open(neff, "r+b") as f:
            f.write(_variant(base))
            f.truncate(len(_variant(base)))
        os.utime(neff, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif action == "special":
        _fresh(target)
        _special(target, rng)
    elif action == "other key":
        with open(neff[:-5] + ".key", "w") as f:
            json.dump({"key": "0" * 64, "sha256": "00", "identity": [0, 0, 0, 0], "checked": 0}, f)
    else:
        for d, _, fs in os.walk(os.path.join(directory, "files")):
            for name in fs:
                with open(os.path.join(d, name), "w") as f:
                    f.write(rng.choice(["{}", "[]", "null", '{"path": 1}', "\0" * 10]))
    before = len(builds)
    got = bundle_format.to_bytes(cache.cached(model, flags, directory, build))
    if got != want:
        raise AssertionError(f"the cache returned another bundle after {action} of {os.path.basename(target)}")
    return "rebuilt" if len(builds) > before else None  # None: a hit (the damage did not reach the entry)


def files_case(base: Base, rng: random.Random) -> str | None:
    """A FIFO, a device, a directory, an empty or missing file, or a path with a NUL byte, where a command reads
    or writes a file: one coded line, at once; nothing replaced."""
    import os

    from neuronx_cc_lite.cli import main

    path = f"{base.tmp}/special"
    _fresh(path)
    kind = _special(path, rng) if rng.random() < 0.9 else "nul"
    if kind == "nul":
        path = f"{base.tmp}/a\0b"
    neff, model, out = f"{base.tmp}/base.neff", f"{base.tmp}/cached.onnx", f"{base.tmp}/out"
    if not os.path.exists(model):
        with open(model, "wb") as f:
            f.write(base.model_bytes)
    _fresh(out)
    argv = rng.choice([
        ["compile", path, "-o", out], ["compile", model, "-o", path, "--no-cache"], ["run", path],
        ["run", neff, "--inputs", path], ["run", neff, "--input", f"x={path}"], ["run", neff, "--outputs", path],
        ["info", path], ["disasm", path], ["asm", path, "-o", out], ["analyze", path],
        ["profile", neff, "--json", path], ["compile", model, "-o", out, "--logfile", path, "--no-cache"],
    ])
    captured, real = io.StringIO(), (sys.stdout, sys.stderr)
    sys.stdout, sys.stderr = io.StringIO(), captured  # the worker's stdout carries its JSON lines only
    try:
        status = main(["-q", *argv])
    finally:
        sys.stdout, sys.stderr = real
    said = captured.getvalue().strip()
    if status == 0:
        if kind not in ("empty", "missing"):  # a log file or an output made where nothing (or nothing) was
            raise AssertionError(f"{argv[0]} on a {kind} exited 0")
        return None
    usage = said.startswith("neuronx-cc-lite: error: NCC_USAGE: ")
    if status != (2 if usage else 1) or "NCC_INTERNAL" in said or said.count("\n") > 0 or not said:
        raise AssertionError(f"{argv[0]} on a {kind} exited {status}: {said[:300]!r}")
    return said.split(": ")[2]


_INTEGER_TYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64")
_INTEGER_OPS = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Neg", "Abs", "Cast", "ReduceSum", "Identity", "Less",
                "Equal", "GreaterOrEqual")
_integer_models: dict[tuple, tuple] = {}  # (op, dtype, to, shape) -> (model, loaded model or CompileError)
# The most loaded models kept at once: each holds its simulated chip's memories, and the worker's address space
# is capped (tests/fuzz/worker.py); now that most integer operators compile, 200 seeds would load ~150 of them
_INTEGER_MODELS_KEPT = 16


def _integer_model(op: str, dtype: str, to: str, shape: tuple[int, ...]) -> tuple:
    """The one-operator model and its loaded bundle (or the compile's CompileError), compiled once per worker."""
    from onnx import helper

    import runtime
    from neuronx_cc_lite.compiler import Options, compile_model
    from neuronx_cc_lite.errors import CompileError

    key = (op, dtype, to, shape)
    if key not in _integer_models:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        unary = op in ("Neg", "Abs", "Cast", "ReduceSum", "Identity")
        inputs = ["a"] if unary else ["a", "b"]
        attrs: dict[str, Any] = {"to": helper.np_dtype_to_tensor_dtype(np.dtype(to))} if op == "Cast" else {}
        out_type = helper.np_dtype_to_tensor_dtype(np.dtype(to)) if op == "Cast" else elem
        if op in ("Less", "Equal", "GreaterOrEqual"):
            out_type = helper.np_dtype_to_tensor_dtype(np.dtype(bool))
        out_shape = list(shape)
        if op == "ReduceSum":
            attrs, out_shape = {"keepdims": 0}, list(shape[:-1])
            inputs.append("axes")
        node = helper.make_node(op, inputs, ["y"], name="the_op", **attrs)
        inits = [helper.make_tensor("axes", 7, [1], [-1])] if op == "ReduceSum" else []
        graph = helper.make_graph([node], "ints", [helper.make_tensor_value_info(n, elem, list(shape))
                                                   for n in inputs if n != "axes"],
                                  [helper.make_tensor_value_info("y", out_type, out_shape)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        try:
            loaded: Any = runtime.Model(compile_model(model, Options()))
        except CompileError as e:
            loaded = e
        if len(_integer_models) >= _INTEGER_MODELS_KEPT:
            del _integer_models[next(iter(_integer_models))]  # the oldest
        _integer_models[key] = (model, loaded)
    return _integer_models[key]


def _integer_values(rng: random.Random, dtype: str, shape: tuple[int, ...], nonzero: bool) -> np.ndarray:
    info = np.iinfo(dtype)
    edges = {int(info.min), int(info.min) + 1, int(info.max) - 1, int(info.max), -1, 0, 1, 2}
    for p in (2**7, 2**8, 2**15, 2**16, 2**23, 2**24, 2**31, 2**32):
        edges |= {p - 1, p, p + 1, -p - 1, -p, -p + 1}
    edges = sorted(v for v in edges if info.min <= v <= info.max)
    small = rng.random() < 0.3  # within 2^11 (where products of two stay within 2^24)
    values = [rng.randint(max(int(info.min), -2**11), min(int(info.max), 2**11)) if small
              else rng.choice(edges) if rng.random() < 0.6 else rng.randint(int(info.min), int(info.max))
              for _ in range(int(np.prod(shape)))]
    if nonzero:
        values = [v or 1 for v in values]
    return np.array(values, dtype).reshape(shape)


def integers_case(base: Base, rng: random.Random) -> str | None:
    """One integer operator on values near 2^24, 2^31 and the type's wrap-around: exactly onnxruntime's bits, or
    a coded refusal at compile (naming the node) or at run (naming the input)."""
    from neuronx_cc_lite.errors import CompileError
    from neuronx_cc_lite.reference import onnxruntime_outputs

    op, dtype = rng.choice(_INTEGER_OPS), rng.choice(_INTEGER_TYPES)
    to = rng.choice(_INTEGER_TYPES) if op == "Cast" else dtype
    shape = rng.choice([(7,), (3, 5), (2, 130)])
    model, loaded = _integer_model(op, dtype, to, shape)
    if isinstance(loaded, CompileError):
        if "the_op" not in str(loaded):
            raise AssertionError(f"the refusal does not name the node: {loaded}")
        raise loaded
    inputs = {i.name: _integer_values(rng, dtype, shape, op == "Div" and i.name == "b") for i in model.graph.input}
    try:
        expected = onnxruntime_outputs(model, inputs)["y"]
    except CompileError:
        return "no-reference"  # onnxruntime has no kernel for this operator on this type: nothing to compare
    got = loaded.run(inputs)["y"]
    if got.dtype != expected.dtype or got.shape != expected.shape or not np.array_equal(got, expected):
        wrong = np.flatnonzero(got.reshape(-1) != expected.reshape(-1)) if got.shape == expected.shape else [0]
        at = int(wrong[0]) if len(wrong) else 0
        raise AssertionError(f"{op} {dtype}->{to}: {got.dtype} {got.reshape(-1)[at]} where onnxruntime gives "
                             f"{expected.dtype} {expected.reshape(-1)[at]} (inputs "
                             f"{[v.reshape(-1)[at] for v in inputs.values()]})")
    return None


# Each case returns None when it ran, or the code of the error a command line reported for it.
CASES: dict[str, Callable[[Base, random.Random], str | None]] = {
    "bundle": bundle_case, "manifest": manifest_case, "stream": stream_case, "listing": listing_case,
    "npz": npz_case, "onnx": onnx_case, "cache": cache_case, "files": files_case,
    "integers": integers_case,
}
