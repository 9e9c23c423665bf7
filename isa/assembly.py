"""A whole bundle as text, and back: `disassemble(bundle)` and `assemble(text)`, with
`assemble(disassemble(b))` giving a bundle of identical bytes.

    ; comments start with a semicolon
    .bundle {"compiler": "...", "flags": {...}, "groups": [], "hbm_size": 8192, "lnc": 1, "stats": {...},
             "target": "trn1"}
    .input {"device_dtype": "fp32", "dtype": "float32", "name": "x", "placements": [{"axis": 0,
            "hbm_offset": 0, "rank": 0, "start": 0, "stop": 1}], "shape": [1, 784]}
    .output {...}
    .state {...}                                  (device state, as .input: a KV cache, its write position)
    .tensor {"hbm_offset": 4096, "kind": "weight", "name": "fc1.weight", "size": 16384}
    .core 0
    .stream PE
         0  nc_matmul dst=... accumulate=false wait[s5>=1] inc[s0]      ; /fc1/Gemm
    .data 0 4096 16384
    <base64 of the weight segment of rank 0 at HBM offset 4096, 16384 bytes>
    .end

`.core N` opens the streams of rank N. Each instruction line is its index in the stream, the instruction (isa/listing.py), and after a semicolon the ONNX
node it came from, as written unless the name would not survive the trip (space at either end, a character that
ends a line for Python or JSON, any other control character, or a leading double quote): then as a JSON string.
Directives carry JSON so that any tensor name survives the trip.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from isa.bundle import Bundle, HbmTensorInfo, Segment, Stream, TensorInfo
from isa.listing import ParseError, format_instruction, parse_instruction

_LINE = 76


def disassemble(bundle: Bundle, data: bool = True, cores: set[int] | None = None,
                streams: set[str] | None = None) -> str:
    """The listing. Leaving out the weights (`data=False`) or some cores or streams gives a listing to read, not
    one to assemble."""
    lines = ["; neuronx-cc-lite bundle listing",
             "; operands: DTYPE MEM[first:end(:partition_stride)]@byte_offset {size:stride, ...} (strides in "
             "elements); wait[sK>=V] holds an instruction until semaphore K reaches V; inc[sK] adds one to K "
             "when it completes"]
    header = {"target": bundle.target, "hbm_size": bundle.hbm_size, "compiler": bundle.compiler,
              "flags": bundle.flags, "stats": bundle.stats, "lnc": bundle.lnc,
              "groups": [list(g) for g in bundle.groups]}
    lines.append(".bundle " + json.dumps(header, sort_keys=True))
    lines += [".input " + json.dumps(t.to_json(), sort_keys=True) for t in bundle.inputs]
    lines += [".output " + json.dumps(t.to_json(), sort_keys=True) for t in bundle.outputs]
    lines += [".state " + json.dumps(t.to_json(), sort_keys=True) for t in bundle.state]
    lines += [".tensor " + json.dumps(t.to_json(), sort_keys=True) for t in bundle.hbm_tensors]
    for c, core in enumerate(bundle.cores):
        if cores is not None and c not in cores:
            continue
        lines.append(f".core {c}")
        names = list(core)
        owners = sorted({(i.signal, name) for name, s in core.items() for i in s.instructions
                         if i.signal is not None})
        lines.append("; semaphores incremented: " + ", ".join(f"s{sem} by {name}" for sem, name in owners))
        for name in names:
            if streams is not None and name not in streams:
                continue
            s = core[name]
            lines.append(f".stream {name}")
            for i, (instr, node) in enumerate(zip(s.instructions, s.nodes)):
                text = f"{i:>6}  {format_instruction(instr)}"
                lines.append(f"{text}  ; {_format_node(node)}" if node else text)
    for seg in bundle.weights:
        lines.append(f".data {seg.rank} {seg.hbm_offset} {len(seg.data)}")
        if data:
            encoded = base64.b64encode(seg.data).decode()
            lines += [encoded[i:i + _LINE] for i in range(0, len(encoded), _LINE)]
            lines.append(".end")
    return "\n".join(lines) + "\n"


def _format_node(name: str) -> str:
    plain = (name == name.strip() and not name.startswith('"') and name.isprintable()
             and len(name.splitlines()) == 1)
    return name if plain else json.dumps(name)


def _parse_node(text: str, lineno: int) -> str:
    if not text.startswith('"'):
        return text
    return _json(text, lineno, str, f"bad node name {text!r}", "a node name in quotes must be a JSON string")


def _json(text: str, lineno: int, kind: type = dict, bad: str = "bad JSON",
          wrong: str = "expected a JSON object") -> Any:
    """The JSON value `text` holds, of type `kind`; ParseError naming the line otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(f"line {lineno}: {bad}: {e.msg}") from None
    if not isinstance(value, kind):
        raise ParseError(f"line {lineno}: {wrong}")
    return value


def assemble(text: str, weights_from: Bundle | None = None) -> Bundle:
    """Parse a listing back into a bundle. A listing without weight data takes them from `weights_from`."""
    header: dict | None = None
    inputs: list[TensorInfo] = []
    outputs: list[TensorInfo] = []
    state: list[TensorInfo] = []
    tensors: list[HbmTensorInfo] = []
    cores: list[dict[str, Stream]] = []
    weights: list[Segment] = []
    stream: Stream | None = None
    data_lines: list[str] | None = None
    pending: tuple[int, int, int, int] | None = None  # rank, offset, size, line of a .data directive

    def close_data(lineno: int) -> None:
        nonlocal pending, data_lines
        if pending is None:
            return
        rank, offset, size, at = pending
        if data_lines is None:
            source = {(s.rank, s.hbm_offset): s.data for s in weights_from.weights} if weights_from else {}
            if (rank, offset) not in source or len(source[rank, offset]) != size:
                raise ParseError(f"line {at}: .data {rank} {offset} has no bytes in the listing; give a bundle to "
                                 "take the weights from")
            weights.append(Segment(offset, source[rank, offset], rank))
        else:
            raise ParseError(f"line {at}: .data without .end")
        pending = None

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if data_lines is not None:
            if line == ".end":
                assert pending is not None
                try:
                    blob = base64.b64decode("".join(data_lines), validate=True)
                except binascii.Error as e:
                    raise ParseError(f"line {pending[3]}: the .data block is not base64: {e}") from None
                if len(blob) != pending[2]:
                    raise ParseError(f"line {pending[3]}: .data says {pending[2]} bytes, found {len(blob)}")
                weights.append(Segment(pending[1], blob, pending[0]))
                pending, data_lines = None, None
            else:
                data_lines.append(line)
            continue
        if not line or line.startswith(";"):
            continue
        word, _, rest = line.partition(" ")
        if word == ".data":
            close_data(lineno)
            try:
                rank, offset, size = (int(v) for v in rest.split())
            except ValueError:
                raise ParseError(f"line {lineno}: .data needs a rank, an HBM offset and a size") from None
            pending = (rank, offset, size, lineno)
            continue
        if pending is not None:
            if not line.startswith("."):  # base64 follows its .data line
                data_lines = [line]
                continue
            close_data(lineno)
        if word == ".bundle":
            header = _json(rest, lineno)
        elif word in (".input", ".output", ".state"):
            try:
                info = TensorInfo.from_json(_json(rest, lineno))
            except (KeyError, TypeError, ValueError) as e:
                raise ParseError(f"line {lineno}: bad tensor description: {e}") from None
            {".input": inputs, ".output": outputs, ".state": state}[word].append(info)
        elif word == ".tensor":
            try:
                tensors.append(HbmTensorInfo.from_json(_json(rest, lineno)))
            except (KeyError, TypeError, ValueError) as e:
                raise ParseError(f"line {lineno}: bad tensor description: {e}") from None
        elif word == ".core":
            if rest.strip() != str(len(cores)):
                raise ParseError(f"line {lineno}: expected .core {len(cores)}")
            cores.append({})
            stream = None
        elif word == ".stream":
            if not cores:
                raise ParseError(f"line {lineno}: .stream before .core")
            stream = cores[-1].setdefault(rest.strip(), Stream([], []))
        elif word == ".part":
            raise ParseError(f"line {lineno}: the listing of a bundle with host parts (--fallback host) is for "
                             "reading; it does not assemble")
        elif word.startswith("."):
            raise ParseError(f"line {lineno}: unknown directive {word}")
        else:
            if stream is None:
                raise ParseError(f"line {lineno}: instruction outside a .stream")
            body, _, node = line.partition(";")
            index, _, instr_text = body.strip().partition(" ")
            if not index.isdigit() or int(index) != len(stream.instructions):
                raise ParseError(f"line {lineno}: expected instruction index {len(stream.instructions)}")
            try:
                stream.instructions.append(parse_instruction(instr_text))
            except ParseError as e:
                raise ParseError(f"line {lineno}: {e.args[0]}") from None
            stream.nodes.append(_parse_node(node.strip(), lineno))
    if data_lines is not None:
        raise ParseError("the listing ends inside a .data block")
    close_data(0)
    if header is None:
        raise ParseError("no .bundle directive")
    try:
        return Bundle(str(header["target"]), int(header["hbm_size"]), inputs, outputs, cores, weights,
                      str(header.get("compiler", "")), dict(header.get("flags", {})), dict(header.get("stats", {})),
                      tensors, int(header["lnc"]), [tuple(int(r) for r in g) for g in header["groups"]], state)
    except (KeyError, TypeError, ValueError) as e:
        raise ParseError(f".bundle directive: {e}") from None
