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


def _zipmap_model(labels: tuple[int, ...] = (10, 20, 30, 40), name: str = "probs") -> onnx.ModelProto:
    """A classifier's tail: MatMul -> Softmax -> ZipMap, a sequence of
    {label: probability} maps, one per row (as sklearn-onnx writes it),
    output ``name``."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Softmax", ["h"], ["p"], name="softmax", axis=1),
        helper.make_node("ZipMap", ["p"], [name], name="zip", domain="ai.onnx.ml", classlabels_int64s=list(labels)),
    ]
    maps = helper.make_sequence_type_proto(helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(F32, [])))
    outputs = [helper.make_value_info(name, maps)]
    return model(nodes, [value("x", shape=(2, 4))], outputs, [init("W", WEIGHT)], extra_opsets=[("ai.onnx.ml", 3)])


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
    assert "<td>out</td><td colspan='7'>sequence: 2 element(s)</td>" in page and "<td>out[1]</td><td class='num'>" in page


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
