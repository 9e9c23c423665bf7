"""Control flow (the inline-control-flow pass): If with a folded or pinned condition, Loop with a static trip count
(a static and a run-time early exit), Scan in every direction, a nested If in a Loop body; each compiled, run on
the simulated chip and compared with onnxruntime. And the errors for what cannot be unrolled, in compile and in
analyze."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import neuronx_cc_lite
import runtime
from neuronx_cc_lite.cli import main
from neuronx_cc_lite.compiler import Options, compile_model, prepare
from neuronx_cc_lite.errors import CompileError, UnsupportedError
from neuronx_cc_lite.ir import print_graph
from neuronx_cc_lite.passes import inline_control_flow
from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.conftest import assert_close, compile_to_model, make_model

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 4)).astype(np.float32) * 0.5


def _graph(name: str, nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list | None]],
           outputs: list[tuple[str, int, list | None]]) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                             [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs])


def _const(name: str, value: object, dtype: object = np.float32) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value, dtype)))


def _compare(model: onnx.ModelProto, tmp: str, feeds: dict[str, np.ndarray], options: Options | None = None,
             reference_feeds: dict[str, np.ndarray] | None = None) -> None:
    compiled = compile_to_model(model, tmp, options)
    ours = compiled.run(feeds)
    assert_close(ours, onnxruntime_outputs(model, {**feeds, **(reference_feeds or {})}), rtol=1e-4)


def _ops(model: onnx.ModelProto, options: Options | None = None) -> list[str]:
    return [n.op for n in prepare(model, options or Options(stop_after="inline-control-flow")).nodes]


# ---------------------------------------------------------------------------------------------------------------
# If

def _if_model(cond: np.ndarray | None) -> onnx.ModelProto:
    """y = If(c) then MatMul(x, w) + 1 (reading w and x from outside) else Neg(x); a constant c when given."""
    then = _graph("then", [_const("one", 1.0), helper.make_node("MatMul", ["x", "w"], ["xw"]),
                           helper.make_node("Add", ["xw", "one"], ["t"])], [], [("t", F, [3, 4])])
    other = _graph("else", [helper.make_node("Neg", ["x"], ["e"])], [], [("e", F, [3, 4])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then, else_branch=other),
             helper.make_node("Relu", ["y"], ["z"])]
    weights = {"w": W} if cond is None else {"w": W, "c": cond}
    inputs = {"x": ([3, 4], F)} if cond is not None else {"x": ([3, 4], F), "c": ([], B)}
    return make_model(nodes, inputs, {"z": ([3, 4], F)}, weights)


@pytest.mark.parametrize("taken", [True, False])
def test_an_if_with_a_constant_condition_is_its_branch(tmp_path, taken):
    model = _if_model(np.array(taken))
    assert "If" not in _ops(model)
    _compare(model, str(tmp_path), {"x": RNG.standard_normal((3, 4)).astype(np.float32)})


def test_an_if_whose_condition_folds_from_shapes_is_inlined(tmp_path):
    """The exporter's pattern: a branch on a dimension (here batch > 1), decided once shapes are static."""
    then = _graph("then", [helper.make_node("ReduceMean", ["x"], ["t"], axes=[0], keepdims=1)], [], [("t", F, None)])
    other = _graph("else", [helper.make_node("Identity", ["x"], ["e"])], [], [("e", F, None)])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), _const("zero", [0], np.int64), _const("one", 1, np.int64),
             helper.make_node("Gather", ["s", "zero"], ["n"]), helper.make_node("ReduceMax", ["n"], ["m"],
                                                                                keepdims=0),
             helper.make_node("Greater", ["m", "one"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Add", ["y", "x"], ["z"])]
    model = make_model(nodes, {"x": ([3, 4], F)}, {"z": ([3, 4], F)}, opset=11)
    assert "If" not in _ops(model)
    _compare(model, str(tmp_path), {"x": RNG.standard_normal((3, 4)).astype(np.float32)})


@pytest.mark.parametrize("taken", [True, False])
def test_an_if_on_an_input_compiles_once_the_input_is_pinned(tmp_path, taken):
    model = _if_model(None)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    _compare(model, str(tmp_path), {"x": x}, Options(input_values={"c": taken}),
             reference_feeds={"c": np.array(taken)})


def test_input_values_from_python_are_part_of_the_cache_key(tmp_path):
    model = _if_model(None)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    results = {}
    for taken in (True, False, True):  # the second True comes from the cache: still the then branch
        b = neuronx_cc_lite.compile(model, input_values={"c": taken}, cache_dir=str(tmp_path))
        assert b.flags["input_values"] == {"c": taken}
        assert [i.name for i in b.inputs] == ["x"]
        results[taken] = runtime.load(b).run({"x": x})["z"]
        expected = onnxruntime_outputs(model, {"x": x, "c": np.array(taken)})["z"]
        np.testing.assert_allclose(results[taken], expected, rtol=1e-4, atol=1e-5)
    assert not np.allclose(results[True], results[False])


def test_input_value_on_the_command_line(tmp_path):
    path, neff = str(tmp_path / "if.onnx"), str(tmp_path / "if.neff")
    onnx.save(_if_model(None), path)
    assert main(["-q", "check", path, "--input-value", "c=false", "--no-cache"]) == 0
    assert main(["-q", "compile", path, "-o", neff, "--input-value", "c=true", "--no-cache"]) == 0
    assert [i.name for i in runtime.load(neff).inputs] == ["x"]


@pytest.mark.parametrize("values, message", [
    ({"q": 1}, "'q', which is not a model input"),
    ({"c": 2}, "not a bool tensor"),
    ({"c": [True, False]}, "has shape \\[2\\]; the input's is \\[\\]"),
])
def test_a_bad_input_value_is_an_option_error(values, message):
    with pytest.raises(CompileError, match=message) as e:
        compile_model(_if_model(None), Options(input_values=values))
    assert e.value.code == "NCC_OPTION"


def test_an_if_on_a_run_time_value_is_refused_naming_the_input():
    with pytest.raises(UnsupportedError, match="'choose' \\(If\\): its condition 'c' is known only at run time "
                                               "\\(it depends on input\\(s\\) 'c'\\).*--input-value"):
        compile_model(_if_model(None))


# ---------------------------------------------------------------------------------------------------------------
# Loop

def _loop_model(trips: int | None, exit_below: float | None = None, scan: bool = True,
                cond_input: bool = False) -> onnx.ModelProto:
    """h = tanh(h @ w + x[i]) for i < trips, x's row i taken by a Slice on the iteration number; each h is a scan
    output. `exit_below`: the body's condition is max(h) > exit_below (a run-time exit), else Identity(cond)."""
    body_nodes = [_const("one", [1], np.int64), _const("axes", [0], np.int64),
                  helper.make_node("Unsqueeze", ["i", "axes"], ["i1"]), helper.make_node("Add", ["i1", "one"], ["i2"]),
                  helper.make_node("Slice", ["x", "i1", "i2"], ["row"]),
                  helper.make_node("MatMul", ["h_in", "w"], ["hw"]), helper.make_node("Add", ["hw", "row"], ["pre"]),
                  helper.make_node("Tanh", ["pre"], ["h_out"])]
    if exit_below is None:
        body_nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    else:
        body_nodes += [_const("limit", exit_below), helper.make_node("ReduceMax", ["h_out"], ["top"], keepdims=0),
                       helper.make_node("Greater", ["top", "limit"], ["c_out"])]
    outputs = [("c_out", B, []), ("h_out", F, [1, 4])]
    if scan:
        body_nodes.append(helper.make_node("Identity", ["h_out"], ["h_scan"]))
        outputs.append(("h_scan", F, [1, 4]))
    body = _graph("body", body_nodes, [("i", I64, []), ("c_in", B, []), ("h_in", F, [1, 4])], outputs)
    loop_outputs = ["h_last", "hs"] if scan else ["h_last"]
    nodes = [helper.make_node("Loop", ["M", "cond" if cond_input else "", "h0"], loop_outputs, name="loop",
                              body=body)]
    inputs = {"x": ([8, 4], F), "h0": ([1, 4], F)}
    weights = {"w": W}
    if trips is None:
        inputs["M"] = ([], I64)
    else:
        weights["M"] = np.array(trips, np.int64)
    if cond_input:
        inputs["cond"] = ([], B)
    outs = {"h_last": ([1, 4], F)}
    if scan:
        outs["hs"] = ([trips, 1, 4], F)
    return make_model(nodes, inputs, outs, weights, opset=13)


def _feeds(seed: int = 0, **extra: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((8, 4)).astype(np.float32), "h0": rng.standard_normal((1, 4)).astype(np.float32),
            **extra}


def test_a_loop_with_a_static_trip_count_is_unrolled(tmp_path):
    model = _loop_model(5)
    ops = _ops(model)
    assert "Loop" not in ops and ops.count("Tanh") == 5 and "Where" not in ops
    _compare(model, str(tmp_path), _feeds())


@pytest.mark.parametrize("seed", range(4))
def test_a_run_time_early_exit_is_predicated(tmp_path, seed):
    """The loop goes on while max(h) > 0.3: these seeds stop it after 3, 5, 1 and 2 of its 6 iterations, and the
    carried value must stop changing there, as onnxruntime's loop stops."""
    model = _loop_model(6, exit_below=0.3, scan=False)
    assert _ops(model).count("Where") == 5  # the first iteration always runs
    _compare(model, str(tmp_path), _feeds(seed))


@pytest.mark.parametrize("first", [True, False])
def test_a_run_time_first_condition_is_predicated_from_the_start(tmp_path, first):
    model = _loop_model(3, exit_below=-2.0, scan=False, cond_input=True)
    _compare(model, str(tmp_path), _feeds(1, cond=np.array(first)))


def test_a_static_early_exit_shortens_the_scan_outputs(tmp_path):
    """The body's condition i < 2 folds in each copy: three iterations run of eight, the scan output has 3 rows."""
    model = _loop_model(8)
    body = model.graph.node[0].attribute[0].g
    cond = next(n for n in body.node if n.output[0] == "c_out")
    body.node.remove(cond)
    body.node.extend([_const("two", 2, np.int64), helper.make_node("Less", ["i", "two"], ["c_out"])])
    model.graph.output[1].type.tensor_type.shape.dim[0].dim_value = 3
    graph = prepare(model, Options())
    assert graph.tensors["hs"].shape == (3, 1, 4) and "Where" not in [n.op for n in graph.nodes]
    _compare(model, str(tmp_path), _feeds())


def test_a_nested_if_in_a_loop_body_follows_the_iteration_number(tmp_path):
    """Even iterations add x's row, odd ones subtract it: the If's condition folds in each unrolled copy."""
    model = _loop_model(4)
    body = model.graph.node[0].attribute[0].g
    add = next(n for n in body.node if n.output[0] == "pre")
    plus = _graph("plus", [helper.make_node("Add", ["hw", "row"], ["p"])], [], [("p", F, [1, 4])])
    minus = _graph("minus", [helper.make_node("Sub", ["hw", "row"], ["q"])], [], [("q", F, [1, 4])])
    index = list(body.node).index(add)
    body.node.remove(add)
    for k, n in enumerate([_const("two", 2, np.int64), _const("zero", 0, np.int64),
                           helper.make_node("Mod", ["i", "two"], ["parity"]),
                           helper.make_node("Equal", ["parity", "zero"], ["even"]),
                           helper.make_node("If", ["even"], ["pre"], then_branch=plus, else_branch=minus)]):
        body.node.insert(index + k, n)
    ops = _ops(model)
    assert "If" not in ops and ops.count("Add") == 2 and ops.count("Sub") == 2
    _compare(model, str(tmp_path), _feeds())


def test_a_loop_pinned_through_its_trip_count(tmp_path):
    _compare(_loop_model(None, scan=False), str(tmp_path), _feeds(), Options(input_values={"M": 3}),
             reference_feeds={"M": np.array(3, np.int64)})


def test_a_run_time_trip_count_is_refused_naming_the_node():
    with pytest.raises(UnsupportedError, match="'loop' \\(Loop\\): its trip count 'M' is known only at run time"):
        compile_model(_loop_model(None, scan=False))


def test_a_run_time_exit_with_scan_outputs_is_refused():
    with pytest.raises(CompileError, match="scan outputs is data-dependent") as e:
        compile_model(_loop_model(4, exit_below=0.0))
    assert e.value.code == "NCC_UNSUPPORTED" and e.value.node == "loop"


def test_the_unroll_limit_names_the_loop():
    with pytest.raises(CompileError, match=f"{inline_control_flow.MAX_BODY_COPIES + 1} copies") as e:
        compile_model(_loop_model(inline_control_flow.MAX_BODY_COPIES + 1, scan=False))
    assert e.value.code == "NCC_UNSUPPORTED" and e.value.node == "loop"


# ---------------------------------------------------------------------------------------------------------------
# Scan

def _scan_model(directions: list[int], out_directions: list[int], axes: list[int], out_axes: list[int]
                ) -> onnx.ModelProto:
    """Two states (a running sum and a running product of tanh) over two scan inputs; two scan outputs."""
    body = _graph("body", [helper.make_node("Add", ["s", "a"], ["s2"]), helper.make_node("Tanh", ["b"], ["tb"]),
                           helper.make_node("Mul", ["p", "tb"], ["p2"]), helper.make_node("Sub", ["s2", "p2"], ["d"]),
                           helper.make_node("Identity", ["s2"], ["e"])],
                  [("s", F, [3]), ("p", F, [3]), ("a", F, [3]), ("b", F, [3])],
                  [("s2", F, [3]), ("p2", F, [3]), ("d", F, [3]), ("e", F, [3])])
    node = helper.make_node("Scan", ["s0", "p0", "xa", "xb"], ["s", "p", "d", "e"], name="scan", body=body,
                            num_scan_inputs=2, scan_input_directions=directions, scan_output_directions=out_directions,
                            scan_input_axes=axes, scan_output_axes=out_axes)
    xa = [5, 3] if axes[0] == 0 else [3, 5]
    xb = [5, 3] if axes[1] == 0 else [3, 5]
    outs = {"s": ([3], F), "p": ([3], F)}
    for name, axis in zip("de", out_axes):
        outs[name] = ([5, 3] if axis in (0, -2) else [3, 5], F)
    return make_model([node], {"s0": ([3], F), "p0": ([3], F), "xa": (xa, F), "xb": (xb, F)}, outs, opset=16)


@pytest.mark.parametrize("directions, out_directions, axes, out_axes", [
    ([0, 0], [0, 0], [0, 0], [0, 0]),
    ([1, 0], [0, 1], [0, 0], [0, 0]),
    ([0, 1], [1, 0], [1, -1], [1, -2]),
], ids=["forward", "reverse", "axes"])
def test_a_scan_is_unrolled(tmp_path, directions, out_directions, axes, out_axes):
    model = _scan_model(directions, out_directions, axes, out_axes)
    assert "Scan" not in _ops(model)
    compiled = compile_to_model(model, str(tmp_path))
    feeds = {i.name: RNG.standard_normal(i.shape).astype(np.float32) for i in compiled.inputs}
    assert_close(compiled.run(feeds), onnxruntime_outputs(model, feeds), rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# Data-dependent shapes, and analyze

def test_a_data_dependent_shape_is_named_in_compile_and_analyze(tmp_path, capsys):
    model = make_model([helper.make_node("NonZero", ["x"], ["y"], name="nz")], {"x": ([3, 4], F)},
                       {"y": ([2, None], I64)})
    with pytest.raises(CompileError, match="NonZero.*produces a data-dependent shape"):
        compile_model(model)
    path = str(tmp_path / "nz.onnx")
    onnx.save(model, path)
    assert main(["analyze", path]) == 1
    assert "unsupported: nz (NonZero): produces a data-dependent shape" in capsys.readouterr().out


def test_a_non_zero_over_constants_folds(tmp_path):
    nodes = [helper.make_node("NonZero", ["k"], ["idx"]), helper.make_node("Cast", ["idx"], ["f"], to=F),
             helper.make_node("ReduceSum", ["f"], ["n"], keepdims=0), helper.make_node("Add", ["x", "n"], ["y"])]
    model = make_model(nodes, {"x": ([3], F)}, {"y": ([3], F)}, {"k": np.array([0, 2, 0, 5], np.float32)}, opset=11)
    _compare(model, str(tmp_path), {"x": RNG.standard_normal(3).astype(np.float32)})


@pytest.mark.parametrize("model", [_if_model(None), _loop_model(None), _loop_model(None, scan=False)],
                         ids=["if", "loop-scan", "loop"])
def test_analyze_lists_control_flow_it_cannot_unroll(tmp_path, capsys, model):
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    assert main(["analyze", path]) == 1
    out = capsys.readouterr().out
    assert "known only at run time" in out and "--input-value" in out
    assert "--input-shape" not in out and "Traceback" not in out


def test_the_ir_dump_shows_a_kept_body_by_its_size():
    text = print_graph(prepare(_loop_model(None, scan=False), Options(stop_after="inline-control-flow")))
    assert "body=graph<body: 9 nodes>" in text and "MatMul" not in text


# ---------------------------------------------------------------------------------------------------------------
# While loops: torch's `while` exports a Loop of INT64_MAX trips whose condition the body computes

NO_LIMIT = np.iinfo(np.int64).max


def _while_model(exit_on: str, scan: bool = True) -> onnx.ModelProto:
    """h = tanh(h @ w + x) while the condition holds; a counter j carried from 0. `exit_on`: "counter" (j + 1 < 5,
    a carried counter), "iteration" (i + 1 < 3, the loop's own iteration number) or "values" (h = h / 2 while
    max |h| > 0.05)."""
    body_nodes = [_const("one", 1, np.int64), helper.make_node("Add", ["j_in", "one"], ["j_out"]),
                  helper.make_node("MatMul", ["h_in", "w"], ["hw"]), helper.make_node("Add", ["hw", "x"], ["pre"]),
                  helper.make_node("Tanh", ["pre"], ["h_out"])]
    if exit_on == "counter":
        body_nodes += [_const("five", 5, np.int64), helper.make_node("Less", ["j_out", "five"], ["c_out"])]
    elif exit_on == "iteration":
        body_nodes += [_const("three", 3, np.int64), helper.make_node("Add", ["i", "one"], ["i1"]),
                       helper.make_node("Less", ["i1", "three"], ["c_out"])]
    else:  # h shrinks by a half each time (the tanh of x alone bounds it) until max |h| <= 0.05: 6 to 10 times
        body_nodes[2:] = [_const("half", 0.5), helper.make_node("Mul", ["h_in", "half"], ["h_out"])]
        body_nodes += [_const("limit", 0.05), helper.make_node("Abs", ["h_out"], ["size"]),
                       helper.make_node("ReduceMax", ["size"], ["top"], keepdims=0),
                       helper.make_node("Greater", ["top", "limit"], ["c_out"])]
    outputs = [("c_out", B, []), ("j_out", I64, []), ("h_out", F, [1, 4])]
    if scan:
        body_nodes.append(helper.make_node("Identity", ["h_out"], ["h_scan"]))
        outputs.append(("h_scan", F, [1, 4]))
    body = _graph("body", body_nodes, [("i", I64, []), ("c_in", B, []), ("j_in", I64, []), ("h_in", F, [1, 4])],
                  outputs)
    loop_outputs = ["j_last", "h_last", *(["hs"] if scan else [])]
    nodes = [helper.make_node("Loop", ["M", "start", "j0", "h0"], loop_outputs, name="while", body=body)]
    outs = {"j_last": ([], I64), "h_last": ([1, 4], F)}
    if scan:
        outs["hs"] = ([{"counter": 5, "iteration": 3}[exit_on], 1, 4], F)
    return make_model(nodes, {"x": ([1, 4], F), "h0": ([1, 4], F)}, outs,
                      {"w": W, "M": np.array(NO_LIMIT, np.int64), "start": np.array(True),
                       "j0": np.array(0, np.int64)}, opset=13)


def _while_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((1, 4)).astype(np.float32), "h0": rng.standard_normal((1, 4)).astype(np.float32)}


@pytest.mark.parametrize("exit_on, copies", [("counter", 5), ("iteration", 3)])
def test_a_while_loop_bounded_by_a_counter_is_unrolled(tmp_path, exit_on, copies):
    model = _while_model(exit_on)
    ops = _ops(model)
    assert "Loop" not in ops and ops.count("Tanh") == copies and "Where" not in ops
    _compare(model, str(tmp_path), _while_feeds())


def test_a_while_loop_on_values_is_refused_clearly_or_runs_on_the_host(tmp_path):
    model = _while_model("values", scan=False)
    with pytest.raises(UnsupportedError, match=f"node 'while' \\(Loop\\): a while loop \\(its trip count {NO_LIMIT}\\) "
                                               "whose exit condition depends on values known only at run time"):
        compile_model(model)
    b = compile_model(model, Options(fallback="host"))
    assert [p.kind for p in b.parts] == ["host"]
    for seed in range(3):
        feeds = _while_feeds(seed)
        assert_close(runtime.load(b).run(feeds), onnxruntime_outputs(model, feeds), rtol=1e-4)


def test_a_while_loop_without_an_exit_names_the_unroll_limit():
    """Its condition reads only the one it was given: the trip count is all there is, and it is over the limit."""
    model = _while_model("counter", scan=False)
    body = model.graph.node[0].attribute[0].g
    cond = next(n for n in body.node if n.output[0] == "c_out")
    body.node.remove(cond)
    body.node.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    with pytest.raises(CompileError, match=f"unrolling it takes {NO_LIMIT} copies") as e:
        compile_model(model)
    assert e.value.code == "NCC_UNSUPPORTED" and e.value.node == "while"
