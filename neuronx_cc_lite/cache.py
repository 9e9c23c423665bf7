"""A persistent compile cache: bundles keyed by the model's bytes, the options and the compiler's own source.

The directory is `--cache-dir`, else $NEURONX_CC_LITE_CACHE, else $XDG_CACHE_HOME/neuronx-cc-lite (by default
~/.cache/neuronx-cc-lite); it keeps to `--cache-size` bytes, else $NEURONX_CC_LITE_CACHE_SIZE, else 4 GiB.

The key is the sha256 of the compiler's sources (not only its version: a changed compiler never returns an old
bundle), the options, and the model's digest: the sha256 of the model file and of each external data file it names
(read a piece at a time), or of a ModelProto's serialisation (sha256 rather than blake2b: with the CPU's SHA
instructions it is the faster, 0.82 GB/s against 0.47 on the 2-core machine). Hashing BERT-base's 438 MB takes half
a second or more, so a file's digest is remembered (files/<hash of its path>.json) with the file's identity
(isa/files.py: device, inode, size, mtime, ctime): while a file keeps its identity its digest is taken from the
record. Any write, truncation, rename or replacement changes the ctime or the inode (and nothing sets a ctime back),
so a changed model or weights file is hashed again.

Settled files. An identity stands for a content only if no change can keep it: a change within the same tick of the
file system's clock as the file's last one would get the same ctime (git's "racily clean" files). So an identity is
recorded only for a file that had settled when its bytes were hashed: the file system's clock had already moved
past its last change, so that every later change gets a strictly later ctime (or, for a file put in its place, a
new inode or a later ctime). The file system's clock is read where it runs, not from time.time(): `_fs_clock` makes
(and removes) a temporary file in the cache and takes its ctime, which has the file system's granularity (a few ms
on ext4, one or two seconds on others) and, on NFS, the server's clock. Where the file is on another file system
than the cache, or nothing can be made in the cache, the wall clock decides with a margin: TRUST_AFTER seconds
since the last change.

An entry is two files: <k>.neff, the bundle, and <k>.key, which binds it to its key: the key, the sha256 of the
bundle's payload (the one its writer computed from the bytes it wrote), the bundle file's identity (device, inode,
size, mtime, ctime), whether that identity stands for the payload (`trusted`), and what `compile` reports of the
bundle (compiler.describe). A read checks that the .key names this key and the bundle's header that hash; while the
bundle keeps a trusted identity its payload is not hashed again, and otherwise it is checked in full (and its
identity trusted from then on if it had settled before it was read). So an entry replaced by another bundle, valid
or not, or edited in place, is never returned for this key: it is removed and the model compiled again. An entry or
record that is not a regular file (a FIFO, a device, a link) is refused unread.

The writer of an entry needs no second hash: it computed the payload's sha256 from the bytes it wrote, renames the
bundle into place, then waits until the file system's clock has moved past the file's last change (usually one or
two ms; at most SETTLE_WAIT seconds, else the entry is stored untrusted and its first hit checks it in full), and
trusts the identity if the file still has the one it had after the rename. Any write after that, even within the
same second, changes the ctime, and any replacement the inode or the ctime: so the first hit, straight after the
store, is as quick as the later ones, and an entry changed after its store is still never returned. What this
cannot see is a change made in the same tick as the rename, by another process racing the writer in the cache
directory; the cache guards against accidents (a bundle copied over an entry, an editor), not against someone who
may write the cache (who could as well write a .key).

A hit for `compile -o` is then a copy of the entry's file (isa/files.py `copy_file`: a reflink where the file system
has them, else copy_file_range; never a hard link, so that neither the user's output nor the entry changes with the
other) and decodes nothing: neither the compiler, onnx, ml_dtypes nor the stream decoder is loaded. A hit for the
Python API decodes the bundle, trusting the check just made.

Each file is written atomically (isa/files.py `replacing`: a temporary renamed into place), so concurrent writers of
one key leave one whole entry. A hit touches the .key; after each store the least recently used entries are removed
until the cache holds at most its size limit (an entry larger than the limit is not stored), and temporaries a killed
writer left are swept.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Callable

from isa.errors import BundleError, IsaError
from isa.files import TEMPORARY_PREFIX, copy_file, identity, open_regular, read_regular, replacing, sweep
from isa.header import HEADER_SIZE, check_output, read_header

if TYPE_CHECKING:  # a hit loads neither (nor numpy, nor the compiler): they are imported where a bundle is made
    import onnx

    from isa.bundle import Bundle

ENV = "NEURONX_CC_LITE_CACHE"
SIZE_ENV = "NEURONX_CC_LITE_CACHE_SIZE"
DEFAULT_SIZE = 4 << 30
TRUST_AFTER = 2.0  # seconds since a file's last change, by the wall clock, where the file system's cannot be read
SETTLE_WAIT = 1.0  # seconds the writer of an entry waits at most for the file system's clock to pass its bundle
_RECORD_BYTES = 1 << 20  # a .key or a file record is a few hundred bytes; anything larger is not one
_ENTRY = re.compile(r"[0-9a-f]{64}\.(neff|key)$")
_RECORD = re.compile(r"[0-9a-f]{64}\.json$")
log = logging.getLogger(__name__)


def default_dir() -> str:
    if os.environ.get(ENV):
        return os.environ[ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "neuronx-cc-lite")


def parse_size(text: str) -> int:
    """Bytes from "4294967296", "500M", "4G", "1.5GiB" (K, M, G, T: powers of 1024); ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a size (a number of bytes, or with K, M, G or T: 500M, 4G)")
    return int(float(match.group(1)) * 1024 ** " KMGT".index(match.group(2).upper() or " "))


def default_size() -> int:
    """$NEURONX_CC_LITE_CACHE_SIZE, else DEFAULT_SIZE."""
    text = os.environ.get(SIZE_ENV)
    if not text:
        return DEFAULT_SIZE
    try:
        return parse_size(text)
    except ValueError as e:
        log.warning(f"${SIZE_ENV}: {e}; using {DEFAULT_SIZE} bytes")
        return DEFAULT_SIZE


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


def _fs_clock(folder: str) -> tuple[int, int] | None:
    """The file system's clock at `folder`: (device, ns) from the ctime of a file made there just now (and removed);
    None when no file can be made there. The file is a temporary of isa/files.py's kind: one a killed process
    leaves is swept."""
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=TEMPORARY_PREFIX, dir=folder)  # O_EXCL: never opens an existing file
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ctime_ns
    finally:
        os.close(fd)
        try:
            os.unlink(probe)
        except OSError:
            pass


def _settled(folder: str | None, st: os.stat_result, wait: float = 0.0) -> bool:
    """Whether the file `st` describes has settled (the module says why it matters): the file system's clock, read in
    `folder` when that is on the file's file system, has moved strictly past the file's last change, polled for up
    to `wait` seconds; else, by the wall clock, the change is TRUST_AFTER seconds old."""
    last = max(st.st_mtime_ns, st.st_ctime_ns)
    deadline = time.monotonic() + wait
    while folder is not None:
        clock = _fs_clock(folder)
        if clock is None or clock[0] != st.st_dev:
            break
        if clock[1] > last:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return time.time_ns() - last >= TRUST_AFTER * 1e9


def _hash_file(path: str, limit: int | None = None, clock: str | None = None
               ) -> tuple[str, tuple[int, ...] | None, bytes | None]:
    """The sha256 of a regular file, a piece at a time; its identity if it had settled before it was read (`_settled`,
    asking the clock in the folder `clock`) and kept it throughout (else None); with a `limit`, also its bytes
    (OSError past it)."""
    h = hashlib.sha256()
    pieces: list[bytes] | None = [] if limit is not None else None
    with open_regular(path) as f:
        before = os.fstat(f.fileno())
        if limit is not None and before.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
        settled = _settled(clock, before)
        for piece in iter(lambda: f.read(1 << 20), b""):
            h.update(piece)
            if pieces is not None:
                pieces.append(piece)
        after = os.fstat(f.fileno())
    ident = identity(before) if settled and identity(before) == identity(after) else None
    return h.hexdigest(), ident, b"".join(pieces) if pieces is not None else None


@dataclass
class ModelFiles:
    """A model file's digest, and the files it was computed from (the model and its external data)."""

    digest: str
    files: list[str]


def _record_path(directory: str, path: str) -> str:
    return os.path.join(directory, "files", hashlib.sha256(path.encode()).hexdigest() + ".json")


def _remembered(directory: str, path: str) -> ModelFiles | None:
    """The model's digest from its record, if the model and every external data file it names keep the identity
    recorded, and each location still leads to the file it led to."""
    try:
        record = json.loads(read_regular(_record_path(directory, path), _RECORD_BYTES))
        if record["path"] != path or list(identity(os.stat(path))) != record["identity"]:
            return None
        root = os.path.dirname(path)
        for location, real, ident, _ in record["external"]:
            if os.path.realpath(os.path.join(root, location)) != real or list(identity(os.stat(real))) != ident:
                return None
        return ModelFiles(record["digest"], [path, *(real for _, real, _, _ in record["external"])])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def model_files(model: str | os.PathLike[str] | onnx.ModelProto, directory: str | None) -> ModelFiles:
    """The model's digest and files, from the records in the cache `directory` when they still hold. Raises
    CompileError (or OSError) for a model that cannot be read; compiling it gives the same coded error."""
    if not isinstance(model, (str, os.PathLike)):  # a ModelProto (onnx is imported only when a model is parsed)
        return ModelFiles(hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest(), [])
    path = os.path.realpath(os.fspath(model))
    known = _remembered(directory, path) if directory is not None else None
    if known is not None:
        return known
    from neuronx_cc_lite.model_files import (MAX_MODEL_BYTES, external_info, external_path, external_tensors,
                                             parse_model)  # onnx: only to find the external data of a new model

    clock = os.path.join(directory, "files") if directory is not None else None  # where the records go
    digest, ident, data = _hash_file(path, MAX_MODEL_BYTES, clock)
    root = os.path.dirname(path)
    tensors = external_tensors(parse_model(data, path))  # external data is not loaded: only its locations are wanted
    locations = sorted({(external_info(t).location, external_path(root, t)) for t in tensors})
    external, idents = [], [ident]
    h = hashlib.sha256(digest.encode())
    for location, real in locations:
        file_digest, file_ident, _ = _hash_file(real, None, clock)
        h.update(f"\0{location}\0{file_digest}".encode())
        external.append([location, real, file_ident and list(file_ident), file_digest])
        idents.append(file_ident)
    found = ModelFiles(h.hexdigest(), [path, *(real for _, real in locations)])
    if directory is not None and all(i is not None for i in idents):
        _write_record(_record_path(directory, path),
                      {"path": path, "identity": list(ident), "digest": found.digest, "external": external})
    return found


def key(model_digest: str, flags: dict[str, object]) -> str:
    text = json.dumps({"compiler": compiler_digest(), "flags": flags, "model": model_digest}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _write_record(path: str, record: dict[str, Any]) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with replacing(path) as f:
            f.write(json.dumps(record, sort_keys=True).encode())
    except OSError as e:  # a cache that cannot be written costs speed, never the compile
        log.warning(f"cannot write the compile cache file {path}: {e.strerror or e}")


@dataclass
class Entry:
    """A cache entry found bound to its key: its bundle file, that file's identity when it was checked, the sha256
    of the bundle's payload, and what `compile` reports of the bundle (compiler.describe)."""

    path: str
    identity: tuple[int, ...]
    sha256: bytes
    summary: dict[str, Any]


def _paths(directory: str, k: str) -> tuple[str, str]:
    stem = os.path.join(directory, k[:2], k)
    return f"{stem}.neff", f"{stem}.key"


def _bind(binding: str, k: str, sha256: bytes, st: os.stat_result, trusted: bool, summary: dict[str, Any]) -> None:
    """Write the .key of an entry: its key, its payload hash, its file's identity, whether that identity stands for
    the payload (the file had settled when the hash was taken), and the bundle's summary."""
    with replacing(binding) as f:
        f.write(json.dumps({"key": k, "sha256": sha256.hex(), "identity": list(identity(st)), "trusted": trusted,
                            "summary": summary}).encode())


def _discard(paths: tuple[str, ...], why: str) -> None:
    log.warning(f"discarding the compile cache entry {paths[0]}: {why}")
    for path in paths:
        try:
            os.unlink(path)  # a link, a FIFO or a device goes as any file does; a directory stays (and misses)
        except OSError:
            pass


def _check_payload(f: BinaryIO, size: int, sha256: bytes, in_full: bool) -> None:
    """BundleError unless the open bundle file `f` of `size` bytes has a header naming `sha256` and the payload
    size it has; `in_full`: and its payload hashes to it."""
    header = read_header(f.read(HEADER_SIZE))
    if size - HEADER_SIZE != header.payload_size:
        raise BundleError(f"payload is {size - HEADER_SIZE} bytes, the header says {header.payload_size}")
    if header.sha256 != sha256:
        raise BundleError("the header's hash is not the one expected: another bundle took this file's place")
    if in_full and hashlib.file_digest(f, "sha256").digest() != sha256:  # type: ignore[arg-type]
        raise BundleError("sha256 hash mismatch: the entry is corrupted")


def lookup(directory: str, k: str) -> Entry | None:
    """The entry of key `k`, checked as the module says (its bundle is not decoded); a broken one is removed."""
    neff, binding = _paths(directory, k)
    try:
        record = json.loads(read_regular(binding, _RECORD_BYTES))
        sha256, recorded, trusted = bytes.fromhex(record["sha256"]), tuple(record["identity"]), record["trusted"]
        summary = record["summary"]
        if record["key"] != k:
            raise ValueError(f"its .key is for another key ({str(record['key'])[:16]}...)")
        if not isinstance(trusted, bool):
            raise ValueError("its .key says neither that its identity is trusted nor that it is not")
        if not isinstance(summary, dict):
            raise ValueError("its .key holds no summary of the bundle")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:  # includes a .key that is a FIFO or a device
        _discard((neff, binding), f"{getattr(e, 'strerror', None) or e}")
        return None
    try:
        with open_regular(neff) as f:
            st = os.fstat(f.fileno())
            trusted = trusted and identity(st) == recorded
            settled = not trusted and _settled(os.path.dirname(neff), st)  # asked before the payload is read
            _check_payload(f, st.st_size, sha256, in_full=not trusted)
        if settled:  # checked in full just now, and any later change will show in the identity:
            _bind(binding, k, sha256, st, True, summary)  # trusted unhashed from now on
        else:
            os.utime(binding)  # the least recently used entries go first
    except FileNotFoundError:
        return None
    except (IsaError, OSError) as e:  # truncated, corrupted, another bundle, not a regular file
        _discard((neff, binding), str(e) if isinstance(e, IsaError) else f"{e.strerror or e}")
        return None
    return Entry(neff, identity(st), sha256, summary)


def decode(entry: Entry) -> Bundle | None:
    """The bundle of an entry that `lookup` checked (its payload not hashed again); None, the entry removed if it
    broke, when its file is no longer the one checked or does not decode."""
    from isa import bundle as bundle_format

    try:
        with open_regular(entry.path) as f:
            if identity(os.fstat(f.fileno())) != entry.identity:
                return None
            return bundle_format.read_from(f, entry.sha256, unchanged=True)
    except FileNotFoundError:
        return None
    except (IsaError, OSError) as e:
        _discard((entry.path, entry.path[:-len(".neff")] + ".key"),
                 str(e) if isinstance(e, IsaError) else f"{e.strerror or e}")
        return None


def store(directory: str, k: str, bundle: Bundle, size_limit: int) -> Entry | None:
    """Write the entry of `k` (None when it cannot be written or is larger than the limit), then shrink the cache
    to `size_limit`."""
    from isa import bundle as bundle_format
    from neuronx_cc_lite.compiler import describe

    neff, binding = _paths(directory, k)
    try:
        os.makedirs(os.path.dirname(neff), exist_ok=True)
        sha256 = bundle_format.write(bundle, neff)  # hashed from the bytes written: never read back to be hashed
        with open_regular(neff) as f:
            st = os.fstat(f.fileno())
            ours = read_header(f.read(HEADER_SIZE)).sha256 == sha256
        if st.st_size > size_limit:
            log.info(f"not caching a bundle of {st.st_size} bytes, more than the cache's {size_limit}")
            os.unlink(neff)
            return None
        summary = describe(bundle)
        # The writer's hash stands for the file once the file system's clock has passed its last change (the module
        # says why); waiting here, a few ms, spares the first hit a full hash of the payload.
        trusted = (ours and _settled(os.path.dirname(neff), st, wait=SETTLE_WAIT)
                   and identity(os.stat(neff)) == identity(st))
        if not trusted:
            log.debug(f"compile cache: {neff} stored untrusted (its first hit checks it in full)")
        _bind(binding, k, sha256, st, trusted, summary)
    except (IsaError, OSError) as e:  # a cache that cannot be written costs speed, never the compile
        log.warning(f"cannot write the compile cache entry {neff}: {getattr(e, 'strerror', None) or e}")
        return None
    shrink(directory, size_limit, keep=k)
    return Entry(neff, identity(st), sha256, summary)


def export(entry: Entry, output: str | os.PathLike[str]) -> bool:
    """Write `output` as a copy of the entry's file, atomically: a reflink where the file system shares blocks
    copy-on-write (btrfs, XFS), else a kernel copy (copy_file_range). Never a hard link: the output is the user's
    to edit in place, and the entry must not change with it. False, writing nothing, when the entry's file is no
    longer the one checked."""
    check_output(output)
    with open_regular(entry.path) as src:
        if identity(os.fstat(src.fileno())) != entry.identity:
            return False
        with replacing(output) as dst:
            copy_file(src, dst, entry.identity[2])
        return identity(os.fstat(src.fileno())) == entry.identity  # not written to while it was copied


def shrink(directory: str, size_limit: int, keep: str | None = None) -> None:
    """Remove the least recently used entries (by their .key's mtime) until the cache holds at most `size_limit`
    bytes, keeping `keep`; sweep stale temporaries. Records of file digests count, and go by age too."""
    groups: dict[str, list[tuple[str, os.stat_result]]] = {}
    for sub in _listdir(directory):
        folder = os.path.join(directory, sub)
        if sub == "files" or re.fullmatch(r"[0-9a-f]{2}", sub):
            sweep(folder)
            for name in _listdir(folder):
                if (_ENTRY if sub != "files" else _RECORD).match(name):
                    try:
                        st = os.lstat(os.path.join(folder, name))
                    except OSError:
                        continue
                    stem = name.rsplit(".", 1)[0] if sub != "files" else f"files/{name}"
                    groups.setdefault(stem, []).append((os.path.join(folder, name), st))
    total = sum(st.st_size for files in groups.values() for _, st in files)
    if total <= size_limit:
        return

    def last_used(files: list[tuple[str, os.stat_result]]) -> float:
        return max(st.st_mtime for path, st in files if not path.endswith(".neff") or len(files) == 1)

    for stem, files in sorted(groups.items(), key=lambda item: last_used(item[1])):
        if total <= size_limit:
            break
        if stem == keep:
            continue
        for path, st in files:
            try:
                os.unlink(path)
                total -= st.st_size
            except OSError:
                pass
        log.debug(f"compile cache: removed {stem}, least recently used")


def _listdir(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def cached(model: str | os.PathLike[str] | onnx.ModelProto, flags: dict[str, object], directory: str | None,
           build: Callable[[], Bundle], output: str | os.PathLike[str] | None = None,
           size_limit: int | None = None) -> Bundle:
    """The cached bundle for (model, flags), else `build()`, stored. `directory` None: no cache. With `output`,
    the bundle is also written there (a hit is copied from its entry file)."""
    bundle = None
    if directory is not None:
        entry, bundle = _found_or_built(model, flags, directory, build, size_limit)
        if entry is not None and bundle is None:
            bundle = decode(entry)
        if entry is not None and bundle is not None and (output is None or export(entry, output)):
            return bundle
    if bundle is None:  # no cache, or a hit whose file changed after it was checked
        bundle = build()
    if output is not None:
        from isa import bundle as bundle_format

        bundle_format.write(bundle, output)
    return bundle


def compile_to(model: str | os.PathLike[str], flags: dict[str, object], directory: str | None,
               build: Callable[[], Bundle], output: str | os.PathLike[str], size_limit: int | None = None
               ) -> dict[str, Any]:
    """`cached` for a command that only writes the bundle to `output`: a hit copies the entry's file there and
    decodes nothing. Returns what `compile` reports of the bundle (compiler.describe)."""
    bundle = None
    if directory is not None:
        entry, bundle = _found_or_built(model, flags, directory, build, size_limit)
        if entry is not None and export(entry, output):
            return entry.summary
    if bundle is None:  # no cache, or a hit whose file changed after it was checked
        bundle = build()
    from isa import bundle as bundle_format
    from neuronx_cc_lite.compiler import describe

    bundle_format.write(bundle, output)
    return describe(bundle)


def _found_or_built(model: str | os.PathLike[str] | onnx.ModelProto, flags: dict[str, object], directory: str,
                    build: Callable[[], Bundle], size_limit: int | None) -> tuple[Entry | None, Bundle | None]:
    """The entry of (model, flags) and None; else the entry `build()`'s bundle was stored as (None when it could
    not be) and that bundle."""
    try:
        k = key(model_files(model, directory).digest, flags)
    except Exception:  # noqa: BLE001 - a file that cannot be read or parsed: compiling it gives the coded error
        k = None
    entry = lookup(directory, k) if k is not None else None
    if entry is not None:
        log.debug(f"compile cache hit {entry.path}")
        return entry, None
    bundle = build()
    return (store(directory, k, bundle, default_size() if size_limit is None else size_limit)
            if k is not None else None), bundle
