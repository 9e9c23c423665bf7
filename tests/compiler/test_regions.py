"""Footprints compared byte run by byte run (codegen/regions.py): exact where a bounding box is not, never smaller
than the truth. Checked against the set of bytes each access pattern names, enumerated by brute force."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from isa.dtypes import DType
from isa.operand import Mem, Operand
from neuronx_cc_lite.codegen.regions import MAX_RUNS, Conflicts, Index, Record, box_of, runs


def bytes_of(o: Operand) -> set[int]:
    """Every byte the operand touches (in one partition row for SBUF/PSUM, over HBM for HBM)."""
    dims = [(o.num_partitions, o.partition_stride), *o.dims] if o.mem is Mem.HBM else list(o.dims)
    found = set()
    for index in itertools.product(*(range(n) for n, _ in dims)):
        at = o.offset + sum(i * stride for i, (_, stride) in zip(index, dims)) * o.dtype.size
        found.update(range(at, at + o.dtype.size))
    return found


def operand(mem, dims, offset, partitions=1, partition_stride=0, dtype=DType.bf16) -> Operand:
    return Operand(mem, dtype, 0, partitions, offset, tuple(dims), partition_stride if mem is Mem.HBM else 0)


patterns = st.builds(
    operand,
    mem=st.sampled_from([Mem.HBM, Mem.SBUF]),
    dims=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 40)), min_size=1, max_size=3),
    offset=st.integers(0, 64).map(lambda e: 2 * e),
    partitions=st.integers(1, 4),
    partition_stride=st.integers(0, 60),
)


@settings(max_examples=300, deadline=None)
@given(patterns)
def test_runs_are_exactly_the_bytes_touched(o):
    found = runs(o)
    assert found is not None
    touched = set().union(*(range(a, b) for a, b in zip(*found)))
    assert touched == bytes_of(o)
    starts, ends = found
    assert all(s > e for s, e in zip(starts[1:], ends[:-1]))  # sorted, merged: no two runs touch


@settings(max_examples=300, deadline=None)
@given(patterns)
def test_the_box_spans_exactly_the_bytes_touched(o):
    touched = bytes_of(o)
    partitions = (0, 1) if o.mem is Mem.HBM else (o.start_partition, o.start_partition + o.num_partitions)
    assert box_of(o) == (*partitions, min(touched), max(touched) + 1)


@settings(max_examples=300, deadline=None)
@given(patterns, patterns)
def test_two_accesses_meet_exactly_when_they_share_a_byte(a, b):
    a = operand(Mem.HBM, a.dims, a.offset, a.num_partitions, a.partition_stride)
    b = operand(Mem.HBM, b.dims, b.offset, b.num_partitions, b.partition_stride)
    ra, rb = Record(box_of(a), 0, 0, True, operand=a), Record(box_of(b), 0, 1, True, operand=b)
    boxes_meet = ra.box[2] < rb.box[3] and rb.box[2] < ra.box[3]
    if boxes_meet:  # the index only asks about accesses whose boxes meet
        assert ra.meets(rb) == bool(bytes_of(a) & bytes_of(b))
    # a write that stands for an earlier access must touch every byte of it
    if rb.covers(ra):
        assert bytes_of(a) <= bytes_of(b)


def test_channel_major_row_blocks_do_not_meet():
    # a [64 channels, 56 x 56] bf16 output stored in blocks of 8 rows: each block is 64 runs of 8 x 56 elements,
    # and its bounding box spans nearly the whole tensor; no two blocks share a byte
    blocks = [operand(Mem.HBM, [(8 * 56, 1)], 2 * 8 * 56 * k, partitions=64, partition_stride=56 * 56)
              for k in range(7)]
    records = [Record(box_of(o), 0, k, True, operand=o) for k, o in enumerate(blocks)]
    assert all(not a.meets(b) for a, b in itertools.combinations(records, 2))
    whole = operand(Mem.HBM, [(56 * 56, 1)], 0, partitions=64, partition_stride=56 * 56)
    assert all(Record(box_of(whole), 0, 9, True, operand=whole).covers(r) for r in records)


def test_a_padded_tiles_border_does_not_meet_its_interior():
    # SBUF tile of 10 x 10 elements per partition: the memset of column 0 and the load of the interior 8 x 8
    border = operand(Mem.SBUF, [(10, 10)], 0)
    interior = operand(Mem.SBUF, [(8, 10), (8, 1)], 2 * 11)
    a, b = Record(box_of(border), 0, 0, True, operand=border), Record(box_of(interior), 1, 1, True, operand=interior)
    assert not a.meets(b)


def test_more_runs_than_the_limit_falls_back_to_the_box():
    o = operand(Mem.HBM, [(MAX_RUNS + 1, 4)], 0)
    assert runs(o) is None
    dense = operand(Mem.HBM, [(4, 1)], 2)  # inside the box, between two of its elements
    a, b = Record(box_of(o), 0, 0, True, operand=o), Record(box_of(dense), 0, 1, True, operand=dense)
    assert a.meets(b)  # as a box: the truth is never smaller


# boxes of every scale the index files: from a few bytes (its finest cells are 512 B) to many MiB
spans = st.tuples(st.integers(0, 127), st.integers(1, 128), st.integers(0, 1 << 24),
                  st.integers(0, 24).flatmap(lambda bits: st.integers(1, 1 << bits)))


def _box(span: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    first_partition, partitions, first_byte, size = span
    return first_partition, min(128, first_partition + partitions), first_byte, first_byte + size


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(spans, st.integers(0, 2)), min_size=1, max_size=40), spans,
       st.lists(st.integers(-1, 40), min_size=3, max_size=3), st.integers(0, 40))
def test_the_index_finds_each_meeting_record_once(added, query, known, settled_at):
    """Index.find against brute force: every live record whose box meets the query's and that the asker does not
    know complete, each once, over records filed at every scale, after records died (some settled, their cells
    dropped) and more were filed in the same cells."""
    index, records = Index(), []

    def add(span, stream):
        r = Record(_box(span), stream, len(records), False)
        records.append(r)
        index.add(Mem.SBUF, r)

    for span, stream in added:
        add(span, stream)
    settled = [min(k, settled_at) for k in known]  # every stream still to run knows at least this much
    index.find(Mem.SBUF, (0, 128, 0, 1 << 26), settled, settled)  # the settled die, their cells emptied
    for span, stream in added:  # filed again, in the same cells
        add(span, stream)
    q = _box(query)
    found = index.find(Mem.SBUF, q, known, settled)
    assert len(found) == len({id(r) for r in found})
    expected = {id(r) for r in records if r.index > known[r.stream] and r.index > settled[r.stream] and
                r.box[0] < q[1] and q[0] < r.box[1] and r.box[2] < q[3] and q[2] < r.box[3]}
    assert {id(r) for r in found} == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(spans, st.booleans()), min_size=1, max_size=30), spans, st.booleans())
def test_conflicts_are_the_meeting_records_of_which_one_writes(added, query, writes):
    """Conflicts.find: the records whose boxes meet the access's, a read's among the writes only."""
    conflicts, records = Conflicts(), []
    for span, wrote in added:
        records.append(Record(_box(span), -1, len(records), wrote))
        conflicts.add(Mem.SBUF, records[-1])
    access = Record(_box(query), -1, len(records), writes)
    q = access.box
    expected = {id(r) for r in records if (writes or r.writes) and
                r.box[0] < q[1] and q[0] < r.box[1] and r.box[2] < q[3] and q[2] < r.box[3]}
    found = conflicts.find(Mem.SBUF, access)
    assert len(found) == len(expected) and {id(r) for r in found} == expected
