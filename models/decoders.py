"""Tiny transformers decoders exported with their KV cache, as optimum lays them out, for `generate`.

    python models/decoders.py OUT_DIR     # writes OUT_DIR/llama_tiny.onnx and OUT_DIR/gpt2_tiny.onnx (+ .data)

Each is a transformers-5 model built from a small random config (seeded; nothing downloaded) and exported by
`torch.onnx.export` (the dynamo exporter by default, or `exporter="torchscript"`) through a wrapper that takes the
cache as flat tensors: inputs input_ids, attention_mask, position_ids and past_key_values.{i}.key / .value with a
dynamic sequence axis; outputs logits and present.{i}.key / .value. The files are written where asked, not
committed (tests/generate/ makes them in a temporary folder). Needs the [torch] extra (torch, transformers).
"""

from __future__ import annotations

import os
import sys
from typing import Any

MODELS = ("llama_tiny", "gpt2_tiny")
EXPORTERS = ("dynamo", "torchscript")


def build(name: str) -> Any:
    """The transformers model (eval mode, seeded random weights)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if name == "llama_tiny":  # GQA (4 heads, 2 KV heads), RoPE, RMSNorm, SwiGLU
        config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                             initializer_range=0.1)
        return LlamaForCausalLM(config).eval()
    if name == "gpt2_tiny":  # learned positions, LayerNorm, GELU, fused QKV (Conv1D)
        config = GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=256, initializer_range=0.2,
                            bos_token_id=0, eos_token_id=0)
        return GPT2LMHeadModel(config).eval()
    raise ValueError(f"no decoder {name!r}: one of {', '.join(MODELS)}")


def export(name: str, directory: str, exporter: str = "dynamo") -> str:
    """Export decoder `name` into `directory`; returns the .onnx path."""
    import torch
    from transformers import DynamicCache

    model = build(name)
    layers = model.config.num_hidden_layers
    heads = getattr(model.config, "num_key_value_heads", None) or model.config.num_attention_heads
    head_size = model.config.hidden_size // model.config.num_attention_heads

    class WithFlatCache(torch.nn.Module):
        """The model with its cache as tensors in and out, as optimum exports it."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, past: list[Any]) -> Any:
            cache = DynamicCache(config=self.model.config)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
            present = [t for i in range(layers) for t in (out.past_key_values.layers[i].keys,
                                                          out.past_key_values.layers[i].values)]
            return (out.logits, *present)

    past_len, new = 3, 2
    past = [torch.randn(1, heads, past_len, head_size) for _ in range(2 * layers)]
    args = (torch.randint(0, model.config.vocab_size, (1, new)), torch.ones(1, past_len + new, dtype=torch.int64),
            torch.arange(past_len, past_len + new)[None], past)
    names = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    kw = dict(input_names=["input_ids", "attention_mask", "position_ids", *names],
              output_names=["logits", *(n.replace("past_key_values", "present") for n in names)])
    path = os.path.join(directory, f"{name}.onnx")
    if exporter == "dynamo":
        dim = torch.export.Dim.DYNAMIC
        torch.onnx.export(WithFlatCache().eval(), args, path, dynamo=True, verbose=False,
                          dynamic_shapes=({1: dim}, {1: dim}, {1: dim}, [{2: dim} for _ in past]), **kw)
    elif exporter == "torchscript":
        axes = {"input_ids": {1: "tokens"}, "attention_mask": {1: "total"}, "position_ids": {1: "tokens"},
                **{n: {2: "past"} for n in names}}
        torch.onnx.export(WithFlatCache().eval(), args, path, dynamo=False, opset_version=17, dynamic_axes=axes, **kw)
    else:
        raise ValueError(f"exporter {exporter!r}: one of {', '.join(EXPORTERS)}")
    return path


def greedy_reference(name: str, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The tokens transformers' own greedy `generate` gives after `prompt`."""
    import torch

    model = build(name)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python models/decoders.py OUT_DIR")
    os.makedirs(sys.argv[1], exist_ok=True)
    for decoder in MODELS:
        print(export(decoder, sys.argv[1]))
