"""The bundle file (our NEFF): a fixed-size header, then a zip archive.

Header (96 bytes: magic, format version, payload size and sha256, target): isa/header.py.

A bundle holds the program of every rank. A rank is a logical NeuronCore: `lnc` physical cores acting as one
(trn2's LNC=2; 1 elsewhere). Ranks fill chips in order (`Target.ranks_per_chip(lnc)` per chip) and chips fill
instances. Each rank addresses its own HBM space of `hbm_size` bytes, its share of its chip's HBM (the ranks of a
chip share the chip's HBM bandwidth). Ranks exchange data only by collective instructions on a replica group:
`groups[g]` lists the ranks of group g.

Archive (stored, fixed timestamps, sorted names, so that equal bundles are equal bytes):
- manifest.json: target, lnc, HBM size per rank, replica groups, inputs and outputs (name, shape, dtype, device
  dtype, and where each piece lives: rank, HBM offset, the slice of one axis), the weight segments (rank, HBM
  offset and size), per rank the streams in order with their files, compiler version and flags, and what the
  compiler knows that only the profiler reads: the model's FLOPs, bytes spilled, and the name, kind and place of
  every HBM tensor (of rank 0);
- core<N>/<STREAM>.bin: the encoded instruction stream of one engine or DMA queue of rank N;
- weights.bin: the weight segments, back to back, copied into HBM at load;
- device state (optional, manifest "state"): tensors placed like inputs (name, shape, dtypes, placements) that the
  program reads and writes in place and that persist in HBM from one run to the next (a KV cache and its write
  position). The runtime keeps them per rank, zeroed at load and on request, never copied to the host unless
  asked, and shared between bundles that declare the same ones (a prefill and a decode program);
- debug.json: for each stream, the ONNX node each instruction came from.

A partitioned bundle (compiled with `--fallback host`) has no cores of its own: its manifest lists the model's
inputs and outputs (name, type, shape; null for what is known only at run time) and its parts in the order they
run, each with its kind, file and the names it reads and makes; `part<K>.neff` is a chip part (a whole bundle, read
and checked as one), `part<K>.onnx` a host part (an ONNX model the runtime runs on the CPU).

Large bundles: `write` streams the members' bytes into the file (the header, with the payload's size and hash,
last) and `read` checks the hash reading a piece at a time and maps weights.bin instead of reading it, so a
bundle's weights are never held twice in memory.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import io
import json
import mmap
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable

import numpy as np

from isa.codec import decode_stream, encode_stream
from isa.errors import BundleError, IsaError
from isa.files import open_regular, replacing
from isa.header import FORMAT_VERSION, HEADER, HEADER_SIZE, MAGIC, Header, check_output, read_header  # noqa: F401
from isa.instructions import Instruction
from isa.limits import MAX_INSTRUCTIONS, MAX_INSTRUCTIONS_PER_STREAM, MAX_MANIFEST_BYTES
from isa.manifest import check_manifest, check_parts_manifest, parse_json
from isa.tensor_kind import TensorKind

_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_CHUNK = 1 << 20  # bytes hashed, checked or copied at a time: large weights never need a second copy in memory
_LOCAL_HEADER = struct.Struct(zipfile.structFileHeader)  # a member's local header, before its bytes


@dataclass(frozen=True)
class Placement:
    """One piece of a model input or output in a rank's HBM: indices [start, stop) of `axis` (the whole tensor
    when they span the axis), row-major at `hbm_offset`."""

    rank: int
    hbm_offset: int
    axis: int
    start: int
    stop: int

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "hbm_offset": self.hbm_offset, "axis": self.axis, "start": self.start,
                "stop": self.stop}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Placement:
        return cls(int(d["rank"]), int(d["hbm_offset"]), int(d["axis"]), int(d["start"]), int(d["stop"]))


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output. An input is written to every placement (its slice of the tensor); an output is
    read from its placements, which together cover it."""

    name: str
    # a partitioned bundle's output may have -1 for a dimension known only at run time, or None for its whole shape
    shape: tuple[int, ...]
    dtype: str  # numpy name of what the user passes or receives
    device_dtype: str  # DType name of the bytes in HBM ("" in a partitioned bundle: each part has its own)
    placements: tuple[Placement, ...]

    @classmethod
    def whole(cls, name: str, shape: tuple[int, ...], dtype: str, device_dtype: str, hbm_offset: int,
              rank: int = 0) -> TensorInfo:
        """The whole tensor on one rank."""
        return cls(name, shape, dtype, device_dtype,
                   (Placement(rank, hbm_offset, 0, 0, shape[0] if shape else 1),))

    @property
    def hbm_offset(self) -> int:
        """Where the first placement starts (the whole tensor, in a one-rank bundle)."""
        return self.placements[0].hbm_offset

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "device_dtype": self.device_dtype, "placements": [p.to_json() for p in self.placements]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TensorInfo:
        return cls(str(d["name"]), tuple(int(n) for n in d["shape"]), str(d["dtype"]), str(d["device_dtype"]),
                   tuple(Placement.from_json(p) for p in d["placements"]))


@dataclass(frozen=True)
class Segment:
    """Bytes placed in a rank's HBM at load: weights and other constants. `data` is bytes, or a view of the
    bundle file read (a memory map: its pages are read from the file when touched), with `mapped` the map and
    where the view starts in it."""

    hbm_offset: int
    data: bytes | memoryview
    rank: int = 0
    mapped: tuple[mmap.mmap, int] | None = field(default=None, compare=False, repr=False)

    def copy_to(self, dst: np.ndarray) -> None:
        """dst (uint8, as long as the data) = the bytes, a piece at a time. The pages of a mapped segment are given
        back once copied (they are read from the page cache again when next needed), so a weight is in memory
        once, where it is copied to, and not twice."""
        for at in range(0, len(self.data), _CHUNK):
            piece = self.data[at:at + _CHUNK]
            dst[at:at + len(piece)] = np.frombuffer(piece, np.uint8)
            if self.mapped is not None:
                _release(self.mapped[0], self.mapped[1] + at, len(piece))


def _release(mapped: mmap.mmap, start: int, length: int) -> None:
    """Drop the pages of [start, start + length) of a read-only file map from this process's memory."""
    first = start - start % mmap.PAGESIZE
    mapped.madvise(mmap.MADV_DONTNEED, first, start + length - first)


@dataclass(frozen=True)
class HbmTensorInfo:
    """Where a tensor of the compiled program lives in HBM (for the profiler: which tensor a DMA reads)."""

    name: str
    kind: TensorKind
    hbm_offset: int
    size: int

    def __post_init__(self) -> None:  # a plain string would compare equal to its kind but fail every `is` test
        assert isinstance(self.kind, TensorKind), f"HBM tensor {self.name}: kind {self.kind!r} is not a TensorKind"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind.value, "hbm_offset": self.hbm_offset, "size": self.size}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HbmTensorInfo:
        return cls(str(d["name"]), TensorKind.parse(d["kind"]), int(d["hbm_offset"]), int(d["size"]))


@dataclass
class Stream:
    instructions: list[Instruction]
    nodes: list[str]  # the ONNX node of each instruction ("" when none)


@dataclass
class Part:
    """One piece of a partitioned bundle (compiled with `--fallback host`), the pieces run in order: a chip part is
    a program of its own (`bundle`, a whole bundle), a host part an ONNX model (`onnx`, its bytes) the runtime runs
    on the CPU. Each reads `inputs` (model inputs and earlier parts' outputs) and makes `outputs`; `ops` counts a
    host part's operators (what `info` and `profile` show of it)."""

    kind: str  # "chip" or "host"
    inputs: list[str]
    outputs: list[str]
    bundle: Bundle | None = None
    onnx: bytes = b""
    ops: dict[str, int] = field(default_factory=dict)

    @property
    def file(self) -> str:
        return "neff" if self.kind == "chip" else "onnx"


@dataclass
class Bundle:
    target: str
    hbm_size: int
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    cores: list[dict[str, Stream]]  # per rank: stream name -> stream
    weights: list[Segment] = field(default_factory=list)
    compiler: str = ""
    flags: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)  # model_flops, spill_bytes, ...
    hbm_tensors: list[HbmTensorInfo] = field(default_factory=list)
    lnc: int = 1  # physical cores per rank
    groups: list[tuple[int, ...]] = field(default_factory=list)  # replica groups of the collectives
    state: list[TensorInfo] = field(default_factory=list)  # device state: persists in HBM across runs
    # A partitioned bundle: its parts, in the order they run (no cores of its own; inputs and outputs are the
    # model's, without placements, a dimension known only at run time given as -1, a shape not known at all as None)
    parts: list[Part] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return len(self.cores)

    @property
    def chip_parts(self) -> list[Bundle]:
        """The programs that run on the chip: the bundle itself, or its chip parts."""
        return [p.bundle for p in self.parts if p.bundle is not None] if self.parts else [self]


def _stream_path(core: int, name: str) -> str:
    return f"core{core}/{name}.bin"


_HASHED_APART = 1 << 20  # bytes from which a chunk is hashed by the second thread while it is written


class _Window(io.RawIOBase):
    """Bytes [start, start + size) of a file as a file of their own, so that the archive after the header is
    written and read as if it began at offset 0 (zipfile records offsets from the start of the file it has).
    Writes are kept (a reference, not a copy), not made: zipfile rewrites a member's local header once the member
    is written, so the archive's bytes are final only at the end, when `write_out` puts them in the file and takes
    their sha256 at the same time. (So an archive an error or a signal abandons never touches the file: its
    finaliser, run at exit, used to write the end record into the file `replacing` had closed, and print
    "Exception ignored ... seek of closed file" after the command's error line.)"""

    def __init__(self, f: BinaryIO, start: int, size: int | None = None) -> None:
        self.f, self.start, self.size, self.pos = f, start, size, 0
        self.written: list[list[Any]] = []  # [position, bytes], in file order
        self.abandoned = False

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        end = self.size if self.size is not None else self.end
        self.pos = (offset, self.pos + offset, end + offset)[whence]
        if self.pos < 0:
            raise OSError("seek before the start of the archive")
        return self.pos

    @property
    def end(self) -> int:
        return self.written[-1][0] + memoryview(self.written[-1][1]).nbytes if self.written else 0

    def readinto(self, b: Any) -> int:
        assert self.size is not None
        view = memoryview(b).cast("B")[:max(0, self.size - self.pos)]
        self.f.seek(self.start + self.pos)
        n = self.f.readinto(view) or 0
        self.pos += n
        return n

    def write(self, b: Any) -> int:
        n = memoryview(b).nbytes
        if self.pos == self.end:
            self.written.append([self.pos, b])
        else:  # zipfile rewriting the header of the member it just wrote: the same length, at the same place
            k = next((k for k in reversed(range(len(self.written)))
                      if self.written[k][0] == self.pos and memoryview(self.written[k][1]).nbytes == n), None)
            if k is None:  # zipfile closing an archive an error abandoned: nothing is written out, nothing to raise
                self.abandoned = True
            else:
                self.written[k][1] = b
        self.pos += n
        return n

    def write_out(self) -> bytes:
        """Write the archive into the file and return its sha256, taken by a second thread as the bytes go out:
        both let go of the GIL, so the write (0.1-0.7 s for BERT-base's 439 MB, most of it the kernel's first
        touch of new page-cache pages) and the hash (0.32 s) take the longer of the two, not their sum."""
        assert not self.abandoned
        h = hashlib.sha256()
        hashing = concurrent.futures.ThreadPoolExecutor(1)
        try:
            pending: concurrent.futures.Future[None] | None = None
            self.f.seek(self.start)
            for _, data in self.written:
                if pending is not None:  # (in order: a chunk is hashed after the one before it)
                    pending.result()
                    pending = None
                if memoryview(data).nbytes < _HASHED_APART:  # a header, a small member: handing over costs more
                    h.update(data)
                else:
                    pending = hashing.submit(h.update, data)
                self.f.write(data)
            if pending is not None:
                pending.result()
        finally:
            hashing.shutdown(wait=True)
        return h.digest()


def _part_path(k: int, part: Part) -> str:
    return f"part{k}.{part.file}"


def _write_members(files: dict[str, bytes], out: BinaryIO) -> zipfile.ZipFile:
    """An archive into `out` holding `files` (in name order, stored, fixed timestamps); returned open, for members
    to stream after them."""
    z = zipfile.ZipFile(out, "w", zipfile.ZIP_STORED)
    for name in sorted(files):
        info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
        info.external_attr = 0o644 << 16
        z.writestr(info, files[name])
    return z


def _write_parts(bundle: Bundle, out: BinaryIO) -> None:
    """The archive of a partitioned bundle: its manifest and each part's file (a chip part's bundle, a host part's
    ONNX model)."""
    manifest = {
        "target": bundle.target,
        "inputs": [signature_json(t) for t in bundle.inputs],
        "outputs": [signature_json(t) for t in bundle.outputs],
        "parts": [{"kind": p.kind, "file": _part_path(k, p), "inputs": p.inputs, "outputs": p.outputs, "ops": p.ops}
                  for k, p in enumerate(bundle.parts)],
        "compiler": bundle.compiler,
        "flags": bundle.flags,
        "stats": bundle.stats,
    }
    files = {"manifest.json": json.dumps(manifest, indent=1, sort_keys=True).encode()}
    for k, p in enumerate(bundle.parts):
        if (p.kind == "chip") != (p.bundle is not None):
            raise BundleError(f"part {k} is a {p.kind} part " + ("without" if p.kind == "chip" else "with") +
                              " a chip program")
        files[_part_path(k, p)] = to_bytes(p.bundle) if p.bundle is not None else p.onnx
    _write_members(files, out).close()


def signature_json(t: TensorInfo) -> dict[str, Any]:
    """A partitioned bundle's input or output: name, type and shape (None for a dimension known at run time)."""
    shape = None if t.shape is None else [n if n >= 0 else None for n in t.shape]
    return {"name": t.name, "dtype": t.dtype, "shape": shape}


def _write_archive(bundle: Bundle, out: BinaryIO) -> None:
    """The zip archive of a bundle into `out`, its members streamed: weights.bin is written segment by segment."""
    if bundle.parts:
        _write_parts(bundle, out)
        return
    manifest = {
        "target": bundle.target,
        "hbm_size": bundle.hbm_size,
        "lnc": bundle.lnc,
        "groups": [list(g) for g in bundle.groups],
        "inputs": [t.to_json() for t in bundle.inputs],
        "outputs": [t.to_json() for t in bundle.outputs],
        "weights": [{"rank": s.rank, "hbm_offset": s.hbm_offset, "size": len(s.data)} for s in bundle.weights],
        "cores": [[{"stream": name, "file": _stream_path(c, name)} for name in streams]
                  for c, streams in enumerate(bundle.cores)],
        "compiler": bundle.compiler,
        "flags": bundle.flags,
        "stats": bundle.stats,
        "hbm_tensors": [t.to_json() for t in bundle.hbm_tensors],
    }
    if bundle.state:  # absent when empty: a bundle without state is byte for byte what it was before state existed
        manifest["state"] = [t.to_json() for t in bundle.state]
    debug = [{name: s.nodes for name, s in streams.items()} for streams in bundle.cores]
    files: dict[str, bytes | None] = {
        "manifest.json": json.dumps(manifest, indent=1, sort_keys=True).encode(),
        "debug.json": json.dumps(debug, sort_keys=True).encode(),
        "weights.bin": None,  # streamed
    }
    for c, streams in enumerate(bundle.cores):
        for name, s in streams.items():
            if len(s.instructions) > MAX_INSTRUCTIONS_PER_STREAM:
                raise BundleError(f"rank {c} {name} has {len(s.instructions)} instructions; a stream holds at most "
                                  f"{MAX_INSTRUCTIONS_PER_STREAM} (isa/limits.py)")
            files[_stream_path(c, name)] = encode_stream(s.instructions)
    with _write_members({k: v for k, v in files.items() if v is not None}, out) as z:
        # weights.bin sorts last of the members: streamed after the others, the order is still by name
        info = zipfile.ZipInfo("weights.bin", date_time=_ZIP_TIME)
        info.external_attr = 0o644 << 16
        info.file_size = sum(len(s.data) for s in bundle.weights)  # as writestr sets it: it decides zip64
        with z.open(info, "w") as member:
            for s in bundle.weights:
                member.write(s.data)


def _header(bundle: Bundle, payload_size: int, digest: bytes) -> bytes:
    return HEADER.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, len(bundle.cores), payload_size, digest,
                       _target_name(bundle)).ljust(HEADER_SIZE, b"\0")


def _target_name(bundle: Bundle) -> bytes:
    target = bundle.target.encode()
    if len(target) > 16:
        raise BundleError(f"target name {bundle.target!r} longer than 16 bytes")
    return target


def to_bytes(bundle: Bundle) -> bytes:
    """The bundle file's bytes, in memory (`write` streams a large bundle into a file instead)."""
    _target_name(bundle)
    archive = io.BytesIO()
    _write_archive(bundle, archive)
    payload = archive.getvalue()
    return _header(bundle, len(payload), hashlib.sha256(payload).digest()) + payload


def write(bundle: Bundle, path: str | os.PathLike[str]) -> bytes:
    """Write atomically (the file appears complete or not at all: isa/files.py `replacing`) and streaming: the
    archive is made of references to the members' bytes and then written out, the header last, so that a bundle's
    weights are never copied in memory; the bytes are those of `to_bytes`. An existing file at `path` is replaced
    only if it is a bundle (`check_output`). Returns the payload's sha256, as written in the header (taken from
    what was written, not read back)."""
    _target_name(bundle)
    check_output(path)
    with replacing(path) as f:
        window = _Window(f, HEADER_SIZE)
        _write_archive(bundle, window)
        sha256 = window.write_out()
        f.seek(0)
        f.write(_header(bundle, window.end, sha256))
    return sha256


def _members(z: zipfile.ZipFile, payload_size: int) -> dict[str, zipfile.ZipInfo]:
    """The archive's members, refused unless each is stored as the writer stores it: uncompressed (no member
    inflates past its size in the file), unencrypted, named once."""
    members: dict[str, zipfile.ZipInfo] = {}
    for info in z.infolist():
        if info.filename in members:
            raise BundleError(f"member {info.filename!r} appears twice in the archive")
        if info.flag_bits & 0x1:
            raise BundleError(f"member {info.filename!r} is encrypted")
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
            raise BundleError(f"member {info.filename!r} is compressed (method {info.compress_type}); a bundle "
                              "stores its members uncompressed")
        if info.file_size > payload_size:
            raise BundleError(f"member {info.filename!r} claims {info.file_size} bytes, more than the archive")
        members[info.filename] = info
    return members


def _read(z: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], name: str, limit: int | None = None) -> bytes:
    if name not in members:
        raise BundleError(f"the archive has no member {name!r}")
    if limit is not None and members[name].file_size > limit:
        raise BundleError(f"member {name!r} is {members[name].file_size} bytes, more than the {limit} allowed")
    return z.read(members[name])


def _check_segments(segments: list[Segment]) -> None:
    ends: dict[int, int] = {}
    for seg in sorted(segments, key=lambda s: (s.rank, s.hbm_offset)):
        if seg.hbm_offset < ends.get(seg.rank, 0):
            raise BundleError(f"weight segments of rank {seg.rank} overlap at HBM offset {seg.hbm_offset}")
        ends[seg.rank] = seg.hbm_offset + len(seg.data)


def from_bytes(data: bytes) -> Bundle:
    """A bundle from its file's bytes (the weights are views of `data`, not copies)."""
    return _parse(io.BytesIO(data), len(data), lambda: memoryview(data), None)


# What a long read says of its progress, if asked: (what it does, how many done, of how many)
Progress = Callable[[str, int, int], None]


def no_progress(label: str, done: int, total: int) -> None:
    """A Progress that nobody watches."""


def read(path: str | os.PathLike[str], on_progress: Progress = no_progress) -> Bundle:
    """A bundle from its file, read a member at a time: the hash is checked streaming, and the weights are a
    memory map of the file, whose pages cost memory only as they are read (the runtime gives them back once it has
    copied them into HBM). The file must not change while the bundle is in use: bundles are replaced, never
    rewritten in place (`write`). A path that is not a regular file is refused unread. `on_progress(what, done,
    total)` is told how far the hash check and the decoding have come (BERT-base's 438 MB take seconds)."""
    try:
        with open_regular(path) as f:
            return read_from(f, on_progress=on_progress)
    except OSError as e:
        raise BundleError(f"cannot read {path}: {e.strerror}") from None


def read_from(f: BinaryIO, expected_sha256: bytes | None = None, unchanged: bool = False,
              on_progress: Progress = no_progress) -> Bundle:
    """A bundle from an open regular file. `expected_sha256`: the payload hash its header must name (a compile
    cache entry's); `unchanged`: the file is known not to have changed since its payload was checked against that
    hash, which is then not taken again."""
    maps: list[mmap.mmap] = []

    def whole() -> memoryview:
        maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        return memoryview(maps[0])

    expected = None if expected_sha256 is None else (expected_sha256, unchanged)
    return _parse(f, os.fstat(f.fileno()).st_size, whole, maps, expected, on_progress)


def _parse(f: BinaryIO, size: int, whole: Callable[[], memoryview], maps: list[mmap.mmap] | None,
           expected: tuple[bytes, bool] | None = None,
           on_progress: Progress = no_progress) -> Bundle:
    """The checks of a bundle, on the file `f` of `size` bytes: `whole()` views all of it, for the weights
    (`maps` holds the memory map it makes, if any). `expected`: the payload hash the header must name, and whether
    the file is known unchanged since its payload was checked against it (then the payload's hash and the weights'
    CRC are not taken again)."""
    f.seek(0)
    header = read_header(f.read(HEADER_SIZE))
    if size - HEADER_SIZE != header.payload_size:
        raise BundleError(f"payload is {size - HEADER_SIZE} bytes, the header says {header.payload_size} "
                          f"(truncated or padded file)")
    if expected is not None and header.sha256 != expected[0]:
        raise BundleError("the header's hash is not the one expected: another bundle took this file's place")
    verify = expected is None or not expected[1]
    hashed = functools.partial(on_progress, "checking bundle bytes")
    if verify and _digest(f, HEADER_SIZE, header.payload_size, hashlib.sha256(), hashed).digest() != header.sha256:
        raise BundleError("sha256 hash mismatch: the bundle is corrupted")
    try:
        with zipfile.ZipFile(_Window(f, HEADER_SIZE, header.payload_size)) as z:
            members = _members(z, header.payload_size)
            manifest = parse_json(_read(z, members, "manifest.json", MAX_MANIFEST_BYTES), "manifest.json")
            if isinstance(manifest, dict) and "parts" in manifest:
                bundle = _parse_parts(z, members, manifest)
                if bundle.target != header.target or header.num_cores:
                    raise BundleError("header and manifest disagree on the target or the number of ranks")
                return bundle
            check_manifest(manifest)
            debug = parse_json(_read(z, members, "debug.json", MAX_MANIFEST_BYTES), "debug.json")
            cores, total = [], 0
            count, decoded = sum(len(streams) for streams in manifest["cores"]), 0
            for c, streams in enumerate(manifest["cores"]):
                core = {}
                for entry in streams:
                    on_progress("decoding streams", decoded, count)
                    decoded += 1
                    name = entry["stream"]
                    instrs = decode_stream(_read(z, members, entry["file"]))
                    total += len(instrs)
                    if total > MAX_INSTRUCTIONS:
                        raise BundleError(f"the bundle holds more than {MAX_INSTRUCTIONS} instructions")
                    nodes = debug[c][name]
                    if not isinstance(nodes, list) or len(nodes) != len(instrs):
                        raise BundleError(f"debug map of core {c} {name} does not have one entry per instruction "
                                          f"({len(instrs)})")
                    core[name] = Stream(instrs, [str(n) for n in nodes])
                cores.append(core)
            first, length = _stored_span(z, members, "weights.bin", header.payload_size)
            if verify and _digest(f, HEADER_SIZE + first, length, zlib.crc32) != members["weights.bin"].CRC:
                raise BundleError("weights.bin fails its CRC-32 check")
            weights_blob = whole()[HEADER_SIZE + first:HEADER_SIZE + first + length] if length else memoryview(b"")
            segments, at = [], 0
            for w in manifest["weights"]:
                mapped = (maps[0], HEADER_SIZE + first + at) if maps else None
                segments.append(Segment(w["hbm_offset"], weights_blob[at:at + w["size"]], w["rank"], mapped))
                at += w["size"]
            if at != len(weights_blob):
                raise BundleError("weights.bin does not match the manifest's weight segments")
            _check_segments(segments)
            bundle = Bundle(
                target=manifest["target"],
                hbm_size=manifest["hbm_size"],
                inputs=[TensorInfo.from_json(t) for t in manifest["inputs"]],
                outputs=[TensorInfo.from_json(t) for t in manifest["outputs"]],
                cores=cores,
                weights=segments,
                compiler=manifest["compiler"],
                flags=manifest["flags"],
                stats=manifest.get("stats", {}),
                hbm_tensors=[HbmTensorInfo.from_json(t) for t in manifest.get("hbm_tensors", [])],
                lnc=manifest["lnc"],
                groups=[tuple(g) for g in manifest["groups"]],
                state=[TensorInfo.from_json(t) for t in manifest.get("state", [])],
            )
    except IsaError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, EOFError, zlib.error,
            KeyError, IndexError, TypeError, ValueError, OverflowError) as e:
        raise BundleError(f"malformed bundle archive: {type(e).__name__}: {e}") from None
    if bundle.target != header.target or len(bundle.cores) != header.num_cores:
        raise BundleError("header and manifest disagree on the target or the number of ranks")
    return bundle


def _parse_parts(z: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], manifest: Any) -> Bundle:
    """A partitioned bundle: each chip part a bundle of its own, checked as any bundle; each host part's ONNX
    bytes as they are (the runtime's onnxruntime checks them as it loads them)."""
    check_parts_manifest(manifest)
    parts = []
    for k, p in enumerate(manifest["parts"]):
        data = _read(z, members, p["file"])
        nested = from_bytes(data) if p["kind"] == "chip" else None
        if nested is not None and (nested.parts or nested.target != manifest["target"]):
            raise BundleError(f"part {k} is not a chip program for {manifest['target']}")
        parts.append(Part(p["kind"], list(p["inputs"]), list(p["outputs"]), nested,
                          b"" if nested is not None else data, dict(p["ops"])))
    signature = [[TensorInfo(t["name"], None if t["shape"] is None else tuple(-1 if n is None else n for n in t["shape"]),
                             t["dtype"], "", ()) for t in manifest[kind]] for kind in ("inputs", "outputs")]
    return Bundle(target=manifest["target"], hbm_size=0, inputs=signature[0], outputs=signature[1], cores=[],
                  compiler=manifest["compiler"], flags=manifest["flags"], stats=manifest["stats"], parts=parts)


def _digest(f: BinaryIO, start: int, length: int, h: Any, done: Callable[[int, int], None] = lambda n, of: None) -> Any:
    """Bytes [start, start + length) of `f` fed to `h` a piece at a time: a hashlib object (returned), or
    zlib.crc32 (the CRC returned). `done(n, length)` after each piece: n bytes are."""
    buffer = memoryview(bytearray(min(length, _CHUNK)))
    f.seek(start)
    crc, total = 0, length
    while length:
        done(total - length, total)
        n = f.readinto(buffer[:min(length, len(buffer))]) or 0
        if n == 0:
            raise BundleError("the file ends early")
        if h is zlib.crc32:
            crc = zlib.crc32(buffer[:n], crc)
        else:
            h.update(buffer[:n])
        length -= n
    return crc if h is zlib.crc32 else h


def _stored_span(z: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], name: str,
                 payload_size: int) -> tuple[int, int]:
    """Where a stored member's bytes lie in the archive, from its local header (checked as zipfile checks it):
    the weights are mapped there, not read."""
    if name not in members:
        raise BundleError(f"the archive has no member {name!r}")
    info = members[name]
    assert z.fp is not None
    z.fp.seek(info.header_offset)
    fixed = z.fp.read(_LOCAL_HEADER.size)
    if len(fixed) != _LOCAL_HEADER.size:
        raise BundleError(f"the local header of {name!r} is cut short")
    fields = _LOCAL_HEADER.unpack(fixed)
    signature, name_length, extra_length = fields[0], fields[10], fields[11]
    if signature != zipfile.stringFileHeader or z.fp.read(name_length) != name.encode():
        raise BundleError(f"the local header of {name!r} is not that member's")
    first = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
    if first + info.file_size > payload_size:
        raise BundleError(f"member {name!r} runs past the end of the archive")
    return first, info.file_size
