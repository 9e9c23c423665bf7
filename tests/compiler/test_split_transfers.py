"""Large transfers cut by partitions (codegen/transfers.py), including those whose sides differ in shape: a
depthwise convolution's rows fanned out of its channels' partitions (lower/row_depthwise.py) are cut a channel at
a time, each channel's partition with the rows it fills."""

from __future__ import annotations

from isa.dtypes import DType
from isa.operand import Engine, Mem
from isa.target import TRN1
from neuronx_cc_lite.codegen.transfers import split_transfers
from neuronx_cc_lite.tile.program import PendingInstr, Program, Tile, TileAccess


def _program(dst: TileAccess, src: TileAccess) -> Program:
    program = Program(TRN1)
    program.instrs = [PendingInstr("dma_copy", Engine.DMA, 0, {"dst": dst, "src": src}, "n")]
    split_transfers(program)
    return program


def test_a_fan_out_is_cut_a_source_partition_at_a_time():
    home = Tile(Mem.SBUF, 128, 4096, DType.fp32, "home")
    window = Tile(Mem.SBUF, 128, 64, DType.fp32, "window")
    # channels 10 and 11 (a partition each, 56 x 56) onto 112 partitions of 56, four elements in
    src = TileAccess(home, 10, 2, 0, ((3136, 1),))
    dst = TileAccess(window, 0, 112, 4, ((56, 1),))
    cut = _program(dst, src).instrs
    assert [(p.args["src"].first, p.args["src"].partitions, p.args["dst"].first, p.args["dst"].partitions)
            for p in cut] == [(10, 1, 0, 56), (11, 1, 56, 56)]
    gathered = _program(src, dst).instrs  # and back
    assert [(p.args["dst"].first, p.args["src"].first) for p in gathered] == [(10, 0), (11, 56)]


def test_sides_whose_rows_do_not_correspond_stay_whole():
    a = Tile(Mem.SBUF, 128, 8192, DType.fp32, "a")
    src = TileAccess(a, 0, 3, 0, ((5000, 1),))  # 15,000 elements: 3 rows of 5,000
    dst = TileAccess(a, 0, 100, 0, ((150, 1),))  # 100 rows of 150: a row of src is not whole rows of dst
    assert len(_program(dst, src).instrs) == 1
