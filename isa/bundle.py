"""The bundle file (our NEFF): a fixed-size header, then a zip archive.

Header (96 bytes, little-endian): magic "NXCLNEFF", format version (u16), header size (u16), number of ranks (u16),
payload size (u64), sha256 of the payload (32 bytes), target name (16 bytes, NUL-padded), zero padding.

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
- debug.json: for each stream, the ONNX node each instruction came from.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import Any

from isa.codec import decode_stream, encode_stream
from isa.errors import BundleError, IsaError
from isa.instructions import Instruction
from isa.limits import MAX_INSTRUCTIONS, MAX_INSTRUCTIONS_PER_STREAM, MAX_MANIFEST_BYTES
from isa.manifest import check_manifest, parse_json

MAGIC = b"NXCLNEFF"
FORMAT_VERSION = 2  # 2: ranks, replica groups, collectives, tensors placed per rank
HEADER = struct.Struct("<8sHHHQ32s16s")
HEADER_SIZE = 96
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


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
    shape: tuple[int, ...]
    dtype: str  # numpy name of what the user passes or receives
    device_dtype: str  # DType name of the bytes in HBM
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
    """Bytes placed in a rank's HBM at load: weights and other constants."""

    hbm_offset: int
    data: bytes
    rank: int = 0


@dataclass(frozen=True)
class HbmTensorInfo:
    """Where a tensor of the compiled program lives in HBM (for the profiler: which tensor a DMA reads)."""

    name: str
    kind: str  # input, output, weight, scratch (between operators) or spill
    hbm_offset: int
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "hbm_offset": self.hbm_offset, "size": self.size}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HbmTensorInfo:
        return cls(str(d["name"]), str(d["kind"]), int(d["hbm_offset"]), int(d["size"]))


@dataclass
class Stream:
    instructions: list[Instruction]
    nodes: list[str]  # the ONNX node of each instruction ("" when none)


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

    @property
    def ranks(self) -> int:
        return len(self.cores)


def _stream_path(core: int, name: str) -> str:
    return f"core{core}/{name}.bin"


def to_bytes(bundle: Bundle) -> bytes:
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
    debug = [{name: s.nodes for name, s in streams.items()} for streams in bundle.cores]
    files = {
        "manifest.json": json.dumps(manifest, indent=1, sort_keys=True).encode(),
        "debug.json": json.dumps(debug, sort_keys=True).encode(),
        "weights.bin": b"".join(s.data for s in bundle.weights),
    }
    for c, streams in enumerate(bundle.cores):
        for name, s in streams.items():
            if len(s.instructions) > MAX_INSTRUCTIONS_PER_STREAM:
                raise BundleError(f"rank {c} {name} has {len(s.instructions)} instructions; a stream holds at most "
                                  f"{MAX_INSTRUCTIONS_PER_STREAM} (isa/limits.py)")
            files[_stream_path(c, name)] = encode_stream(s.instructions)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            z.writestr(info, files[name])
    payload = archive.getvalue()
    target = bundle.target.encode()
    if len(target) > 16:
        raise BundleError(f"target name {bundle.target!r} longer than 16 bytes")
    header = HEADER.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, len(bundle.cores), len(payload),
                         hashlib.sha256(payload).digest(), target)
    return header.ljust(HEADER_SIZE, b"\0") + payload


def write(bundle: Bundle, path: str | os.PathLike[str]) -> None:
    """Write atomically: the file appears complete or not at all."""
    data = to_bytes(bundle)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".neff-", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes the file private; a bundle is made as any file is
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it; put it back at once
    os.umask(mask)
    return mask


@dataclass(frozen=True)
class Header:
    version: int
    num_cores: int
    payload_size: int
    sha256: bytes
    target: str


def read_header(data: bytes) -> Header:
    if len(data) < HEADER_SIZE:
        raise BundleError(f"file is {len(data)} bytes, shorter than the {HEADER_SIZE}-byte bundle header")
    magic, version, header_size, cores, size, digest, target = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BundleError("not a neuronx-cc-lite bundle (bad magic)")
    if version != FORMAT_VERSION:
        raise BundleError(f"bundle format version {version}; this tool reads version {FORMAT_VERSION} "
                          f"(recompile the model with this neuronx-cc-lite)")
    if header_size != HEADER_SIZE:
        raise BundleError(f"header size {header_size}, expected {HEADER_SIZE}")
    return Header(version, cores, size, digest, target.rstrip(b"\0").decode("ascii", "replace"))


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
    header = read_header(data)
    payload = data[HEADER_SIZE:]
    if len(payload) != header.payload_size:
        raise BundleError(f"payload is {len(payload)} bytes, the header says {header.payload_size} "
                          f"(truncated or padded file)")
    if hashlib.sha256(payload).digest() != header.sha256:
        raise BundleError("sha256 hash mismatch: the bundle is corrupted")
    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as z:
            members = _members(z, len(payload))
            manifest = parse_json(_read(z, members, "manifest.json", MAX_MANIFEST_BYTES), "manifest.json")
            check_manifest(manifest)
            debug = parse_json(_read(z, members, "debug.json", MAX_MANIFEST_BYTES), "debug.json")
            weights_blob = _read(z, members, "weights.bin")
            cores, total = [], 0
            for c, streams in enumerate(manifest["cores"]):
                core = {}
                for entry in streams:
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
            segments, at = [], 0
            for w in manifest["weights"]:
                size = w["size"]
                segments.append(Segment(w["hbm_offset"], weights_blob[at:at + size], w["rank"]))
                at += size
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
            )
    except IsaError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, EOFError, zlib.error,
            KeyError, IndexError, TypeError, ValueError, OverflowError) as e:
        raise BundleError(f"malformed bundle archive: {type(e).__name__}: {e}") from None
    if bundle.target != header.target or len(bundle.cores) != header.num_cores:
        raise BundleError("header and manifest disagree on the target or the number of ranks")
    return bundle


def read(path: str | os.PathLike[str]) -> Bundle:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BundleError(f"cannot read {path}: {e.strerror}") from None
    return from_bytes(data)
