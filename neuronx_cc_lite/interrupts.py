"""Ctrl-C, SIGTERM and SIGHUP end a command with one coded line (NCC_INTERRUPTED) and the shell's status for the
signal (128 + its number: 130, 143, 129), wherever they arrive: while modules load, while arguments are parsed,
during the work or while it cleans up.

The signal is raised as an exception where the program is (KeyboardInterrupt for SIGINT, Interrupted for the
others), so every `finally` runs and every atomic write removes its temporary file (isa/files.py `replacing`).
Only the first signal does so: the handlers then ignore the signals until the command has ended, so a second
Ctrl-C cannot cut the cleanup short. This module imports nothing heavy: the entry point (`main`) sets the handlers
before the command line's modules load.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

PROG = "neuronx-cc-lite"
WHY = {signal.SIGINT: "interrupted (Ctrl-C)", signal.SIGTERM: "terminated by SIGTERM",
       signal.SIGHUP: "hung up (SIGHUP)"}


class Interrupted(BaseException):
    """SIGTERM or SIGHUP, raised where the program was."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def status(error: BaseException) -> int:
    """The exit status for an interruption: 128 + the signal's number."""
    return 128 + (error.signum if isinstance(error, Interrupted) else signal.SIGINT)


def message(error: BaseException) -> str:
    signum = error.signum if isinstance(error, Interrupted) else signal.SIGINT
    return f"NCC_INTERRUPTED: {WHY[signum]}; no output was written"


def _raise(signum: int, frame: object) -> None:
    for s in WHY:  # the first signal only: the cleanup it starts must not be cut short by a second
        signal.signal(s, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(signum)


@contextmanager
def handled() -> Iterator[None]:
    """Inside, the signals raise as the module says, but for those ignored already; the handlers before are put
    back after (a command may run inside a longer-lived program). Off the main thread, where handlers cannot be
    set: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # a signal the parent set to be ignored stays ignored (nohup's SIGHUP, a shell's background jobs' SIGINT)
    previous = {s: signal.signal(s, _raise) for s in WHY if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    """The `neuronx-cc-lite` command: the signal handlers first, then the command line (neuronx_cc_lite/cli.py)."""
    try:
        with handled():
            from neuronx_cc_lite.cli import main as run

            return run(argv)
    except (KeyboardInterrupt, Interrupted) as e:  # before the command line had its own handling in place
        print(f"{PROG}: error: {message(e)}", file=sys.stderr)
        return status(e)


if __name__ == "__main__":
    sys.exit(main())
