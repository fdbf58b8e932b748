"""Coverage: the share of float compute (MAC-weighted) a plan runs low, and the WARN line naming why not more."""

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
from onnx import TensorProto, helper

from amp_convert import convert
from amp_convert.coverage import coverage
from amp_convert.macs import node_macs
from amp_convert.report import report_schema

ZOO = Path(__file__).resolve().parents[1] / "models" / "zoo"
PYPI = ZOO.parent / "cache" / "pypi"  # (fetched by `make test`)


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("amp-convert")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300)


def test_gemm_family_macs_follow_their_shapes():
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),  # 3x8 @ 8x16: 3*16*8
        helper.make_node("Gemm", ["h", "G"], ["g"], name="gemm", transB=1),  # 3x16 @ (4x16)^T: 3*4*16
        helper.make_node("Relu", ["g"], ["y"], name="relu"),  # its output's elements
    ]
    inits = [init("W", np.ones((8, 16), np.float32)), init("G", np.ones((4, 16), np.float32))]
    m = model(nodes, [value("x", shape=(3, 8))], [value("y", shape=(3, 4))], inits)
    assert node_macs(m)[""] == [3 * 16 * 8, 3 * 4 * 16, 12]


def test_conv_macs_count_each_output_elements_kernel():
    # 1x3x8x8 -> 4 filters of 3x3x3, pads 1: 4*8*8 outputs, 27 MACs each
    conv = helper.make_node("Conv", ["x", "W"], ["y"], name="conv", pads=[1, 1, 1, 1])
    m = model(
        [conv],
        [value("x", shape=(1, 3, 8, 8))],
        [value("y", shape=("n", 4, "h", "w"))],
        [init("W", np.ones((4, 3, 3, 3), np.float32))],
    )
    assert node_macs(m)[""] == [4 * 8 * 8 * 27]


def test_a_plain_cnn_runs_nearly_all_its_compute_low_without_a_warning():
    m = onnx.load(ZOO / "resnet50.onnx")
    result = convert(m, level="O2", check="none")
    assert result.coverage.low_share > 0.95
    assert result.coverage.warning() is None
    # O0 lowers nothing and has no cause to name
    none = convert(m, level="O0", check="none").coverage
    assert none.low_share == 0 and none.causes == () and none.warning() is None


def test_the_warning_names_the_schema_for_a_bf16_cnn_below_opset_22():
    covered = convert(onnx.load(ZOO / "resnet50.onnx"), level="O2", dtype="bf16", check="none").coverage
    assert covered.low_share < 0.1 and covered.expected_share > 0.9
    assert covered.causes[0].cause == "schema"
    warning = covered.warning()
    assert warning.startswith("WARN coverage: ") and "O2 would lower about" in warning
    schema = covered.causes[0]
    assert f"{schema.nodes} nodes whose schema admits no bf16" in warning


def test_the_warning_names_missing_kernels():
    # at opset 22 the schemas admit bf16 for LSTM; CUDA has no bf16 LSTM kernel
    covered = convert(onnx.load(ZOO / "lstm.onnx"), level="O2", dtype="bf16", target_opset=22, check="none").coverage
    assert covered.causes[0].cause == "kernel"
    assert "without a bf16 kernel" in covered.warning()
    unfiltered = convert(
        onnx.load(ZOO / "lstm.onnx"), level="O2", dtype="bf16", target_opset=22, target_provider="none", check="none"
    )
    assert unfiltered.coverage.warning() is None and unfiltered.coverage.low_share > 0.95


def _unknown_typed_model() -> onnx.ModelProto:
    """x -> custom::Opaque (no schema, no declared output type) -> MatMul (the compute) -> y."""
    nodes = [
        helper.make_node("Opaque", ["x"], ["h"], name="opaque", domain="custom"),
        helper.make_node("MatMul", ["h", "W"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [value("x", shape=(64, 64))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (64, 256))],
        [init("W", np.ones((64, 256), np.float32))],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)])
    m.ir_version = 8
    return m


def test_the_warning_names_unknown_types():
    result = convert(_unknown_typed_model(), level="O2", check="none")
    assert result.plan.by_name("mm").rule == "unknown-type"
    covered = result.coverage
    assert covered.causes[0].cause == "unknown-type" and covered.causes[0].nodes == 2  # (the custom op and the MatMul)
    assert "2 nodes of unknown type" in covered.warning()


def test_coverage_is_in_the_summary_line_the_json_and_the_html(tmp_path):
    src = tmp_path / "lstm.onnx"
    src.write_bytes((ZOO / "lstm.onnx").read_bytes())
    out, report, page = tmp_path / "o.onnx", tmp_path / "r.json", tmp_path / "r.html"
    args = [str(src), "--level", "O2", "--dtype", "bf16", "--target-opset", "22", "--no-validate"]
    run = _cli(*args, "-o", str(out), "--report", str(report), "--html", str(page))
    assert run.returncode == 0, run.stderr
    data = json.loads(report.read_text())
    jsonschema.validate(data, report_schema())
    covered = data["plan"]["coverage"]
    assert covered["warning"] in run.stderr.splitlines()
    assert f"({covered['summary']})" in run.stdout and "of float compute low" in covered["summary"]
    assert covered["causes"][0]["cause"] == "kernel" and 0 < covered["low_share"] < covered["expected_share"]
    html = page.read_text()
    assert "id='coverage-warning'" in html and "id='coverage'" in html
    # no warning where nothing holds the compute back
    plain = _cli(str(src), "--level", "O2", "--no-validate", "-o", str(out), "--report", str(report))
    assert "WARN coverage" not in plain.stderr and json.loads(report.read_text())["plan"]["coverage"]["warning"] is None


def test_a_plan_of_another_model_is_refused():
    a = convert(onnx.load(ZOO / "bert.onnx"), level="O2", check="none")
    with pytest.raises(ValueError, match="the plan is not this model's"):
        coverage(onnx.load(ZOO / "resnet50.onnx"), a.plan)


@pytest.mark.parametrize("path", [ZOO / "controlflow.onnx", ZOO / "detector.onnx", PYPI / "silero_vad.onnx"])
def test_models_with_subgraphs_are_covered_graph_by_graph(path):
    if not path.is_file():
        pytest.skip("run `make pypi-models` (make test does) to fetch the PyPI models")
    m = onnx.load(path)  # (silero's main graph holds no GEMM; its If bodies do)
    macs = node_macs(m)
    result = convert(m, level="O2", check="none")
    assert set(macs) == set(result.plan.entries)  # every graph, bodies without a GEMM too
    assert 0 < result.coverage.low_share <= 1
