"""Progress on long work, and how long each phase of a compile took.

Progress is one status line on stderr, rewritten in place ("\\r") and erased when the work ends, only when stderr is
a terminal: logs, pipes and tests see nothing. The work only sets the line's text, which costs a global lookup when
nothing is shown; a background thread draws it, at most ten times a second (and not at all for work shorter than a
tenth of a second). A simulation is polled rather than told, so the runtime needs no hook. Work that knows its
total shows how far it is (42%) and, once it has run a second, the time left at the rate so far.

    with progress.shown(console_handler):                # the command line, around a command
        with progress.timed() as seconds:                # {phase: seconds} of the phases run inside
            with progress.phase("lowering"):             # the compiler, around a phase (summed over ranks)
                for k, node in enumerate(nodes):
                    progress.step("lowering", k, len(nodes), node.name)
        with progress.simulating(model):                 # "simulating 1200/5000 instructions (24%, 3 s left)"
            model.run(inputs)
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TextIO

INTERVAL = 0.1  # seconds between redraws: ten a second at most
ESTIMATE_AFTER = 1.0  # seconds of work before the time left is estimated: earlier rates say little


class StatusLine:
    """The line on a terminal stream. `text` (or `poll()`, when set) is what to show; a daemon thread draws it
    every `interval` seconds when it changed."""

    def __init__(self, stream: TextIO, interval: float = INTERVAL) -> None:
        self.stream = stream
        self.interval = interval
        self.text = ""
        self.poll: Callable[[], str] | None = None
        self._drawn = ""
        self._lock = threading.Lock()  # the drawing thread and the work's log records write the same line
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                text = self.poll() if self.poll is not None else self.text
            except Exception:  # noqa: BLE001 - a poll racing the work it reads: keep the last line
                continue
            self.draw(text)

    def draw(self, text: str) -> None:
        with self._lock:
            if text == self._drawn:
                return
            width = shutil.get_terminal_size().columns - 1  # a wrapped line could not be rewritten
            self.stream.write("\r" + text[:width] + "\x1b[K")
            self.stream.flush()
            self._drawn = text

    def erase(self) -> None:
        self.write_over("")
        self.stream.flush()

    def write_over(self, text: str) -> int:
        """Erase the line and write `text` in its place, with no redraw in between."""
        with self._lock:
            if self._drawn:
                self.stream.write("\r\x1b[K")
                self._drawn = ""
            return self.stream.write(text) if text else 0

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.erase()


class _Erasing:
    """The handler's stream while the line shows: a log record takes the line's place; the next tick draws the
    line again below it."""

    def __init__(self, stream: TextIO, line: StatusLine) -> None:
        self.stream = stream
        self.line = line

    def write(self, text: str) -> int:
        return self.line.write_over(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, ...: the stream's
        return getattr(self.stream, name)


_line: StatusLine | None = None  # the line being shown, if any
_command_start = time.perf_counter()  # when the command began (start_command)


def start_command(with_process: bool) -> None:
    """Start the command's clock: now, or, for a command that is the whole process (the console script), when the
    process started, so that the time a command reports includes the interpreter's start and its imports."""
    global _command_start
    _command_start = time.perf_counter() - (_process_age() if with_process else 0.0)


def since_start() -> float:
    """Seconds since the command started (start_command)."""
    return time.perf_counter() - _command_start


def _process_age() -> float:
    """Seconds since this process started, from /proc (Linux); 0 where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time, in clock ticks after boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - started / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def fraction(done: int, total: int, elapsed: float) -> str:
    """"1200/5000 (24%, 3 s left)": the time left at the rate so far, once there is a rate to go by."""
    text = f"{done}/{total} ({100 * done // max(total, 1)}%"
    if done and elapsed >= ESTIMATE_AFTER and done < total:
        left = elapsed * (total - done) / done
        text += f", {left:.0f} s left" if left < 60 else f", {int(left // 60)} min {int(left % 60):02d} s left"
    return text + ")"


class _Timing(threading.local):
    """A thread's phase timing: compiles in other threads (the Python API) keep their own."""

    seconds: dict[str, float] | None = None  # the phases' times, inside timed()
    running: list[str]  # the phases entered and not left, innermost last
    lapped = 0.0  # when the innermost phase's time was last added

    def __init__(self) -> None:
        self.running = []


_timing = _Timing()


@contextmanager
def shown(handler: logging.StreamHandler[Any], enabled: bool = True, interval: float = INTERVAL) -> Iterator[None]:
    """Show progress on the handler's stream while inside, if it is a terminal (asked once, here)."""
    global _line
    stream = handler.stream
    if not enabled or _line is not None or not (hasattr(stream, "isatty") and stream.isatty()):
        yield
        return
    line = StatusLine(stream, interval)
    handler.setStream(_Erasing(stream, line))  # type: ignore[arg-type]
    _line = line
    try:
        yield
    finally:
        _line = None
        handler.setStream(stream)
        line.close()


def status(text: str) -> None:
    """Say what is being done, when nothing counts it (loading the compiler, looking up the cache)."""
    line = _line
    if line is not None:
        line.text = text
        if not line._drawn and since_start() >= INTERVAL:
            # drawn now rather than by the thread: an import that holds the GIL (ml_dtypes' takes a second on a
            # busy machine) would keep the thread from drawing until it ends
            line.draw(text)


_step = ["", 0.0]  # the label step() counts and when its count began


def step(label: str, done: int, total: int | None = None, detail: str = "") -> None:
    """Say how far `label` has come: done of total (with the share and the time left), and what it works on now."""
    line = _line
    if line is None:
        return
    now = time.perf_counter()
    if _step[0] != label or done == 0:
        _step[:] = [label, now]
    count = str(done) if total is None else fraction(done, total, now - _step[1])
    line.text = f"{label} {count} {detail}".rstrip()


@contextmanager
def timed() -> Iterator[dict[str, float]]:
    """The seconds each phase() inside took, in the order they first ran."""
    outer, seconds = _timing.seconds, {}
    _timing.seconds = seconds
    try:
        yield seconds
    finally:
        _timing.seconds = outer


@contextmanager
def phase(name: str) -> Iterator[None]:
    """A phase of the work: named on the status line, and timed when inside timed(). A phase run again (per rank)
    adds up; a phase inside another counts for itself only, so that the phases add up to the whole."""
    if _line is not None:
        _line.text = f"{name}..."
    _lap()
    _timing.running.append(name)
    try:
        yield
    finally:
        _lap()
        _timing.running.pop()
        if _line is not None and not _timing.running:
            _line.text = ""  # not the name of a phase that has ended


def _lap() -> None:
    """Add the time since the last lap to the innermost running phase."""
    now = time.perf_counter()
    running, seconds = _timing.running, _timing.seconds
    if running and seconds is not None:
        seconds[running[-1]] = seconds.get(running[-1], 0.0) + now - _timing.lapped
    _timing.lapped = now


@contextmanager
def simulating(model: Any) -> Iterator[None]:
    """While the model runs, show how many of its instructions the simulator has completed, by polling the
    simulator's streams (their program counters) from the drawing thread."""
    line = _line
    if line is None:
        yield
        return

    start = time.perf_counter()

    def poll() -> str:
        streams = model.simulator.streams
        done, total = sum(s.pc for s in streams), sum(len(s.ops) for s in streams)
        return f"simulating {fraction(done, total, time.perf_counter() - start)} instructions"

    line.poll = poll
    try:
        yield
    finally:
        line.poll = None
        line.text = ""  # not what was said before the simulation
