"""What a decoder exported with its cache takes and gives, read from the ONNX file's declarations (no weights).

The layout transformers and optimum users export: inputs `input_ids` [batch, tokens], `attention_mask` [batch,
past + tokens], optionally `position_ids` [batch, tokens], and `past_key_values.{i}.key` / `.value` whose
sequence axis is dynamic; outputs `logits` [batch, tokens, vocabulary] and `present.{i}.key` / `.value` (the past
and the new entries concatenated). A static-cache export has the same names, a past of fixed length on its sequence
axis and a present of the same shape (the new entries written into it), and may take the positions as
`cache_position` [tokens] or a TensorScatter's `write_indices` [batch].

`step_shapes` pins every dynamic dimension for one compiled step: batch 1, `tokens` new tokens, and a past of
`past` entries (0 for a prefill, capacity - 1 for a decode step of a growing cache; the fixed length of a static
one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import onnx

from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.model_files import read_model

PAST = "past_key_values."
PRESENT = "present."
# inputs generate computes on the device from the cache's length (the positions, the mask, the write position)
POSITION_INPUTS = ("position_ids", "attention_mask", "cache_position", "write_indices")


@dataclass(frozen=True)
class DecoderLayout:
    path: str
    past: tuple[str, ...]  # the past inputs, in the model's order
    seq_axis: int  # the sequence axis of every past tensor
    fixed_length: int | None  # a static-cache export: the cache's capacity; None: a growing (concatenated) cache
    inputs: dict[str, tuple[int | str | None, ...]]  # every input's declared dimensions (a name when dynamic)
    vocabulary: int | None

    @property
    def present(self) -> tuple[str, ...]:
        return tuple(PRESENT + name[len(PAST):] for name in self.past)

    def step_shapes(self, tokens: int, past: int) -> dict[str, tuple[int, ...]]:
        """Every input's shape for one step: `tokens` new tokens after `past` cached ones, batch 1."""
        shapes = {}
        for name, dims in self.inputs.items():
            if name in self.past:
                shape = [1 if k == 0 else past if k == self.seq_axis else d for k, d in enumerate(dims)]
            elif name == "attention_mask":
                shape = [1, (self.fixed_length or past + tokens)]
            elif name == "cache_position":
                shape = [tokens]
            elif name == "write_indices":
                shape = [1]
            else:  # input_ids, position_ids: [batch, tokens]
                shape = [1, tokens] + list(dims[2:])
            if not all(isinstance(d, int) for d in shape):
                raise CompileError("NCC_GENERATE", f"input {name!r} of {self.path} has dimensions "
                                   f"{list(dims)}; generate pins only the batch, token and past axes")
            shapes[name] = tuple(shape)  # type: ignore[arg-type]
        return shapes


def read_layout(path: str | os.PathLike[str]) -> DecoderLayout:
    """The decoder's interface, or CompileError NCC_GENERATE naming what does not fit the layout."""
    model = read_model(path)
    where = os.fspath(path)
    inputs = {vi.name: _dims(vi) for vi in model.graph.input
              if vi.name not in {i.name for i in model.graph.initializer}}
    outputs = {vi.name: _dims(vi) for vi in model.graph.output}

    def refuse(why: str) -> CompileError:
        return CompileError("NCC_GENERATE", f"{where}: {why} (generate takes a decoder exported with its cache: "
                                            "inputs input_ids, attention_mask, past_key_values.N.key/.value; "
                                            "outputs logits, present.N.key/.value)")

    if "input_ids" not in inputs or "logits" not in outputs:
        raise refuse("no input_ids input or no logits output")
    past = tuple(name for name in inputs if name.startswith(PAST))
    if not past:
        raise refuse("no past_key_values.* inputs")
    missing = [PRESENT + name[len(PAST):] for name in past if PRESENT + name[len(PAST):] not in outputs]
    if missing:
        raise refuse(f"no output {missing[0]} for input {PAST + missing[0][len(PRESENT):]}")
    unknown = [n for n in inputs if n not in past and n != "input_ids" and n not in POSITION_INPUTS]
    if unknown:
        raise refuse(f"input {unknown[0]!r} is not one generate can feed")
    axes = {name: [k for k, d in enumerate(inputs[name]) if k > 0 and not isinstance(d, int)] for name in past}
    growing = {name: a for name, a in axes.items() if a}
    if growing and len(growing) != len(past):
        raise refuse(f"{next(n for n in past if n not in growing)} has a fixed length and {next(iter(growing))} "
                     "a dynamic one")
    if growing:
        seq = {tuple(a) for a in growing.values()}
        if len(seq) != 1 or len(next(iter(seq))) != 1:
            raise refuse(f"the past tensors must have one dynamic axis (the sequence), the same in each; found "
                         f"{ {n: list(inputs[n]) for n in past} }")
        seq_axis, fixed = next(iter(seq))[0], None
    else:
        first, present = inputs[past[0]], outputs[PRESENT + past[0][len(PAST):]]
        if len(first) < 3:
            raise refuse(f"{past[0]} has {len(first)} dimensions; a cache has batch, sequence and features")
        if any(inputs[n] != first for n in past) or list(present) != list(first):
            raise refuse("a static cache's past and present tensors must all have one shape")
        seq_axis = len(first) - 2  # [batch, heads, sequence, head size]
        fixed = first[seq_axis]  # type: ignore[assignment]
    logits = outputs["logits"]
    vocabulary = logits[-1] if logits and isinstance(logits[-1], int) else None
    return DecoderLayout(where, past, seq_axis, fixed, inputs, vocabulary)


def _dims(vi: onnx.ValueInfoProto) -> tuple[int | str | None, ...]:
    shape = vi.type.tensor_type.shape
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim)
