"""The race checker: reports two accesses to the same bytes, at least one a write, that no chain of semaphores
orders (DESIGN.md invariant 5).

Happens-before is tracked with vector clocks. Each stream's clock counts its instructions; an instruction that
waits for `s >= v` takes in the clock of every increment of `s` that must have happened in *every* schedule once
`s` reads v: when the streams signalling `s` on that core do so c_1 .. c_m times in all, at least
v - (c_1 + .. + c_m - c_j) of the increments came from stream j, so its clock at that increment is joined
(`s >= 0` joins nothing, as the listing says: it never waits). A wait thus means the same under every policy.
A collective starts only once every member has posted it, so when it starts the clocks of its members' streams
are joined: what any member knew when it posted happens before whatever follows the collective on any member.
Each rank has its own memories (keys ("HBM", rank), ("SBUF", rank), ...); a collective's accesses are its src and
dst on each member, checked like any other.

Shadow state, for every byte an operand element starts at (FastTrack's scheme):
    write:  the epoch (stream, clock) of the last write
    read:   the epoch of the one read since that write that every other read since then happened before,
            or SHARED when reads since the write are concurrent; the shared bytes keep one clock per stream
            (the stream's last read), in chunks allocated when a byte first becomes shared
A read must follow the write; a write must follow the write and every read since it. Since every read since the
last write is kept (one stream's later read stands for its earlier ones), whether a program has a race does not
depend on the order the simulator picked: one run under either policy finds it.

The shadow holds only the pages (4 KiB of the address space) some access touches, each at the coarsest
granularity its element starts allow (an fp32 page: one entry per 4 bytes), so it costs 8 bytes per element
start touched, whatever the size of HBM. Each access keeps its footprint as runs (a start per row, one step and
length for all rows) and expands it only while it is checked.
"""

from __future__ import annotations

import numpy as np

from runtime.errors import NeuronRuntimeError

PAGE_BITS = 12
_OFFSET_MASK = (1 << PAGE_BITS) - 1
_CHUNK_BITS = 10  # shared-read clocks are allocated for 1024 shadow entries at a time
SHARED = -1


class RaceError(NeuronRuntimeError):
    code = "NRT_RACE"


class Access:
    """What one operand of one instruction touches: memory ("HBM", rank), ("SBUF", rank) or ("PSUM", rank), the
    flat byte index of each element's start, and whether it writes them."""

    __slots__ = ("key", "writes", "_starts", "_step", "_length")

    def __init__(self, key: tuple[str, int], at: np.ndarray, writes: bool) -> None:
        self.key, self.writes = key, writes
        self._starts, self._step, self._length = _runs(np.ravel(at).astype(np.int64, copy=False))

    @property
    def at(self) -> np.ndarray:
        if self._length == 1:
            return self._starts
        return np.ravel(self._starts[:, None] + self._step * np.arange(self._length, dtype=np.int64))

    @property
    def size(self) -> int:
        return self._starts.size * self._length

    @property
    def last(self) -> int:
        """The highest byte index of an element start."""
        return int(self._starts.max()) + max(0, self._step * (self._length - 1))


def _runs(at: np.ndarray) -> tuple[np.ndarray, int, int]:
    """`at` as rows of equal length and equal step, (start of each row, step, length), when it is one (an
    operand's innermost dimension is usually such a row); else (at, 0, 1). Kept compressed because a run
    precomputes the footprint of every instruction at once."""
    if at.size < 2:
        return at, 0, 1
    step = int(at[1] - at[0])
    breaks = np.flatnonzero(np.diff(at) != step)
    length = int(breaks[0]) + 1 if breaks.size else at.size
    if at.size % length:
        return at, 0, 1
    rows = at.reshape(-1, length)
    if not np.array_equal(rows, rows[:, :1] + step * np.arange(length, dtype=np.int64)):
        return at, 0, 1
    return rows[:, 0].copy(), step, length


class _Shadow:
    """The shadow state of the element starts one memory's accesses touch (see the module docstring)."""

    def __init__(self, accesses: list[Access], epoch: type, streams: int) -> None:
        pages = max(a.last for a in accesses) // (1 << PAGE_BITS) + 1
        touched = np.zeros(pages, bool)
        self.shift = np.full(pages, PAGE_BITS, np.int64)  # log2 of the bytes one entry of each page covers
        for a in accesses:
            at = a.at
            page = at >> PAGE_BITS
            touched[page] = True
            self.shift[page] = np.minimum(self.shift[page], _alignment(at & _OFFSET_MASK))
        entries = np.where(touched, (1 << PAGE_BITS) >> self.shift, 0)
        self.base = np.concatenate(([0], np.cumsum(entries)[:-1]))  # first entry of each page
        self.write = np.zeros(int(entries.sum()), epoch)
        self.read = np.zeros(int(entries.sum()), epoch)
        self.shared: dict[int, np.ndarray] = {}  # chunk -> (streams, entries) clock of each stream's last read
        self.streams = streams

    def entries(self, at: np.ndarray) -> np.ndarray:
        page = at >> PAGE_BITS
        return self.base[page] + ((at & _OFFSET_MASK) >> self.shift[page])

    def shared_clocks(self, idx: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(positions in idx, chunk array, columns in it) for each chunk the entries `idx` lie in."""
        chunk = idx >> _CHUNK_BITS
        out = []
        for c in np.unique(chunk):
            where = np.flatnonzero(chunk == c)
            if int(c) not in self.shared:
                self.shared[int(c)] = np.zeros((self.streams, 1 << _CHUNK_BITS), self.read.dtype)
            out.append((where, self.shared[int(c)], idx[where] & ((1 << _CHUNK_BITS) - 1)))
        return out


def _alignment(offsets: np.ndarray) -> int:
    """log2 of the largest power of two (at most a page) dividing every offset."""
    bits = int(np.bitwise_or.reduce(offsets)) if offsets.size else 0
    return PAGE_BITS if bits == 0 else min(PAGE_BITS, (bits & -bits).bit_length() - 1)


class RaceChecker:
    def __init__(self, streams: list, accesses: list[list[list[Access]]], semaphores: int, cores: int) -> None:
        """`accesses[s][i]`: the accesses of instruction i of stream s (streams as the simulator lists them)."""
        self.streams = streams
        self.accesses = accesses
        self.index = {id(s): k for k, s in enumerate(streams)}
        n = len(streams)
        self.clocks = np.zeros((n, n), np.int64)  # row s: what stream s has seen of every stream
        # an epoch packs (clock, stream) in one integer: clock << stream_bits | stream; 0 is "never"
        self.stream_bits = max(1, (n - 1).bit_length())
        longest = max((len(s.ops) for s in streams), default=0)
        epoch = np.int32 if (longest + 1) << self.stream_bits < 2**31 else np.int64
        self._signallers(streams)
        by_memory: dict[tuple[str, int], list[Access]] = {}
        for per_stream in accesses:
            for per_instr in per_stream:
                for a in per_instr:
                    if a.size:
                        by_memory.setdefault(a.key, []).append(a)
        self.shadow = {key: _Shadow(found, epoch, n) for key, found in by_memory.items()}

    def _signallers(self, streams: list) -> None:
        """For each semaphore, how many increments of each signalling stream a wait for v is sure of: v minus
        every increment the other streams make in the whole program."""
        counts: dict[tuple[int, int], dict[int, int]] = {}
        for k, s in enumerate(streams):
            for op in s.ops:
                if op.signal is not None:
                    per = counts.setdefault((s.core, op.signal), {})
                    per[k] = per.get(k, 0) + 1
        self.others = {key: [(k, sum(per.values()) - c) for k, c in per.items()] for key, per in counts.items()}
        self.signals: dict[tuple[int, int, int], list[np.ndarray]] = {}  # (core, sem, stream) -> clock per signal

    def issue(self, s: object, pc: int) -> None:
        k = self.index[id(s)]
        clock = self.clocks[k]
        core = s.core  # type: ignore[attr-defined]
        for sem, value in s.ops[pc].waits:  # type: ignore[attr-defined]
            for j, others in self.others.get((core, sem), ()):
                if value - others >= 1:
                    np.maximum(clock, self.signals[core, sem, j][value - others - 1], out=clock)
        clock[k] = pc + 1
        mine = (pc + 1) << self.stream_bits | k
        for a in self.accesses[k][pc]:
            if not a.size:
                continue
            sh = self.shadow[a.key]
            at = a.at
            idx = sh.entries(at)
            self._check(k, pc, a, at, sh.write[idx], "written")
            if a.writes:
                self._check_readers(k, pc, a, at, sh, idx)
                sh.write[idx] = mine
                sh.read[idx] = 0
            else:
                self._read(k, pc, sh, idx, mine)

    def join(self, members: list) -> None:
        """A collective starts on `members` (streams): each learns what every other knew when it posted."""
        rows = [self.index[id(s)] for s in members]
        self.clocks[rows] = self.clocks[rows].max(axis=0)

    def complete(self, s: object, pc: int) -> None:
        signal = s.ops[pc].signal  # type: ignore[attr-defined]
        if signal is not None:
            k = self.index[id(s)]
            self.signals.setdefault((s.core, signal, k), []).append(self.clocks[k].copy())  # type: ignore[attr-defined]

    def _unordered(self, k: int, epochs: np.ndarray) -> np.ndarray:
        """Which epochs stream k has not seen (0, "never", is always seen)."""
        return (epochs >> self.stream_bits) > self.clocks[k][epochs & ((1 << self.stream_bits) - 1)]

    def _read(self, k: int, pc: int, sh: _Shadow, idx: np.ndarray, mine: int) -> None:
        """Record a read: it replaces the read kept when that one happened before it, else the byte's reads
        become shared."""
        last = sh.read[idx]
        was_shared = last == SHARED
        concurrent = ~was_shared & self._unordered(k, np.maximum(last, 0))
        sh.read[idx] = np.where(was_shared | concurrent, SHARED, mine)
        if not (was_shared.any() or concurrent.any()):
            return
        into = np.flatnonzero(was_shared | concurrent)
        fresh = concurrent[into]
        first = last[into]
        for where, clocks, col in sh.shared_clocks(idx[into]):
            new = fresh[where]
            clocks[:, col[new]] = 0
            prior = first[where][new]
            clocks[prior & ((1 << self.stream_bits) - 1), col[new]] = prior >> self.stream_bits
            clocks[k, col] = pc + 1

    def _check_readers(self, k: int, pc: int, a: Access, at: np.ndarray, sh: _Shadow, idx: np.ndarray) -> None:
        last = sh.read[idx]
        self._check(k, pc, a, at, np.maximum(last, 0), "read")
        shared = np.flatnonzero(last == SHARED)
        for where, clocks, col in sh.shared_clocks(idx[shared]):
            bad = clocks[:, col] > self.clocks[k][:, None]
            if bad.any():
                j, first = np.unravel_index(int(np.argmax(bad)), bad.shape)
                self._report(k, pc, a, int(at[shared[where][first]]), int(j), int(clocks[j, col[first]]), "read")

    def _check(self, k: int, pc: int, a: Access, at: np.ndarray, epochs: np.ndarray, verb: str) -> None:
        bad = self._unordered(k, epochs)
        if bad.any():
            first = int(np.argmax(bad))
            e = int(epochs[first])
            self._report(k, pc, a, int(at[first]), e & ((1 << self.stream_bits) - 1), e >> self.stream_bits, verb)

    def _report(self, k: int, pc: int, a: Access, byte: int, j: int, clock: int, verb: str) -> None:
        kind = "writes" if a.writes else "reads"
        raise RaceError(f"{_name(self.streams[k], pc)} {kind} {a.key[0]} byte {byte} {verb} by "
                        f"{_name(self.streams[j], clock - 1)} with no semaphore ordering the two")


def _name(s: object, pc: int) -> str:
    op = s.ops[pc]  # type: ignore[attr-defined]
    node = f" (node {op.node})" if op.node else ""
    return f"core {s.core} {s.name} #{pc} {op.mnemonic}{node}"  # type: ignore[attr-defined]
