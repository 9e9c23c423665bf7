"""What an ONNX node's attributes and constant inputs say, where a graph pass and a lowering both read it: the axes a
Reduce* node reduces, a Transpose's permutation, HardSigmoid's alpha and beta, Clip's bounds, whether a
BatchNormalization is the inference form and the per-channel scale and shift it then applies."""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node


def normalize_axes(axes: tuple[int, ...] | list[int], rank: int) -> tuple[int, ...]:
    """An axes attribute's axes, a negative one counted from the end, in order and each once."""
    return tuple(sorted({a + rank if a < 0 else a for a in axes}))


def reduced_axes(node: Node, g: Graph) -> tuple[int, ...] | None:
    """The axes a Reduce* node reduces, None when they are not known at compile time; () means "all"."""
    rank = len(g.tensors[node.inputs[0]].shape)
    if len(node.inputs) > 1 and node.inputs[1]:
        t = g.tensors[node.inputs[1]]
        if not t.is_constant:
            return None
        axes = tuple(int(a) for a in t.value.reshape(-1))
    else:
        axes = tuple(node.attrs.get("axes", ()))
    return normalize_axes(axes, rank)


def transpose_perm(node: Node, g: Graph) -> list[int]:
    """A Transpose's permutation: its perm attribute, or the axes reversed when it has none."""
    perm = node.attrs.get("perm")
    return list(perm) if perm is not None else list(reversed(range(len(g.tensors[node.inputs[0]].shape))))


def hard_sigmoid_attrs(attrs: dict[str, object]) -> tuple[float, float]:
    """(alpha, beta) of a HardSigmoid, ONNX's defaults where absent."""
    return float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))  # type: ignore[arg-type]


def clip_bounds(node: Node, g: Graph) -> tuple[float | None, float | None]:
    """A Clip's (min, max), None where absent: attributes before opset 11, constant inputs (the registry makes sure)
    from then on."""
    if g.opset_of(node) < 11:
        return node.attrs.get("min"), node.attrs.get("max")  # type: ignore[return-value]
    bounds = [float(np.asarray(g.tensors[node.inputs[i]].value).reshape(-1)[0])
              if len(node.inputs) > i and node.inputs[i] else None for i in (1, 2)]
    return bounds[0], bounds[1]


def inference_only(node: Node) -> str | None:
    """Why a BatchNormalization node is not a plain inference normalisation, or None."""
    if node.attrs.get("training_mode", 0):
        return "training_mode=1 (batch statistics and running-mean outputs) is not supported"
    if any(node.outputs[1:]):
        return "the running mean / variance outputs (training) are not supported"
    if not node.attrs.get("spatial", 1):
        return "spatial=0 (per-element statistics) is not supported"
    return None


def scale_shift(values: list[np.ndarray], epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (scale, shift) from constant gamma, beta, mean and var, in float64."""
    gamma, beta, mean, var = (v.astype(np.float64) for v in values)
    scale = gamma / np.sqrt(var + epsilon)
    return scale, beta - mean * scale
