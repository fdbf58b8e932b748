"""Graph outputs onnxruntime gives as something other than an array
(sequences, optionals, sequences of maps, sparse tensors) through
validation, calibration, the auto search and the reports: real models on
disk, the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import pytest
from helpers import init, model, value
from onnx import TensorProto, helper, numpy_helper

from amp_convert.report import report_schema

F32 = TensorProto.FLOAT
WEIGHT = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)


def cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("amp-convert")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)


def _sequence_model(elements: int = 2) -> onnx.ModelProto:
    """x -> MatMul -> h, Relu(h) -> r; the output is the sequence [h, r, h, ...] of ``elements``."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("SequenceConstruct", [("h", "r")[k % 2] for k in range(elements)], ["out"], name="seq"),
    ]
    out = helper.make_tensor_sequence_value_info("out", F32, None)
    return model(nodes, [value("x", shape=(2, 4))], [out], [init("W", WEIGHT)])


def _optional_model(present: bool = True) -> onnx.ModelProto:
    """x -> MatMul -> h; the outputs: ``maybe``, Optional(h) (``present``) or an
    empty Optional, and ``none``, an empty Optional."""
    empty = {"type": helper.make_tensor_type_proto(F32, None)}
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Optional", ["h"] if present else [], ["maybe"], name="maybe", **({} if present else empty)),
        helper.make_node("Optional", [], ["none"], name="none", **empty),
    ]
    optional = helper.make_optional_type_proto(helper.make_tensor_type_proto(F32, None))
    outputs = [helper.make_value_info("maybe", optional), helper.make_value_info("none", optional)]
    return model(nodes, [value("x", shape=(2, 4))], outputs, [init("W", WEIGHT)], opset=18)


def _zipmap_model(
    labels: tuple[int, ...] = (10, 20, 30, 40), name: str = "probs", rows: int | str = 2, shift: np.ndarray | None = None
) -> onnx.ModelProto:
    """A classifier's tail: MatMul -> Softmax -> ZipMap, a sequence of
    {label: probability} maps, one per row of x (``rows`` of them) as
    sklearn-onnx writes it, output ``name``; ``shift``: added to the logits
    (a model that differs in some rows)."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Softmax", ["h"], ["p"], name="softmax", axis=1),
        helper.make_node("ZipMap", ["p"], [name], name="zip", domain="ai.onnx.ml", classlabels_int64s=list(labels)),
    ]
    inits = [init("W", WEIGHT)]
    if shift is not None:
        nodes.insert(1, helper.make_node("Add", ["h0", "shift"], ["h"], name="shift"))
        nodes[0].output[0] = "h0"
        inits.append(init("shift", shift))
    maps = helper.make_sequence_type_proto(helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(F32, [])))
    outputs = [helper.make_value_info(name, maps)]
    return model(nodes, [value("x", shape=(rows, 4))], outputs, inits, extra_opsets=[("ai.onnx.ml", 3)])


def _matmul_model() -> onnx.ModelProto:
    """x -> MatMul -> out, a tensor."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["out"], name="mm")]
    return model(nodes, [value("x", shape=(2, 4))], [value("out", shape=(2, 4))], [init("W", WEIGHT)])


def _split_model() -> onnx.ModelProto:
    """x (N x 4) -> MatMul -> SplitToSequence by rows: N elements, as many as the sample has rows."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("SplitToSequence", ["h", "one"], ["rows"], name="split", axis=0),
    ]
    rows = helper.make_tensor_sequence_value_info("rows", F32, None)
    return model(nodes, [value("x", shape=("N", 4))], [rows], [init("W", WEIGHT), init("one", np.array(1, np.int64))])


def _save(m: onnx.ModelProto, path: Path) -> Path:
    onnx.save(m, str(path))
    return path


def _report(path: Path) -> dict:
    report = json.loads(path.read_text())
    jsonschema.validate(report, report_schema())
    return report


def _rows(report: dict) -> dict[str, dict]:
    return {o["name"]: o for o in report["validation"]["outputs"]}


def _lines(stdout: str) -> list[str]:
    """The terminal's lines, runs of spaces as one (the table's columns)."""
    return [" ".join(line.split()) for line in stdout.splitlines()]


@pytest.mark.parametrize(
    "how",
    [("--level", "O2"), ("--level", "O3", "--no-per-node"), ("--level", "auto"), ("--level", "O2", "--calibration")],
    ids=["O2", "O3-no-per-node", "auto", "calibration"],
)
def test_a_sequence_output_is_compared_element_by_element(how, tmp_path):
    """Each element of a sequence output is an output of its own, out[0] and
    out[1], judged by the tolerance; the sequence's row says its length.
    Every path that runs the models read the output as an array (its bytes,
    its values): the fp32 model itself stopped with 'internal error:
    AttributeError: 'list' object has no attribute 'nbytes'' (exit 3)."""
    src = _save(_sequence_model(), tmp_path / "seq.onnx")
    np.savez(tmp_path / "cal.npz", x=np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    args = [*how, str(tmp_path / "cal.npz")] if how[-1] == "--calibration" else list(how)
    report_path, html_path = tmp_path / "r.json", tmp_path / "r.html"
    proc = cli(str(src), *args, "-o", str(tmp_path / "o.onnx"), "--report", str(report_path), "--html", str(html_path))
    assert proc.returncode == 0, proc.stderr
    rows = _rows(_report(report_path))
    assert list(rows) == ["out", "out[0]", "out[1]"]
    assert rows["out"]["kind"] == "sequence" and rows["out"]["lengths"] == [2, 2] and rows["out"]["passed"]
    assert all(rows[n]["kind"] == "float" and rows[n]["passed"] and rows[n]["samples"] == 2 for n in ("out[0]", "out[1]"))
    assert rows["out[0]"]["max_abs_err"] > 0  # (it ran low)
    table = _lines(proc.stdout)
    assert "out length 2 element(s) as fp32's PASS" in table and "out[1] max abs error" in " ".join(table)
    page = html_path.read_text()
    assert "<td>out</td><td colspan='9'>sequence: 2 element(s)</td>" in page and "<td>out[1]</td><td class='num'>" in page


def test_a_sequence_of_another_length_fails_with_its_lengths(tmp_path):
    """compare: a candidate whose sequence holds 3 elements where the
    reference's holds 2 fails on the sequence's structure (exit 1), with
    the lengths and the sample in its reason; no element is compared, and
    the node that makes it adds infinite error."""
    ref = _save(_sequence_model(2), tmp_path / "ref.onnx")
    cand = _save(_sequence_model(3), tmp_path / "cand.onnx")
    report_path, html_path = tmp_path / "r.json", tmp_path / "r.html"
    proc = cli("compare", str(ref), str(cand), "--report", str(report_path), "--html", str(html_path))
    assert proc.returncode == 1, proc.stderr
    report = _report(report_path)
    [row] = report["validation"]["outputs"]
    reason = "sample 1: 2 element(s) in fp32, 3 in the converted model (2 samples differ)"
    assert row["name"] == "out" and not row["passed"] and row["failures"] == [reason]
    assert row["structure_mismatch"] == 2 and "lengths" not in row
    assert {n["name"]: n["error_after"] for n in report["validation"]["nodes"]}["seq"] == "inf"
    assert "out structure differs as fp32's FAIL" in _lines(proc.stdout)
    assert f"mismatch: out: {reason}" in proc.stdout
    assert "structure differs" in html_path.read_text() and reason in html_path.read_text()


@pytest.mark.parametrize(
    ("reference", "candidate", "kinds"),
    [
        (_sequence_model, _matmul_model, "seq(tensor) in the reference but tensor"),
        (_matmul_model, _sequence_model, "tensor in the reference but seq(tensor)"),
        (_sequence_model, lambda: _zipmap_model(name="out"), "seq(tensor) in the reference but seq(map)"),
    ],
    ids=["sequence-tensor", "tensor-sequence", "tensors-maps"],
)
def test_compare_refuses_a_candidate_whose_output_holds_another_kind_of_value(reference, candidate, kinds, tmp_path):
    """An output that holds another kind of value in each model (a tensor,
    a sequence of tensors, a sequence of maps) has nothing to compare
    element by element: a one-line usage error naming both (a tensor
    against a sequence compared the stacked elements: 'shape differs')."""
    ref, cand = _save(reference(), tmp_path / "ref.onnx"), _save(candidate(), tmp_path / "cand.onnx")
    proc = cli("compare", str(ref), str(cand))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"amp-convert: error: the models' outputs differ: 'out' is {kinds} in the candidate"


def test_optional_outputs_compare_their_values_and_equal_when_both_are_empty(tmp_path):
    """An optional output that holds a tensor in both models compares as one;
    one empty in both is equal (its row says so); one empty in the
    candidate only fails, naming which is empty."""
    src = _save(_optional_model(), tmp_path / "opt.onnx")
    report_path = tmp_path / "r.json"
    proc = cli(str(src), "--level", "O2", "-o", str(tmp_path / "o.onnx"), "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    rows = _rows(_report(report_path))
    assert rows["maybe"]["kind"] == "float" and rows["maybe"]["passed"] and rows["maybe"]["max_abs_err"] > 0
    assert rows["none"]["kind"] == "empty" and rows["none"]["empty"] == 2 and rows["none"]["passed"]
    assert "none value empty in both as fp32's PASS" in _lines(proc.stdout)

    cand = _save(_optional_model(present=False), tmp_path / "cand.onnx")
    proc = cli("compare", str(src), str(cand), "--report", str(report_path))
    assert proc.returncode == 1, proc.stderr
    rows = _rows(_report(report_path))
    reason = "sample 1: present in fp32, empty in the converted model (2 samples differ)"
    assert rows["maybe"]["failures"] == [reason] and rows["maybe"]["kind"] == "empty"
    assert rows["none"]["passed"]
    assert f"mismatch: maybe: {reason}" in proc.stdout


def test_a_sequence_of_maps_compares_values_by_key(tmp_path):
    """A classifier's ZipMap output: one map per row, compared as the
    vector of its values in key order (probs[0], probs[1]); a candidate
    whose maps have other keys fails, saying so."""
    src = _save(_zipmap_model(), tmp_path / "zip.onnx")
    report_path = tmp_path / "r.json"
    proc = cli(str(src), "--level", "O3", "-o", str(tmp_path / "o.onnx"), "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    rows = _rows(_report(report_path))
    assert list(rows) == ["probs", "probs[0]", "probs[1]"]
    assert rows["probs[0]"]["kind"] == "float" and 0 < rows["probs[0]"]["max_abs_err"] < 1e-2
    assert rows["probs[0]"]["dtype"] == "float32"  # (the declared value type: onnxruntime gives Python floats)

    cand = _save(_zipmap_model((10, 20, 30, 50)), tmp_path / "cand.onnx")
    proc = cli("compare", str(src), str(cand), "--report", str(report_path))
    assert proc.returncode == 1, proc.stderr
    rows = _rows(_report(report_path))
    assert rows["probs"]["passed"]  # (as long in both)
    reason = "sample 1: the map's keys differ (4 in fp32, 4 in the converted model, 3 shared) (2 samples differ)"
    assert rows["probs[0]"]["failures"] == [reason]


def test_sequences_whose_length_follows_the_sample_have_an_element_per_index(tmp_path):
    """A sample of 1 row and one of 3 split into 1 and 3 elements: rows[0]
    is compared in both samples, rows[1] and rows[2] in the second only,
    in index order; the sequence's row gives the range of lengths."""
    src = _save(_split_model(), tmp_path / "split.onnx")
    rng = np.random.default_rng(0)
    for n in (1, 3):
        np.savez(tmp_path / f"s{n}.npz", x=rng.standard_normal((n, 4)).astype(np.float32))
    report_path = tmp_path / "r.json"
    inputs = ["--inputs", str(tmp_path / "s1.npz"), "--inputs", str(tmp_path / "s3.npz")]
    proc = cli(str(src), "--level", "O3", "-o", str(tmp_path / "o.onnx"), *inputs, "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    rows = _rows(_report(report_path))
    assert list(rows) == ["rows", "rows[0]", "rows[1]", "rows[2]"]
    assert rows["rows"]["lengths"] == [1, 3] and [rows[f"rows[{i}]"]["samples"] for i in range(3)] == [2, 1, 1]
    assert "rows length 1-3 elements as fp32's PASS" in _lines(proc.stdout)


def test_a_sparse_constant_output_compares_as_the_dense_tensor_it_stands_for(tmp_path):
    """onnxruntime gives a sparse Constant's output as a SparseTensor: it
    compares as its dense values, equal in both models (it was one object
    against another, 'equal fraction 0', a failure, exit 1; before
    sequences were handled, an internal error, exit 3)."""
    dense = np.zeros((2, 4), np.float32)
    dense.flat[[1, 6]] = [1.5, -2.5]
    values = numpy_helper.from_array(dense.flat[[1, 6]].copy(), "S")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([1, 6], np.int64), "S_idx"), [2, 4])
    nodes = [
        helper.make_node("Constant", [], ["S"], name="s", sparse_value=sparse),
        helper.make_node("MatMul", ["x", "W"], ["y"], name="mm"),
    ]
    src = _save(model(nodes, [value("x", shape=(2, 4))], [value("S"), value("y")], [init("W", WEIGHT)]), tmp_path / "sp.onnx")
    report_path = tmp_path / "r.json"
    proc = cli(str(src), "--level", "O2", "-o", str(tmp_path / "o.onnx"), "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    rows = _rows(_report(report_path))
    assert rows["S"]["kind"] == "float" and rows["S"]["max_abs_err"] == 0 and rows["S"]["max_abs_ref"] == 2.5
    assert rows["y"]["max_abs_err"] > 0


def test_a_mismatch_in_an_element_names_the_sample_it_came_from(tmp_path):
    """Samples of 1 row and of 3: probs[1] and probs[2] exist only in the
    second sample, so their key mismatch is in sample 2 (it said 'sample 1',
    each element counting the samples it was in)."""
    ref = _save(_zipmap_model(rows="N"), tmp_path / "ref.onnx")
    cand = _save(_zipmap_model((10, 20, 30, 50), rows="N"), tmp_path / "cand.onnx")
    rng = np.random.default_rng(0)
    for n in (1, 3):
        np.savez(tmp_path / f"s{n}.npz", x=rng.standard_normal((n, 4)).astype(np.float32))
    proc = cli("compare", str(ref), str(cand), "--inputs", str(tmp_path / "s1.npz"), "--inputs", str(tmp_path / "s3.npz"))
    assert proc.returncode == 1, proc.stderr
    keys = "the map's keys differ (4 in fp32, 4 in the converted model, 3 shared)"
    assert f"mismatch: probs[0]: sample 1: {keys} (2 samples differ)" in proc.stdout
    assert f"mismatch: probs[1]: sample 2: {keys}" in proc.stdout and f"mismatch: probs[2]: sample 2: {keys}" in proc.stdout


def test_element_rows_say_whose_element_they_are_and_never_take_an_outputs_name(tmp_path):
    """A sequence output ``s`` beside a tensor output literally named
    ``s[0]``: the element's row is named apart from the output's (there
    were two rows named s[0]) and says which sequence and index it is;
    the output's row says neither."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["s[0]"], name="relu"),
        helper.make_node("SequenceConstruct", ["h", "h"], ["s"], name="sc"),
    ]
    outputs = [helper.make_tensor_sequence_value_info("s", F32, None), value("s[0]", shape=(2, 4))]
    src = _save(model(nodes, [value("x", shape=(2, 4))], outputs, [init("W", WEIGHT)]), tmp_path / "collide.onnx")
    report_path = tmp_path / "r.json"
    proc = cli("compare", str(src), str(src), "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    outputs = _report(report_path)["validation"]["outputs"]
    assert [(o["name"], o.get("element_of"), o.get("index")) for o in outputs] == [
        ("s", None, None),
        ("s[0] (element)", "s", 0),
        ("s[1]", "s", 1),
        ("s[0]", None, None),
    ]


def test_a_long_sequence_reports_one_row_for_its_elements_and_lists_the_failing_ones(tmp_path):
    """A ZipMap over 40 rows: one row for its elements (how many pass, the
    worst by name and index), not 40 (20,000 rows printed 120,008 lines);
    against a candidate off in rows 3 and 30 the row fails and only those
    two are listed; against one off in every row, the 16 worst are listed
    and the rest counted. Terminal, JSON and HTML agree."""
    src = _save(_zipmap_model(rows=40), tmp_path / "zip.onnx")
    report_path, html_path = tmp_path / "r.json", tmp_path / "r.html"
    proc = cli(str(src), "--level", "O3", "-o", str(tmp_path / "o.onnx"), "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    [seq, summary] = _report(report_path)["validation"]["outputs"]
    assert seq["name"] == "probs" and seq["lengths"] == [40, 40]
    assert summary["name"] == "probs[*]" and summary["kind"] == "elements" and summary["element_of"] == "probs"
    elements = summary["elements"]
    assert summary["passed"] and (elements["count"], elements["passed"], elements["failed"], elements["listed"]) == (40, 40, 0, 0)
    assert elements["worst"]["name"] == f"probs[{elements['worst']['index']}]"
    assert elements["worst"]["detail"].startswith("max abs error ")
    assert "probs[*] elements passing 40 of 40 all PASS" in _lines(proc.stdout) and "probs[1]" not in proc.stdout

    shift = np.zeros((40, 4), np.float32)
    shift[3, 0], shift[30, 1] = 0.5, 2.0
    cand = _save(_zipmap_model(rows=40, shift=shift), tmp_path / "cand.onnx")
    proc = cli("compare", str(src), str(cand), "--report", str(report_path), "--html", str(html_path))
    assert proc.returncode == 1, proc.stderr
    rows = _rows(_report(report_path))
    assert list(rows) == ["probs", "probs[*]", "probs[3]", "probs[30]"]
    elements = rows["probs[*]"]["elements"]
    assert (elements["passed"], elements["failed"], elements["listed"]) == (38, 2, 2)
    assert elements["worst"]["name"] == "probs[30]" and elements["worst"]["index"] == 30
    assert not rows["probs[3]"]["passed"] and rows["probs[3]"]["index"] == 3
    reason = rows["probs[*]"]["failures"][0]
    assert reason.startswith("2 of 40 elements fail, the worst probs[30] (max abs error ")
    assert "probs[*] elements passing 38 of 40 all FAIL" in _lines(proc.stdout)
    assert f"failing: probs[*]: {reason}" in proc.stdout
    page = html_path.read_text()
    assert "<td>probs[*]</td><td colspan='9'>38 of 40 elements pass; the worst probs[30]: max abs error" in page

    shift[:] = np.linspace(0.1, 2, 40, dtype=np.float32)[:, None] * np.array([1, 0, 0, 0], np.float32)
    cand = _save(_zipmap_model(rows=40, shift=shift), tmp_path / "cand.onnx")
    proc = cli("compare", str(src), str(cand), "--report", str(report_path))
    assert proc.returncode == 1, proc.stderr
    rows = _rows(_report(report_path))
    listed = [o["index"] for o in rows.values() if o["kind"] == "float"]
    assert list(rows)[:2] == ["probs", "probs[*]"] and len(listed) == 16 and listed == sorted(listed)
    assert rows["probs[*]"]["elements"]["worst"]["index"] in listed
    assert rows["probs[*]"]["failures"][0].endswith("; the 16 worst are listed, 24 more are not")


def test_an_optional_sequence_empty_in_both_models_is_kind_empty(tmp_path):
    """An optional sequence that no sample held in both models is kind
    "empty", as an optional tensor's (it said "sequence"), and its row says
    it was empty in both."""
    optional = helper.make_optional_type_proto(helper.make_sequence_type_proto(helper.make_tensor_type_proto(F32, None)))
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Optional", [], ["o"], name="opt", type=optional.optional_type.elem_type),
    ]
    outputs = [value("h", shape=(2, 4)), helper.make_value_info("o", optional)]
    src = _save(model(nodes, [value("x", shape=(2, 4))], outputs, [init("W", WEIGHT)], opset=18), tmp_path / "opt.onnx")
    report_path = tmp_path / "r.json"
    proc = cli(str(src), "--level", "O2", "-o", str(tmp_path / "o.onnx"), "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    row = _rows(_report(report_path))["o"]
    assert row["kind"] == "empty" and row["empty"] == 2 and row["passed"] and "lengths" not in row
    assert "o value empty in both as fp32's PASS" in _lines(proc.stdout)


def test_the_schema_requires_what_every_output_row_has(tmp_path):
    """Every row of a report (convert, compare) has its checks, warnings and
    warning_kinds, so the schema requires them: a row without is refused."""
    src = _save(_sequence_model(), tmp_path / "seq.onnx")
    for args in ([str(src), "--level", "O2", "-o", str(tmp_path / "o.onnx")], ["compare", str(src), str(src)]):
        report_path = tmp_path / "r.json"
        assert cli(*args, "--report", str(report_path)).returncode == 0
        report = _report(report_path)
        for key in ("checks", "warnings", "warning_kinds"):
            for row in report["validation"]["outputs"]:
                broken = json.loads(json.dumps(report))
                del next(o for o in broken["validation"]["outputs"] if o["name"] == row["name"])[key]
                with pytest.raises(jsonschema.ValidationError):
                    jsonschema.validate(broken, report_schema())
