"""The files a command reads and writes, handled so that neither hangs nor destroys anything.

Reading: a FIFO blocks its open until a writer comes, a character device (/dev/zero, a terminal) never ends, a
directory is no file. `open_regular` opens without blocking (O_NONBLOCK: a FIFO's open returns at once) and refuses
what fstat says is not a regular file before a byte is read; `read_regular` also reads at most a limit. Every file
the compiler, the runtime and the command line read goes through them (the exceptions are documented where they are
made).

Writing: `replacing` writes a file under a temporary name beside it and renames it into place, so the file appears
whole or not at all, and the temporary is removed on any exception (Ctrl-C and SIGTERM included). It refuses a path
that exists and is not a regular file: renaming onto /dev/null as root would replace the device with a file. A
temporary that a killed process (SIGKILL, power loss) left is swept by the next write into that directory once it
is older than `STALE_SECONDS`: no write takes that long, so the sweep never removes a live writer's file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import tempfile
import time
from typing import BinaryIO, Callable, Iterator

TEMPORARY_PREFIX = ".neff-"  # every temporary this project writes starts so (tempfile adds 8 characters)
_TEMPORARY = re.compile(re.escape(TEMPORARY_PREFIX) + r"[a-z0-9_]{8}$")
STALE_SECONDS = 3600.0


class NotRegularFile(OSError):
    """A path that names a FIFO, a device, a socket or a directory where a regular file is wanted."""


def kind(mode: int) -> str:
    """What a file of this st_mode is, in words."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def _not_regular(path: str | os.PathLike[str], mode: int, doing: str) -> NotRegularFile:
    return NotRegularFile(errno.EINVAL, f"{kind(mode)}, not a regular file: {doing}", os.fspath(path))


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened for reading in binary, refused (NotRegularFile, an OSError) unless it is a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode, "refusing to read it")
        return os.fdopen(fd, "rb")  # O_NONBLOCK changes nothing for a regular file's reads
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (OSError EFBIG past it, before reading it)."""
    with open_regular(path) as f:
        if os.fstat(f.fileno()).st_size > limit:
            raise OSError(errno.EFBIG, f"larger than the {limit} bytes this file may hold", os.fspath(path))
        data = f.read(limit + 1)  # a file that grows while it is read stops at the limit too
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than the {limit} bytes this file may hold", os.fspath(path))
    return data


def identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What changes whenever a file's content may have: device, inode, size, mtime and ctime (in ns). A write or a
    rename onto it changes the ctime or the inode, and no call sets a ctime back."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def check_replaceable(path: str | os.PathLike[str]) -> None:
    """Refuse (NotRegularFile) to write `path` when it exists, through any symbolic link, and is not a regular
    file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # absent (or unreachable: the write says why)
        return
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode, "refusing to replace it")


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file (through links, `.` and `..`, hard links included)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return False


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A file to write that takes the name `path` when the block ends, atomically; on any exception it is removed
    and `path` is as it was. It gets the permissions of a file made with open() (the user's umask)."""
    check_replaceable(path)
    directory = os.path.dirname(os.path.abspath(path))
    sweep(directory)
    fd, tmp = tempfile.mkstemp(prefix=TEMPORARY_PREFIX, dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes the file private
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:  # a write's error (a full disk) names no file
            raise OSError(e.errno, e.strerror, os.fspath(path)) from None
        raise


def link_into_place(source: str, path: str | os.PathLike[str], accept: Callable[[os.stat_result], bool]) -> bool:
    """Make `path` a hard link of the file `source`, atomically (a temporary link renamed into place), if the file
    linked passes `accept` (its stat: that it is still the file the caller checked). False, with nothing changed,
    when it does not or the file system cannot link them (another device, no hard links). `path` is refused as
    `replacing` refuses it."""
    check_replaceable(path)
    directory = os.path.dirname(os.path.abspath(path))
    sweep(directory)
    tmp = os.path.join(directory, TEMPORARY_PREFIX + secrets.token_hex(4))
    try:
        os.link(source, tmp, follow_symlinks=False)
    except OSError:  # another device, no hard links, or (once in 4 billion) a name taken
        return False
    try:
        if not accept(os.lstat(tmp)):
            os.unlink(tmp)
            return False
        os.replace(tmp, path)
        with contextlib.suppress(FileNotFoundError):  # a rename onto another link of the same file does nothing
            os.unlink(tmp)
        return True
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def sweep(directory: str) -> None:
    """Remove this project's temporaries in `directory` that are older than STALE_SECONDS (a killed writer's)."""
    now = time.time()
    try:
        with os.scandir(directory) as entries:
            stale = [e.path for e in entries if _TEMPORARY.match(e.name) and e.is_file(follow_symlinks=False)
                     and now - e.stat(follow_symlinks=False).st_mtime > STALE_SECONDS]
    except OSError:
        return
    for path in stale:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it; put it back at once
    os.umask(mask)
    return mask
