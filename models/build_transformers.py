"""Build the example transformers in models/ (seeded random weights, no downloads).

    python models/build_transformers.py    # writes models/{bert,gpt}_{legacy,modern}.onnx

Each model comes in two forms, the way two generations of exporters write the same network:

- LEGACY (opset 13, as torch.onnx.export of the TorchScript era gives it): LayerNorm decomposed into
  ReduceMean, Sub, Pow(2), ReduceMean, Add(eps), Sqrt, Div, Mul(gamma), Add(beta); GELU written out with Erf
  (BERT) or Tanh (GPT-2's NewGELU); every reshape target computed at run time, Shape -> Gather -> Unsqueeze ->
  Concat -> Reshape, and small scalars as Constant nodes, so a compiler has shape arithmetic to fold.
- MODERN (opset 20): LayerNormalization and Gelu ops, constant reshape shapes as initializers.

- bert_{legacy,modern}: a BERT encoder. Inputs input_ids int64 [2,16] (token ids in [0,100)) and
  attention_mask int64 [2,16] (1 = token, 0 = padding). Word embeddings [100,64] (Gather), position embeddings
  [32,64] (legacy: Gather of the position_ids buffer sliced to the sequence length; modern: the table sliced
  with constant bounds and added), token-type row 0 added as a constant, LayerNorm; the padding mask as
  transformers makes it: Unsqueeze twice to [B,1,1,S], Cast, 1.0 - mask, times -10000.0 (legacy) or the float32
  minimum (modern); two post-LN encoder layers (4 heads of 16, Q/K/V MatMul + Add, scores / sqrt(16) + mask,
  Softmax, FFN 64 -> 128 -> 64 with GELU); outputs last_hidden_state float32 [2,16,64] and pooler_output
  float32 [2,64] (token 0, Gemm, Tanh).
- gpt_{legacy,modern}: one GPT-2 decoder block, pre-LN. Input hidden float32 [1,32,64]; c_attn to Q, K, V
  (Split), 4 heads of 16, causal mask (legacy: the bool lower-triangular buffer h.0.attn.bias [1,1,64,64]
  sliced with Slice to [key_length - query_length : key_length, :key_length]; modern: Trilu of a
  ConstantOfShape of ones), Where(mask, scores, float32 min), Softmax, c_proj, residual; LayerNorm, MLP
  64 -> 256 -> 64 with GELU in the tanh form (legacy written out with Pow and Tanh, modern
  Gelu(approximate="tanh")), residual; output out float32 [1,32,64]. The legacy form writes GPT-2's Conv1D as
  torch exports addmm: Reshape to [-1, in] (shape computed), Gemm, Reshape back (shape computed).

Weights: embeddings normal * 0.02 (BERT / GPT-2 init); projection weights normal / sqrt(fan_in), so that
attention is neither uniform nor one-hot and GELU sees O(1) inputs; biases normal * 0.02; LayerNorm gamma
1 + 0.1 * normal, beta 0.05 * normal. MatMul weights are stored [in, out], as torch.onnx folds the transposed
nn.Linear weight (and as GPT-2's Conv1D keeps it). Node and tensor names follow torch.onnx:
"/encoder/layer.0/attention/self/query/MatMul" producing "/encoder/layer.0/attention/self/query/MatMul_output_0".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import save

LEGACY_OPSET, MODERN_OPSET = 13, 20
FLOAT32_MIN = float(np.finfo(np.float32).min)



@dataclass(frozen=True)
class Sizes:
    """The sizes of a model; the defaults are those of the models in models/ (GPT: batch 1, its own seq/ffn)."""

    batch: int = 2
    seq: int = 16
    vocab: int = 100
    max_pos: int = 32
    hidden: int = 64
    heads: int = 4
    ffn: int = 128
    layers: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


GPT_SIZES = Sizes(batch=1, seq=32, max_pos=64, ffn=256, layers=1)


class _Graph:
    """Nodes named the way torch.onnx names them: "<scope>/<Op>", then "<scope>/<Op>_1", ...; outputs
    "<node name>_output_<i>" unless given. Small constants are Constant nodes in the legacy form and
    initializers (named as the Constant's output would be) in the modern one."""

    def __init__(self, legacy: bool, rng: np.random.Generator, sizes: Sizes) -> None:
        self.legacy, self.rng, self.sizes = legacy, rng, sizes
        self.nodes: list[onnx.NodeProto] = []
        self.weights: dict[str, np.ndarray] = {}
        self._seen: dict[str, int] = {}

    def _name(self, scope: str, op: str) -> str:
        base = f"{scope}/{op}"
        k = self._seen.get(base, 0)
        self._seen[base] = k + 1
        return base if k == 0 else f"{base}_{k}"

    def node(self, scope: str, op: str, inputs: list[str], outputs: list[str] | None = None, n_out: int = 1,
             **attrs) -> str | list[str]:
        name = self._name(scope, op)
        outs = outputs or [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def weight(self, name: str, value: np.ndarray) -> str:
        self.weights[name] = value
        return name

    def const(self, scope: str, value, dtype=np.int64) -> str:
        value = np.asarray(value, dtype=dtype)
        if self.legacy:
            return self.node(scope, "Constant", [], value=numpy_helper.from_array(value))
        return self.weight(f"{self._name(scope, 'Constant')}_output_0", value)

    # parameters, seeded in the order they are created
    def normal(self, name: str, shape: tuple[int, ...], std: float) -> str:
        return self.weight(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def dim(self, scope: str, x: str, axis: int) -> str:
        """x.size(axis) as a [1] int64 tensor: Shape -> Gather -> Unsqueeze."""
        shape = self.node(scope, "Shape", [x])
        d = self.node(scope, "Gather", [shape, self.const(scope, axis)], axis=0)
        return self.node(scope, "Unsqueeze", [d, self.const(scope, [0])])


def _model(name: str, g: _Graph, inputs: list, outputs: list) -> onnx.ModelProto:
    graph = helper.make_graph(g.nodes, name, inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in g.weights.items()])
    opset = LEGACY_OPSET if g.legacy else MODERN_OPSET
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="neuronx-cc-lite models/build_transformers.py")
    model.ir_version = 8 if g.legacy else 9
    onnx.checker.check_model(model, full_check=True)
    return model


def _linear(g: _Graph, scope: str, param: str, x: str, fan_in: int, fan_out: int) -> str:
    """nn.Linear on a [..., fan_in] activation: MatMul by the [in, out] weight, Add the bias."""
    w = g.normal(f"{param}.weight", (fan_in, fan_out), 1 / np.sqrt(fan_in))
    b = g.normal(f"{param}.bias", (fan_out,), 0.02)
    return g.node(scope, "Add", [g.node(scope, "MatMul", [x, w]), b])


def _conv1d(g: _Graph, scope: str, param: str, x: str, fan_in: int, fan_out: int) -> str:
    """GPT-2's Conv1D. Legacy: x.view(-1, in) -> addmm -> view(size()[:-1] + (out,)), both shapes computed;
    modern: MatMul + Add."""
    if not g.legacy:
        return _linear(g, scope, param, x, fan_in, fan_out)
    w = g.normal(f"{param}.weight", (fan_in, fan_out), 1 / np.sqrt(fan_in))
    b = g.normal(f"{param}.bias", (fan_out,), 0.02)
    size_out = g.node(scope, "Concat", [g.dim(scope, x, 0), g.dim(scope, x, 1), g.const(scope, [fan_out])], axis=0)
    flat = g.node(scope, "Concat", [g.const(scope, [-1]), g.dim(scope, x, 2)], axis=0)
    y = g.node(scope, "Gemm", [g.node(scope, "Reshape", [x, flat]), w, b], alpha=1.0, beta=1.0)
    return g.node(scope, "Reshape", [y, size_out])


def _layer_norm(g: _Graph, scope: str, param: str, x: str, eps: float, outputs: list[str] | None = None) -> str:
    hidden = g.sizes.hidden
    gamma = g.weight(f"{param}.weight", (1 + 0.1 * g.rng.standard_normal(hidden)).astype(np.float32))
    beta = g.normal(f"{param}.bias", (hidden,), 0.05)
    if not g.legacy:
        return g.node(scope, "LayerNormalization", [x, gamma, beta], outputs=outputs, axis=-1, epsilon=eps)
    mean = g.node(scope, "ReduceMean", [x], axes=[-1], keepdims=1)
    centered = g.node(scope, "Sub", [x, mean])
    var = g.node(scope, "ReduceMean", [g.node(scope, "Pow", [centered, g.const(scope, 2.0, np.float32)])],
                 axes=[-1], keepdims=1)
    std = g.node(scope, "Sqrt", [g.node(scope, "Add", [var, g.const(scope, eps, np.float32)])])
    y = g.node(scope, "Mul", [g.node(scope, "Div", [centered, std]), gamma])
    return g.node(scope, "Add", [y, beta], outputs=outputs)


def _split_heads(g: _Graph, scope: str, x: str) -> str:
    """[B,S,64] -> view [B,S,4,16] -> permute(0,2,1,3): [B,4,S,16]."""
    z = g.sizes
    if g.legacy:
        shape = g.node(scope, "Concat", [g.dim(scope, x, 0), g.dim(scope, x, 1), g.const(scope, [z.heads]),
                                         g.const(scope, [z.head_dim])], axis=0)
    else:
        shape = g.const(scope, [z.batch, z.seq, z.heads, z.head_dim])
    return g.node(scope, "Transpose", [g.node(scope, "Reshape", [x, shape])], perm=[0, 2, 1, 3])


def _merge_heads(g: _Graph, scope: str, x: str) -> str:
    """[B,4,S,16] -> permute(0,2,1,3) -> view [B,S,64]."""
    z = g.sizes
    x = g.node(scope, "Transpose", [x], perm=[0, 2, 1, 3])
    if g.legacy:
        shape = g.node(scope, "Concat", [g.dim(scope, x, 0), g.dim(scope, x, 1), g.const(scope, [z.hidden])],
                       axis=0)
    else:
        shape = g.const(scope, [z.batch, z.seq, z.hidden])
    return g.node(scope, "Reshape", [x, shape])


def _bert_gelu(g: _Graph, scope: str, x: str) -> str:
    if not g.legacy:
        return g.node(scope, "Gelu", [x], approximate="none")
    erf = g.node(scope, "Erf", [g.node(scope, "Div", [x, g.const(scope, 1.4142135381698608, np.float32)])])
    y = g.node(scope, "Mul", [x, g.node(scope, "Add", [erf, g.const(scope, 1.0, np.float32)])])
    return g.node(scope, "Mul", [y, g.const(scope, 0.5, np.float32)])


def _gpt_gelu(g: _Graph, scope: str, x: str) -> str:
    """NewGELU: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))."""
    if not g.legacy:
        return g.node(scope, "Gelu", [x], approximate="tanh")
    half = g.node(scope, "Mul", [x, g.const(scope, 0.5, np.float32)])
    cube = g.node(scope, "Pow", [x, g.const(scope, 3.0, np.float32)])
    inner = g.node(scope, "Add", [x, g.node(scope, "Mul", [cube, g.const(scope, 0.044715, np.float32)])])
    t = g.node(scope, "Tanh", [g.node(scope, "Mul", [inner, g.const(scope, np.sqrt(2 / np.pi), np.float32)])])
    return g.node(scope, "Mul", [half, g.node(scope, "Add", [t, g.const(scope, 1.0, np.float32)])])


def bert(legacy: bool, seed: int = 20, sizes: Sizes = Sizes()) -> onnx.ModelProto:
    g = _Graph(legacy, np.random.default_rng(seed), sizes)
    z = sizes
    hidden, ffn = z.hidden, z.ffn
    eps = 1e-12
    # embeddings: word + token type 0 + position, LayerNorm
    e = "/embeddings"
    h = g.node(f"{e}/word_embeddings", "Gather",
               [g.normal("embeddings.word_embeddings.weight", (z.vocab, hidden), 0.02), "input_ids"], axis=0)
    h = g.node(e, "Add", [h, g.normal("embeddings.token_type_embeddings.row0", (hidden,), 0.02)])
    table = g.normal("embeddings.position_embeddings.weight", (z.max_pos, hidden), 0.02)
    if legacy:
        ids = g.weight("embeddings.position_ids", np.arange(z.max_pos, dtype=np.int64)[None])
        ids = g.node(e, "Slice", [ids, g.const(e, [0]), g.dim(e, "input_ids", 1), g.const(e, [1]), g.const(e, [1])])
        pos = g.node(f"{e}/position_embeddings", "Gather", [table, ids], axis=0)          # [1,S,64]
    else:
        pos = g.node(f"{e}/position_embeddings", "Slice", [table, g.const(e, [0]), g.const(e, [z.seq]),
                                                           g.const(e, [0])])              # [S,64]
    h = g.node(e, "Add", [h, pos])
    h = _layer_norm(g, f"{e}/LayerNorm", "embeddings.LayerNorm", h, eps)
    # extended attention mask [B,1,1,S]: (1.0 - mask) * big negative
    m = g.node("", "Unsqueeze", ["attention_mask", g.const("", [1])])
    m = g.node("", "Unsqueeze", [m, g.const("", [2])])
    m = g.node("", "Cast", [m], to=TensorProto.FLOAT)
    m = g.node("", "Sub", [g.const("", 1.0, np.float32), m])
    mask = g.node("", "Mul", [m, g.const("", -10000.0 if legacy else FLOAT32_MIN, np.float32)])
    for i in range(z.layers):
        s, p = f"/encoder/layer.{i}", f"encoder.layer.{i}"
        a = f"{s}/attention/self"
        q = _split_heads(g, a, _linear(g, f"{a}/query", f"{p}.attention.self.query", h, hidden, hidden))
        k = _split_heads(g, a, _linear(g, f"{a}/key", f"{p}.attention.self.key", h, hidden, hidden))
        v = _split_heads(g, a, _linear(g, f"{a}/value", f"{p}.attention.self.value", h, hidden, hidden))
        scores = g.node(a, "MatMul", [q, g.node(a, "Transpose", [k], perm=[0, 1, 3, 2])])
        scores = g.node(a, "Div", [scores, g.const(a, np.sqrt(z.head_dim), np.float32)])
        probs = g.node(a, "Softmax", [g.node(a, "Add", [scores, mask])], axis=-1)
        ctx = _merge_heads(g, a, g.node(a, "MatMul", [probs, v]))
        o = f"{s}/attention/output"
        y = _linear(g, f"{o}/dense", f"{p}.attention.output.dense", ctx, hidden, hidden)
        h = _layer_norm(g, f"{o}/LayerNorm", f"{p}.attention.output.LayerNorm", g.node(o, "Add", [y, h]), eps)
        y = _linear(g, f"{s}/intermediate/dense", f"{p}.intermediate.dense", h, hidden, ffn)
        y = _bert_gelu(g, f"{s}/intermediate/intermediate_act_fn", y)
        y = _linear(g, f"{s}/output/dense", f"{p}.output.dense", y, ffn, hidden)
        h = _layer_norm(g, f"{s}/output/LayerNorm", f"{p}.output.LayerNorm", g.node(f"{s}/output", "Add", [y, h]),
                        eps, outputs=["last_hidden_state"] if i == z.layers - 1 else None)
    # pooler: tanh(dense(hidden[:, 0]))
    first = g.node("/pooler", "Gather", [h, g.const("/pooler", 0)], axis=1)
    w = g.normal("pooler.dense.weight", (hidden, hidden), 1 / np.sqrt(hidden))
    b = g.normal("pooler.dense.bias", (hidden,), 0.02)
    y = g.node("/pooler/dense", "Gemm", [first, w, b], alpha=1.0, beta=1.0, transB=1)
    g.node("/pooler/activation", "Tanh", [y], outputs=["pooler_output"])
    info = helper.make_tensor_value_info
    return _model(f"bert_{'legacy' if legacy else 'modern'}", g,
                  [info("input_ids", TensorProto.INT64, [z.batch, z.seq]),
                   info("attention_mask", TensorProto.INT64, [z.batch, z.seq])],
                  [info("last_hidden_state", TensorProto.FLOAT, [z.batch, z.seq, hidden]),
                   info("pooler_output", TensorProto.FLOAT, [z.batch, hidden])])


def _causal_mask(g: _Graph, scope: str, q: str, k: str) -> str:
    """A bool mask, True where a query may attend to a key, broadcastable to the [B,4,S,S] scores."""
    if not g.legacy:
        ones = g.node(scope, "ConstantOfShape", [g.const(scope, [g.sizes.seq, g.sizes.seq])],
                      value=numpy_helper.from_array(np.array([True])))
        return g.node(scope, "Trilu", [ones], upper=0)
    bias = g.weight("h.0.attn.bias", np.tril(np.ones((g.sizes.max_pos, g.sizes.max_pos), dtype=bool))[None, None])
    q_len = g.node(scope, "Gather", [g.node(scope, "Shape", [q]), g.const(scope, 2)], axis=0)
    k_len = g.node(scope, "Gather", [g.node(scope, "Shape", [k]), g.const(scope, 2)], axis=0)
    start = g.node(scope, "Unsqueeze", [g.node(scope, "Sub", [k_len, q_len]), g.const(scope, [0])])
    end = g.node(scope, "Unsqueeze", [k_len, g.const(scope, [0])])
    rows = g.node(scope, "Slice", [bias, start, end, g.const(scope, [2]), g.const(scope, [1])])
    return g.node(scope, "Slice", [rows, g.const(scope, [0]), end, g.const(scope, [3]), g.const(scope, [1])])


def gpt(legacy: bool, seed: int = 30, sizes: Sizes = GPT_SIZES) -> onnx.ModelProto:
    g = _Graph(legacy, np.random.default_rng(seed), sizes)
    z = sizes
    hidden = z.hidden
    eps = 1e-5
    s, a = "/h.0", "/h.0/attn"
    x = _layer_norm(g, f"{s}/ln_1", "h.0.ln_1", "hidden", eps)
    qkv = _conv1d(g, f"{a}/c_attn", "h.0.attn.c_attn", x, hidden, 3 * hidden)
    if legacy:
        q, k, v = g.node(a, "Split", [qkv, g.const(a, [hidden] * 3)], n_out=3, axis=2)
    else:
        q, k, v = g.node(a, "Split", [qkv], n_out=3, axis=2, num_outputs=3)
    q, k, v = (_split_heads(g, a, t) for t in (q, k, v))
    scores = g.node(a, "MatMul", [q, g.node(a, "Transpose", [k], perm=[0, 1, 3, 2])])
    if legacy:  # attn_weights / torch.full([], value.size(-1) ** 0.5)
        d = g.node(a, "Gather", [g.node(a, "Shape", [v]), g.const(a, 3)], axis=0)
        d = g.node(a, "Pow", [g.node(a, "Cast", [d], to=TensorProto.FLOAT), g.const(a, 0.5, np.float32)])
    else:
        d = g.const(a, np.sqrt(z.head_dim), np.float32)
    scores = g.node(a, "Div", [scores, d])
    scores = g.node(a, "Where", [_causal_mask(g, a, q, k), scores, g.const(a, FLOAT32_MIN, np.float32)])
    probs = g.node(a, "Softmax", [scores], axis=-1)
    ctx = _merge_heads(g, a, g.node(a, "MatMul", [probs, v]))
    h = g.node(s, "Add", [_conv1d(g, f"{a}/c_proj", "h.0.attn.c_proj", ctx, hidden, hidden), "hidden"])
    y = _layer_norm(g, f"{s}/ln_2", "h.0.ln_2", h, eps)
    y = _conv1d(g, f"{s}/mlp/c_fc", "h.0.mlp.c_fc", y, hidden, z.ffn)
    y = _gpt_gelu(g, f"{s}/mlp/act", y)
    y = _conv1d(g, f"{s}/mlp/c_proj", "h.0.mlp.c_proj", y, z.ffn, hidden)
    g.node(s, "Add", [y, h], outputs=["out"])
    info = helper.make_tensor_value_info
    return _model(f"gpt_{'legacy' if legacy else 'modern'}", g,
                  [info("hidden", TensorProto.FLOAT, [z.batch, z.seq, hidden])],
                  [info("out", TensorProto.FLOAT, [z.batch, z.seq, hidden])])


def build() -> dict[str, onnx.ModelProto]:
    return {
        "bert_legacy": bert(legacy=True),
        "bert_modern": bert(legacy=False),
        "gpt_legacy": gpt(legacy=True),
        "gpt_modern": gpt(legacy=False),
    }


def main() -> None:
    save(build())


if __name__ == "__main__":
    main()
