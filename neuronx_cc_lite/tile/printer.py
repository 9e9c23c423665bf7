"""The tile program as text: what `--dump-ir-after STAGE` and `--stop-after STAGE` print for the stages after
lowering (codegen/stages.py), as print_graph does for the graph passes.

    tile  x#3        SBUF 128 x 512 fp32 @ 4096          (offset once placed, else ?)
    hbm   mul_4      scratch 1048576 B @ ?
       12  DVE  tensor_tensor  dst=y#4[0:128]+0{512:1} a=x#3[0:128]+0{512:1} ...  ; node_add
A tile access is tile[first partition:end partition]+element offset{size:stride, ...}; an HBM access is
tensor[partitions x partition stride]+element offset{...}; a DMA names its queue once the schedule chose one.
"""

from __future__ import annotations

from neuronx_cc_lite.tile.program import HbmAccess, PendingInstr, Program, TileAccess


def _dims(dims: tuple[tuple[int, int], ...]) -> str:
    return "{" + ", ".join(f"{size}:{stride}" for size, stride in dims) + "}"


def _operand(value: object) -> str:
    if isinstance(value, TileAccess):
        return f"{value.tile.name}[{value.first}:{value.first + value.partitions}]+{value.offset}{_dims(value.dims)}"
    if isinstance(value, HbmAccess):
        return (f"{value.tensor.name}[{value.partitions}x{value.partition_stride}]+{value.offset}"
                f"{_dims(value.dims)}")
    if hasattr(value, "name") and hasattr(value, "value"):  # an enum: its name
        return str(value.name)
    return repr(value)


def format_instr(position: int, p: PendingInstr, queues: bool = False) -> str:
    queue = f" q{p.queue}" if queues and p.op.startswith("dma") else ""
    args = " ".join(f"{k}={_operand(v)}" for k, v in p.args.items() if v is not None)
    return f"{position:7d}  {p.engine.name:4s}{queue} {p.op}  {args}  ; {p.node}"


def print_program(program: Program, queues: bool = False) -> str:
    """The program's tiles, HBM tensors and instructions; `queues`: the DMA queues are chosen (after schedule)."""
    lines = [f"// {len(program.instrs)} instructions, {len(program.tiles)} tiles, {len(program.hbm)} HBM tensors"]
    for t in program.tiles:
        at = "?" if t.offset is None else t.offset
        lines.append(f"tile  {t.name}  {t.mem.name} {t.partitions} x {t.free} {t.dtype.name} @ {at}")
    for h in program.hbm:
        at = "?" if h.offset is None else h.offset
        lines.append(f"hbm   {h.name}  {h.kind} {h.nbytes} B @ {at}")
    lines += [format_instr(i, p, queues) for i, p in enumerate(program.instrs)]
    return "\n".join(lines) + "\n"
