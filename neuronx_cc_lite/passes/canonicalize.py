"""Canonicalise what older exporters emit into single operations that lower well:

- the decomposed LayerNorm of torch.onnx before opset 17,
      ReduceMean, Sub, Pow(2), ReduceMean, Add(eps), Sqrt, Div, [Mul(gamma)], [Add(beta)]
  -> LayerNormalization (one pass over each row, statistics in partition columns, instead of nine HBM round trips);
- GELU written out with Erf, 0.5 * x * (1 + Erf(x / sqrt(2))) -> Gelu;
- GELU written out with Tanh, 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) -> Gelu(approximate="tanh");
- the RMSNorm of Llama-style models as torch.onnx writes it,
      Pow(2), ReduceMean, Add(eps), Sqrt, Reciprocal or Div(1, .), Mul(x), [Mul(weight)]   (or Div(x, Sqrt) for
      the last two)
  -> RMSNormalization (opset 23's op: one pass over each row, as LayerNormalization);
- GroupNorm as torch.onnx writes it (both exporters),
      Reshape(x, [N, G, -1]), InstanceNormalization(scale [G], bias [G]), Reshape(back to x's shape),
      [Mul(gamma [C, 1, ...])], [Add(beta [C, 1, ...])]
  -> GroupNormalization (opset 21's op: scale and bias per channel; each group's statistics over all its channels
     in one pass, instead of G rows of C/G * H * W elements read piece by piece);
- a GroupNormalization followed by SiLU (x * Sigmoid(x)), Relu, Sigmoid or Tanh, as a diffusion UNet's ResNet
  block has it -> GroupNormActivation (the compiler's own op): ScalarE applies the function to each tile as the
  normalisation leaves it, instead of two more passes over the tensor;
- a 2D convolution whose stride is its kernel (a ViT's patch embedding: non-overlapping patches, no padding)
  -> PatchEmbedding (the compiler's own op: a row per patch, lower/patches.py contracting over channels and kernel
     rows with the image's rows loaded whole), then Reshape and Transpose back to the convolution's layout: a
     token-major result, as the transformer after it reads it, instead of a convolution of 16x16 taps;
- SiLU as the exporters write it, x * Sigmoid(x) -> Silu (the compiler's own op: ScalarE's silu, one pass where
  there were two; and a function a matmul's or a convolution's evacuation applies, passes/fuse_epilogues.py: an
  EfficientNet's convolutions, a Llama MLP's gate projection);
- an AveragePool or MaxPool with one window over the whole input (no padding; ceil_mode lets the window run past
  the end, as transformers' EfficientNet pools its [1280, 7, 7] features with AvgPool2d(1280, ceil_mode=True))
  -> GlobalAveragePool or GlobalMaxPool, which onnxruntime computes it as (a window past the input counts only the
     input); the pooling lowering would refuse a window larger than its input.

A pattern is rewritten (into one node, or a few) only when every intermediate value it swallows has no other use,
so the rewrite never changes what the rest of the graph sees. The nodes left without users are removed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from neuronx_cc_lite.ir import Graph, Node, Tensor
from neuronx_cc_lite.ops.registry import INTERNAL_DOMAIN

# Single-input activations a GroupNormalization takes on (besides SiLU, written as x * Sigmoid(x))
GROUP_NORM_ACTIVATIONS = ("Relu", "Sigmoid", "Tanh")


@dataclass
class _Matcher:
    g: Graph
    producers: dict[str, Node]
    users: dict[str, list[Node]]

    def const(self, name: str) -> float | None:
        t = self.g.tensors.get(name)
        if t is None or not t.is_constant or t.value.size != 1 or t.value.dtype.kind not in "fiu":
            return None
        return float(t.value.reshape(-1)[0])

    def is_const(self, name: str, value: float, rel: float = 1e-5) -> bool:
        v = self.const(name)
        return v is not None and math.isclose(v, value, rel_tol=rel)

    def only_used_by(self, name: str, *nodes: Node) -> bool:
        if name in self.g.outputs:
            return False
        return all(any(u is n for n in nodes) for u in self.users.get(name, []))

    def node(self, name: str, op: str) -> Node | None:
        n = self.producers.get(name)
        return n if n is not None and n.op == op else None

    def user(self, name: str, op: str) -> Node | None:
        found = [u for u in self.users.get(name, []) if u.op == op]
        return found[0] if len(found) == 1 else None


def _other(node: Node, name: str) -> str | None:
    """The other input of a binary node, given one."""
    a, b = node.inputs[:2]
    return b if a == name else a if b == name else None


def _times_half_x(m: _Matcher, x: str, gate: str) -> tuple[Node, list[Node]] | None:
    """0.5 * x * gate in any association: returns the final Mul and the Muls the pattern consumes."""
    for outer in [u for u in m.users.get(gate, []) if u.op == "Mul"]:
        other = _other(outer, gate)
        if other == x:  # (x * gate) * 0.5
            final = m.user(outer.outputs[0], "Mul")
            if final is not None and m.is_const(_other(final, outer.outputs[0]) or "", 0.5):
                return final, [outer]
        elif other is not None and m.is_const(other, 0.5):  # x * (gate * 0.5)
            final = m.user(outer.outputs[0], "Mul")
            if final is not None and _other(final, outer.outputs[0]) == x:
                return final, [outer]
        elif other is not None and (half := m.node(other, "Mul")) is not None:  # (x * 0.5) * gate
            if x in half.inputs and m.is_const(_other(half, x) or "", 0.5):
                return outer, [half]
    return None


def _gelu_tail(m: _Matcher, x: str, function: Node) -> tuple[Node, list[Node]] | None:
    """0.5 * x * (1 + function(...)): the Add of 1, the multiplications, and the final node."""
    plus = m.user(function.outputs[0], "Add")
    if plus is None or not m.is_const(_other(plus, function.outputs[0]) or "", 1.0):
        return None
    tail = _times_half_x(m, x, plus.outputs[0])
    if tail is None:
        return None
    final, muls = tail
    return final, [plus, *muls, final]


def _gelu_erf(m: _Matcher, erf: Node) -> tuple[Node, list[Node]] | None:
    scaled = erf.inputs[0]
    div, mul = m.node(scaled, "Div"), m.node(scaled, "Mul")
    if div is not None and m.is_const(div.inputs[1], math.sqrt(2)):
        x, first = div.inputs[0], div
    elif mul is not None:
        x = next((i for i in mul.inputs if not m.is_const(i, 1 / math.sqrt(2))), None)
        if x is None or not m.is_const(_other(mul, x) or "", 1 / math.sqrt(2)):
            return None
        first = mul
    else:
        return None
    tail = _gelu_tail(m, x, erf)
    if tail is None:
        return None
    final, rest = tail
    return Node("Gelu", final.name, [x], list(final.outputs)), [first, erf, *rest]


def _gelu_tanh(m: _Matcher, tanh: Node) -> tuple[Node, list[Node]] | None:
    k = m.node(tanh.inputs[0], "Mul")
    if k is None:
        return None
    inner = next((i for i in k.inputs if not m.is_const(i, math.sqrt(2 / math.pi))), None)
    s = m.node(inner or "", "Add")
    if s is None or not m.is_const(_other(k, inner) or "", math.sqrt(2 / math.pi), 1e-4):
        return None
    for x in s.inputs:
        cubic_term = m.node(_other(s, x) or "", "Mul")
        if cubic_term is None:
            continue
        cube_name = next((i for i in cubic_term.inputs if not m.is_const(i, 0.044715)), "")
        if not m.is_const(_other(cubic_term, cube_name) or "", 0.044715):
            continue
        cube = m.node(cube_name, "Pow")
        if cube is None or cube.inputs[0] != x or not m.is_const(cube.inputs[1], 3.0):
            continue
        tail = _gelu_tail(m, x, tanh)
        if tail is None:
            return None
        final, rest = tail
        return (Node("Gelu", final.name, [x], list(final.outputs), {"approximate": "tanh"}),
                [cube, cubic_term, s, k, tanh, *rest])
    return None


def _trailing_axes(m: _Matcher, node: Node, rank: int) -> tuple[int, ...] | None:
    if len(node.inputs) > 1 and node.inputs[1]:
        t = m.g.tensors[node.inputs[1]]
        if not t.is_constant:
            return None
        axes = [int(a) for a in t.value.reshape(-1)]
    else:
        axes = list(node.attrs.get("axes", []))
    axes = sorted(a + rank if a < 0 else a for a in axes)
    if not axes or axes != list(range(axes[0], rank)) or not node.attrs.get("keepdims", 1):
        return None
    return tuple(axes)


def _layer_norm(m: _Matcher, mean: Node) -> tuple[Node, list[Node]] | None:
    x = mean.inputs[0]
    shape = m.g.tensors[x].shape
    if shape is None:
        return None
    axes = _trailing_axes(m, mean, len(shape))
    sub = m.user(mean.outputs[0], "Sub")
    if axes is None or sub is None or sub.inputs != [x, mean.outputs[0]]:
        return None
    d = sub.outputs[0]
    square = m.user(d, "Pow")
    div = m.user(d, "Div")
    if square is None or div is None or not m.is_const(square.inputs[1], 2.0):
        return None
    var = m.user(square.outputs[0], "ReduceMean")
    if var is None or _trailing_axes(m, var, len(shape)) != axes:
        return None
    add = m.user(var.outputs[0], "Add")
    eps = m.const(_other(add, var.outputs[0]) or "") if add is not None else None
    sqrt = m.user(add.outputs[0], "Sqrt") if add is not None else None
    if eps is None or sqrt is None or div.inputs != [d, sqrt.outputs[0]]:
        return None
    matched = [mean, sub, square, var, add, sqrt, div]
    out, inputs = div.outputs[0], [x]
    for op in ("Mul", "Add"):
        nxt = m.user(out, op)
        param = _other(nxt, out) if nxt is not None else None
        t = m.g.tensors.get(param or "")
        if nxt is None or t is None or not t.is_constant or m.g.tensors[nxt.outputs[0]].shape != shape \
                or not m.only_used_by(out, nxt):
            break
        if op == "Add" and len(inputs) == 1:  # a bias without a scale: scale by ones
            break
        inputs.append(param)  # type: ignore[arg-type]
        matched.append(nxt)
        out = nxt.outputs[0]
    last = matched[-1]
    ln = Node("LayerNormalization", last.name, inputs, [out], {"axis": axes[0], "epsilon": eps})
    return ln, matched


def _rms_norm(m: _Matcher, square: Node) -> tuple[Node, list[Node]] | None:
    x = square.inputs[0]
    shape = m.g.tensors[x].shape
    if shape is None or not m.is_const(square.inputs[1], 2.0):
        return None
    mean = m.user(square.outputs[0], "ReduceMean")
    axes = _trailing_axes(m, mean, len(shape)) if mean is not None else None
    add = m.user(mean.outputs[0], "Add") if mean is not None else None
    eps = m.const(_other(add, mean.outputs[0]) or "") if add is not None and mean is not None else None
    sqrt = m.user(add.outputs[0], "Sqrt") if add is not None else None
    if axes is None or eps is None or sqrt is None:
        return None
    root = sqrt.outputs[0]
    recip = m.user(root, "Reciprocal")
    divided = m.user(root, "Div")
    if recip is None and divided is not None and divided.inputs[1] == root and m.is_const(divided.inputs[0], 1.0):
        recip = divided  # (TorchScript's Llama: 1 / sqrt)
    if recip is not None:
        mul = m.user(recip.outputs[0], "Mul")
        if mul is None or _other(mul, recip.outputs[0]) != x:
            return None
        matched = [square, mean, add, sqrt, recip, mul]
    else:
        mul = m.user(root, "Div")
        if mul is None or mul.inputs != [x, root]:
            return None
        matched = [square, mean, add, sqrt, mul]
    out, scale = mul.outputs[0], None
    weighted = m.user(out, "Mul")
    param = _other(weighted, out) if weighted is not None else None
    t = m.g.tensors.get(param or "")
    if weighted is not None and t is not None and t.is_constant and m.only_used_by(out, weighted) and \
            m.g.tensors[weighted.outputs[0]].shape == shape and t.shape == tuple(shape[axes[0]:]):
        scale = param
        matched.append(weighted)
        out = weighted.outputs[0]
    if scale is None:  # RMSNormalization takes a scale: ones
        scale = m.g.fresh(f"{mul.name}/ones")
        dtype = m.g.tensors[x].dtype
        m.g.tensors[scale] = Tensor(scale, tuple(shape[axes[0]:]), dtype, np.ones(shape[axes[0]:], dtype))
    last = matched[-1]
    return Node("RMSNormalization", last.name, [x, scale], [out], {"axis": axes[0], "epsilon": eps}), matched


def _channel_vector(m: _Matcher, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """A constant with one value per channel of an [N, C, ...] tensor (shape [C, 1, ...] or broadcasting alike),
    as a [C] vector; None for anything else."""
    t = m.g.tensors.get(name)
    if t is None or not t.is_constant or t.value.dtype.kind != "f" or len(t.value.shape) > len(shape):
        return None
    full = (1,) * (len(shape) - len(t.value.shape)) + tuple(t.value.shape)
    if full[0] != 1 or full[1] not in (1, shape[1]) or any(n != 1 for n in full[2:]):
        return None
    return np.broadcast_to(t.value.reshape(-1), (shape[1],)).astype(np.float32)


def _group_norm(m: _Matcher, norm: Node) -> tuple[Node, list[Node]] | None:
    g = m.g
    split = m.node(norm.inputs[0], "Reshape")
    if split is None or len(norm.inputs) < 3:
        return None
    x = split.inputs[0]
    shape, grouped = g.tensors[x].shape, g.tensors[norm.inputs[0]].shape
    if shape is None or grouped is None or len(shape) < 3 or len(grouped) != 3 or grouped[0] != shape[0] or \
            shape[1] % grouped[1] or grouped[2] != math.prod(shape[1:]) // grouped[1]:
        return None
    groups = grouped[1]
    params = [g.tensors[n] for n in norm.inputs[1:3]]
    if not all(p.is_constant and p.value.size == groups for p in params):
        return None
    merge = m.user(norm.outputs[0], "Reshape")
    if merge is None or g.tensors[merge.outputs[0]].shape != shape:
        return None
    # InstanceNormalization's per-group scale and bias, repeated over each group's channels, then the per-channel
    # affine after it folded in: gamma * (s * n + b) + beta
    per_group = shape[1] // groups
    scale, bias = (np.repeat(p.value.reshape(-1).astype(np.float32), per_group) for p in params)
    matched, out = [split, norm, merge], merge.outputs[0]
    for op in ("Mul", "Add"):
        nxt = m.user(out, op)
        vector = _channel_vector(m, _other(nxt, out) or "", shape) if nxt is not None else None
        if nxt is None or vector is None or g.tensors[nxt.outputs[0]].shape != shape or not m.only_used_by(out, nxt):
            break
        if op == "Mul":
            scale, bias = scale * vector, bias * vector
        else:
            bias = bias + vector
        matched.append(nxt)
        out = nxt.outputs[0]
    last = matched[-1]
    names = []
    for suffix, value in (("scale", scale), ("bias", bias)):
        name = g.fresh(f"{last.name}/{suffix}")
        dtype = g.tensors[x].dtype  # GroupNormalization's scale and bias have its input's type
        g.tensors[name] = Tensor(name, (shape[1],), dtype, value.astype(dtype))
        names.append(name)
    attrs = {"num_groups": groups, "epsilon": float(norm.attrs.get("epsilon", 1e-5))}
    return Node("GroupNormalization", last.name, [x, *names], [out], attrs, opset=21), matched


def _group_norm_activation(m: _Matcher, norm: Node) -> tuple[Node, list[Node]] | None:
    if norm.domain not in ("", "ai.onnx") or m.g.opset_of(norm) < 21:
        return None
    y = norm.outputs[0]
    users = m.users.get(y, [])
    gate = m.user(y, "Sigmoid")
    if len(users) == 2 and gate is not None:  # SiLU: y * Sigmoid(y)
        mul = m.user(y, "Mul")
        if mul is None or sorted(mul.inputs) != sorted([y, gate.outputs[0]]):
            return None
        matched, function = [norm, gate, mul], "Silu"
    elif len(users) == 1 and users[0].op in GROUP_NORM_ACTIVATIONS:
        matched, function = [norm, users[0]], users[0].op
    else:
        return None
    last = matched[-1]
    attrs = {**norm.attrs, "activation": function}
    return Node("GroupNormActivation", last.name, list(norm.inputs), list(last.outputs), attrs, INTERNAL_DOMAIN,
                opset=21), matched


def _inner_values_private(m: _Matcher, matched: list[Node]) -> bool:
    """Every value the pattern produces, but its final output, is used only inside the pattern."""
    final = matched[-1]
    for n in matched:
        for out in n.outputs:
            if n is not final and not m.only_used_by(out, *matched):
                return False
    return True


def _patchify(m: _Matcher, conv: Node) -> tuple[list[Node], list[Node]] | None:
    g = m.g
    x, w = conv.inputs[0], conv.inputs[1]
    bias = conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2] else None
    xs, wt, y = g.tensors[x].shape, g.tensors[w], g.tensors[conv.outputs[0]]
    if len(xs) != 4 or not wt.is_constant or (bias and not g.tensors[bias].is_constant):
        return None
    m_out, c, kh, kw = wt.shape
    a = conv.attrs
    if (list(a.get("strides", [1, 1])) != [kh, kw] or any(a.get("pads", [0, 0, 0, 0])) or
            any(d != 1 for d in a.get("dilations", [1, 1])) or a.get("group", 1) != 1 or
            a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or kh * kw == 1 or
            xs[1] != c or xs[2] % kh or xs[3] % kw):
        return None
    n, ph, pw = xs[0], xs[2] // kh, xs[3] // kw
    if y.shape != (n, m_out, ph, pw) or m.user(conv.outputs[0], "BatchNormalization") is not None:
        return None  # a batch norm after it folds into the convolution's weights (fold-batchnorm)
    if any(u.op == "Conv" for u in m.users.get(conv.outputs[0], [])):
        return None  # a convolution reads it channels first, as the convolution writes it (ConvNeXt's downsampling)
    name, dtype = conv.name, g.tensors[x].dtype

    def tensor(suffix: str, shape: tuple[int, ...], value: np.ndarray | None = None) -> str:
        full = g.fresh(f"{name}/{suffix}")
        g.tensors[full] = Tensor(full, shape, value.dtype if value is not None else dtype, value)
        return full

    def shape_of(suffix: str, shape: tuple[int, ...]) -> str:
        return tensor(suffix, (len(shape),), np.array(shape, dtype=np.int64))

    product = tensor("product", (n * ph * pw, m_out))
    grid = tensor("grid", (n, ph, pw, m_out))
    nodes = [Node("PatchEmbedding", f"{name}/patches", [x, w] + ([bias] if bias else []), [product],
                  {"kernel_shape": [kh, kw]}, INTERNAL_DOMAIN),
             Node("Reshape", f"{name}/unflatten", [product, shape_of("grid_shape", (n, ph, pw, m_out))], [grid]),
             Node("Transpose", name, [grid], list(conv.outputs), {"perm": [0, 3, 1, 2]})]
    return nodes, [conv]


def _silu(m: _Matcher, gate: Node) -> tuple[Node, list[Node]] | None:
    """Mul(x, Sigmoid(x)), the Sigmoid read by the Mul alone, in fp32 (an fp16 model rounds between the two)."""
    x, s = gate.inputs[0], gate.outputs[0]
    mul = m.user(s, "Mul")
    if gate.domain not in ("", "ai.onnx") or mul is None or len(m.users.get(s, [])) != 1 or \
            sorted(mul.inputs) != sorted([x, s]) or m.g.tensors[x].dtype != np.float32 or \
            m.g.tensors[mul.outputs[0]].shape != m.g.tensors[x].shape:
        return None
    return Node("Silu", mul.name, [x], list(mul.outputs), {}, INTERNAL_DOMAIN), [gate, mul]


def _global_pool(m: _Matcher, pool: Node) -> tuple[Node, list[Node]] | None:
    """A pool with one output per channel whose window starts at the input's first element and covers it all."""
    x, y = m.g.tensors[pool.inputs[0]], m.g.tensors[pool.outputs[0]]
    a, rank = pool.attrs, len(x.shape) - 2
    kernel = list(a.get("kernel_shape", []))
    if (len(pool.outputs) > 1 and pool.outputs[1]) or rank < 1 or len(kernel) != rank or \
            any(d is None for d in (*x.shape, *y.shape)) or list(y.shape[2:]) != [1] * rank:
        return None
    if any(a.get("pads", [0] * 2 * rank)) or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or \
            any(d != 1 for d in a.get("dilations", [1] * rank)) or any(k < n for k, n in zip(kernel, x.shape[2:])):
        return None
    op = "GlobalAveragePool" if pool.op == "AveragePool" else "GlobalMaxPool"
    return Node(op, pool.name, [pool.inputs[0]], [pool.outputs[0]]), [pool]


REWRITES = (("ReduceMean", _layer_norm), ("Erf", _gelu_erf), ("Tanh", _gelu_tanh), ("Pow", _rms_norm),
            ("Conv", _patchify), ("InstanceNormalization", _group_norm),
            ("GroupNormalization", _group_norm_activation), ("Sigmoid", _silu), ("AveragePool", _global_pool),
            ("MaxPool", _global_pool))


def run(g: Graph) -> Graph:
    for op, rewrite in REWRITES:
        producers = g.producers()
        users = g.consumers()
        m = _Matcher(g, producers, users)
        replaced: dict[int, Node] = {}  # id of the pattern's last node -> the new node
        dead: set[int] = set()
        for node in list(g.nodes):
            if node.op != op or id(node) in dead:
                continue
            found = rewrite(m, node)
            if found is None:
                continue
            new, matched = found
            if any(id(n) in dead for n in matched) or not _inner_values_private(m, matched):
                continue
            dead.update(id(n) for n in matched)
            replaced[id(matched[-1])] = new
        g.nodes = [r for n in g.nodes if id(n) not in dead or id(n) in replaced
                   for r in _as_list(replaced.get(id(n), n))]
    return g


def _as_list(found: Node | list[Node]) -> list[Node]:
    return found if isinstance(found, list) else [found]

