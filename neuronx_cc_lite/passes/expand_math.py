"""The inverse trigonometric and hyperbolic functions, written in the functions ScalarE has (atan, sqrt, log, exp):

    Asin(x)  = atan(x / sqrt(1 - x^2))                  (+-1: x / 0 = +-inf, atan(+-inf) = +-pi/2)
    Acos(x)  = 2 atan(sqrt((1 - x) / (1 + x)))          (no cancellation near 1, where acos is small)
    Asinh(x) = sign(x) log(|x| + sqrt(x^2 + 1))         (odd: no cancellation for negative x)
    Acosh(x) = log(x + sqrt(x^2 - 1))
    Atanh(x) = log((1 + x) / (1 - x)) / 2
    Sinh(x)  = (exp(x) - exp(-x)) / 2,  Cosh(x) = (exp(x) + exp(-x)) / 2

Outside a function's domain the formulas give NaN where ONNX's functions do (sqrt or log of a negative number).
And the p-norm pooling, as an average pooling that counts the padding (the window's sum over its size):

    LpPool(x) = (AveragePool(|x|^p, count_include_pad=1) * kernel size)^(1/p)
"""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.passes.writer import Writer

OPSET = 19  # AveragePool with dilations


def _asin(w: Writer, x: str, out: str) -> None:
    root = w.add("Sqrt", [w.add("Sub", [w.const(1.0), w.add("Mul", [x, x])])])
    w.add("Atan", [w.add("Div", [x, root])], out)


def _acos(w: Writer, x: str, out: str) -> None:
    one = w.const(1.0)
    ratio = w.add("Div", [w.add("Sub", [one, x]), w.add("Add", [one, x])])
    w.add("Mul", [w.add("Atan", [w.add("Sqrt", [ratio])]), w.const(2.0)], out)


def _asinh(w: Writer, x: str, out: str) -> None:
    size = w.add("Abs", [x])
    root = w.add("Sqrt", [w.add("Add", [w.add("Mul", [x, x]), w.const(1.0)])])
    w.add("Mul", [w.add("Sign", [x]), w.add("Log", [w.add("Add", [size, root])])], out)


def _acosh(w: Writer, x: str, out: str) -> None:
    root = w.add("Sqrt", [w.add("Sub", [w.add("Mul", [x, x]), w.const(1.0)])])
    w.add("Log", [w.add("Add", [x, root])], out)


def _atanh(w: Writer, x: str, out: str) -> None:
    one = w.const(1.0)
    ratio = w.add("Div", [w.add("Add", [one, x]), w.add("Sub", [one, x])])
    w.add("Mul", [w.add("Log", [ratio]), w.const(0.5)], out)


def _hyperbolic(w: Writer, x: str, out: str) -> None:
    up, down = w.add("Exp", [x]), w.add("Exp", [w.add("Neg", [x])])
    both = w.add("Sub" if w.node.op == "Sinh" else "Add", [up, down])
    w.add("Mul", [both, w.const(0.5)], out)


def _lp_pool(w: Writer, x: str, out: str) -> None:
    a = w.node.attrs
    p = float(a.get("p", 2))
    powered = w.add("Mul", [x, x]) if p == 2 else w.add("Pow", [w.add("Abs", [x]), w.const(p)])
    pool = {k: v for k, v in a.items() if k in ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads",
                                                 "strides")}
    average = w.add("AveragePool", [powered], count_include_pad=1, **pool)
    total = w.add("Mul", [average, w.const(float(np.prod(a["kernel_shape"])))])
    w.add("Sqrt", [total], out) if p == 2 else w.add("Pow", [total, w.const(1.0 / p)], out)


_EXPANSIONS = {"Asin": _asin, "Acos": _acos, "Asinh": _asinh, "Acosh": _acosh, "Atanh": _atanh,
               "Sinh": _hyperbolic, "Cosh": _hyperbolic, "LpPool": _lp_pool}


def run(g: Graph) -> Graph:
    nodes: list[Node] = []
    for node in g.nodes:
        t = g.tensors[node.inputs[0]] if node.inputs else None
        if node.op in _EXPANSIONS and node.domain in ("", "ai.onnx") and t is not None and t.dtype == np.float32:
            w = Writer(g, node, OPSET)
            _EXPANSIONS[node.op](w, node.inputs[0], node.outputs[0])
            nodes.extend(w.folded())
        else:
            nodes.append(node)
    g.nodes = nodes
    return g
