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
import fcntl
import os
import re
import signal
import stat
import tempfile
import time
from typing import BinaryIO, Callable, Iterator

TEMPORARY_PREFIX = ".neff-"  # every temporary this project writes starts so (tempfile adds 8 characters)
_TEMPORARY = re.compile(re.escape(TEMPORARY_PREFIX) + r"[a-z0-9_]{8}$")
STALE_SECONDS = 3600.0
_FICLONE = 0x40049409  # the ioctl that makes a file share another's blocks (linux/fs.h); the fcntl module lacks it


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
        _rename_into_place(tmp, os.fspath(path))
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:  # a write's error (a full disk) names no file
            raise OSError(e.errno, e.strerror, os.fspath(path)) from None
        raise


# Called once a file has its name, while the signals are still held: a program that would rather finish than be
# interrupted once its output is in place sets it (neuronx_cc_lite/interrupts.py: a command then ignores them).
# If it raises, the file is taken back out (the old one, if any, put back) and the exception goes on.
placed_hook: Callable[[], None] | None = None


def _rename_into_place(tmp: str, path: str) -> None:
    """os.replace(tmp, path), but a file already at `path` is first renamed aside, and removed once the new one
    has the name. Renamed over another file, a file is written to disk before the rename returns on ext4 (its
    default auto_da_alloc, for programs that skip fsync): 0.4-0.55 s for BERT-base's 439 MB bundle on this
    machine, which every compile into an existing output paid. Renamed onto no name, its pages are written back
    when the kernel sees fit. Signals are held over the renames, so that none strands the old file aside; if the
    second rename fails, or placed_hook refuses the new file, the old file is put back (or the new one removed
    where there was none). (The aside name has the temporaries' form, so a killed
    writer's is swept; mktemp's race is harmless here: a file made under that name in the meantime is one of ours
    or nobody's.)"""
    aside = tempfile.mktemp(prefix=TEMPORARY_PREFIX, dir=os.path.dirname(tmp))
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        try:
            with contextlib.suppress(FileNotFoundError):  # (nothing to replace)
                os.rename(path, aside)
            os.rename(tmp, path)
            if placed_hook is not None:
                placed_hook()
        except BaseException:  # the new file not in place, or the hook refused it: the old one is put back
            # (a signal to the process can still land here through another thread, which does not hold it)
            if os.path.lexists(aside):
                os.rename(aside, path)
            elif os.path.lexists(path) and not os.path.lexists(tmp):
                os.unlink(path)
            raise
        with contextlib.suppress(OSError):
            os.unlink(aside)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def copy_file(src: BinaryIO, dst: BinaryIO, size: int) -> None:
    """Copy the first `size` bytes of the open file `src` into the open, empty file `dst`: as a reflink where the
    file system shares blocks copy-on-write (btrfs, XFS: no byte is copied, and a later write to either file
    copies only what it changes), else in the kernel (copy_file_range: no byte passes through Python), else by
    reads and writes (copy_file_range refused: another file system on an older kernel). OSError EIO if `src`
    ends early."""
    try:
        fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
        if os.fstat(dst.fileno()).st_size == size:
            return
        os.ftruncate(dst.fileno(), 0)  # the file grew or shrank since its size was taken: copy what was asked
    except OSError:  # no reflinks here (ext4, tmpfs), or across file systems
        pass
    done = 0
    try:
        while done < size:
            n = os.copy_file_range(src.fileno(), dst.fileno(), size - done, done, done)
            if n == 0:
                raise OSError(errno.EIO, "the file ended while it was copied", getattr(src, "name", None))
            done += n
        return
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP) or done:
            raise
    src.seek(0)
    while done < size:
        piece = src.read(min(size - done, 1 << 20))
        if not piece:
            raise OSError(errno.EIO, "the file ended while it was copied", getattr(src, "name", None))
        dst.write(piece)
        done += len(piece)


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
