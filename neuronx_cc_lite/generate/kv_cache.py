"""A decoder step with its KV cache on the device: the graph rewrite behind `generate`.

The exported decoder (generate/layout.py) takes its past from the host and gives back the past and the new entries
concatenated. The rewrite makes one step of it a program over device state (Graph.state) that persists across
runs: each `past_key_values.*` input becomes a cache of fixed capacity L (`max_length`) in HBM, plus
`past_length` [batch], how many positions of it are filled. The host sends only the tokens (and, to a prefill,
the prompt's length) and gets only the logits (and the token, when the device picks it).

    decode (tokens S = 1; imported with a past of L - 1, so every length in the graph is L):
        present.i    = TensorScatter(cache.i, new.i, write_indices=past_length)     in place: one row written
        position_ids = past_length + arange(S)
        mask[b, j]   = j < past_length[b] + S            the cache's unwritten (or stale) positions masked
        past_length' = past_length + S
    prefill (a bucket of S tokens, of which prompt_length are the prompt; imported with an empty past):
        present.i    = new.i                              attention over the prompt only: causal, positions from 0
        cache.i'     = TensorScatter(cache.i, new.i, write_indices=0)   the bucket's rows written in place
        position_ids = arange(S);  mask[b, j] = j < prompt_length[b]
        logits       = logits[:, prompt_length - 1]       the last prompt token's only
        past_length' = prompt_length
    a static-cache export (its present is its past with rows scattered in): the past is the cache as it is, and
        the positions, the mask, cache_position and write_indices come from past_length as above.
    greedy on the device (`greedy`): token = ArgMax(logits) is an output and the state `next_token`, which the
        next decode step reads as its input_ids: the host sends nothing, so it can queue step t+1 before it has
        looked at step t's token (generate/generator.py).

Why a decode step sees a past of L - 1: the export's causal mask lets query i see keys up to past + i; with past =
L - 1 and one query that is every slot, so the mask on the cache's filled length alone decides, and the slot a
token is written to (past_length) needs no place in the causal structure. A prefill from an empty cache has the
causal mask and the positions the export computes. Positions come from `position_ids` (or `cache_position`):
a growing-cache export without either would compute them from the past's length, which a fixed capacity hides,
and is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.generate.layout import PAST, PRESENT
from neuronx_cc_lite.ir import Graph, Node, Tensor

LENGTH = "past_length"  # state: the cache's filled positions, per batch row
PROMPT_LENGTH = "prompt_length"  # a prefill's input: the prompt's tokens in the bucket, per batch row
TOKEN = "token"  # output of a greedy step: the token the device picked
NEXT_TOKEN = "next_token"  # state of a greedy decode: the token the next step reads
STEPS = ("prefill", "decode")
SCATTERS = ("TensorScatter", "ScatterND", "ScatterElements")
TENSOR_SCATTER_OPSET = 24


def decoder_step(g: Graph, step: dict[str, Any]) -> Graph:
    """Rewrite `g` (imported with the step's shapes pinned) into the step `step` describes: {"step": "prefill" or
    "decode", "max_length": L, "tokens": S, "greedy": bool}. Returns `g`, changed."""
    kind, capacity, tokens, greedy = step["step"], int(step["max_length"]), int(step["tokens"]), bool(step["greedy"])
    if kind not in STEPS:
        raise CompileError("NCC_OPTION", f"decoder step {kind!r}: one of {', '.join(STEPS)}")
    rewrite = _Rewrite(g, capacity, tokens)
    pairs = [(name, PRESENT + name[len(PAST):]) for name in g.inputs if name.startswith(PAST)]
    producers = g.producers()
    growing = [producers[_through_identity(g, present, producers)].op == "Concat" for _, present in pairs]
    if any(growing) != all(growing):
        raise CompileError("NCC_GENERATE", "some present tensors concatenate the past and some scatter into it")
    length = rewrite.state_input(LENGTH, (1,), np.dtype(np.int64))
    if kind == "decode":
        start, valid = length, rewrite.constant("generate/tokens", np.full((1,), tokens, np.int64))
    else:
        start = rewrite.constant("generate/zero", np.zeros((1,), np.int64))
        valid = rewrite.host_input(PROMPT_LENGTH, (1,), np.dtype(np.int64))
    for past, present in pairs:
        if growing[0]:
            rewrite.growing_cache(past, present, start, prefill=kind == "prefill")
        else:
            rewrite.static_cache(past, present)
    if growing[0] and "position_ids" not in g.inputs and "cache_position" not in g.inputs:
        raise CompileError("NCC_GENERATE", "the model takes no position_ids: its positions would come from the "
                                           "past's length, which a cache of fixed capacity does not have; export it "
                                           "with position_ids (as optimum does)")
    rewrite.positions(start, valid)
    rewrite.advance(LENGTH, rewrite.add("generate/past_length_next", start, valid))
    if kind == "prefill":
        rewrite.last_logits(valid)
    if greedy:
        rewrite.greedy(decode=kind == "decode")
    rewrite.finish()
    return g


def _through_identity(g: Graph, name: str, producers: dict[str, Node]) -> str:
    """The tensor `name` copies through Identity nodes."""
    while name in producers and producers[name].op == "Identity":
        name = producers[name].inputs[0]
    if name not in producers:
        raise CompileError("NCC_GENERATE", f"output {name!r} is not computed by the model")
    return name


class _Rewrite:
    def __init__(self, g: Graph, capacity: int, tokens: int) -> None:
        self.g, self.capacity, self.tokens = g, capacity, tokens
        self.front: list[Node] = []  # nodes that compute what replaced inputs: before every model node
        self.back: list[Node] = []  # after every model node
        self.state: dict[str, str] = {}
        self.host: list[str] = []  # new inputs the host sends

    # -- tensors and nodes ------------------------------------------------------------------------------------

    def constant(self, name: str, value: np.ndarray) -> str:
        self.g.tensors[name] = Tensor(name, tuple(value.shape), value.dtype, value)
        return name

    def node(self, op: str, name: str, inputs: list[str], shape: tuple[int, ...], dtype: Any,
             front: bool = True, **attrs: Any) -> str:
        out = self.g.fresh(name)
        self.g.tensors[out] = Tensor(out, shape, np.dtype(dtype))
        opset = TENSOR_SCATTER_OPSET if op == "TensorScatter" else None
        (self.front if front else self.back).append(Node(op, out, inputs, [out], attrs, "", opset))
        return out

    def add(self, name: str, a: str, b: str, front: bool = True) -> str:
        t = self.g.tensors[a]
        return self.node("Add", name, [a, b], t.shape, t.dtype, front)

    def state_input(self, name: str, shape: tuple[int, ...], dtype: Any) -> str:
        if name in self.g.tensors:
            raise CompileError("NCC_GENERATE", f"the model already has a tensor named {name!r}")
        self.g.tensors[name] = Tensor(name, shape, np.dtype(dtype))
        self.g.inputs.append(name)
        return name

    def host_input(self, name: str, shape: tuple[int, ...], dtype: Any) -> str:
        self.state_input(name, shape, dtype)
        self.host.append(name)
        return name

    def advance(self, state: str, value: str) -> None:
        """`value` is what state input `state` holds for the next run."""
        out = self.node("Identity", f"{state}.next", [value], self.g.tensors[state].shape,
                        self.g.tensors[state].dtype, front=False)
        self.state[state] = out

    def replace_input(self, name: str, value: str) -> None:
        """Input `name` is computed (its tensor keeps its name, made by an Identity of `value`)."""
        t = self.g.tensors[name]
        self.g.inputs.remove(name)
        self.front.append(Node("Identity", f"generate/{name}", [value], [name]))
        self.g.tensors[name] = Tensor(name, t.shape, t.dtype)

    # -- the cache ----------------------------------------------------------------------------------------------

    def growing_cache(self, past: str, present: str, start: str, prefill: bool) -> None:
        """present = Concat(past, new) -> a write of new into the cache (see the module's docstring)."""
        g = self.g
        producers, users = g.producers(), g.consumers()
        concat = producers[_through_identity(g, present, producers)]
        chains = [self._chain_to(past, name, producers) for name in concat.inputs] if concat.op == "Concat" else []
        if len(concat.inputs) != 2 or sum(c is not None for c in chains) != 1:
            raise CompileError("NCC_GENERATE", f"{present} is made by {concat.op} of {concat.inputs}, not a Concat "
                                               f"of {past} and the new entries", concat.name, concat.op)
        side = next(k for k, c in enumerate(chains) if c is not None)
        chain = chains[side] or []
        old = g.tensors[past]
        axis = int(concat.attrs.get("axis", 0)) % len(old.shape)
        new = concat.inputs[1 - side]
        for tensor in [past, *(n.outputs[0] for n in chain)]:  # their lengths were the export's: folded
            for user in users.get(tensor, []):
                if user is concat or user in chain:
                    continue
                if user.op != "Shape":
                    raise CompileError("NCC_GENERATE", f"{tensor} is read by {user.op}; the past is read only by the "
                                                       "Concat that extends it (and Shape)", user.name, user.op)
                self._fold_shape(user, g.tensors[tensor].shape)
        for node in chain:
            g.nodes.remove(node)
        cache_shape = tuple(self.capacity if k == axis else n for k, n in enumerate(old.shape))
        g.tensors[past] = Tensor(past, cache_shape, old.dtype)
        if prefill:  # attention reads the new entries alone; the cache takes them at position 0
            concat.op, concat.inputs, concat.attrs = "Identity", [new], {}
            written = self.node("TensorScatter", f"{past}/write", [past, new, start], cache_shape, old.dtype,
                                front=False, axis=axis)
            g.outputs.remove(present)
            self.state[past] = written
        else:
            if g.tensors[present].shape not in (None, cache_shape):
                raise CompileError("NCC_GENERATE", f"{present} has shape {g.tensors[present].shape}; the cache "
                                                   f"{cache_shape}")
            concat.op, concat.inputs, concat.attrs = "TensorScatter", [past, new, start], {"axis": axis}
            concat.opset = TENSOR_SCATTER_OPSET
            g.tensors[concat.outputs[0]] = Tensor(concat.outputs[0], cache_shape, old.dtype)
            self.state[past] = present

    def _chain_to(self, past: str, name: str, producers: dict[str, Node]) -> list[Node] | None:
        """The nodes that pass `past` on unchanged to `name` (Identity; a Concat with empty constants, as a cache
        object made empty and then extended exports), or None when `name` is not the past passed on."""
        chain: list[Node] = []
        while name != past:
            node = producers.get(name)
            if node is None:
                return None
            others = [i for i in node.inputs if i and not (self.g.tensors[i].is_constant and
                                                           self.g.tensors[i].value.size == 0)]
            if node.op not in ("Identity", "Concat") or len(others) != 1:
                return None
            chain.append(node)
            name = others[0]
        return chain

    def static_cache(self, past: str, present: str) -> None:
        """present = a scatter into past: the past is the cache, as it is."""
        g = self.g
        producers = g.producers()
        scatter = producers[_through_identity(g, present, producers)]
        if scatter.op not in SCATTERS or scatter.inputs[0] != past:
            raise CompileError("NCC_GENERATE", f"{present} is made by {scatter.op}; a static cache's present is a "
                                               f"scatter into {past}", scatter.name, scatter.op)
        cache = g.tensors[past]
        if cache.shape[len(cache.shape) - 2] != self.capacity:
            raise CompileError("NCC_GENERATE", f"the model's cache holds {cache.shape[-2]} positions; "
                                               f"--max-length must be {cache.shape[-2]}")
        self.state[past] = present

    def _fold_shape(self, node: Node, shape: tuple[int, ...]) -> None:
        """A Shape of the past becomes the constant it was at import (its length is the export's, not the
        cache's)."""
        dims = np.array(shape, np.int64)
        start, end = node.attrs.get("start", 0), node.attrs.get("end", len(shape))
        self.constant(node.outputs[0], dims[slice(start, end)])
        self.g.nodes.remove(node)

    # -- what the host no longer sends ------------------------------------------------------------------------

    def positions(self, start: str, valid: str) -> None:
        """position_ids, cache_position, write_indices and attention_mask from the cache's length."""
        g, s = self.g, self.tokens
        for name in [n for n in g.inputs if n in ("position_ids", "cache_position", "write_indices",
                                                  "attention_mask")]:
            t = g.tensors[name]
            if name == "write_indices":
                value = start
            elif name == "attention_mask":
                width = t.shape[-1]
                slots = self.constant("generate/slots", np.arange(width, dtype=np.int64).reshape(1, width))
                end = self.add("generate/filled", start, valid)
                bound = self.node("Reshape", "generate/filled_column", [end, self.constant(
                    "generate/column", np.array([-1, 1], np.int64))], (1, 1), np.int64)
                below = self.node("Less", "generate/written", [slots, bound], (1, width), np.bool_)
                value = self.node("Cast", "generate/mask", [below], (1, width), t.dtype,
                                  to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)))
            else:
                steps = self.constant(f"generate/{name}_steps", np.arange(s, dtype=np.int64).reshape(t.shape))
                first = start if name == "cache_position" else self.node(
                    "Reshape", "generate/start_column", [start, self.constant(
                        "generate/column", np.array([-1, 1], np.int64))], (1, 1), np.int64)
                value = self.node("Add", f"generate/{name}", [steps, first], t.shape, np.int64)
                if np.dtype(t.dtype) != np.int64:
                    value = self.node("Cast", f"generate/{name}_typed", [value], t.shape, t.dtype,
                                      to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)))
            self.replace_input(name, value)

    def last_logits(self, valid: str) -> None:
        """A prefill's logits: the row of the prompt's last token only ([1, 1, vocabulary])."""
        g = self.g
        t = g.tensors["logits"]
        if t.shape is not None and (len(t.shape) != 3 or t.shape[0] != 1):
            raise CompileError("NCC_GENERATE", f"logits has shape {list(t.shape)}; generate takes [1, tokens, "
                                               "vocabulary]")
        every = g.fresh("logits/every")
        producer = g.producers()["logits"]
        producer.outputs[producer.outputs.index("logits")] = every
        for user in g.consumers().get("logits", []):
            user.inputs = [every if i == "logits" else i for i in user.inputs]
        g.tensors[every] = Tensor(every, t.shape, t.dtype)
        last = self.node("Sub", "generate/last", [valid, self.constant("generate/one", np.ones(1, np.int64))],
                         (1,), np.int64, front=False)
        self.back.append(Node("Gather", "generate/logits", [every, last], ["logits"], {"axis": 1}))
        g.tensors["logits"] = Tensor("logits", None if t.shape is None else (1, 1, t.shape[2]), t.dtype)

    def greedy(self, decode: bool) -> None:
        """token = ArgMax(logits) for the host, and as state for the next decode step's input_ids."""
        g = self.g
        t = g.tensors["logits"]
        if t.shape is not None and t.shape[:2] != (1, 1):
            raise CompileError("NCC_GENERATE", f"logits has shape {list(t.shape)}; a greedy step picks from [1, 1, "
                                               "vocabulary]")
        picked = self.node("ArgMax", "generate/argmax", ["logits"], (1, 1), np.int64, front=False, axis=-1,
                           keepdims=1)
        self.back.append(Node("Identity", "generate/token", [picked], [TOKEN]))
        g.tensors[TOKEN] = Tensor(TOKEN, (1, 1), np.dtype(np.int64))
        g.outputs.append(TOKEN)
        ids = g.tensors["input_ids"]
        token_state = self.state_input(NEXT_TOKEN, (1, 1), ids.dtype)
        self.advance(NEXT_TOKEN, picked if np.dtype(ids.dtype) == np.int64 else self.node(
            "Cast", "generate/token_typed", [picked], (1, 1), ids.dtype, front=False,
            to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(ids.dtype))))
        if decode:
            self.replace_input("input_ids", token_state)

    def finish(self) -> None:
        g = self.g
        g.nodes[:0] = self.front
        g.nodes.extend(self.back)
        for after in self.state.values():
            if after not in g.outputs:
                g.outputs.append(after)
        g.state.update(self.state)
        # the host's inputs first, then the state, each in the order made
        g.inputs.sort(key=lambda n: (n in self.state, n in self.host))
