"""The memory planner (codegen/allocate.py): places that never overlap while both tiles live, room found where
placing tile by tile runs out, and a range kept until the schedule expects its last reader done."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isa.dtypes import DType
from isa.operand import Mem
from isa.target import get_target
from neuronx_cc_lite.codegen.allocate import OnChipMemory, footprint, free_positions, lifetimes, plan
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.tile.program import PendingInstr, Program, Tile

TARGET = get_target("trn1")
KIB = 1024


class _Program(Program):
    """Just enough program for the planner: an instruction per position, naming the node it came from."""

    def __init__(self, positions: int) -> None:
        super().__init__(TARGET)
        self.instrs = [PendingInstr("memset", None, 0, {}, f"n{i}") for i in range(positions)]  # type: ignore


def sbuf(nbytes: int, name: str) -> Tile:
    return Tile(Mem.SBUF, 128, nbytes // 4, DType.fp32, name)


def uses_of(spans: list[tuple[Tile, int, int]], positions: int) -> list[list[Tile]]:
    """Each tile named at the first and last position of its span."""
    uses: list[list[Tile]] = [[] for _ in range(positions)]
    for tile, first, last in spans:
        uses[first].append(tile)
        if last != first:
            uses[last].append(tile)
    return uses


def check_placed(spans: list[tuple[Tile, int, int]]) -> None:
    capacity = TARGET.sbuf_partition_bytes
    for tile, _, _ in spans:
        assert tile.offset is not None and 0 <= tile.offset
        assert tile.offset + footprint(tile, TARGET) <= capacity
    for a, (ta, fa, la) in enumerate(spans):
        for tb, fb, lb in spans[a + 1:]:
            if fa <= lb and fb <= la:  # both live at once
                assert ta.offset + footprint(ta, TARGET) <= tb.offset or tb.offset + footprint(tb, TARGET) <= ta.offset


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 48), st.integers(0, 39), st.integers(0, 8)), min_size=1, max_size=30))
def test_tiles_living_at_once_never_share_a_byte(raw):
    spans = [(sbuf(kib * KIB, f"t{k}"), first, first + length) for k, (kib, first, length) in enumerate(raw)]
    positions = 48
    try:
        plan(_Program(positions), uses_of(spans, positions))
    except CompileError as e:  # room can run out (the plan is a heuristic), but only with the error that says so
        assert e.code == "NCC_SBUF_FULL"
        return
    check_placed(spans)


def test_the_plan_finds_room_that_placing_as_you_go_does_not():
    # A 64 KiB and C 64 KiB live briefly, B and D (32 KiB) long: placed as they come, B and D sit between A's and
    # C's ranges, and once A and C are gone E (96 KiB) finds two 64 KiB gaps. Knowing the lifetimes, the plan
    # keeps B and D together.
    a, b, c, d, e = sbuf(64 * KIB, "a"), sbuf(32 * KIB, "b"), sbuf(64 * KIB, "c"), sbuf(32 * KIB, "d"), \
        sbuf(96 * KIB, "e")
    spans = [(a, 0, 1), (b, 0, 4), (c, 0, 1), (d, 0, 4), (e, 2, 4)]
    online = OnChipMemory(TARGET)
    for tile in (a, b, c, d):
        assert online.place(tile)
    online.free(a)
    online.free(c)
    assert not online.place(e)
    plan(_Program(5), uses_of(spans, 5))
    check_placed(spans)


def test_a_range_is_kept_until_its_last_reader_is_expected_done():
    # position 1 reads tile x and is expected to run from 10 to 100 ns; positions 2 and 3 start at 20 and 120
    starts, ends = [0.0, 10.0, 20.0, 120.0], [10.0, 100.0, 30.0, 130.0]
    assert free_positions(starts, ends) == [1, 3, 3, 4]
    x, y = sbuf(4 * KIB, "x"), sbuf(4 * KIB, "y")
    uses = [[x], [x], [], [y]]
    (life_x, life_y) = lifetimes(uses, free_positions(starts, ends))
    assert (life_x.first, life_x.end) == (0, 3)  # kept past position 2, which starts before 100 ns
    assert (life_y.first, life_y.end) == (3, 4)


def test_no_room_names_the_tile_and_the_peak():
    big = [sbuf(120 * KIB, "big0"), sbuf(120 * KIB, "big1")]
    with pytest.raises(CompileError) as caught:
        plan(_Program(2), uses_of([(big[0], 0, 1), (big[1], 0, 1)], 2))
    assert caught.value.code == "NCC_SBUF_FULL"
    assert "big" in caught.value.message and "245760 of 196608" in caught.value.message


def test_tiles_placed_on_top_fill_sbuf_from_its_end_down():
    """The weights' tiles of a placing try on top (codegen/schedule.py PLACING_TRIES) go as high as they fit and
    leave the working tiles' cursor where it was: a freed working tile's gap at the bottom is not taken by them
    while a higher one holds them."""
    memory, capacity = OnChipMemory(TARGET), TARGET.sbuf_partition_bytes
    work, w1, w2, more = sbuf(16 * KIB, "work"), sbuf(32 * KIB, "w1"), sbuf(8 * KIB, "w2"), sbuf(4 * KIB, "more")
    assert memory.place(work) and work.offset == 0
    assert memory.place(w1, top=True) and w1.offset == capacity - 32 * KIB
    assert memory.place(w2, top=True) and w2.offset == capacity - 40 * KIB
    assert memory.place(more) and more.offset == 16 * KIB  # after the working tile, not under the weights
    memory.free(work)
    w3 = sbuf(8 * KIB, "w3")
    assert memory.place(w3, top=True) and w3.offset == capacity - 48 * KIB
    psum = Tile(Mem.PSUM, 128, 512, DType.fp32, "acc")
    assert memory.place(psum, top=True) and psum.offset == 0  # (PSUM: a bank each, as ever)
