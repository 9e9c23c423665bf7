"""Ctrl-C, SIGTERM and SIGHUP end a command with one coded line (NCC_INTERRUPTED) and the shell's status for the
signal (128 + its number: 130, 143, 129), wherever they arrive: while modules load, while arguments are parsed,
during the work or while it cleans up.

The signal is raised as an exception where the program is (KeyboardInterrupt for SIGINT, Interrupted for the
others), so every `finally` runs and every atomic write removes its temporary file (isa/files.py `replacing`).
Only the first signal does so: the handlers then ignore the signals until the command has ended, so a second
Ctrl-C cannot cut the cleanup short. Once a file the command writes has its name (its output, or first a compile
cache entry; isa/files.py calls `placed_hook` with the signals still held over the rename), the command finishes
instead: the signals are ignored from then on, so none reports "no output was written" beside a bundle that was.
The signal is also remembered (`interrupted_by`): an exception raised inside an import of a compiled module comes
out as that module's ImportError, which is still the signal's doing. A signal
that comes while a module is being imported is raised once the import has ended (an exception inside a compiled
module's initialisation can abort the process instead). This module imports nothing heavy: the entry point
(`main`) sets the handlers before the command line's modules load.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Iterator

PROG = "neuronx-cc-lite"
WHY = {signal.SIGINT: "interrupted (Ctrl-C)", signal.SIGTERM: "terminated by SIGTERM",
       signal.SIGHUP: "hung up (SIGHUP)"}


class Interrupted(BaseException):
    """SIGTERM or SIGHUP, raised where the program was."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_received: list[int] = []  # the signal the handlers raised since they were set, if any


def interrupted_by(error: BaseException) -> int | None:
    """The signal that `error` comes from: its own, or the one the handlers raised while it was on its way (numpy's
    import turns the KeyboardInterrupt raised inside it into an ImportError); None for any other error."""
    if isinstance(error, Interrupted):
        return error.signum
    if isinstance(error, KeyboardInterrupt):
        return signal.SIGINT
    return _received[0] if _received else None


def status(error: BaseException) -> int:
    """The exit status for an interruption: 128 + the signal's number."""
    return 128 + (interrupted_by(error) or signal.SIGINT)


def message(error: BaseException) -> str:
    return f"NCC_INTERRUPTED: {WHY[signal.Signals(interrupted_by(error) or signal.SIGINT)]}; no output was written"


# How often a signal that came during an import looks again whether the import has ended.
RETRY_S = 0.02


def _importing(frame: FrameType | None) -> bool:
    """Whether the program is inside an import. A compiled module's initialisation may be running Python code (the
    enums pybind11 makes in onnx's, numpy's own set-up), and an exception raised there does not unwind: the process
    aborts or faults (SIGABRT, SIGSEGV: seen with SIGTERM 0.25 and 0.78 s into a compile on a loaded machine)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _raise(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    for s in WHY:  # the first signal only: the cleanup it starts must not be cut short by a second
        signal.signal(s, signal.SIG_IGN)
    _raise_when_safe(signal.SIGALRM, frame)


_deferred: list[bool] = []  # a signal's exception waits for an import to end


def _raise_when_safe(_: int, frame: FrameType | None) -> None:
    """The first signal's exception, where the program is; inside an import, once it has ended: a timer looks
    again every RETRY_S."""
    if _importing(frame):
        if not _deferred:
            _deferred.append(True)
            signal.signal(signal.SIGALRM, _raise_when_safe)
        signal.setitimer(signal.ITIMER_REAL, RETRY_S)
        return
    _deferred.clear()
    if _received[0] == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(_received[0])


def _finish() -> None:
    """A command whose output has its name finishes: the signals are ignored from then on (one held over the
    rename, isa/files.py, is dropped), so that it never reports "no output was written" beside its output. But a
    signal that came earlier, inside an import, and waits for its exception (`_deferred`) is raised now: the output
    is taken back out (isa/files.py), and the command ends as it would have."""
    if _deferred:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _raise_when_safe(signal.SIGALRM, None)
    for s in WHY:
        if signal.getsignal(s) is _raise:
            signal.signal(s, signal.SIG_IGN)


@contextmanager
def handled(ignore_after: bool = False) -> Iterator[None]:
    """Inside, the signals raise as the module says, but for those ignored already; the handlers before are put
    back after (a command may run inside a longer-lived program), or with `ignore_after` the signals are ignored
    from then on (the process's own command, which has ended). Off the main thread, where handlers cannot be set:
    nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # a signal the parent set to be ignored stays ignored (nohup's SIGHUP, a shell's background jobs' SIGINT)
    alarm = signal.getsignal(signal.SIGALRM)  # the timer of a signal that came during an import
    previous = {s: signal.signal(s, _raise) for s in WHY if signal.getsignal(s) is not signal.SIG_IGN}
    if previous:  # a new command: a signal an earlier one took is not this one's
        _received.clear()
    from isa import files  # (after the handlers: a signal during the import is raised once it has ended)

    hook = files.placed_hook
    files.placed_hook = _finish
    try:
        yield
    finally:
        files.placed_hook = hook
        mine = alarm is not _raise_when_safe  # (inside a command, a command's timer is the outer one's)
        pending = mine and bool(_deferred)
        if mine and signal.getsignal(signal.SIGALRM) is _raise_when_safe:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, alarm)
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_IGN if ignore_after else handler)
        if pending:  # the import has ended and so has the command, before the timer looked again: raise it now
            _raise_when_safe(signal.SIGALRM, None)


def command() -> int:
    """The process's entry point (`neuronx-cc-lite`, `python -m neuronx_cc_lite`): `main`, the signals ignored
    once the command has ended. Its output is written and its status decided, and the interpreter's shutdown
    (collecting the compile's objects) can take longer than a small compile: a signal there ended the process with
    the signal's status after "compiled ..." (seen: SIGTERM 0.95 s into a 0.88 s compile, exit -15)."""
    return main(ignore_after=True)


def main(argv: list[str] | None = None, ignore_after: bool = False) -> int:
    """The `neuronx-cc-lite` command: the signal handlers first, then the command line (neuronx_cc_lite/cli.py).
    `ignore_after`: see `handled`."""
    try:
        with handled(ignore_after):
            from neuronx_cc_lite.cli import main as run

            return run(argv)
    except BaseException as e:  # before the command line had its own handling in place
        if interrupted_by(e) is None:
            raise
        print(f"{PROG}: error: {message(e)}", file=sys.stderr)
        return status(e)


if __name__ == "__main__":
    sys.exit(command())
