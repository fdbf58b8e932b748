"""The statistic of an output's errors that is judged (--check-error-stat,
--error-quantile, per output error_stat= / quantile=): streamed exactly
within its memory budget, bounded past it, on real onnxruntime runs."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import init, model, value
from onnx import helper

from amp_convert.cli import main
from amp_convert.errors import AmpError
from amp_convert.inputs import make_source
from amp_convert.metrics import ErrorStats
from amp_convert.options import ERROR_STATS
from amp_convert.report import report_schema
from amp_convert.report_html import html_report
from amp_convert.report_text import terminal_table
from amp_convert.tolerance import Tolerance, parse_tolerances

ROWS, COLS = 64, 16
# The values the candidate moves, by 0.5 (its limit is about 0.056): 5 of 1,024 per sample.
OFF = [3, 100, 500, 700, 1000]


def _pair(tmp_path: Path, off: np.ndarray, scale: float = 1.0, outputs: int = 1) -> tuple[Path, Path]:
    """ref: y = x @ W (+ 0); cand: y = x @ (W * scale) + off, the same MatMul
    (equal values where off is 0 and scale 1). ``outputs`` 2: z, a copy of y's
    computation, as a second output."""
    w = np.random.default_rng(0).standard_normal((8, COLS)).astype(np.float32)
    paths = []
    for name, add, mul in (("ref", np.zeros_like(off), 1.0), ("cand", off, scale)):
        nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["y"])]
        outs = [value("y", shape=(ROWS, COLS))]
        if outputs == 2:
            nodes.append(helper.make_node("Add", ["h", "B"], ["z"]))
            outs.append(value("z", shape=(ROWS, COLS)))
        m = model(nodes, [value("x", shape=(ROWS, 8))], outs, [init("W", w * np.float32(mul)), init("B", add)])
        path = tmp_path / f"{name}.onnx"
        onnx.save(m, str(path))
        paths.append(path)
    return paths[0], paths[1]


def _few_off() -> np.ndarray:
    off = np.zeros((ROWS, COLS), np.float32)
    off.flat[OFF] = 0.5
    return off


def _errors(ref: Path, cand: Path, output: str = "y", samples: int = 2) -> np.ndarray:
    """|ref - cand| of ``output`` over the samples compare generates, from onnxruntime runs of our own."""
    source = make_source(onnx.load(str(ref)), samples=samples)
    ref_run, cand_run = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (ref, cand))
    errors = []
    for feeds in source:
        a = ref_run.run([output], feeds)[0].astype(np.float64)
        b = cand_run.run([output], feeds)[0].astype(np.float64)
        errors.append(np.abs(a - b).ravel())
    return np.concatenate(errors)


def _compare(ref: Path, cand: Path, tmp_path: Path, *extra: str) -> tuple[int, dict]:
    report = tmp_path / "r.json"
    report.unlink(missing_ok=True)
    code = main(["compare", str(ref), str(cand), "--report", str(report), "-q", *extra])
    return code, json.loads(report.read_text()) if report.exists() else {}


def test_streamed_statistics_of_an_output_equal_numpys_over_all_samples():
    """ErrorStats folds samples in one by one; its statistics are those of
    every element of every sample (the mean from float64 sums)."""
    rng = np.random.default_rng(2)
    ref = [rng.standard_normal((3, 50, 40)).astype(np.float32) for _ in range(4)]
    cand = [r + rng.standard_normal(r.shape).astype(np.float32) * 1e-3 for r in ref]
    stats = ErrorStats("y", quantiles=True)
    for r, c in zip(ref, cand, strict=True):
        stats.update(r, c)
    every = np.concatenate([np.abs(r.astype(np.float64) - c.astype(np.float64)).ravel() for r, c in zip(ref, cand, strict=True)])
    base = Tolerance(1e-3, 1e-2, 0.999)
    got = {s: stats.error_stat(Tolerance(1e-3, 1e-2, 0.999, error_stat=s)) for s in ERROR_STATS}
    assert got["max"].value == every.max() and got["median"].value == np.median(every)
    assert got["quantile"].value == np.quantile(every, 0.99)
    assert got["mean"].value == pytest.approx(every.mean(), rel=1e-12)
    assert stats.error_stat(Tolerance(1e-3, 1e-2, 0.999, error_stat="quantile", quantile=0.5)).value == np.quantile(every, 0.5)
    assert all(g.exact for g in got.values())
    # max is the verdict it always was: the check keeps its name and its limit
    assert stats.checks(base) == {"nonfinite": True, "max_abs_err": every.max() <= stats.limit_abs_err(base), "cosine": True}
    d = stats.as_dict(base)
    assert d["error_stat"] == {"name": "max", "quantile": None, "value": d["max_abs_err"], "exact": True, "bounds": None}


def test_max_fails_a_handful_of_values_off_where_median_mean_and_p99_pass(tmp_path):
    ref, cand = _pair(tmp_path, _few_off())
    errors = _errors(ref, cand)
    assert np.count_nonzero(errors) == 10  # (5 per sample, 2 samples: the rest equal)
    code, report = _compare(ref, cand, tmp_path)
    [out] = report["validation"]["outputs"]
    assert code == 1 and out["checks"]["max_abs_err"] is False and out["error_stat"]["value"] == errors.max() > 0.49
    limit = out["limit_abs_err"]
    for stat, numpy_value in (("median", np.median(errors)), ("mean", errors.mean()), ("quantile", np.quantile(errors, 0.99))):
        code, report = _compare(ref, cand, tmp_path, "--check-error-stat", stat)
        [out] = report["validation"]["outputs"]
        assert code == 0, (stat, out["failures"])
        assert out["error_stat"]["name"] == stat and out["error_stat"]["value"] == pytest.approx(numpy_value, rel=1e-12, abs=0)
        assert out["checks"][f"{stat}_abs_err"] is True and "max_abs_err" not in out["checks"]
        assert out["limit_abs_err"] == limit  # (the limit is the same whatever the statistic)
        assert report["validation"]["tolerance"]["error_stat"] == stat
        jsonschema.validate(report, report_schema())
    # p99.9 reaches the moved values: 10 of 2,048 are more than 0.1%
    code, report = _compare(ref, cand, tmp_path, "--check-error-stat", "quantile", "--error-quantile", "0.999")
    [out] = report["validation"]["outputs"]
    assert code == 1 and out["error_stat"]["value"] == np.quantile(errors, 0.999) > limit
    assert out["failures"][0].startswith("p99.9 abs error 0.5 > 0.0563 (10 of 2,048 values over it")
    assert report["validation"]["tolerance"]["quantile"] == 0.999


def test_real_damage_fails_the_median_too(tmp_path):
    """Weights off by 30%: every value moves, and the median is far past the limit."""
    ref, cand = _pair(tmp_path, np.zeros((ROWS, COLS), np.float32), scale=1.3)
    errors = _errors(ref, cand)
    code, report = _compare(ref, cand, tmp_path, "--check-error-stat", "median")
    [out] = report["validation"]["outputs"]
    assert code == 1 and out["checks"]["median_abs_err"] is False
    assert out["error_stat"]["value"] == np.median(errors) > out["limit_abs_err"]
    assert out["failures"][0].startswith("median abs error ")


def test_an_output_can_be_judged_by_a_statistic_of_its_own(tmp_path, capsys):
    """--tolerance y:error_stat=median judges y by its median and z, left out,
    by the run's max; the terminal table, JSON and HTML show each one's."""
    ref, cand = _pair(tmp_path, _few_off(), outputs=2)
    report = tmp_path / "r.json"
    page = tmp_path / "r.html"
    code = main(
        ["compare", str(ref), str(cand), "--tolerance", "y:error_stat=median", "--report", str(report), "--html", str(page)]
    )
    table = capsys.readouterr().out
    assert code == 1
    data = json.loads(report.read_text())
    jsonschema.validate(data, report_schema())
    y, z = data["validation"]["outputs"]
    assert y["passed"] and y["tolerance"]["error_stat"] == "median" and y["error_stat"]["name"] == "median"
    assert not z["passed"] and z["error_stat"]["name"] == "max" and "tolerance" not in z
    lines = table.splitlines()
    assert any(line.split()[:5] == ["y", "median", "abs", "error", "0"] and line.endswith("PASS") for line in lines), table
    assert any(line.split()[:4] == ["z", "max", "abs", "error"] and line.endswith("FAIL") for line in lines), table
    assert terminal_table(data) in table
    html = page.read_text()
    assert "<th>judged error</th>" in html and "<td class='num'>median 0</td>" in html and "<td class='num'>max 0.5</td>" in html
    # a quantile of its own, on a run judged by another quantile
    code, data = _compare(ref, cand, tmp_path, "--check-error-stat", "quantile", "--tolerance", "z:quantile=0.5")
    y, z = data["validation"]["outputs"]
    assert code == 0 and y["error_stat"]["quantile"] == 0.99 and z["error_stat"]["quantile"] == 0.5
    # a statistic of its own drops the run's quantile
    code, data = _compare(
        ref, cand, tmp_path, "--check-error-stat", "quantile", "--error-quantile", "0.999", "--tolerance", "y:error_stat=mean"
    )
    y, z = data["validation"]["outputs"]
    assert code == 1 and y["passed"] and y["error_stat"]["name"] == "mean" and not z["passed"]
    assert html_report(data).count("<th>judged error</th>") == 1


def test_the_statistic_comes_from_a_config_file_too(tmp_path):
    ref, _ = _pair(tmp_path, _few_off())
    config = tmp_path / "amp.toml"
    config.write_text('check-error-stat = "quantile"\nerror_quantile = 0.5\n')
    model_path = tmp_path / "m.onnx"
    model_path.write_bytes(ref.read_bytes())
    report = tmp_path / "r.json"
    code = main([str(model_path), "--config", str(config), "-o", str(tmp_path / "o.onnx"), "--report", str(report), "-q"])
    assert code == 0
    tolerance = json.loads(report.read_text())["validation"]["tolerance"]
    assert tolerance["error_stat"] == "quantile" and tolerance["quantile"] == 0.5


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--error-quantile", "0"], "--error-quantile"),
        (["--error-quantile", "1.5"], "--error-quantile"),
        (["--error-quantile", "nan"], "--error-quantile"),
        (["--error-quantile", "0.9"], "--error-quantile applies to --check-error-stat quantile only"),
        (["--check-error-stat", "median", "--error-quantile", "0.9"], "(the statistic is median)"),
        (["--check-error-stat", "mode"], "--check-error-stat"),
        (["--tolerance", "nope:error_stat=median"], "not an output of the model"),
        (["--tolerance", "y:error_stat=mode"], "error_stat is one of max, mean, median, quantile"),
        (["--tolerance", "y:quantile=0"], "quantile must be a number in (0, 1]"),
        (["--tolerance", "y:quantile=0.9"], "tolerance for 'y': an error quantile (0.9) applies to the statistic quantile"),
        (["--tolerance", "y"], "expected NAME:atol="),
        (["--tolerance", "y:error_stat"], "is not one of"),
    ],
)
def test_bad_values_exit_2_with_one_line_naming_the_option(tmp_path, capsys, args, says):
    ref, cand = _pair(tmp_path, _few_off())
    code = main(["compare", str(ref), str(cand), "-q", *args])
    err = capsys.readouterr().err
    assert code == 2 and says in err and err.count("\n") == 1, err


def test_a_config_file_value_of_the_wrong_kind_exits_2(tmp_path, capsys):
    ref, _ = _pair(tmp_path, _few_off())
    for text, says in (('error-quantile = "high"\n', "error-quantile must be a number"), ("check-error-stat = 3\n", "check")):
        config = tmp_path / "amp.toml"
        config.write_text(text)
        code = main([str(ref), "--config", str(config), "-o", str(tmp_path / "o.onnx"), "-q"])
        err = capsys.readouterr().err
        assert code == 2 and says in err and err.count("\n") == 1, err


def test_the_library_refuses_what_means_nothing():
    with pytest.raises(AmpError, match="unknown error statistic"):
        Tolerance(1e-3, 1e-2, 0.999, error_stat="mode")
    with pytest.raises(AmpError, match=r"must be in \(0, 1\]"):
        Tolerance(1e-3, 1e-2, 0.999, error_stat="quantile", quantile=0.0)
    with pytest.raises(AmpError, match="applies to the statistic quantile only"):
        Tolerance(1e-3, 1e-2, 0.999, quantile=0.5)
    assert parse_tolerances(["y:error_stat=quantile,quantile=0.999"]) == {"y": {"error_stat": "quantile", "quantile": 0.999}}
