"""A Llama-3 decoder as ONNX, exported with its KV cache in the layout transformers/optimum users have, at any size:
with random weights (small configs, to check the numbers) or with its weights declared and not present (each
initializer its shape and type, no data: Llama-3-8B and 70B, to compile and time from their shapes alone).

    python models/llama_shapes.py OUT.onnx --config llama3-8b [--layers 2] [--pad-for 24]
    from llama_shapes import CONFIGS, build;  onnx.save(build(CONFIGS["llama3-8b"]), "llama.onnx")

The graph is what transformers' LlamaForCausalLM computes (and what its exports contain, op for op):
    h = embed[input_ids]
    per layer:  x = RMSNorm(h) * w_in;   q, k, v = x Wq, x Wk, x Wv  (heads H, key/value heads KV: grouped-query)
                q, k = RoPE(q, k at position_ids)   (theta 500,000: rotate_half, cos and sin of position x inv_freq)
                k, v = concat(past, k / v)          -> present.{i}.key / .value
                a = softmax(q k^T / sqrt(d) + causal and padding mask) v   (each key/value head serves H/KV heads)
                h = h + a Wo;   x = RMSNorm(h) * w_post;   h = h + (silu(x Wgate) * x Wup) Wdown
    logits = RMSNorm(h) * w_final @ lm_head
Inputs input_ids [batch, seq], attention_mask [batch, past + seq], position_ids [batch, seq],
past_key_values.{i}.key / .value [batch, KV, past, d]; outputs logits and present.{i}.key / .value.

The configurations are the published model cards' (meta-llama/Meta-Llama-3-8B and -70B config.json): hidden size,
heads, key/value heads, intermediate size, layers, vocabulary, rope_theta, rms_norm_eps. `pad_for=N` pads the heads
and the intermediate size to multiples that N ranks can cut, as AWS's NxD Inference does for inf2's 24 ranks: query
heads become H' (a multiple of N and of KV, the added heads' weights zero, placed inside each key/value group so that
the grouping is kept) and intermediate columns I' (zero columns of gate and up, zero rows of down). The function is
the same; the padded weights still take HBM and bandwidth, as they do on the device.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper


@dataclass(frozen=True)
class LlamaConfig:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    layers: int
    vocabulary: int
    head_size: int = 128
    rope_theta: float = 500000.0
    eps: float = 1e-5

    def padded_for(self, ranks: int) -> LlamaConfig:
        """Heads and intermediate size padded so that `ranks` ranks can cut them (module docstring)."""
        heads = self.heads
        while heads % ranks or heads % self.kv_heads:
            heads += 1
        intermediate = -(-self.intermediate // ranks) * ranks
        return replace(self, name=f"{self.name}-pad{ranks}", heads=heads, intermediate=intermediate)

    @property
    def parameters(self) -> int:
        d = self.head_size
        attention = self.hidden * d * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attention + mlp + 2 * self.hidden) + 2 * self.vocabulary * self.hidden + self.hidden


# The model cards' config.json (meta-llama/Meta-Llama-3-8B, Meta-Llama-3-70B; Llama 3.1 has the same shapes)
CONFIGS = {
    "llama3-8b": LlamaConfig("llama3-8b", hidden=4096, heads=32, kv_heads=8, intermediate=14336, layers=32,
                             vocabulary=128256),
    "llama3-70b": LlamaConfig("llama3-70b", hidden=8192, heads=64, kv_heads=8, intermediate=28672, layers=80,
                              vocabulary=128256),
    # small enough to run with values and check against onnxruntime (the same graph)
    "llama3-tiny": LlamaConfig("llama3-tiny", hidden=64, heads=4, kv_heads=2, intermediate=128, layers=2,
                               vocabulary=128, head_size=16),
}


class _Graph:
    def __init__(self, dtype: int, declared: bool, seed: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.dtype, self.declared = dtype, declared
        self.np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def op(self, op: str, inputs: list[str], name: str, **attrs: Any) -> str:
        self.count += 1
        out = f"{name}.{self.count}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"/{name}/{op}_{self.count}", **attrs))
        return out

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(onnx.numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name: str, shape: tuple[int, ...], scale: float, zero: np.ndarray | None = None,
               ones: bool = False) -> str:
        """A weight: declared (its shape and type, no data), or seeded random values (`zero`: a mask of entries
        that are padding, set to 0; `ones`: a norm's weight, near 1)."""
        if self.declared:
            self.inits.append(TensorProto(name=name, data_type=self.dtype, dims=list(shape)))
            return name
        value = self.rng.standard_normal(shape).astype(np.float32) * scale + (1.0 if ones else 0.0)
        if zero is not None:
            value[zero] = 0
        return self.const(name, value.astype(self.np_dtype))


def _head_mask(config: LlamaConfig, real: LlamaConfig, axis_len: int, per_head: int) -> np.ndarray:
    """Which of the padded query heads' columns (or rows) are padding: in each key/value group, the last ones."""
    group, real_group = config.heads // config.kv_heads, real.heads // real.kv_heads
    head = np.arange(axis_len) // per_head
    return head % group >= real_group


def build(config: LlamaConfig, declared: bool = True, dtype: int = TensorProto.FLOAT, seed: int = 0,
          real: LlamaConfig | None = None) -> onnx.ModelProto:
    """The decoder (module docstring). `real`: the unpadded config when `config` is padded (the padding's weights
    are zero, so the function is the unpadded model's)."""
    real = real or config
    g = _Graph(dtype, declared, seed)
    H, KV, d, D = config.heads, config.kv_heads, config.head_size, config.hidden
    scale = 1.0 / math.sqrt(D)
    B, S, P, T = "batch", "seq", "past", "total"
    eps = g.const("eps", np.array(config.eps, g.np_dtype))
    two = g.const("two", np.array(2.0, g.np_dtype))
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    g.const("inv_freq", inv_freq.astype(np.float32).reshape(1, 1, d // 2))
    g.const("half_axes", np.array([3], np.int64))
    g.const("q_shape", np.array([1, -1, H, d], np.int64))
    g.const("kv_shape", np.array([1, -1, KV, d], np.int64))
    g.const("flat_shape", np.array([1, -1, H * d], np.int64))
    g.const("gqa_shape", np.array([1, H, -1, d], np.int64))
    g.const("gqa_expand", np.array([1, KV, H // KV, 1, 1], np.int64))
    g.const("starts_lo", np.array([0], np.int64))
    g.const("ends_lo", np.array([d // 2], np.int64))
    g.const("ends_hi", np.array([d], np.int64))
    g.const("axis2", np.array([2], np.int64))
    g.const("axis1", np.array([1], np.int64))
    g.const("minus_one", np.array([-1], np.int64))
    g.const("lowest", np.array(np.finfo(np.float32).min, g.np_dtype))
    g.const("zero", np.array(0, g.np_dtype))
    g.const("scale", np.array(1.0 / math.sqrt(d), g.np_dtype))

    def rms(x: str, w: str, name: str) -> str:
        var = g.op("ReduceMean", [g.op("Pow", [x, two], name), "minus_one"], name, keepdims=1)
        inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [var, eps], name)], name)], name)
        return g.op("Mul", [g.op("Mul", [x, inv], name), w], name)

    def rope(x: str, cos: str, sin: str, name: str) -> str:
        lo = g.op("Slice", [x, "starts_lo", "ends_lo", "half_axes"], name)
        hi = g.op("Slice", [x, "ends_lo", "ends_hi", "half_axes"], name)
        rotated = g.op("Concat", [g.op("Neg", [hi], name), lo], name, axis=-1)
        return g.op("Add", [g.op("Mul", [x, cos], name), g.op("Mul", [rotated, sin], name)], name)

    # positions -> cos, sin [1, 1, S, d]
    pos = g.op("Cast", [g.op("Unsqueeze", ["position_ids", "minus_one"], "rope")], "rope", to=TensorProto.FLOAT)
    freqs = g.op("Mul", [pos, "inv_freq"], "rope")
    emb = g.op("Concat", [freqs, freqs], "rope", axis=-1)
    cos = g.op("Unsqueeze", [g.op("Cast", [g.op("Cos", [emb], "rope")], "rope", to=dtype), "axis1"], "rope")
    sin = g.op("Unsqueeze", [g.op("Cast", [g.op("Sin", [emb], "rope")], "rope", to=dtype), "axis1"], "rope")
    # the mask [1, 1, S, T]: key j is seen by query i when j <= past + i and attention_mask[j] is 1
    total = g.op("Shape", ["attention_mask"], "mask", start=1, end=2)
    seq = g.op("Shape", ["input_ids"], "mask", start=1, end=2)
    keys = g.op("Range", [g.const("r0", np.array(0, np.int64)), g.op("Squeeze", [total], "mask"),
                          g.const("r1", np.array(1, np.int64))], "mask")
    past_len = g.op("Sub", [total, seq], "mask")
    queries = g.op("Add", [g.op("Range", [g.const("q0", np.array(0, np.int64)), g.op("Squeeze", [seq], "mask"),
                                          g.const("q1", np.array(1, np.int64))], "mask"), past_len], "mask")
    causal = g.op("LessOrEqual", [keys, g.op("Unsqueeze", [queries, "minus_one"], "mask")], "mask")
    padding = g.op("Cast", [g.op("Unsqueeze", ["attention_mask", "axis1"], "mask")], "mask", to=TensorProto.BOOL)
    seen = g.op("And", [causal, padding], "mask")
    mask = g.op("Unsqueeze", [g.op("Where", [seen, "zero", "lowest"], "mask"), "axis1"], "mask")

    h = g.op("Gather", [g.weight("embed_tokens.weight", (config.vocabulary, D), 1.0), "input_ids"], "embed")
    outputs = []
    for i in range(config.layers):
        n = f"layers.{i}"
        q_pad = _head_mask(config, real, H * d, d) if config is not real else None
        x = rms(h, g.weight(f"{n}.input_layernorm.weight", (D,), 0.1, ones=True), f"{n}/input_layernorm")
        q = g.op("MatMul", [x, g.weight(f"{n}.q_proj.weight", (D, H * d), scale,
                                        None if q_pad is None else np.s_[:, q_pad])], f"{n}/q_proj")
        k = g.op("MatMul", [x, g.weight(f"{n}.k_proj.weight", (D, KV * d), scale)], f"{n}/k_proj")
        v = g.op("MatMul", [x, g.weight(f"{n}.v_proj.weight", (D, KV * d), scale)], f"{n}/v_proj")
        q = g.op("Transpose", [g.op("Reshape", [q, "q_shape"], n)], n, perm=[0, 2, 1, 3])
        k = g.op("Transpose", [g.op("Reshape", [k, "kv_shape"], n)], n, perm=[0, 2, 1, 3])
        v = g.op("Transpose", [g.op("Reshape", [v, "kv_shape"], n)], n, perm=[0, 2, 1, 3])
        q, k = rope(q, cos, sin, f"{n}/rope_q"), rope(k, cos, sin, f"{n}/rope_k")
        key, value = f"present.{i}.key", f"present.{i}.value"
        g.nodes.append(helper.make_node("Concat", [f"past_key_values.{i}.key", k], [key], axis=2, name=f"/{n}/cat_k"))
        g.nodes.append(helper.make_node("Concat", [f"past_key_values.{i}.value", v], [value], axis=2,
                                        name=f"/{n}/cat_v"))
        outputs += [key, value]

        def grouped(t: str) -> str:  # [1, KV, T, d] -> [1, H, T, d]: each key/value head serves H / KV heads
            wide = g.op("Expand", [g.op("Unsqueeze", [t, "axis2"], n), "gqa_expand"], n)
            return g.op("Reshape", [wide, "gqa_shape"], n)

        scores = g.op("MatMul", [q, g.op("Transpose", [grouped(key)], n, perm=[0, 1, 3, 2])], f"{n}/attn")
        scores = g.op("Add", [g.op("Mul", [scores, "scale"], f"{n}/attn"), mask], f"{n}/attn")
        probs = g.op("Softmax", [scores], f"{n}/attn", axis=-1)
        a = g.op("MatMul", [probs, grouped(value)], f"{n}/attn")
        a = g.op("Reshape", [g.op("Transpose", [a], n, perm=[0, 2, 1, 3]), "flat_shape"], n)
        h = g.op("Add", [h, g.op("MatMul", [a, g.weight(f"{n}.o_proj.weight", (H * d, D), scale,
                                                        None if q_pad is None else np.s_[q_pad, :])],
                                 f"{n}/o_proj")], n)
        x = rms(h, g.weight(f"{n}.post_attention_layernorm.weight", (D,), 0.1, ones=True),
                f"{n}/post_attention_layernorm")
        i_pad = np.arange(config.intermediate) >= real.intermediate if config is not real else None
        gate = g.op("MatMul", [x, g.weight(f"{n}.gate_proj.weight", (D, config.intermediate), scale,
                                           None if i_pad is None else np.s_[:, i_pad])], f"{n}/mlp")
        up = g.op("MatMul", [x, g.weight(f"{n}.up_proj.weight", (D, config.intermediate), scale,
                                         None if i_pad is None else np.s_[:, i_pad])], f"{n}/mlp")
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{n}/mlp")], f"{n}/mlp"), up], f"{n}/mlp")
        h = g.op("Add", [h, g.op("MatMul", [act, g.weight(f"{n}.down_proj.weight", (config.intermediate, D),
                                                          1.0 / math.sqrt(config.intermediate),
                                                          None if i_pad is None else np.s_[i_pad, :])],
                                 f"{n}/mlp")], n)
    x = rms(h, g.weight("norm.weight", (D,), 0.1, ones=True), "norm")
    g.nodes.append(helper.make_node("MatMul", [x, g.weight("lm_head.weight", (D, config.vocabulary), scale)],
                                    ["logits"], name="/lm_head/MatMul"))
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [B, S]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [B, T]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, [B, S])]
    for i in range(config.layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", dtype, [B, KV, P, d]))
    outs = [helper.make_tensor_value_info("logits", dtype, [B, S, config.vocabulary])]
    outs += [helper.make_tensor_value_info(o, dtype, [B, KV, T, d]) for o in outputs]
    graph = helper.make_graph(g.nodes, config.name, inputs, outs, g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="llama_shapes")


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("output", metavar="OUT.onnx")
    p.add_argument("--config", choices=sorted(CONFIGS), default="llama3-8b")
    p.add_argument("--layers", type=int, help="fewer layers than the model card's")
    p.add_argument("--pad-for", type=int, metavar="N", help="pad heads and intermediate size for N ranks")
    p.add_argument("--random", action="store_true", help="seeded random weights instead of declared ones")
    args = p.parse_args(argv)
    config = CONFIGS[args.config]
    if args.layers:
        config = replace(config, layers=args.layers)
    real = config
    if args.pad_for:
        config = config.padded_for(args.pad_for)
    onnx.save(build(config, declared=not args.random, real=real), args.output)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
