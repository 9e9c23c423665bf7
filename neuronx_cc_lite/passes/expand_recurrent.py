"""LSTM, GRU and RNN unrolled over their static sequence length into ops that lower already.

Shapes for layout 0 (layout 1 swaps the first two axes of X, Y and the states: X is transposed in, the outputs
transposed out, and the steps run on layout 0's [B, H] blocks either way):

    X [T, B, I]   W [D, G*H, I]   R [D, G*H, H]   B [D, 2*G*H] (Wb, then Rb)   sequence_lens [B]
    initial_h, initial_c [D, B, H]   P [D, 3*H] (LSTM peepholes, gates i, o, f)
    Y [T, D, B, H]   Y_h, Y_c [D, B, H]

D is 2 for bidirectional (forward first), G the gates in ONNX's order: LSTM i, o, f, c; GRU z, r, h; RNN one.
Per direction the input projection of every step is one matmul over T*B rows, the biases its bias row:

    XW = X[T*B, I] @ W^T + Wb + Rb          sliced by gate and by step into [B, H] blocks xw_g[t] (views)

When the graph holds X batch-first, [B, T, I] (layout 1's X; layout 0's made by a Transpose of one, as torch
exports batch_first=True), the matmul takes its rows in that order, B*T of them, and step t's block is every T-th
row from row t (a strided view): reordering X to time-major first would copy it in rows of I elements, DMA pieces
of I*4 bytes (an embedding 16 wide: 64 bytes).

then step by step (t ascending, or descending for reverse) one matmul per gate on the state, whose Add of xw and
activation fuse-epilogues folds into the matmul:

    LSTM  i = f(xw_i + h Ri^T + Pi*c)     f = f(xw_f + h Rf^T + Pf*c)     (input_forget: f = 1 - i)
          c~ = g(xw_c + h Rc^T)           c' = f*c + i*c~
          o = f(xw_o + h Ro^T + Po*c')    h' = o * h(c')
    GRU   z = f(xw_z + h Rz^T)            r = f(xw_r + h Rr^T)
          h~ = g(xw_h + (r*h) Rh^T)                      linear_before_reset = 0 (Rbh joins xw_h)
          h~ = g(xw_h + r*(h Rh^T + Rbh))                linear_before_reset = 1
          h' = h~ + z*(h - h~)                           that is (1 - z)*h~ + z*h
    RNN   h' = f(xw_i + h Ri^T)

`clip` clamps every activation's input to [-clip, clip]; f, g, h are the `activations` of each direction, with
`activation_alpha`/`beta` consumed in order by the functions that take them (onnxruntime's reading, and its
defaults). With sequence_lens, step t of batch row b counts only while t < lens[b] (a reverse row thus starts at
its last valid step), so each update is predicated on the step's mask m_t = t < lens, a [B, 1] bool:

    h = Where(m_t, h', h)        Y[t] = Where(m_t, h', 0)

which leaves Y zero past a row's length and Y_h, Y_c at its last valid step (zero for a row of length 0, as
onnxruntime gives them). Lengths known at compile time give constant masks, and none for a step every row takes.
Constant weights are sliced and transposed here, in numpy; weights given at run time become Slice, Reshape and
Transpose ops. A node this cannot unroll stays as it is, for its lowering's check to name the reason
(lower/recurrent.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neuronx_cc_lite.ir import Graph, Node, Tensor

RECURRENT = ("LSTM", "GRU", "RNN")
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
# lower-case name -> (default alpha or None when it takes none, default beta or None): onnxruntime's defaults
ACTIVATIONS: dict[str, tuple[float | None, float | None]] = {
    "relu": (None, None), "tanh": (None, None), "sigmoid": (None, None), "softsign": (None, None),
    "softplus": (None, None), "affine": (0.0, 0.0), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None),
    "scaledtanh": (0.0, 0.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, None),
}
SINCE = 7  # the opset whose LSTM/GRU/RNN (no output_sequence attribute) the expansion follows
OPSET = 13  # the expansion's own ops take their axes, split sizes and clip bounds as inputs, as opset 13 has them


@dataclass(frozen=True)
class Activation:
    name: str  # lower case
    alpha: float
    beta: float


def why_not_expanded(node: Node, g: Graph) -> str | None:
    """None when the pass can unroll the node, else the reason."""
    if g.opset_of(node) < SINCE:
        return f"{node.op} of opset {g.opset_of(node)} (from opset {SINCE} only)"
    for i in (*node.inputs[:3], *node.outputs):
        if i and g.tensors[i].shape is None:
            return f"{node.op} whose shape of {i!r} is not static"
    if np.dtype(g.tensors[node.inputs[0]].dtype).kind != "f":
        return f"{node.op} on {g.tensors[node.inputs[0]].dtype}"
    if node.attrs.get("direction", "forward") not in ("forward", "reverse", "bidirectional"):
        return f"direction {node.attrs['direction']!r}"
    if node.attrs.get("layout", 0) not in (0, 1):
        return f"layout {node.attrs['layout']}"
    acts = activations(node)
    return acts if isinstance(acts, str) else None


def _directions(node: Node) -> int:
    return 2 if node.attrs.get("direction", "forward") == "bidirectional" else 1


def activations(node: Node) -> list[list[Activation]] | str:
    """Each direction's activation functions with their alpha and beta, or why they are refused."""
    per_direction = len(DEFAULT_ACTIVATIONS[node.op])
    names = [n.decode() if isinstance(n, bytes) else n for n in node.attrs.get("activations", ())]
    names = names or list(DEFAULT_ACTIVATIONS[node.op]) * _directions(node)
    if len(names) != per_direction * _directions(node):
        return f"{len(names)} activations for {_directions(node)} direction(s) of {per_direction} each"
    unknown = [n for n in names if n.lower() not in ACTIVATIONS]
    if unknown:
        return f"activation {unknown[0]!r}"
    alphas, betas = list(node.attrs.get("activation_alpha", ())), list(node.attrs.get("activation_beta", ()))
    found = []
    for name in names:
        alpha, beta = ACTIVATIONS[name.lower()]
        alpha = (alphas.pop(0) if alphas else alpha) if alpha is not None else 0.0
        beta = (betas.pop(0) if betas else beta) if beta is not None else 0.0
        found.append(Activation(name.lower(), float(alpha), float(beta)))
    return [found[d * per_direction:(d + 1) * per_direction] for d in range(_directions(node))]


class _Builder:
    """Makes the expansion's nodes and tensors, named under the recurrent node; folds constant operands in numpy."""

    def __init__(self, g: Graph, node: Node) -> None:
        self.g, self.node, self.count = g, node, 0
        self.nodes: list[Node] = []
        self.dtype = np.dtype(g.tensors[node.inputs[0]].dtype)

    def _name(self, what: str) -> str:
        self.count += 1
        return f"{self.node.name}/{what}{self.count}"

    def const(self, value: np.ndarray) -> str:
        name = self._name("const")
        value = np.asarray(value)
        self.g.tensors[name] = Tensor(name, tuple(value.shape), value.dtype, value)
        return name

    def scalar(self, value: float) -> str:
        return self.const(np.asarray(value, dtype=self.dtype))

    def op(self, op: str, inputs: list[str], shape: tuple[int, ...], dtype: np.dtype | None = None,
           out: str | None = None, **attrs: object) -> str:
        name = out or self._name(op.lower())
        if out is None:
            self.g.tensors[name] = Tensor(name, tuple(shape), np.dtype(dtype or self.dtype))
        self.nodes.append(Node(op, self._name(op), inputs, [name], attrs, opset=OPSET))
        return name

    def shape(self, x: str) -> tuple[int, ...]:
        return tuple(self.g.tensors[x].shape)

    def value(self, x: str) -> np.ndarray | None:
        return self.g.tensors[x].value

    def take(self, x: str, axis: int, start: int, stop: int) -> str:
        """x[start:stop] along axis."""
        return self.block(x, {axis: (start, stop)})

    def block(self, x: str, ranges: dict[int, tuple[int, int] | tuple[int, int, int]]) -> str:
        """x[start:stop(:step)] along each axis in `ranges`: a constant, or a Slice (a view: no instruction). Not a
        Split, whose results dead-code elimination could not drop one by one (an LSTM's unread last output gate)."""
        if (v := self.value(x)) is not None:
            return self.const(v[tuple(slice(*ranges.get(a, (None, None))) for a in range(v.ndim))])
        shape = list(self.shape(x))
        steps = {a: (r + (1,))[2] for a, r in ranges.items()}
        for axis, (start, stop, *_) in ranges.items():
            shape[axis] = len(range(start, stop, steps[axis]))
        axes = sorted(ranges)
        bounds = [self.const(np.array([ranges[a][k] for a in axes])) for k in (0, 1)]
        inputs = [x, *bounds, self.const(np.array(axes))]
        if any(step != 1 for step in steps.values()):
            inputs.append(self.const(np.array([steps[a] for a in axes])))
        return self.op("Slice", inputs, tuple(shape), self.g.tensors[x].dtype)

    def reshape(self, x: str, shape: tuple[int, ...], out: str | None = None) -> str:
        if out is None and self.shape(x) == shape:
            return x
        if out is None and (v := self.value(x)) is not None:
            return self.const(v.reshape(shape))
        return self.op("Reshape", [x, self.const(np.array(shape))], shape, self.g.tensors[x].dtype, out)

    def transpose(self, x: str, perm: tuple[int, ...]) -> str:
        if (v := self.value(x)) is not None:
            return self.const(np.ascontiguousarray(v.transpose(perm)))
        return self.op("Transpose", [x], tuple(self.shape(x)[p] for p in perm), self.g.tensors[x].dtype, perm=perm)

    def add(self, a: str, b: str) -> str:
        if (va := self.value(a)) is not None and (vb := self.value(b)) is not None:
            return self.const((va + vb).astype(self.dtype))
        return self.op("Add", [a, b], np.broadcast_shapes(self.shape(a), self.shape(b)))

    def concat(self, xs: list[str], axis: int) -> str:
        if len(xs) == 1:
            return xs[0]
        if all(self.value(x) is not None for x in xs):
            return self.const(np.concatenate([self.value(x) for x in xs], axis=axis))  # type: ignore[misc]
        shape = list(self.shape(xs[0]))
        shape[axis] = sum(self.shape(x)[axis] for x in xs)
        return self.op("Concat", xs, tuple(shape), self.g.tensors[xs[0]].dtype, axis=axis)

    def matmul(self, a: str, b: str) -> str:
        if (va := self.value(a)) is not None and (vb := self.value(b)) is not None:  # a constant initial state
            return self.const((va @ vb).astype(self.dtype))
        return self.op("MatMul", [a, b], (*self.shape(a)[:-1], self.shape(b)[-1]))

    def binary(self, op: str, a: str, b: str) -> str:
        return self.op(op, [a, b], np.broadcast_shapes(self.shape(a), self.shape(b)))

    def activate(self, x: str, act: Activation, clip: float | None) -> str:
        if clip is not None:
            x = self.op("Clip", [x, self.scalar(-clip), self.scalar(clip)], self.shape(x))
        shape = self.shape(x)
        if act.name == "affine":
            return self.binary("Add", self.binary("Mul", x, self.scalar(act.alpha)), self.scalar(act.beta))
        if act.name == "scaledtanh":
            tanh = self.op("Tanh", [self.binary("Mul", x, self.scalar(act.beta))], shape)
            return self.binary("Mul", tanh, self.scalar(act.alpha))
        if act.name == "leakyrelu":
            return self.op("LeakyRelu", [x], shape, alpha=act.alpha)
        if act.name == "thresholdedrelu":
            return self.op("ThresholdedRelu", [x], shape, alpha=act.alpha)
        if act.name == "hardsigmoid":
            return self.op("HardSigmoid", [x], shape, alpha=act.alpha, beta=act.beta)
        if act.name == "elu":
            return self.op("Elu", [x], shape, alpha=act.alpha)
        op = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "softsign": "Softsign", "softplus": "Softplus"}
        return self.op(op[act.name], [x], shape)


@dataclass
class _Direction:
    """One direction's operands, each [B, H] or [H, H] unless noted."""
    xw: list[list[str]]  # [gate][t]: the input projection of step t, biases included
    rt: list[str]  # [gate]: R_g^T
    acts: list[Activation]
    h0: str
    c0: str | None  # LSTM
    peep: list[str] | None  # LSTM: P_i, P_o, P_f, each [H]
    rbh: str | None  # GRU with linear_before_reset: Rbh [H], added after the recurrent matmul


def _input(node: Node, i: int) -> str:
    return node.inputs[i] if len(node.inputs) > i else ""


def _direction(b: _Builder, d: int, x2: str, sizes: tuple[int, int, int, int], acts: list[Activation],
               batch_first: bool) -> _Direction:
    """`x2`: X's rows, [T*B, I] time-major or, `batch_first`, [B*T, I]."""
    node, (T, B, I, H) = b.node, sizes
    G = GATES[node.op]
    w = b.transpose(b.reshape(b.take(node.inputs[1], 0, d, d + 1), (G * H, I)), (1, 0))
    r = b.reshape(b.take(node.inputs[2], 0, d, d + 1), (G * H, H))
    rt = [b.transpose(b.take(r, 0, k * H, (k + 1) * H), (1, 0)) for k in range(G)]
    xw = b.matmul(x2, w)
    lbr = node.op == "GRU" and node.attrs.get("linear_before_reset", 0) != 0
    rbh = None
    if _input(node, 3):
        bias = b.reshape(b.take(node.inputs[3], 0, d, d + 1), (2 * G * H,))
        wb, rb = b.take(bias, 0, 0, G * H), b.take(bias, 0, G * H, 2 * G * H)
        if lbr:  # Rbh is added inside the reset gate's product, not to the input projection
            rbh = b.take(rb, 0, 2 * H, 3 * H)
            rb = b.concat([b.take(rb, 0, 0, 2 * H), b.const(np.zeros(H, b.dtype))], 0)
        xw = b.add(xw, b.add(wb, rb))
    rows = [(t, (B - 1) * T + t + 1, T) if batch_first else (t * B, (t + 1) * B) for t in range(T)]
    blocks = [[b.block(xw, {0: rows[t], 1: (k * H, (k + 1) * H)}) for t in range(T)] for k in range(G)]
    layout = node.attrs.get("layout", 0)

    def state(i: int) -> str:
        if not _input(node, i):
            return b.const(np.zeros((B, H), b.dtype))
        return b.reshape(b.take(node.inputs[i], layout, d, d + 1), (B, H))

    peep = None
    if node.op == "LSTM" and _input(node, 7):
        p = b.reshape(b.take(node.inputs[7], 0, d, d + 1), (3 * H,))
        peep = [b.take(p, 0, k * H, (k + 1) * H) for k in range(3)]
    return _Direction(blocks, rt, acts, state(5), state(6) if node.op == "LSTM" else None, peep, rbh)


def _gate(b: _Builder, xw: str, h: str, rt: str) -> str:
    """xw + h @ R^T, the Add after the MatMul so that fuse-epilogues takes xw as the matmul's residual. (One matmul
    per gate rather than one for all: each gate's activation then leaves PSUM fused with it, in the layout the gate
    arithmetic reads, where column slices of a shared result would be laid out anew through HBM.)"""
    recurrent = b.matmul(h, rt)
    v = b.value(recurrent)
    return xw if v is not None and not v.any() else b.binary("Add", recurrent, xw)  # a zero state adds nothing


def _lstm_step(b: _Builder, d: _Direction, t: int, h: str, c: str, clip: float | None,
               input_forget: bool) -> tuple[str, str]:
    f_act, g_act, h_act = d.acts
    pre = [_gate(b, d.xw[k][t], h, d.rt[k]) for k in range(4)]  # i, o, f, c
    if d.peep:
        pre[0] = b.binary("Add", pre[0], b.binary("Mul", c, d.peep[0]))
        pre[2] = b.binary("Add", pre[2], b.binary("Mul", c, d.peep[2]))
    i = b.activate(pre[0], f_act, clip)
    f = b.binary("Sub", b.scalar(1.0), i) if input_forget else b.activate(pre[2], f_act, clip)
    cell = b.binary("Add", b.binary("Mul", f, c), b.binary("Mul", i, b.activate(pre[3], g_act, clip)))
    if d.peep:
        pre[1] = b.binary("Add", pre[1], b.binary("Mul", cell, d.peep[1]))
    o = b.activate(pre[1], f_act, clip)
    return b.binary("Mul", o, b.activate(cell, h_act, None)), cell


def _gru_step(b: _Builder, d: _Direction, t: int, h: str, clip: float | None, lbr: bool) -> str:
    f_act, g_act = d.acts
    z = b.activate(_gate(b, d.xw[0][t], h, d.rt[0]), f_act, clip)
    r = b.activate(_gate(b, d.xw[1][t], h, d.rt[1]), f_act, clip)
    if lbr:
        recurrent = b.matmul(h, d.rt[2])
        if d.rbh is not None:
            recurrent = b.binary("Add", recurrent, d.rbh)
        pre = b.binary("Add", d.xw[2][t], b.binary("Mul", r, recurrent))
    else:
        pre = _gate(b, d.xw[2][t], b.binary("Mul", r, h), d.rt[2])
    cand = b.activate(pre, g_act, clip)
    return b.binary("Add", cand, b.binary("Mul", z, b.binary("Sub", h, cand)))


def _masks(b: _Builder, T: int, B: int) -> list[str | None]:
    """Step t's [B, 1] bool mask t < sequence_lens, or None when the step counts for every row."""
    lens = _input(b.node, 4)
    if not lens:
        return [None] * T
    if (v := b.value(lens)) is not None:
        return [None if np.all(t < v) else b.const((t < v).reshape(B, 1)) for t in range(T)]
    column = b.reshape(lens, (B, 1))
    dtype = b.g.tensors[lens].dtype
    return [b.op("Less", [b.const(np.asarray(t, dtype)), column], (B, 1), np.dtype(bool)) for t in range(T)]


def _emit(b: _Builder, value: str, out: str) -> None:
    """Write `value`, [T or 1, D, B, H] in layout 0, to the output `out` in the node's layout and shape."""
    if b.node.attrs.get("layout", 0) == 1:
        value = b.transpose(value, (2, 0, 1, 3))
    b.reshape(value, tuple(b.g.tensors[out].shape), out)


def _batch_first(g: Graph, node: Node) -> str | None:
    """X as [B, T, I], when the graph holds it so: layout 1's X, or the input of the Transpose that makes layout
    0's."""
    x = node.inputs[0]
    if node.attrs.get("layout", 0) == 1:
        return x
    made_by = g.producers().get(x)
    if made_by is not None and made_by.op == "Transpose" and list(made_by.attrs.get("perm", ())) == [1, 0, 2]:
        return made_by.inputs[0]
    return None


def _expand(g: Graph, node: Node) -> list[Node]:
    b = _Builder(g, node)
    acts = activations(node)
    assert not isinstance(acts, str)
    x = node.inputs[0]
    if node.attrs.get("layout", 0) == 1:
        x = b.transpose(x, (1, 0, 2))
    T, B, I = b.shape(x)
    H = b.shape(node.inputs[2])[-1]
    sizes = (T, B, I, H)
    batch_first = _batch_first(g, node)
    x2 = b.reshape(batch_first or x, (T * B, I))
    clip = float(node.attrs["clip"]) if "clip" in node.attrs else None
    masks = _masks(b, T, B)
    zero = b.scalar(0.0) if any(masks) else ""
    ys, hs, cs = [], [], []
    for d in range(_directions(node)):
        reverse = node.attrs.get("direction", "forward") == "reverse" or d == 1
        dirn = _direction(b, d, x2, sizes, acts[d], batch_first is not None)
        h, c, y = dirn.h0, dirn.c0, [""] * T
        for t in (reversed(range(T)) if reverse else range(T)):
            new_c = None
            if node.op == "LSTM":
                assert c is not None
                new_h, new_c = _lstm_step(b, dirn, t, h, c, clip, node.attrs.get("input_forget", 0) != 0)
            elif node.op == "GRU":
                new_h = _gru_step(b, dirn, t, h, clip, node.attrs.get("linear_before_reset", 0) != 0)
            else:
                new_h = b.activate(_gate(b, dirn.xw[0][t], h, dirn.rt[0]), dirn.acts[0], clip)
            if masks[t]:
                y[t] = b.op("Where", [masks[t], new_h, zero], (B, H))
                h = b.op("Where", [masks[t], new_h, h], (B, H))
                c = b.op("Where", [masks[t], new_c, c], (B, H)) if new_c else None
            else:
                y[t], h, c = new_h, new_h, new_c
        if masks[0]:  # a row of length 0 ends with zero states, not its initial ones (as onnxruntime has it)
            h = b.op("Where", [masks[0], h, zero], (B, H))
            c = b.op("Where", [masks[0], c, zero], (B, H)) if c else None
        ys.append(b.reshape(b.concat(y, 0), (T, 1, B, H)))
        hs.append(b.reshape(h, (1, 1, B, H)))
        cs.append(b.reshape(c, (1, 1, B, H)) if c else "")
    for k, values in enumerate((ys, hs, cs)):
        if len(node.outputs) > k and node.outputs[k]:
            _emit(b, b.concat(values, 1), node.outputs[k])
    return b.nodes


def run(g: Graph) -> Graph:
    nodes: list[Node] = []
    for node in g.nodes:
        if node.op in RECURRENT and node.domain in ("", "ai.onnx") and why_not_expanded(node, g) is None:
            nodes.extend(_expand(g, node))
        else:
            nodes.append(node)
    g.nodes = nodes
    return g
