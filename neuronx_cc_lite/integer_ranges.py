"""Which integer values the engines compute with exactly, and which integer operators the compiler must refuse.

The engines compute in fp32 (CHIP.md): an integer is exact through an ALU while |value| <= 2^24, and a result the
engine writes into a narrower integer type saturates where onnxruntime wraps (uint8 250 + 10 is 4). So an operator
that computes with integers (arithmetic, comparisons, reductions) is lowered through fp32 when the compiler can
show, for every element, that each integer it reads and the exact result lie within 2^24 and within the output
type, or, for Add, Sub, Mul, Div, Neg and Sum, whose exact result within 2^24 the lowering wraps into the output type
as onnxruntime does (WRAPPED). Where it cannot, an Add, Sub, Neg, Mul, comparison, Max or Min is computed in
limbs (LIMBED, lower/integer_limbs.py: exact over any 32-bit integer, and wrapped), and anything else is refused
(NCC_UNSUPPORTED, naming the node and the range it could not bound). Selections (Where) and integer casts move bits,
not values, and are exact whatever the range.

    ranges: an interval [low, high] for every integer tensor, in graph order:
        constants                   their values' minimum and maximum
        graph inputs                their type's range (int64 is held as int32: the runtime refuses an int64 input
                                    outside it), narrowed to what their readers accept (input_ranges: token ids)
                                    and, for an input an operator computes with in fp32 (or an int64 Add, Sub, Mul,
                                    Neg in limbs), through moves and casts to int32 or int64, to [-B, B], B the
                                    largest power of two up to 2^30 that lets every result be bounded
                                    (integer_ranges): the bundle records that bound (stats["integer_bounds"])
                                    and the runtime refuses a value outside it (NRT_INPUT) instead of computing a
                                    wrong answer
        operators that move values  the union of what they move (reshapes, slices, gathers, concatenations, ...)
        arithmetic                  interval arithmetic on the exact values (Add, Sub, Mul, Neg, Abs, Sum, Div, ...)
        casts                       the input's range where the cast keeps every value of it (uint32 to int64), else
                                    the output type's
        fills                       the constant they fill with (ConstantOfShape's value, OneHot's values)
        anything else               the output type's range

The device holds an int64 as int32 (as neuronx-cc does, whose NCC_ESFH002 refuses a 64-bit constant past 32
bits), so a node whose int64 result may leave int32 (a Concat or Pad with such a constant, a Cast from uint32) is
refused too, and so is a fill whose integer value is past 2^24 (it is written as an fp32 immediate): `why_unheld`.
"""

from __future__ import annotations

import math
import weakref
from typing import Callable

import numpy as np

from neuronx_cc_lite.input_ranges import _MOVES, input_ranges
from neuronx_cc_lite.ir import Graph, Node

EXACT = 1 << 24  # the largest magnitude up to which every integer is an fp32 value
Range = tuple[int, int]  # inclusive

# Operators whose lowering computes with integer operands on an engine (through fp32)
COMPUTING = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Abs", "Sum", "Max", "Min", "Mod", "CumSum", "Equal",
                       "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "TopK", "ReduceSum",
                       "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1", "ArgMax", "ArgMin",
                       "Sign", "Clip", "Relu"})
# Operators whose lowering wraps an exact result (within 2^24) into the output type, two's complement, as
# onnxruntime's integer kernels do (lower/elementwise.py `wrapping`)
WRAPPED = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Sum"})
# Operators lower/integer_limbs.py computes exactly over the whole range of integers of up to 32 bits (in 16-bit
# or 8-bit limbs), chosen where the ranges cannot prove a node exact in fp32. Their results wrap to the output
# type, as onnxruntime's; an int64 result (held in 32 bits) is exact only while the exact result stays in int32,
# so int64 arithmetic is limbed only where the (bounded) inputs' ranges prove that.
LIMBED_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Neg", "Abs"})
COMPARISONS = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
LIMBED = LIMBED_ARITHMETIC | COMPARISONS | {"Max", "Min"}
_LIMB_TYPES = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                                              np.int64))
# More operators that only move values (beyond input_ranges' list): position -> the inputs whose values they hold
_MORE_MOVES: dict[str, tuple[int, ...] | None] = {
    "GatherElements": (0,), "GatherND": (0,), "ScatterND": (0, 2), "ScatterElements": (0, 2), "Scatter": (0, 2),
    "Pad": (0, 2), "ReduceMax": (0,), "ReduceMin": (0,), "Max": None, "Min": None, "TopK": (0,), "DepthToSpace": (0,),
    "SpaceToDepth": (0,), "Compress": (0,), "Trilu": (0,), "Where": (1, 2), "Clip": None, "Relu": (0,),
    "TensorScatter": (0, 1),
}
# Operators that write a constant of the graph through an fp32 immediate: exact to 2^24 (lower/movement.py, onehot.py)
FILLS = frozenset({"ConstantOfShape", "OneHot"})


def type_range(dtype: np.dtype) -> Range:
    """The values a tensor of `dtype` holds on the device (int64 as int32; bool as 0 and 1)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return 0, 1
    if dtype == np.int64:
        dtype = np.dtype(np.int32)
    if dtype == np.uint64:
        dtype = np.dtype(np.uint32)
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def value_range(dtype: np.dtype) -> Range:
    """The values ONNX lets a tensor of `dtype` hold (int64 in full; bool as 0 and 1)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return 0, 1
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _is_int(g: Graph, name: str) -> bool:
    t = g.tensors.get(name) if name else None
    return t is not None and t.dtype is not None and np.dtype(t.dtype).kind in "biu"


def _union(ranges: list[Range]) -> Range:
    return min(r[0] for r in ranges), max(r[1] for r in ranges)


def _products(a: Range, b: Range) -> Range:
    corners = [x * y for x in a for y in b]
    return min(corners), max(corners)


def _magnitude(r: Range) -> int:
    return max(abs(r[0]), abs(r[1]))


def _axis_length(node: Node, g: Graph) -> int:
    shape = g.tensors[node.inputs[0]].shape or ()
    axes = node.attrs.get("axes")
    if node.op == "CumSum":
        value = g.tensors[node.inputs[1]].value if len(node.inputs) > 1 else None
        axes = None if value is None else [int(np.asarray(value).reshape(-1)[0])]
    elif axes is None and len(node.inputs) > 1 and node.inputs[1] and g.tensors[node.inputs[1]].value is not None:
        axes = np.asarray(g.tensors[node.inputs[1]].value).reshape(-1).tolist()
    if axes is None or len(axes) == 0:
        return math.prod(shape) if axes is None or not node.attrs.get("noop_with_empty_axes", 0) else 1
    return math.prod(shape[int(a) % len(shape)] for a in axes) if shape else 1


# The exact result of a computing operator from its inputs' ranges (missing: the output type's range)
_RESULTS: dict[str, Callable[[list[Range], Node, Graph], Range]] = {
    "Add": lambda r, n, g: (r[0][0] + r[1][0], r[0][1] + r[1][1]),
    "Sub": lambda r, n, g: (r[0][0] - r[1][1], r[0][1] - r[1][0]),
    "Mul": lambda r, n, g: _products(r[0], r[1]),
    "Neg": lambda r, n, g: (-r[0][1], -r[0][0]),
    "Abs": lambda r, n, g: (0 if r[0][0] <= 0 <= r[0][1] else min(abs(r[0][0]), abs(r[0][1])), _magnitude(r[0])),
    "Sum": lambda r, n, g: (sum(x[0] for x in r), sum(x[1] for x in r)),
    "Div": lambda r, n, g: (0 if r[0][0] >= 0 and r[1][0] >= 0 else -_magnitude(r[0]), _magnitude(r[0])),
    "Mod": lambda r, n, g: (0 if r[0][0] >= 0 and r[1][0] >= 0 else -(_magnitude(r[1]) - 1), _magnitude(r[1]) - 1),
    "CumSum": lambda r, n, g: (min(r[0][0], r[0][0] * _axis_length(n, g)), max(r[0][1], r[0][1] * _axis_length(n, g))),
    "ReduceSum": lambda r, n, g: (min(r[0][0], r[0][0] * _axis_length(n, g)),
                                  max(r[0][1], r[0][1] * _axis_length(n, g))),
    "ReduceL1": lambda r, n, g: (0, _magnitude(r[0]) * _axis_length(n, g)),
    "ReduceSumSquare": lambda r, n, g: (0, _magnitude(r[0]) ** 2 * _axis_length(n, g)),
    "ReduceProd": lambda r, n, g: (-_magnitude(r[0]) ** _axis_length(n, g), _magnitude(r[0]) ** _axis_length(n, g)),
    "Sign": lambda r, n, g: (-1, 1),
    "ArgMax": lambda r, n, g: (0, max(0, (g.tensors[n.inputs[0]].shape or (1,))[int(n.attrs.get("axis", 0))] - 1)),
    "ArgMin": lambda r, n, g: (0, max(0, (g.tensors[n.inputs[0]].shape or (1,))[int(n.attrs.get("axis", 0))] - 1)),
}


def limbable(node: Node, g: Graph) -> bool:
    """Whether lower/integer_limbs.py can compute `node`: a LIMBED operator on integers the device holds in up to
    32 bits (int64 included)."""
    return node.op in LIMBED and all(np.dtype(g.tensors[name].dtype) in _LIMB_TYPES for name in node.inputs if name)


def limbed_whatever_the_inputs(node: Node, g: Graph) -> bool:
    """Whether the limbs compute `node` exactly whatever its inputs hold: all but int64 arithmetic, whose exact
    result may leave the int32 the device holds it in."""
    return limbable(node, g) and not (node.op in LIMBED_ARITHMETIC and g.tensors[node.outputs[0]].dtype == np.int64)


def _fill_range(node: Node, g: Graph) -> Range:
    """The values a fill writes: ConstantOfShape's `value` (0 when absent), OneHot's off and on values."""
    if node.op == "OneHot":
        values = np.asarray(g.tensors[node.inputs[2]].value).reshape(-1)[:2]
    else:
        values = np.asarray(node.attrs.get("value", 0)).reshape(-1)[:1]
    return int(values.min()), int(values.max())


class IntegerRanges:
    """The ranges of a graph's integer tensors, the integer inputs bounded for exactness, and the reason each
    computing node cannot be lowered exactly (if any)."""

    def why_inexact(self, node: Node) -> str | None:
        return self.refused.get(id(node))

    def why_unheld(self, node: Node) -> str | None:
        """Why the node's integer result cannot be held or written exactly (an int64 past int32, a fill past 2^24)."""
        return self.unheld.get(id(node))

    def limbed(self, node: Node) -> bool:
        """Whether the node is computed in limbs (lower/integer_limbs.py): exact where fp32 would not be."""
        return id(node) in self.limbs

    def wraps(self, node: Node) -> bool:
        """Whether the node's exact result (within 2^24) may leave its type, to be wrapped as onnxruntime does."""
        return id(node) in self.wrapping

    def __init__(self, g: Graph, bound: int = EXACT) -> None:
        self.ranges: dict[str, Range] = {}
        self.bounds: dict[str, Range] = {}  # graph input -> the bound the runtime enforces
        self.refused: dict[int, str] = {}  # id(node) -> why
        self.wrapping: set[int] = set()  # id(node) of WRAPPED nodes whose result may leave its type
        self.unheld: dict[int, str] = {}  # id(node) -> why its result is not held exactly
        self.limbs: set[int] = set()  # id(node) of LIMBED nodes fp32 cannot compute exactly
        recorded = input_ranges(g)
        computed = _inputs_computed_with(g)
        for name in g.inputs:
            if not _is_int(g, name):
                continue
            low, high = type_range(g.tensors[name].dtype)
            if name in recorded:
                low, high = max(low, recorded[name][0]), min(high, recorded[name][1] - 1)
            if name in computed and (low < -bound or high > bound):
                low, high = max(low, -bound), min(high, bound)
                self.bounds[name] = (low, high)
            self.ranges[name] = (low, high)
        for name, t in g.tensors.items():
            if t.is_constant and _is_int(g, name):
                values = np.asarray(t.value)
                self.ranges[name] = (int(values.min()), int(values.max())) if values.size else (0, 0)
        for node in g.nodes:
            self._visit(node, g)

    def range(self, g: Graph, name: str) -> Range:
        if name not in self.ranges:
            self.ranges[name] = type_range(g.tensors[name].dtype)
        return self.ranges[name]

    def _visit(self, node: Node, g: Graph) -> None:
        ints = [name for name in node.inputs if _is_int(g, name)]
        moves = _MORE_MOVES.get(node.op, _MOVES.get(node.op, ()))
        held = [name for i, name in enumerate(node.inputs) if name and _is_int(g, name)
                and (moves is None or i in moves)]
        for out in node.outputs:
            if not _is_int(g, out) or out in self.ranges:
                continue
            if node.op in _RESULTS and ints:
                self.ranges[out] = _RESULTS[node.op]([self.range(g, i) for i in node.inputs if i], node, g)
            elif node.op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
                self.ranges[out] = (0, 1)
            elif held and node.op != "Cast":
                self.ranges[out] = _union([self.range(g, name) for name in held])
            elif node.op == "Cast" and held:
                inside, limit = self.range(g, held[0]), value_range(g.tensors[out].dtype)
                self.ranges[out] = inside if limit[0] <= inside[0] and inside[1] <= limit[1] else limit
            elif node.op in FILLS:
                self.ranges[out] = _fill_range(node, g)
            else:
                self.ranges[out] = type_range(g.tensors[out].dtype)
            why = self._unheld(node, g, out)
            if why:
                self.unheld.setdefault(id(node), why)
        if node.op in COMPUTING and ints:
            why = self._inexact(node, g)
            if why and limbable(node, g) and self._held(node, g):
                self._limb(node, g)
            elif why:
                self.refused[id(node)] = why
        out = node.outputs[0] if node.outputs else ""
        if (id(node) in self.wrapping or id(node) in self.limbs) and out in self.ranges:
            # a wrapped result holds any value of its type, not the exact result's interval
            low, high = self.ranges[out]
            limit = type_range(g.tensors[out].dtype)
            if low < limit[0] or high > limit[1]:
                self.ranges[out] = limit

    def _small_operand_comparison(self, node: Node, g: Graph) -> bool:
        """A comparison one of whose operands stays under 2^24 in magnitude (a constant, a position's arange, a
        step index): exact in fp32 whatever the other holds, as small_constant_comparison says (which decides it
        from constants alone, before the ranges are known)."""
        return _comparison_of_held_types(node, g) and \
            any(_magnitude(self.range(g, name)) < EXACT for name in node.inputs)

    def _held(self, node: Node, g: Graph) -> bool:
        """Whether the node's exact result is what its output holds once wrapped: always, but for an int64
        result, held in int32, which must hold the exact result."""
        if limbed_whatever_the_inputs(node, g):
            return True
        low, high = self.ranges[node.outputs[0]]
        held = type_range(g.tensors[node.outputs[0]].dtype)
        return held[0] <= low and high <= held[1]

    def _limb(self, node: Node, g: Graph) -> None:
        """Computed in limbs: exact, and wrapped as onnxruntime wraps, by the limbs' own join."""
        self.limbs.add(id(node))
        self.wrapping.discard(id(node))

    def _unheld(self, node: Node, g: Graph, out: str) -> str | None:
        low, high = self.ranges[out]
        dtype = np.dtype(g.tensors[out].dtype)
        held = type_range(dtype)
        # a narrower type holds its own range, where a computing node's exact result is wrapped or refused (_inexact)
        if (low < held[0] or high > held[1]) and held != value_range(dtype) and node.op not in COMPUTING:
            return (f"its {dtype} result {out!r} may hold values in [{low}, {high}], outside [{held[0]}, {held[1]}]: "
                    f"the device holds {dtype} in 32 bits")
        if node.op in FILLS and _magnitude((low, high)) > EXACT:
            return (f"it fills {out!r} with {high if abs(high) >= abs(low) else low}, which the engines write as an "
                    "fp32 value, exact to 2^24")
        return None

    def _inexact(self, node: Node, g: Graph) -> str | None:
        if self._small_operand_comparison(node, g):
            return None
        for name in node.inputs:
            if name and _is_int(g, name) and _magnitude(self.range(g, name)) > EXACT:
                low, high = self.range(g, name)
                return (f"integer input {name!r} may hold values in [{low}, {high}]; the engines compute in fp32, "
                        f"exact to 2^24")
        for out in node.outputs:
            if not out or not _is_int(g, out) or node.op in ("TopK", "ArgMax", "ArgMin") and out != node.outputs[0]:
                continue
            low, high = self.ranges[out]
            limit = type_range(g.tensors[out].dtype)
            if _magnitude((low, high)) > EXACT:
                return (f"its exact integer result may reach [{low}, {high}]; the engines compute in fp32, exact to "
                        "2^24")
            if (low < limit[0] or high > limit[1]) and node.op in WRAPPED:
                self.wrapping.add(id(node))
            elif low < limit[0] or high > limit[1]:
                return (f"its {g.tensors[out].dtype} result may wrap around (the exact result spans [{low}, {high}]), "
                        "which the engines, saturating, do not do")
        return None


# The types a comparison may take in fp32: the device holds them in 32 bits (int64 in an int32, its inputs refused
# at run time past int32); uint32 is left to the limbs.
_HELD_WHOLE = frozenset(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16))


def _comparison_of_held_types(node: Node, g: Graph) -> bool:
    return node.op in COMPARISONS and len(node.inputs) == 2 and \
        all(np.dtype(g.tensors[name].dtype) in _HELD_WHOLE for name in node.inputs)


def small_constant_comparison(node: Node, g: Graph) -> bool:
    """Whether `node` compares an integer with a constant of magnitude under 2^24, which fp32 decides exactly
    whatever the other side holds: rounding to fp32 keeps order, the constant is exact, and a value that rounds to
    it would have to be the constant itself (integers under 2^24 are exact; one at or past 2^24 rounds to a
    magnitude at or past 2^24). A sequence-length mask (step < lengths) then costs one instruction, not limbs."""
    if not _comparison_of_held_types(node, g):
        return False
    for name in node.inputs:
        t = g.tensors[name]
        if t.is_constant and _is_int(g, name):
            values = np.asarray(t.value)
            if values.size and int(np.abs(values.astype(np.int64)).max()) < EXACT:
                return True
    return False


def _inputs_computed_with(g: Graph) -> set[str]:
    """The integer graph inputs whose values reach a computing operator through operators that move them."""
    users = g.consumers()
    found = set()
    for name in g.inputs:
        seen, todo = {name}, [name]
        while todo and name not in found:
            value = todo.pop()
            for node in users.get(value, []):
                positions = [p for p, used in enumerate(node.inputs) if used == value]
                moves = _MORE_MOVES.get(node.op, _MOVES.get(node.op, ()))
                if small_constant_comparison(node, g):
                    continue  # exact in fp32 whatever the input holds
                if limbed_whatever_the_inputs(node, g):
                    if node.op in LIMBED_ARITHMETIC or node.op in ("Max", "Min"):  # carry the values on
                        todo += [o for o in node.outputs if o and o not in seen]
                        seen.update(node.outputs)
                elif node.op in COMPUTING:
                    found.add(name)
                elif (node.op != "Cast" or _keeps_every_bound(node, g)) and \
                        (moves is None or any(p in moves for p in positions)):
                    todo += [o for o in node.outputs if o and o not in seen]
                    seen.update(node.outputs)
    return found


def _keeps_every_bound(cast: Node, g: Graph) -> bool:
    """Whether a Cast keeps each value of an input bounded to [-B, B], B up to WIDEST_BOUND: one to a signed
    integer of 32 bits or more (BLOOM's attention mask, cast to int32 and summed up along the sequence). A cast to
    a narrower type wraps whatever bound its input has, and one to a float computes nothing in integers."""
    return np.dtype(g.tensors[cast.outputs[0]].dtype) in (np.dtype(np.int32), np.dtype(np.int64))


# The widest bound put on an input computed with: an int64 Add or Sub of two such inputs, computed in limbs, stays
# within the int32 the device holds it in
WIDEST_BOUND = 1 << 30
# The narrowest bound put on an input computed with: below it, refusing the node says more than a run refusing
# every realistic value would
LEAST_BOUND = 1 << 8
_CACHE: list[tuple[weakref.ref[Graph], int, IntegerRanges]] = []  # the last graph analysed (not kept alive)


def integer_ranges(g: Graph) -> IntegerRanges:
    """The ranges of `g` with the widest bound on the inputs computed with (2^30, halved down to LEAST_BOUND) that
    leaves no node refused for what it computes from them: a ReduceSum over 64 values bounds its input to 2^18,
    an int64 Add of two inputs (in limbs, within int32) to 2^29, an int32 Add none at all (limbs). Computed once
    while the graph keeps its nodes and tensors (the checks ask per node)."""
    if _CACHE and _CACHE[0][0]() is g and _CACHE[0][1] == len(g.nodes):
        return _CACHE[0][2]
    bound = WIDEST_BOUND
    found = IntegerRanges(g, bound)
    while found.refused and found.bounds and bound > LEAST_BOUND:
        bound //= 2
        narrower = IntegerRanges(g, bound)
        if len(narrower.refused) < len(found.refused) or not narrower.refused:
            found = narrower
        if not found.refused:
            break
    _CACHE[:] = [(weakref.ref(g), len(g.nodes), found)]
    return found
