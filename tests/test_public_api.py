"""The public API on its own, with no CLI involved: convert at every level
(auto included), validate, compare, Report, save and the typed errors, on
zoo models written to disk and read back, run by onnxruntime."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import model, value
from onnx import TensorProto, helper, numpy_helper

import amp_convert as ac

ZOO = Path(__file__).resolve().parents[1] / "models" / "zoo"
ONE = ac.ValidationOptions(samples=1, provider="cpu")


@pytest.fixture(scope="module")
def bert() -> onnx.ModelProto:
    return onnx.load(str(ZOO / "bert.onnx"))


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_convert_runs_each_level_and_leaves_the_input_alone(bert, level):
    before = bert.SerializeToString()
    result = ac.convert(bert, level=level)
    assert bert.SerializeToString() == before
    counts = result.plan.counts()
    assert (counts["low"] == 0) == (level == "O0")
    low = {t.data_type for t in result.model.graph.initializer} & {TensorProto.FLOAT16}
    assert bool(low) == (level != "O0")
    assert result.validation is None and result.auto is None
    onnx.checker.check_model(result.model, full_check=True)


def test_validate_judges_a_conversion_and_says_what_it_ran_on(bert, tmp_path):
    result = ac.convert(bert, level="O2")
    verdict = ac.validate(bert, result.model, ONE)
    assert verdict.passed and verdict.samples == 1
    assert verdict.inputs is not None and verdict.inputs["kind"] == "random"
    # Files work as models; an impossible tolerance fails.
    ac.save(result.model, tmp_path / "low.onnx")
    onnx.save(bert, str(tmp_path / "ref.onnx"))
    strict = ac.validate(tmp_path / "ref.onnx", tmp_path / "low.onnx", ONE, atol=0.0, rtol=0.0, min_cosine=1.0)
    assert not strict.passed


def test_auto_returns_a_validated_low_model(bert):
    result = ac.convert(bert, level="auto", max_trials=3, validation=ONE)
    assert result.auto is not None and result.auto.trials
    assert result.validation is result.auto.validation and result.validation.passed
    assert result.validation.inputs["samples"] == 1
    assert result.plan.counts()["low"] > 0
    assert ac.Report.of(result).data["options"]["level"] == "auto"


def _matmul() -> onnx.ModelProto:
    """x -> MatMul -> Mul -> Relu: no low-precision assignment of them meets a tolerance of zero."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")
    k = numpy_helper.from_array(np.float32([0.37]), "k")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Mul", ["h", "k"], ["s"], name="scale"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    return model(nodes, [value("x", shape=[4, 16])], [value("y", shape=[4, 16])], [w, k])


def test_auto_that_cannot_pass_says_so_and_hands_back_no_fp32_model():
    impossible = ac.ValidationOptions(samples=1, provider="cpu", atol=0.0, rtol=0.0, min_cosine=1.0)
    result = ac.convert(_matmul(), level="auto", max_trials=3, validation=impossible)
    assert not result.validation.passed
    assert result.plan.counts()["low"] > 0  # (the closest trial, not the fp32 model)
    assert not ac.Report.of(result).passed


def test_report_renders_json_html_and_text_and_saves_atomically(bert, tmp_path):
    result = ac.convert(bert, level="O2")
    report = ac.Report.of(result, ac.validate(bert, result.model, ONE), model="bert.onnx")
    data = json.loads(report.to_json())
    assert data["schema"] == "amp-convert-report" and data["result"]["status"] == "passed" and report.passed
    assert data["plan"]["counts"] == result.plan.counts()
    assert "<html" in report.to_html().lower() and "PASS" in report.to_text()
    report.save(tmp_path / "r.json")
    report.save(tmp_path / "r.html")
    assert json.loads((tmp_path / "r.json").read_text()) == data
    assert (tmp_path / "r.html").read_text().lower().startswith("<!doctype html")
    with pytest.raises(ac.AmpError):
        report.save(tmp_path / "missing" / "r.json")
    assert not (tmp_path / "missing").exists()
    unvalidated = ac.Report.of(result)
    assert unvalidated.status == "not-validated" and unvalidated.to_text() == ""


def test_compare_scores_two_files_and_writes_its_reports(bert, tmp_path):
    onnx.save(bert, str(tmp_path / "ref.onnx"))
    ac.save(ac.convert(bert, level="O3").model, tmp_path / "cand.onnx")
    report = ac.compare(tmp_path / "ref.onnx", tmp_path / "cand.onnx", ONE, report=tmp_path / "c.json", html=tmp_path / "c.html")
    assert report.data["command"] == "compare" and report.status in ("passed", "failed")
    assert json.loads((tmp_path / "c.json").read_text())["result"] == report.data["result"]
    assert (tmp_path / "c.html").is_file()


def test_save_writes_one_file_or_external_data_and_both_load(bert, tmp_path):
    low = ac.convert(bert, level="O2").model
    one = ac.save(low, tmp_path / "one.onnx", external_data="never")
    assert one == tmp_path / "one.onnx" and not (tmp_path / "one.onnx.data").exists()
    split = ac.save(ac.convert(bert, level="O2").model, tmp_path / "split.onnx", external_data="always")
    assert (tmp_path / "split.onnx.data").stat().st_size > 0
    for path in (one, split):
        assert ac.validate(bert, path, ONE).passed  # (read back from disk with its data)
    with pytest.raises(ac.UsageError, match="`external_data`"):
        ac.save(low, tmp_path / "x.onnx", external_data="sometimes")
    assert not (tmp_path / "x.onnx").exists()


def test_convert_file_does_what_the_command_does(bert, tmp_path):
    src = tmp_path / "bert.onnx"
    onnx.save(bert, str(src))
    outputs = ac.OutputOptions(output=tmp_path / "out.onnx", report=tmp_path / "r.json", plan_json=tmp_path / "p.json")
    run = ac.convert_file(src, ac.ConvertOptions(level="O2"), validation=ONE, outputs=outputs)
    assert run.written and run.passed and run.output == tmp_path / "out.onnx"
    assert json.loads((tmp_path / "r.json").read_text())["result"]["status"] == "passed"
    assert json.loads((tmp_path / "p.json").read_text())["level"] == "O2"
    onnx.checker.check_model(str(tmp_path / "out.onnx"), full_check=True)
    # Out of tolerance: nothing written unless write_on_fail.
    strict = ac.ValidationOptions(samples=1, provider="cpu", atol=0.0, rtol=0.0, min_cosine=1.0)
    failed = ac.convert_file(src, ac.ConvertOptions(level="O3"), validation=strict, outputs=ac.OutputOptions(tmp_path / "f.onnx"))
    assert not failed.passed and not failed.written and not (tmp_path / "f.onnx").exists()


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda m: ac.convert(m, level="O7"), "level"),
        (lambda m: ac.convert(m, data_max=0.0), "data_max"),
        (lambda m: ac.convert(m, level="auto", max_trials=0), "max_trials"),
        (lambda m: ac.convert(m, level="O2", validation=ONE), "validation"),
        (lambda m: ac.validate(m, m, ONE, error_quantile=0.5), "error_quantile"),
        (lambda m: ac.validate(m, m, ONE, check_error_stat="quantile", error_quantile=1.5), "error_quantile"),
        (lambda m: ac.validate(m, m, ONE, atol=-1.0), "atol"),
        (lambda m: ac.validate(m, m, ONE, no_such_option=1), "no_such_option"),
    ],
)
def test_usage_errors_name_the_field_not_a_flag(bert, call, field):
    with pytest.raises(ac.UsageError) as raised:
        call(bert)
    assert raised.value.field == field and f"`{field}`" in str(raised.value) and "--" not in str(raised.value)
    assert raised.value.kind == "usage"


def test_a_bad_model_is_an_input_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ac.AmpError) as raised:
        ac.convert(bad)
    assert not isinstance(raised.value, ac.UsageError)
    with pytest.raises(TypeError):
        ac.convert(42)


def test_the_api_imports_no_cli():
    import subprocess

    code = "import amp_convert as ac, sys; ac.convert; assert 'amp_convert.cli' not in sys.modules and 'click' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_every_public_name_states_its_contract():
    """Each public name has a docstring; each public function that converts,
    judges, reads or writes says what it returns and what it raises."""
    import inspect

    for name in ac.__all__:
        obj = getattr(ac, name)
        doc = inspect.getdoc(obj) or ""
        assert doc, name
        if inspect.isfunction(obj) and not name.startswith("get_"):  # (the list getters return copies, raise nothing)
            assert "Return" in doc and "Raise" in doc, name
