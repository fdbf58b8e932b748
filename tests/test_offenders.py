"""The offenders rank by the error a node's rounding brings to the outputs,
and ``--level auto`` keeps fp32 the part of the graph that amplifies it."""

from __future__ import annotations

import json

import numpy as np
import onnx
from helpers import init, model, value
from onnx import helper
from text_image import detector_input

from amp_convert import ConvertOptions, Precision, convert
from amp_convert.auto import auto_convert
from amp_convert.calibrate import calibrate
from amp_convert.cli import main
from amp_convert.inputs import make_source
from amp_convert.validation import ValidationConfig, validate

CPU = ValidationConfig(provider="cpu")


def _const(name: str, v) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"{name}_c", value=onnx.numpy_helper.from_array(np.array(v, np.float32)))


def test_a_node_that_damages_the_output_ranks_first_and_epsilons_below_a_matmul():
    """An RMSNorm's epsilon (1e-6) and a one-element -2.65e-6 round by over
    1% of their own values in fp16; added to values of order 1 they bring
    almost nothing to the output. A Mul by 1e-6 (its results subnormal in
    fp16: a few bits left) that two Muls by 1e3 take back damages it: it
    ranks first, and the constants rank below the MatMul, which only rounds."""
    rng = np.random.default_rng(0)
    k = 64
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("Mul", ["h", "h"], ["sq"], name="sq"),
        helper.make_node("ReduceMean", ["sq"], ["ms"], name="mean", axes=[-1]),
        _const("eps", 1e-6),
        helper.make_node("Add", ["ms", "eps"], ["mse"], name="add_eps"),
        helper.make_node("Sqrt", ["mse"], ["rms"], name="sqrt"),
        helper.make_node("Div", ["h", "rms"], ["n"], name="norm"),
        _const("tiny", [-2.65e-6]),
        helper.make_node("Add", ["n", "tiny"], ["nt"], name="add_tiny"),
        helper.make_node("Mul", ["nt", "small"], ["s"], name="shrink"),
        helper.make_node("Mul", ["s", "large"], ["g1"], name="grow1"),
        helper.make_node("Mul", ["g1", "large"], ["g"], name="grow2"),
        helper.make_node("MatMul", ["g", "W2"], ["y"], name="mm2"),
    ]
    inits = [
        init("W1", rng.normal(0, 0.2, (k, k)).astype(np.float32)),
        init("W2", rng.normal(0, 0.2, (k, k)).astype(np.float32)),
        init("small", np.array(1e-6, np.float32)),
        init("large", np.array(1e3, np.float32)),
    ]
    m = model(nodes, [value("x", shape=(4, k))], [value("y", shape=(4, k))], inits, opset=17)
    source = make_source(m, samples=2)
    out, plan = convert(m, level="O3")
    result = validate(m, out, source, CPU, plan)
    assert not result.passed  # (the subnormal values fail the output)
    by_name = {n.name: n for n in result.nodes}
    ranked = [n.name for n in result.ranked()]
    assert ranked[0] == "shrink", ranked
    for name in ("eps_c", "tiny_c"):
        assert by_name[name].error_after > 10 * by_name["mm1"].error_after  # (their own rounding is large ...)
        assert name not in ranked or ranked.index(name) > ranked.index("mm1")
        assert by_name[name].rank_error < by_name["shrink"].rank_error / 100  # (... what reaches the output is not)


def _steep_head(height: int = 32, width: int = 64) -> tuple[onnx.ModelProto, np.ndarray]:
    """A text detector in small: three 3x3 Convs with Relu (the body) on a
    rendered page, then a head: a 1x1 Conv to one channel with a large bias
    (its values near 4.5), minus the median (``head_bias``), times 10 / std
    (``head_scale``), Sigmoid: a probability map whose edge is steep. The
    head's fp16 rounding of the values near 4.5 becomes, after the
    subtraction and the scale, errors of several hundredths: only the head
    Conv and the subtraction need fp32, 0.1% of the compute."""
    rng = np.random.default_rng(0)
    c = 64

    def conv_w(o: int, i: int, size: int) -> np.ndarray:
        return rng.normal(0, np.sqrt(2 / (i * size * size)), (o, i, size, size)).astype(np.float32)

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1] * 4),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], name="conv3", pads=[1] * 4),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        helper.make_node("Conv", ["r3", "wh", "bh"], ["z"], name="head_conv"),
    ]
    inits = [
        init("w1", conv_w(c // 2, 3, 3)),
        init("w2", conv_w(c, c // 2, 3)),
        init("w3", conv_w(c, c, 3)),
        init("wh", np.abs(rng.normal(0, 1 / c, (1, c, 1, 1))).astype(np.float32)),
        init("bh", np.array([4.0], np.float32)),
    ]
    x = detector_input(height, width)
    shape = (1, 3, height, width)
    body = model(nodes, [value("x", shape=shape)], [value("z", shape=(1, 1, height, width))], inits)
    import onnxruntime as ort

    z = ort.InferenceSession(body.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    nodes += [
        helper.make_node("Add", ["z", "b"], ["zb"], name="head_bias"),
        helper.make_node("Mul", ["zb", "k"], ["logit"], name="head_scale"),
        helper.make_node("Sigmoid", ["logit"], ["prob"], name="head_sigmoid"),
    ]
    inits += [init("b", np.array(-np.median(z), np.float32)), init("k", np.array(10 / z.std(), np.float32))]
    return model(nodes, [value("x", shape=shape)], [value("prob", shape=(1, 1, height, width))], inits), x


def test_auto_keeps_only_the_amplifying_head_fp32(tmp_path):
    """O3 fails on the steep head's map; keeping fp32 the nodes chosen by
    the error they add over their inputs (the subtraction, the Sigmoid,
    then the body's Convs) never fixed it, and once ended at 0.4% of the
    compute low, failing. Ranked by what reaches the output, the head Conv
    whose rounding the subtraction amplifies comes first with it: the
    search passes with the head fp32 and the body low."""
    m, x = _steep_head()
    np.savez(tmp_path / "page.npz", x=x)
    source = make_source(m, [tmp_path / "page.npz"])
    searched = auto_convert(m, ConvertOptions(), source, CPU, calibrate(m, source, "cpu"), max_trials=8)
    assert not searched.trials[0].passed  # (all low: the map is off by hundredths)
    assert searched.validation.passed and searched.low_compute > 0.99
    plan = {e.name: e.precision for e in searched.conversion.plan}
    assert plan["head_conv"] is plan["head_bias"] is Precision.FP32
    assert all(plan[name] is Precision.LOW for name in ("conv1", "conv2", "conv3"))


def test_the_terminal_json_and_page_show_the_error_reaching_the_outputs(tmp_path, capsys):
    """At O3 the steep head's subtraction ranks first and the head Conv
    before it among the first three (its own error 2.5e-4, 0.03 reaching
    the map), each line saying what reaches the output; the JSON's
    error_to_outputs and the page's column hold the same figure."""
    m, x = _steep_head()
    path, page = tmp_path / "steep.onnx", tmp_path / "page.npz"
    onnx.save(m, str(path))
    np.savez(page, x=x)
    report, html = tmp_path / "r.json", tmp_path / "r.html"
    flags = ["--inputs", str(page), "--report", str(report), "--html", str(html), "--provider", "cpu", "--top", "3"]
    assert main([str(path), "--level", "O3", "-o", str(tmp_path / "o.onnx"), *flags]) == 1
    listed = capsys.readouterr().out.split("worst first:\n")[1].split("\n\n")[0].splitlines()
    offenders = json.loads(report.read_text())["validation"]["offenders"]
    names = [o["name"] for o in offenders]
    assert names[0] == "head_bias" and "head_conv" in names  # (the Sigmoid, which only passes it on, is close)
    conv = offenders[names.index("head_conv")]
    assert conv["error_to_outputs"] > 50 * conv["error_after"]  # (its own rounding, amplified by the subtraction)
    for line, o in zip(listed, offenders, strict=True):
        assert line.startswith(f"  {o['name']} (") and line.endswith(f"; reaching {o['error_to_outputs']:.4g}")
    assert "<th>reaching the outputs</th>" in html.read_text()


def test_a_node_read_only_inside_an_if_body_still_reaches_the_outputs():
    """A low MatMul whose output the If's branches read from the main graph
    (captured, not an input of the If): its error reaches the output
    through them, so it ranks; before, the gain stopped at the If's inputs."""
    rng = np.random.default_rng(0)
    then_branch = helper.make_graph([helper.make_node("Identity", ["h"], ["t"])], "then", [], [value("t", shape=(2, 16))])
    else_branch = helper.make_graph([helper.make_node("Neg", ["h"], ["e"])], "else", [], [value("e", shape=(2, 16))])
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_branch, else_branch=else_branch),
    ]
    inputs = [value("x", shape=(2, 16)), value("c", onnx.TensorProto.BOOL, ())]
    m = model(nodes, inputs, [value("y", shape=(2, 16))], [init("W", rng.standard_normal((16, 16)).astype(np.float32))])
    converted = convert(m, level="O3").model
    result = validate(m, converted, make_source(m, ranges=["c=1:2"]), CPU)
    mm = next(n for n in result.nodes if n.name == "mm")
    assert mm.added > 0 and mm.to_outputs > 0
    assert "mm" in [n.name for n in result.ranked()]
