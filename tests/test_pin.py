"""Pinned choices: validation feeds the converted model the fp32 model's
TopK / NonMaxSuppression / NonZero / ArgMax choices, so outputs built from
them compare values, not tie-breaks (real models, real onnxruntime, the CLI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import pytest
from helpers import I64, init, model, run, value
from onnx import helper

from amp_convert import convert
from amp_convert import validation as validate_module
from amp_convert.errors import RunFailure
from amp_convert.graph import build_context, tensor_names
from amp_convert.inputs import make_source
from amp_convert.pin import find_selections, pin
from amp_convert.report import report_schema
from amp_convert.runner import runnable
from amp_convert.schema import model_opsets
from amp_convert.typeinfo import infer_types
from amp_convert.validation import ValidationConfig, validate

K = 8


def cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("amp-convert")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)


def near_ties_model(indices_out: bool = False, overflow: bool = False) -> onnx.ModelProto:
    """x -> MatMul(W) -> scores (256 columns a few 1e-4 apart: fp16 rounding
    reorders them) -> TopK 8 -> Gather of a table whose columns differ a lot.
    ``overflow``: the scores go through Exp of values past fp16's range first.
    ``indices_out``: the chosen indices are a graph output too."""
    rng = np.random.default_rng(0)
    base = np.abs(rng.standard_normal((16, 1))).astype(np.float32)
    w = base + 1e-4 * rng.standard_normal((16, 256)).astype(np.float32)
    table = rng.standard_normal((16, 256)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["raw"], name="score")]
    scores = "raw"
    inits = [init("W", w), init("T", table), init("k", np.array([K], np.int64))]
    if overflow:
        inits.append(init("big", np.array([4.0], np.float32)))
        nodes += [
            helper.make_node("Mul", ["raw", "big"], ["scaled"], name="scale"),
            helper.make_node("Exp", ["scaled"], ["expd"], name="exp"),
        ]
        scores = "expd"
    nodes += [
        helper.make_node("TopK", [scores, "k"], ["top_values", "top_idx"], name="topk", axis=1),
        helper.make_node("MatMul", ["x", "T"], ["table"], name="table_proj"),
        helper.make_node("GatherElements", ["table", "top_idx"], ["picked"], name="pick", axis=1),
    ]
    outputs = [value("picked", shape=(1, K))]
    if not overflow:
        outputs.append(value("top_values", shape=(1, K)))
    if indices_out:
        outputs.append(value("top_idx", I64, shape=(1, K)))
    return model(nodes, [value("x", shape=(1, 16))], outputs, inits)


@pytest.fixture
def ties_path(tmp_path) -> Path:
    path = tmp_path / "ties.onnx"
    onnx.save(near_ties_model(), str(path))
    return path


def _report(path: Path) -> dict:
    data = json.loads(path.read_text())
    jsonschema.validate(data, report_schema())
    return data


def test_pinned_choices_compare_values_not_tie_breaks(ties_path, tmp_path):
    report = tmp_path / "pinned.json"
    out = tmp_path / "a.onnx"
    pinned = cli(str(ties_path), "--level", "O2", "-o", str(out), "--input-range", "x=1:2", "--report", str(report))
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    v = _report(report)["validation"]
    [choice] = v["pinned"]["selections"]
    assert choice["name"] == "top_idx" and choice["op_type"] == "TopK" and choice["node"] == "topk"
    # fp16 reorders the near-ties: its own choice differs, which is what the pin hides from the outputs.
    assert choice["agreement"] < 1.0
    assert [i["name"] for i in v["pinned"]["inputs"]] == ["raw"] and v["pinned"]["inputs"][0]["passed"]
    assert "1 choice(s) pinned to the fp32 model's (TopK 1)" in pinned.stdout
    assert "(--no-pin-choices compares as is)" in pinned.stdout  # (the report's `pin_choices` false, as a flag)

    unpinned = cli(str(ties_path), "--level", "O2", "-o", str(tmp_path / "b.onnx"), "--input-range", "x=1:2", "--no-pin-choices")
    assert unpinned.returncode == 1, unpinned.stdout + unpinned.stderr
    assert "picked" in unpinned.stdout and "FAIL" in unpinned.stdout
    assert not (tmp_path / "b.onnx").exists()


def test_a_choice_made_from_overflowing_values_still_fails(tmp_path):
    """The output only gathers at the (pinned) indices, so it matches; the
    scores the choice was made from overflow fp16 at O3, and that fails."""
    path = tmp_path / "overflow_ties.onnx"
    onnx.save(near_ties_model(overflow=True), str(path))
    report, page = tmp_path / "o3.json", tmp_path / "o3.html"
    o3 = cli(
        str(path),
        "--level",
        "O3",
        "-o",
        str(tmp_path / "o3.onnx"),
        "--input-range",
        "x=1:2",
        "--report",
        str(report),
        "--html",
        str(page),
    )
    assert o3.returncode == 1, o3.stdout + o3.stderr
    v = _report(report)["validation"]
    assert all(o["passed"] for o in v["outputs"])
    [scores] = v["pinned"]["inputs"]
    assert scores["name"] == "expd" and not scores["passed"] and scores["new_nonfinite"] > 0
    assert "expd (choice input)" in o3.stdout
    # The page says it too: the row that fails, and why (it showed every row passing under a failed badge).
    html = page.read_text()
    row = html[html.index("<td>expd (choice input)</td>") :].split("</tr>")[0]
    assert ">FAIL<" in row and f"<li>expd (choice input): {scores['failures'][0]}</li>" in html


def test_a_choice_that_is_a_graph_output_is_compared_not_pinned(tmp_path):
    path = tmp_path / "idx_out.onnx"
    onnx.save(near_ties_model(indices_out=True), str(path))
    report = tmp_path / "r.json"
    proc = cli(str(path), "--level", "O2", "-o", str(tmp_path / "o.onnx"), "--input-range", "x=1:2", "--report", str(report))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the chosen indices themselves differ
    v = _report(report)["validation"]
    assert v["pinned"]["selections"] == []
    top_idx = next(o for o in v["outputs"] if o["name"] == "top_idx")
    assert top_idx["kind"] == "exact" and not top_idx["passed"]


def test_pinned_model_reads_the_choice_and_keeps_values_consistent():
    m = near_ties_model()
    ctx = build_context(m.graph)
    infer_types(ctx, model_opsets(m))
    selections = find_selections(ctx)
    assert [(s.name, s.op_type, s.inputs) for s in selections] == [("top_idx", "TopK", ("raw",))]
    pinned, own = pin(m, selections, tensor_names(ctx))  # (a validation artifact: onnxruntime runs it, nobody writes it)
    assert [v.name for v in pinned.graph.input] == ["x", "top_idx"]
    assert own == {"top_idx": "top_idx__amp_own"}
    x = np.full((1, 16), 1.5, np.float32)
    chosen = np.array([[5, 3, 200, 7, 0, 1, 2, 9]], np.int64)
    picked, values, own_choice = run(pinned, {"x": x, "top_idx": chosen})
    raw = x @ onnx.numpy_helper.to_array(m.graph.initializer[0])
    table = x @ onnx.numpy_helper.to_array(m.graph.initializer[1])
    np.testing.assert_allclose(values, np.take_along_axis(raw, chosen, 1), rtol=1e-6)  # TopK's values at the pinned indices
    np.testing.assert_allclose(picked, np.take_along_axis(table, chosen, 1), rtol=1e-6)
    assert own_choice.shape == (1, K) and not np.array_equal(own_choice, chosen)  # its own choice, exposed


def test_a_choice_is_pinned_before_opset_11_without_gather_elements():
    """GatherElements, which gathers a pinned TopK's values, came in opset
    11: at opset 10 the pinned copy was invalid and validation fell back to
    comparing tie-breaks (a detector failed, auto kept it all fp32). There
    the indices are pinned and the values stay TopK's own (sorted, they
    differ from those at the pinned indices by the near-tie alone)."""
    rng = np.random.default_rng(0)
    base = np.abs(rng.standard_normal((16, 1))).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["raw"], name="score"),
        helper.make_node("TopK", ["raw", "k"], ["top_values", "top_idx"], name="topk", axis=1),
        helper.make_node("Gather", ["table", "top_idx"], ["picked"], name="pick", axis=0),
    ]
    inits = [
        init("W", base + 1e-4 * rng.standard_normal((16, 256)).astype(np.float32)),
        init("table", rng.standard_normal((256, 2)).astype(np.float32)),
        init("k", np.array([K], np.int64)),
    ]
    m = model(
        nodes, [value("x", shape=(1, 16))], [value("picked", shape=(1, K, 2)), value("top_values", shape=(1, K))], inits, opset=10
    )
    ctx = build_context(m.graph)
    infer_types(ctx, model_opsets(m))
    selections = find_selections(ctx)
    pinned, own = pin(m, selections, tensor_names(ctx))
    assert own == {"top_idx": "top_idx__amp_own"}
    assert "GatherElements" not in {n.op_type for n in pinned.graph.node}
    x = np.full((1, 16), 1.5, np.float32)
    chosen = np.array([[5, 3, 200, 7, 0, 1, 2, 9]], np.int64)
    picked, values, own_choice = run(pinned, {"x": x, "top_idx": chosen})
    np.testing.assert_array_equal(picked, onnx.numpy_helper.to_array(inits[1])[chosen])  # read at the pinned indices
    np.testing.assert_array_equal(values, run(m, {"x": x})[1])  # TopK's own values
    assert own_choice.shape == (1, K)


def _argmax_model(columns: int) -> onnx.ModelProto:
    """x -> MatMul -> ArgMax over ``columns`` columns -> Gather from a table of that many rows."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["scores"], name="score"),
        helper.make_node("ArgMax", ["scores"], ["best"], name="argmax", axis=1, keepdims=0),
        helper.make_node("Gather", ["table", "best"], ["y"], name="lookup", axis=0),
    ]
    inits = [
        init("W", rng.standard_normal((16, columns)).astype(np.float32)),
        init("table", np.arange(columns * 2.0, dtype=np.float32).reshape(columns, 2)),
    ]
    return model(nodes, [value("x", shape=(1, 16))], [value("y", shape=(1, 2))], inits)


def test_a_candidate_that_cannot_take_the_pinned_choice_is_compared_as_it_is():
    """``compare`` of two different models: the reference chooses among 256
    rows, the candidate has 4; fed the reference's choice it would index out
    of range, so validation compares it unpinned and says why."""
    reference, candidate = _argmax_model(256), _argmax_model(4)
    result = validate(reference, candidate, make_source(reference, samples=2), ValidationConfig(provider="cpu"))
    assert result.pinned == [] and result.pin_note.startswith("choices not pinned: the pinned candidate failed")
    assert result.as_dict()["pinned"]["note"] == result.pin_note


def test_a_reference_that_cannot_run_on_the_samples_is_not_validated_again_unpinned(monkeypatch):
    """The model reads row ``row`` of x, which has one: on samples whose
    row is 1 no model runs. Validation retried without the pinned choice
    (ArgMax -> Gather) on any failure, the reference's too, which runs the
    same without pins: both sessions were built twice and the second
    failure reported. Only the pinned candidate's own failure is retried."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Gather", ["x", "row"], ["picked_row"], name="pick_row", axis=0),
        helper.make_node("MatMul", ["picked_row", "W"], ["scores"], name="score"),
        helper.make_node("ArgMax", ["scores"], ["best"], name="argmax", axis=1, keepdims=0),
        helper.make_node("Gather", ["table", "best"], ["y"], name="lookup", axis=0),
    ]
    inits = [
        init("W", rng.standard_normal((16, 4)).astype(np.float32)),
        init("table", np.arange(8.0, dtype=np.float32).reshape(4, 2)),
    ]
    reference = model(nodes, [value("x", shape=(1, 16)), value("row", I64, shape=(1,))], [value("y", shape=(1, 2))], inits)
    ctx = build_context(reference.graph)
    infer_types(ctx, model_opsets(reference))
    assert [s.name for s in find_selections(ctx)] == ["best"]  # (pinned in the candidate, which makes it too)
    candidate = convert(reference, level="O2").model
    built = []
    monkeypatch.setattr(
        validate_module, "runnable", lambda *args, **kw: built.append(args[0] is reference) or runnable(*args, **kw)
    )
    source = make_source(reference, ranges=["row=1:2"])
    with pytest.raises(RunFailure) as failure:
        validate(reference, candidate, source, ValidationConfig(provider="cpu"))
    assert failure.value.role == "reference" and "out of data bounds" in failure.value.detail, failure.value
    assert built == [False, True]  # (the pinned candidate's session, then the reference's)


@pytest.mark.parametrize("label_type", [onnx.TensorProto.INT32, onnx.TensorProto.FLOAT])
def test_a_choice_that_only_becomes_labels_is_compared_not_pinned(label_type):
    """ArgMax -> Cast -> output: the choice picks no float data (a Cast to
    float is its value), so pinning would only hide label flips; the labels
    are compared as they are."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["logits"], name="score"),
        helper.make_node("ArgMax", ["logits"], ["best"], name="argmax", axis=1, keepdims=0),
        helper.make_node("Cast", ["best"], ["label"], name="to_label", to=label_type),
    ]
    m = model(
        nodes,
        [value("x", shape=(4, 16))],
        [value("label", label_type, shape=(4,))],
        [init("W", rng.standard_normal((16, 10)).astype(np.float32))],
    )
    ctx = build_context(m.graph)
    infer_types(ctx, model_opsets(m))
    assert find_selections(ctx) == []
    result = validate(m, m, make_source(m, samples=1), ValidationConfig(provider="cpu"))
    assert result.pinned == [] and result.outputs[0].kind == ("exact" if label_type == onnx.TensorProto.INT32 else "float")
