"""Ops that are a Gather or a MatMul by a constant once an input is known at compile time:

    Compress(x, condition, axis)  = Gather(x, nonzero(condition), axis)      (a condition shorter than the axis
    Compress(x, condition)        = Gather(Reshape(x, [-1]), nonzero(condition), 0)         drops the rest)
    ReverseSequence(x, lengths)   = Gather(Reshape(x, [T * B, ...]), source, 0) reshaped back: output (t, b) reads
                                    (lengths[b] - 1 - t, b) for t < lengths[b], else (t, b) (time and batch are
                                    the first two axes, in either order)
    DFT(x, length, axis)          = the real-linear map of the signal along `axis` (its values and, when the last
                                    axis is 2, their imaginary parts) to the spectrum, as one MatMul: the axis and
                                    the last moved together by a Transpose, the matrix built by numpy's FFT of each
                                    basis signal (fft, ifft, one-sided rfft and irfft alike, dft_length padding or
                                    truncating) and split in two fp32 matrices, read at once

What is known only at run time stays: a Compress's condition makes the output's size depend on the data, and is
refused with why (or runs on the host with --fallback host)."""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node, Tensor
from neuronx_cc_lite.ops.registry import kept_by_pass
from neuronx_cc_lite.passes.writer import Writer

OPSET = 13  # Gather, Reshape, Transpose and MatMul as they are since


@kept_by_pass("Compress")
def why_kept(node: Node, g: Graph) -> str:
    return ("its condition is known only at run time, so how many elements it outputs depends on the data (it "
            "compiles when the condition is a constant or a pinned input)")


def _known(g: Graph, node: Node, index: int) -> np.ndarray | None:
    """The value of an input known now; None when absent or known only at run time."""
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    t = g.tensors[node.inputs[index]]
    return np.asarray(t.value) if t.is_constant else None


def _compress(w: Writer, g: Graph, node: Node) -> bool:
    condition = _known(g, node, 1)
    if condition is None:
        return False
    x, axis = node.inputs[0], node.attrs.get("axis")
    kept = np.flatnonzero(condition.reshape(-1).astype(bool))
    t = g.tensors[x]
    if not kept.size:  # nothing kept: an empty constant, as fold-constants makes them
        if t.shape is None:
            return False
        shape = (0,) if axis is None else tuple(0 if k == axis % len(t.shape) else n for k, n in enumerate(t.shape))
        g.tensors[node.outputs[0]] = Tensor(node.outputs[0], shape, t.dtype, np.zeros(shape, t.dtype))
        return True
    if axis is None:
        x, axis = w.add("Reshape", [x, w.const([-1], np.int64)]), 0
    w.add("Gather", [x, w.const(kept, np.int64)], node.outputs[0], axis=int(axis))
    return True


def _reverse_sequence(w: Writer, g: Graph, node: Node) -> bool:
    lengths, shape = _known(g, node, 1), g.tensors[node.inputs[0]].shape
    if lengths is None or shape is None:
        return False
    time_axis, batch_axis = int(node.attrs.get("time_axis", 0)), int(node.attrs.get("batch_axis", 1))
    steps, batch = shape[time_axis], shape[batch_axis]
    t, b = np.meshgrid(np.arange(steps), np.arange(batch), indexing="ij")
    n = lengths.reshape(-1).astype(np.int64)[b]
    source_t = np.where(t < n, n - 1 - t, t)
    flat = (source_t * batch + b) if time_axis == 0 else (b * steps + source_t)  # positions in (axis 0, axis 1)
    order = flat if time_axis == 0 else flat.T  # output position (axis 0, axis 1) in row-major order
    rows = w.add("Reshape", [node.inputs[0], w.const([steps * batch, -1], np.int64)])
    picked = w.add("Gather", [rows, w.const(order.reshape(-1), np.int64)], axis=0)
    w.add("Reshape", [picked, w.const(list(shape), np.int64)], node.outputs[0])
    return True


def _spectrum(signal: np.ndarray, length: int, inverse: bool, onesided: bool) -> np.ndarray:
    """The DFT of each signal [K, N, 1 or 2] along axis 1, as ONNX defines it: [K, N', 2], or [K, N', 1] for an
    inverse one-sided one (irfft, whose output is real)."""
    z = signal[..., 0] + 1j * signal[..., 1] if signal.shape[-1] == 2 else signal[..., 0]
    if inverse:
        y = np.fft.irfft(z, n=length, axis=1) if onesided else np.fft.ifft(z, n=length, axis=1)
    else:
        y = np.fft.fft(z, n=length, axis=1)
        y = y[:, :length // 2 + 1] if onesided else y
    return y.real[..., None] if inverse and onesided else np.stack([y.real, y.imag], -1)


def _dft(w: Writer, g: Graph, node: Node) -> bool:
    shape, opset = g.tensors[node.inputs[0]].shape, g.opset_of(node)
    if shape is None or (len(node.inputs) > 1 and node.inputs[1] and _known(g, node, 1) is None):
        return False
    if opset >= 20:
        axis_value = _known(g, node, 2)
        if len(node.inputs) > 2 and node.inputs[2] and axis_value is None:
            return False
        axis = int(axis_value.reshape(-1)[0]) if axis_value is not None else -2
    else:
        axis = int(node.attrs.get("axis", 1))
    rank, inverse, onesided = len(shape), bool(node.attrs.get("inverse", 0)), bool(node.attrs.get("onesided", 0))
    axis %= rank
    if axis == rank - 1 or shape[-1] not in (1, 2):
        return False  # the node stays, for lowering to refuse
    n, parts = shape[axis], shape[-1]
    given = _known(g, node, 1)
    length = int(given.reshape(-1)[0]) if given is not None else (2 * (n - 1) if inverse and onesided else n)
    basis = np.eye(n * parts).reshape(n * parts, n, parts)
    matrix = _spectrum(basis, length, inverse, onesided)  # row k: the spectrum of basis signal k
    out_n, out_parts = matrix.shape[1], matrix.shape[2]
    matrix = matrix.reshape(n * parts, out_n * out_parts)
    matrix[np.abs(matrix) < 1e-12] = 0.0  # sin(0) and cos(pi / 2) as numpy computes them
    perm = [k for k in range(rank - 1) if k != axis] + [axis, rank - 1]
    rest = [shape[k] for k in perm[:-2]]
    moved = w.add("Transpose", [node.inputs[0]], perm=perm) if perm != list(range(rank)) else node.inputs[0]
    flat = w.add("Reshape", [moved, w.const([-1, n * parts], np.int64)])
    # the matrix as the sum of its fp32 rounding and what that leaves, the signal read twice: one MatMul whose
    # products are the float64 matrix's to 2**-48, so that the values that cancel (an inverse's imaginary parts of
    # a real signal, a spectrum's zeros) do so to fp32 rounding of the result, not of the matrix
    high = matrix.astype(np.float32)
    split = np.concatenate([high, (matrix - high).astype(np.float32)])
    product = w.add("MatMul", [w.add("Concat", [flat, flat], axis=1), w.const(split, np.float32)])
    if perm == list(range(rank)):
        w.add("Reshape", [product, w.const([*rest, out_n, out_parts], np.int64)], node.outputs[0])
    else:
        spectrum = w.add("Reshape", [product, w.const([*rest, out_n, out_parts], np.int64)])
        w.add("Transpose", [spectrum], node.outputs[0], perm=[int(k) for k in np.argsort(perm)])
    return True


_EXPANSIONS = {"Compress": _compress, "ReverseSequence": _reverse_sequence, "DFT": _dft}


def run(g: Graph) -> Graph:
    nodes: list[Node] = []
    for node in g.nodes:
        expand = _EXPANSIONS.get(node.op) if node.domain in ("", "ai.onnx") else None
        w = Writer(g, node, OPSET)
        if expand is not None and (node.op != "DFT" or g.tensors[node.inputs[0]].dtype == np.float32) and \
                expand(w, g, node):
            nodes.extend(w.folded())
        else:
            nodes.append(node)
    g.nodes = nodes
    return g
