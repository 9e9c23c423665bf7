"""Where the weights stored inside an ONNX file lie, so that the model can be parsed without them.

Parsing a model copies every initializer's raw_data into the message, and taking it out as an array copies it again:
for BERT-base's 439 MB that was 0.6-1.0 s of a 9 s compile, and the weights twice in memory. `split_weights`
walks the protobuf wire format along the only path to those bytes, ModelProto.graph (field 7) ->
GraphProto.initializer (field 5) -> TensorProto.raw_data (field 9), and returns the model's bytes without any
raw_data (every other field copied as it is) and where each initializer's raw_data lies in the file. The frontend
parses the small remainder and views the weights in a memory map of the file (frontend.read_model_mapping_weights).

Wire format: each field is a key varint (field number << 3 | wire type), then a varint (type 0), 8 bytes (1), a
length varint and that many bytes (2), or 4 bytes (5). A message field that appears more than once is merged by
the parser, and repeated fields (initializers) concatenate in file order, which is the order of the spans.
"""

from __future__ import annotations

from typing import Iterator

GRAPH, INITIALIZER, RAW_DATA = 7, 5, 9  # ModelProto.graph, GraphProto.initializer, TensorProto.raw_data
VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5

Span = tuple[int, int]  # (offset in the file, length in bytes)


class WireError(ValueError):
    """The bytes are not a protobuf message the walk can follow: the caller leaves them to the parser, which names
    the problem."""


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise WireError(f"a varint runs past byte {end}")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, the field's first byte, its value's first byte, its end) for each field of the
    message buf[start:end]."""
    pos = start
    while pos < end:
        key, value = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            stop = _varint(buf, value, end)[1]
        elif wire == FIXED64:
            stop = value + 8
        elif wire == LENGTH:
            length, value = _varint(buf, value, end)
            stop = value + length
        elif wire == FIXED32:
            stop = value + 4
        else:  # groups (3, 4): deprecated, never in ONNX
            raise WireError(f"wire type {wire} at byte {pos}")
        if number == 0 or stop > end:
            raise WireError(f"field {number} at byte {pos} runs past byte {end}")
        yield number, wire, pos, value, stop
        pos = stop


def _message(number: int, body: bytes) -> bytes:
    return _encode_varint(number << 3 | LENGTH) + _encode_varint(len(body)) + body


def _tensor(buf: bytes, start: int, end: int, spans: list[Span | None]) -> bytes:
    """A TensorProto without its raw_data; appends where the raw_data lies (the last one, as the parser keeps)."""
    parts, span = [], None
    for number, wire, field, value, stop in _fields(buf, start, end):
        if number == RAW_DATA and wire == LENGTH:
            span = (value, stop - value)
        else:
            parts.append(buf[field:stop])
    spans.append(span)
    return b"".join(parts)


def _graph(buf: bytes, start: int, end: int, spans: list[Span | None]) -> bytes:
    parts = []
    for number, wire, field, value, stop in _fields(buf, start, end):
        if number == INITIALIZER and wire == LENGTH:
            parts.append(_message(INITIALIZER, _tensor(buf, value, stop, spans)))
        else:
            parts.append(buf[field:stop])
    return b"".join(parts)


def split_weights(buf: bytes) -> tuple[bytes, list[Span | None]]:
    """The ModelProto in `buf` (bytes, or a memory map) without its initializers' raw_data, and per initializer of
    its graph, in order, where its raw_data lies in `buf` (None: it has none). WireError if the walk cannot follow
    the bytes."""
    parts, spans = [], []
    for number, wire, field, value, stop in _fields(buf, 0, len(buf)):
        if number == GRAPH and wire == LENGTH:
            parts.append(_message(GRAPH, _graph(buf, value, stop, spans)))
        else:
            parts.append(buf[field:stop])
    return b"".join(parts), spans
