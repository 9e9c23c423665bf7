"""The bundle file's fixed-size header, and the check that an output path may be replaced by a bundle.

Kept apart from isa/bundle.py (which needs numpy and ml_dtypes to decode streams) so that a command that only looks
at a bundle's header, or copies a bundle whole (a compile cache hit), loads neither.

Header (96 bytes, little-endian): magic "NXCLNEFF", format version (u16), header size (u16), number of ranks (u16),
payload size (u64), sha256 of the payload (32 bytes), target name (16 bytes, NUL-padded), zero padding.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass

from isa.errors import BundleError
from isa.files import open_regular

MAGIC = b"NXCLNEFF"
FORMAT_VERSION = 4  # 2: ranks, replica groups, collectives, tensors placed per rank; 3: activation scale a column;
# 4: a DMA's SBUF operand may start each partition row further in (partition_stride: depthwise diagonals)
HEADER = struct.Struct("<8sHHHQ32s16s")
HEADER_SIZE = 96


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


def check_output(path: str | os.PathLike[str]) -> None:
    """A bundle replaces an empty file or a bundle, nothing else: `-o` naming the model, its weights or any other
    file by mistake must not destroy it (FileExistsError). Devices and FIFOs are refused by `replacing`."""
    try:
        with open_regular(path) as f:
            start = f.read(len(MAGIC))
    except OSError:  # absent, or not a regular file (which `replacing` refuses with its reason)
        return
    if start and start != MAGIC:
        raise FileExistsError(errno.EEXIST, "exists and is not a bundle: refusing to replace it (remove it first if "
                              "that is what you want)", os.fspath(path))
