"""Validation and reports: real onnxruntime runs, real files, the real CLI."""

from __future__ import annotations

import base64
import io
import json
import math
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import jsonschema
import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import init, manifest_source, model, value
from onnx import helper

from amp_convert import convert, runner
from amp_convert.emulate import emulation_twin
from amp_convert.errors import LoadFailure
from amp_convert.inputs import make_source
from amp_convert.metrics import ErrorStats
from amp_convert.report import report_schema
from amp_convert.report_html import html_report
from amp_convert.report_text import terminal_table
from amp_convert.runner import runnable
from amp_convert.tolerance import DEFAULT_TOLERANCES, Tolerance
from amp_convert.validation import ValidationConfig, validate
from models.zoo_inputs import load_manifest, make_inputs

ROOT = Path(__file__).resolve().parents[1]
ZOO = {e["name"]: e for e in load_manifest(str(ROOT / "models" / "zoo" / "manifest.json"))}


def cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("amp-convert")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)


def overflow_model() -> onnx.ModelProto:
    """x -> MatMul -> Mul(3) -> Exp -> y: Exp of values up to ~14 overflows fp16 (max 65504)."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
        helper.make_node("Mul", ["h", "k"], ["hk"], name="scale"),
        helper.make_node("Exp", ["hk"], ["y"], name="exp"),
    ]
    w = (rng.standard_normal((8, 8)) * 0.5).astype(np.float32)
    return model(
        nodes, [value("x", shape=(4, 8))], [value("y", shape=(4, 8))], [init("W", w), init("k", np.array([3.0], np.float32))]
    )


@pytest.fixture
def overflow_path(tmp_path) -> Path:
    path = tmp_path / "overflow.onnx"
    onnx.save(overflow_model(), str(path))
    return path


def test_overflow_at_o3_exits_1_and_names_the_node_first(overflow_path, tmp_path):
    out, report_path = tmp_path / "o3.onnx", tmp_path / "o3.json"
    proc = cli(str(overflow_path), "--level", "O3", "-o", str(out), "--report", str(report_path), "--input-range", "x=-2:2")
    assert proc.returncode == 1, proc.stderr
    assert not out.exists()  # out of tolerance: not written without --write-on-fail
    report = json.loads(report_path.read_text(), parse_constant=_refuse_constant)  # (strict JSON: no NaN, Infinity)
    jsonschema.validate(report, report_schema())
    v = report["validation"]
    assert not v["passed"] and v["outputs"][0]["new_nonfinite"] > 0
    assert v["offenders"][0]["name"] == "exp" and v["offenders"][0]["error_after"] == "inf"
    assert "FAIL" in proc.stdout and "not written" in proc.stdout


def _refuse_constant(name: str):
    raise ValueError(f"not JSON: {name}")


def test_same_model_at_o1_exits_0(overflow_path, tmp_path):
    out = tmp_path / "o1.onnx"
    proc = cli(str(overflow_path), "--level", "O1", "-o", str(out), "--input-range", "x=-2:2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out.exists() and "PASS" in proc.stdout


def test_write_on_fail_writes_and_still_exits_1(overflow_path, tmp_path):
    out = tmp_path / "o3.onnx"
    proc = cli(str(overflow_path), "--level", "O3", "-o", str(out), "--write-on-fail", "--input-range", "x=-2:2", "-q")
    assert proc.returncode == 1 and out.exists() and proc.stdout == ""


def test_no_validate_writes_without_running(overflow_path, tmp_path):
    out = tmp_path / "o3.onnx"
    proc = cli(str(overflow_path), "--level", "O3", "-o", str(out), "--no-validate", "--json")
    assert proc.returncode == 0 and out.exists()
    assert json.loads(proc.stdout)["result"]["status"] == "not-validated"


def test_emulation_rounds_where_the_cpu_provider_does_not():
    # Intermediate 2*1e4*x overflows fp16 for |x| > 3.3, though the output (scaled back) fits.
    nodes = [
        helper.make_node("Mul", ["x", "big"], ["h"], name="up"),
        helper.make_node("Add", ["h", "h"], ["h2"], name="double"),
        helper.make_node("Mul", ["h2", "small"], ["y"], name="down"),
    ]
    inits = [init("big", np.array([1e4], np.float32)), init("small", np.array([1e-4], np.float32))]
    m = model(nodes, [value("x", shape=(4,))], [value("y", shape=(4,))], inits)
    low = convert(m, level="O3").model
    twin = emulation_twin(low)
    onnx.checker.check_model(twin, full_check=True)
    from helpers import run

    x = np.array([1.0, 2.0, 4.0, 5.0], np.float32)
    emulated = run(twin, {"x": x})[0]
    assert np.isfinite(emulated[:2]).all() and np.isinf(emulated[2:]).all()
    assert np.allclose(emulated[:2], 2 * x[:2], rtol=1e-2)


def test_bf16_validates_on_cpu_through_emulation_with_its_own_metrics():
    for name in ("resnet50", "vit", "bert"):
        entry = ZOO[name]
        reference = onnx.load(entry["path"])
        metrics = {}
        for dtype in ("fp16", "bf16"):
            result = convert(reference, level="O2", dtype=dtype, target_opset=22)
            v = validate(
                reference, result.model, manifest_source(entry, reference), ValidationConfig(provider="cpu"), result.plan
            )
            assert v.emulated and v.provider == "cpu" and v.dtype == dtype
            metrics[dtype] = v.outputs[0].max_abs_err
            assert v.outputs[0].max_abs_err > 0
            assert v.passed, (name, dtype, [o.verdict(v.tolerance) for o in v.outputs])
        assert metrics["bf16"] != metrics["fp16"]
        assert metrics["bf16"] > metrics["fp16"]  # 8 significant bits against 11


def _npz_samples(entry: dict, folder: Path, n: int = 2) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = folder / f"sample{i}.npz"
        np.savez(path, **make_inputs(entry, seed=i))
        paths.append(path)
    return paths


@pytest.mark.parametrize("kind", ["npz", "folder", "polygraphy", "random"])
def test_input_sources(kind, tmp_path):
    entry = ZOO["bert"]
    args = [entry["path"], "--level", "O2", "-o", str(tmp_path / "out.onnx"), "--report", str(tmp_path / "r.json"), "-q"]
    samples = _npz_samples(entry, tmp_path / "samples")
    if kind == "npz":
        args += ["--inputs", str(samples[0]), "--inputs", str(samples[1])]
    elif kind == "folder":
        args += ["--inputs", str(tmp_path / "samples")]
    elif kind == "polygraphy":
        data = [{k: _polygraphy_encode(v) for k, v in make_inputs(entry, seed=i).items()} for i in range(3)]
        (tmp_path / "inputs.json").write_text(json.dumps(data))
        args += ["--inputs", str(tmp_path / "inputs.json")]
    else:
        args += [
            "--input-shape",
            "input_ids=2x12",
            "--input-shape",
            "attention_mask=2x12",
            "--input-shape",
            "token_type_ids=2x12",
        ]
        args += ["--input-range", "input_ids=0:1000", "--samples", "3"]
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    expected = {"npz": 2, "folder": 2, "polygraphy": 3, "random": 3}[kind]
    assert report["validation"]["samples"] == expected
    assert report["inputs"]["kind"] == ("random" if kind == "random" else "files")


def _polygraphy_encode(array: np.ndarray) -> dict:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return {"array": base64.b64encode(buf.getvalue()).decode(), "polygraphy_class": "ndarray"}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: {**{k: v for k, v in d.items() if k != "input_ids"}, "input_idz": d["input_ids"]}, "'input_idz'"),
        (lambda d: {**d, "input_ids": d["input_ids"].astype(np.int32)}, "'input_ids' has dtype int32"),
        (lambda d: {**d, "input_ids": d["input_ids"][None]}, "'input_ids' has shape [1, 1, 16]"),
        (lambda d: {k: v for k, v in d.items() if k != "token_type_ids"}, "missing input 'token_type_ids'"),
    ],
)
def test_wrong_inputs_exit_2_naming_the_input(mutate, message, tmp_path):
    entry = ZOO["bert"]
    source = tmp_path / "bert.onnx"
    shutil.copy(entry["path"], source)
    bad = tmp_path / "bad.npz"
    np.savez(bad, **mutate(make_inputs(entry, seed=0)))
    out = tmp_path / "out.onnx"
    out.write_bytes(b"previous output")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    proc = cli(str(source), "-o", str(out), "--inputs", str(bad))
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # input, samples and old output untouched


def test_bad_input_flags_exit_2(tmp_path):
    entry = ZOO["bert"]
    for args, message in (
        (["--input-shape", "nope=1x2"], "'nope' is not an input"),
        (["--input-shape", "input_ids=1x2x3"], "rank 3"),
        (["--input-range", "input_ids=5:1"], "LOW < HIGH"),
        (["--inputs", str(tmp_path / "missing.npz")], "no such file"),
    ):
        proc = cli(entry["path"], "-o", str(tmp_path / "o.onnx"), *args)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)


def test_object_arrays_in_npz_are_refused(tmp_path):
    bad = tmp_path / "pickled.npz"
    np.savez(bad, input=np.array([{"a": 1}], dtype=object))
    source = tmp_path / "resnet50.onnx"
    shutil.copy(ROOT / "models" / "zoo" / "resnet50.onnx", source)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    proc = cli(str(source), "-o", str(tmp_path / "o.onnx"), "--inputs", str(bad), "--report", str(tmp_path / "r.json"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "object arrays" in lines[0] and "Traceback" not in proc.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing written, nothing changed


def test_provider_cuda_without_a_usable_gpu_exits_2(tmp_path):
    from amp_convert.runner import cuda_usable

    if cuda_usable()[0]:
        pytest.skip("a usable CUDA device is here")
    proc = cli(str(ROOT / "models" / "zoo" / "lstm.onnx"), "-o", str(tmp_path / "o.onnx"), "--provider", "cuda")
    assert proc.returncode == 2 and "--provider cuda" in proc.stderr and not (tmp_path / "o.onnx").exists()
    report = tmp_path / "r.json"
    proc = cli(str(ROOT / "models" / "zoo" / "lstm.onnx"), "-o", str(tmp_path / "o.onnx"), "--report", str(report), "-q")
    assert proc.returncode == 0 and json.loads(report.read_text())["validation"]["provider"] == "cpu"  # auto: the CPU


def test_tolerance_flags_decide_the_verdict(overflow_path, tmp_path):
    """O1 of the overflow model passes the defaults; tighter flags fail it, each on its own criterion."""
    base = [str(overflow_path), "--level", "O1", "-o", str(tmp_path / "o.onnx"), "--input-range", "x=-2:2"]
    assert cli(*base, "-q").returncode == 0
    report = tmp_path / "r.json"
    tight = cli(*base, "--atol", "0", "--rtol", "0", "--report", str(report), "-q")
    assert tight.returncode == 1
    [y] = json.loads(report.read_text())["validation"]["outputs"]
    assert y["checks"]["max_abs_err"] is False and y["checks"]["cosine"] is True
    strict = cli(*base, "--min-cosine", "1", "--report", str(report), "-q")
    assert strict.returncode == 1
    [y] = json.loads(report.read_text())["validation"]["outputs"]
    assert y["checks"]["cosine"] is False and y["checks"]["max_abs_err"] is True


def test_compare_command_scores_another_tools_conversion(tmp_path):
    from onnxconverter_common import float16

    entry = ZOO["resnet50"]
    peer = float16.convert_float_to_float16(onnx.load(entry["path"]), keep_io_types=True)
    peer_path = tmp_path / "peer.onnx"
    onnx.save(peer, str(peer_path))
    report_path = tmp_path / "cmp.json"
    proc = cli("compare", entry["path"], str(peer_path), "--report", str(report_path), "--samples", "1")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    jsonschema.validate(report, report_schema())
    assert report["command"] == "compare" and report["validation"]["emulated"]
    assert report["validation"]["nodes"]  # per-node errors, precision read off the candidate
    precisions = [n["precision"] for n in report["validation"]["nodes"]]
    assert precisions.count("low") > len(precisions) // 2  # read off the candidate's tensor types


def test_error_stats():
    s = ErrorStats("y")
    ref = np.array([1.0, -2.0, 3.0, 0.0], np.float32)
    s.update(ref, ref + np.array([0.01, 0.0, -0.03, 0.0], np.float32))
    s.update(ref, np.array([1.0, -2.0, np.inf, 0.0], np.float32))
    assert s.samples == 2 and s.new_nonfinite == 1 and s.cand_inf == 1
    assert math.isclose(s.max_abs_err, 0.03, rel_tol=1e-4)
    assert 0.999 < s.cosine < 1.0 and s.snr_db > 30
    assert s.verdict(DEFAULT_TOLERANCES["fp16"]) == ["1 new NaN/Inf values"]  # 0.03 <= 1e-3 + 1e-2 * 3
    # Over the finite pairs: errors |0.01|, 0, |0.03|, 0 then 0, 0, 0 (the Inf pair left out).
    assert math.isclose(s.sum_abs_err / s.count, 0.04 / 7, rel_tol=1e-4)
    assert math.isclose(s.max_rel_err, 0.01, rel_tol=1e-4)  # 0.01 / |1| and 0.03 / |3|
    assert (s.ref_nan, s.ref_inf, s.cand_nan) == (0, 0, 0)
    nans = ErrorStats("z")
    nans.update(np.array([np.nan, np.inf, 1.0], np.float32), np.array([np.nan, np.inf, np.nan], np.float32))
    assert (nans.ref_nan, nans.ref_inf, nans.cand_nan, nans.cand_inf, nans.new_nonfinite) == (1, 1, 2, 1, 1)
    d = nans.as_dict(DEFAULT_TOLERANCES["fp16"])
    assert d["new_nonfinite"] == 1 and not d["passed"]
    exact = ErrorStats("ids")
    exact.update(np.array([1, 2, 3, 4]), np.array([1, 2, 0, 4]))
    assert exact.kind == "exact" and exact.equal_fraction == 0.75
    assert exact.verdict(DEFAULT_TOLERANCES["fp16"])


STREAMING_DRIVER = """
import sys
import numpy as np
import onnx
from onnx import helper, numpy_helper
from amp_convert import convert
from amp_convert.inputs import make_source
from amp_convert.validation import ValidationConfig, validate

rng = np.random.default_rng(3)
nodes, inits, x = [], [], "x"
for i in range(12):  # 12 MatMul + Relu pairs on 256x256: 24 intermediate tensors of 256 KB
    inits.append(numpy_helper.from_array((rng.standard_normal((256, 256)) / 16).astype(np.float32), f"W{i}"))
    nodes += [
        helper.make_node("MatMul", [x, f"W{i}"], [f"h{i}"], name=f"mm{i}"),
        helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}"),
    ]
    x = f"r{i}"
graph = helper.make_graph(
    nodes, "g", [helper.make_tensor_value_info("x", 1, (256, 256))], [helper.make_tensor_value_info(x, 1, (256, 256))], inits
)
reference = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
reference.ir_version = 8
low = convert(reference, level="O2").model
samples = int(sys.argv[1])
result = validate(reference, low, make_source(reference, samples=samples), ValidationConfig(provider="cpu", per_node=True))
assert result.samples == samples and len(result.nodes) == 24
status = open("/proc/self/status").read()
print(int(status.split("VmHWM:")[1].split()[0]) * 1024)
"""


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the peak resident set size from /proc")
def test_per_node_memory_does_not_grow_with_samples(tmp_path):
    """Streaming: one sample's tensors at a time and running sums, so the
    process's peak memory is the same for 2 or 40 samples, where holding
    every exposed tensor of every sample would add 40 x 12.6 MB (24
    intermediate 256x256 float32 tensors in each of the two models)."""
    driver = tmp_path / "stream.py"
    driver.write_text(STREAMING_DRIVER)

    def peak(samples: int) -> int:
        proc = subprocess.run([sys.executable, str(driver), str(samples)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout.split()[-1])

    per_sample = 2 * 24 * 256 * 256 * 4
    assert peak(40) - peak(2) < 4 * per_sample  # held, the 38 extra samples would take 38 x per_sample


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is installed by `make test` (make browser)")
def test_html_report_opens_in_headless_chromium_with_the_chart(tmp_path):
    from playwright.sync_api import sync_playwright

    html_path = tmp_path / "report.html"
    proc = cli(str(ROOT / "models" / "zoo" / "convnext.onnx"), "-o", str(tmp_path / "c.onnx"), "--html", str(html_path), "-q")
    assert proc.returncode == 0, proc.stderr
    text = html_path.read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "<script" not in text  # self-contained
    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        page = browser.new_page()
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(html_path.as_uri())
        chart = page.locator("#error-chart")
        box = chart.bounding_box()
        marks = page.locator("#error-chart circle").count()
        status = page.locator("#status").inner_text()
        rows = page.locator("#offenders tr").count()
        browser.close()
    assert problems == []
    assert box is not None and box["width"] > 500 and box["height"] > 200
    assert marks == len(onnx.load(str(ROOT / "models" / "zoo" / "convnext.onnx")).graph.node)
    assert status == "passed" and rows > 1


def test_per_node_diff_is_skipped_on_huge_graphs_unless_forced(monkeypatch):
    import amp_convert.validation as validation

    entry = ZOO["vit"]
    reference = onnx.load(entry["path"])
    low = convert(reference, level="O2").model
    monkeypatch.setattr(validation, "PER_NODE_LIMIT", 10)
    skipped = validate(reference, low, make_source(reference, samples=1), ValidationConfig(provider="cpu"))
    assert skipped.nodes == [] and "per-node diff skipped" in skipped.per_node_note
    forced = validate(reference, low, make_source(reference, samples=1), ValidationConfig(provider="cpu", per_node=True))
    assert forced.nodes and forced.per_node_note == ""


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_io_types_low_conversions_validate_from_fp32_feeds(dtype, tmp_path):
    """A model that reads low inputs is fed the reference's fp32 samples,
    rounded to its input type (directly for fp16, through the emulation for bf16)."""
    out, report = tmp_path / "low_io.onnx", tmp_path / "r.json"
    args = [str(ZOO["resnet50"]["path"]), "--level", "O2", "--io-types", "low", "--dtype", dtype, "-o", str(out)]
    proc = cli(*args, "--report", str(report), "--quiet")
    assert proc.returncode == 0, proc.stderr
    converted = onnx.load(str(out))
    low = onnx.TensorProto.FLOAT16 if dtype == "fp16" else onnx.TensorProto.BFLOAT16
    assert converted.graph.input[0].type.tensor_type.elem_type == low
    data = json.loads(report.read_text())
    assert data["result"]["status"] == "passed" and data["validation"]["passed"]
    [metrics] = data["validation"]["outputs"]
    assert metrics["max_abs_err"] > 0 and metrics["cosine"] > 0.999
    if dtype == "fp16":  # a real fp16 feed is possible: with --emulate never it is what runs
        proc = cli(*args, "--emulate", "never", "--quiet")
        assert proc.returncode == 0, proc.stderr


def test_output_wiped_out_to_zeros_is_flagged_and_fails_a_tight_atol():
    """Every fp32 value is below fp16's smallest subnormal: O3 flushes the
    weight and the output becomes all zeros."""
    m = model(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        [value("x", shape=(2, 8))],
        [value("y", shape=(2, 8))],
        [init("W", (np.eye(8) * 1e-8).astype(np.float32))],
    )
    out = convert(m, level="O3").model
    result = validate(m, out, make_source(m, samples=2), ValidationConfig())
    [metrics] = result.outputs
    # Within the default atol of 0 the output passes, but not silently.
    [warning] = metrics.warnings()
    assert result.passed and warning.kind == "all_zeros" and "became 0" in warning.text
    d = metrics.as_dict(result.tolerance)
    assert d["warnings"] == [warning.text] and d["warning_kinds"] == ["all_zeros"]
    strict = validate(
        m, out, make_source(m, samples=2), ValidationConfig(tolerance=Tolerance(atol=1e-12, rtol=1e-2, min_cosine=0.999))
    )
    assert not strict.passed
    failed = strict.outputs[0].as_dict(strict.tolerance)
    assert failed["warnings"] == failed["warning_kinds"] == []  # (it does not pass: its failures say why)


def test_the_all_zeros_warning_is_shown_by_its_kind_in_the_terminal_json_and_html(tmp_path):
    """The terminal's WARN row, the JSON's warning_kinds and the HTML's list
    item follow the warning's kind: reworded, an all-zeros warning keeps its
    row (the terminal told the kinds apart by how the text began)."""
    m = model(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        [value("x", shape=(2, 8))],
        [value("y", shape=(2, 8))],
        [init("W", (np.eye(8) * 1e-8).astype(np.float32))],
    )
    source, report, page = tmp_path / "zeros.onnx", tmp_path / "r.json", tmp_path / "r.html"
    onnx.save(m, str(source))
    proc = cli(str(source), "--level", "O3", "-o", str(tmp_path / "o.onnx"), "--report", str(report), "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    assert any(line.split() == ["all", "zeros", "yes", "within", "--atol", "WARN"] for line in proc.stdout.splitlines())
    assert "mixed scales" not in proc.stdout
    assert "warning: y: every value became 0 (fp32 reaches " in proc.stdout
    data = json.loads(report.read_text())
    jsonschema.validate(data, report_schema())
    [out] = data["validation"]["outputs"]
    assert out["warning_kinds"] == ["all_zeros"] and out["warnings"][0].startswith("every value became 0")
    assert "<li data-kind='all_zeros'>y: every value became 0" in page.read_text()
    out["warnings"] = ["all of y is 0 now"]
    assert re.search(r"all zeros +yes", terminal_table(data)) and "warning: y: all of y is 0 now" in terminal_table(data)
    assert "<li data-kind='all_zeros'>y: all of y is 0 now</li>" in html_report(data)


def test_an_output_wiped_out_to_zeros_that_fails_is_not_said_to_pass(tmp_path):
    """x * 1e-8 * 1e8: at O3 fp16 flushes 1e-8 to 0, and the output, x in
    fp32 (1 to 2), becomes all zeros and fails. The report gave it the
    all-zeros warning too: a WARN row "within --atol" and "it passes only
    because the whole output is within --atol of 0", beside its FAIL rows."""
    nodes = [
        helper.make_node("Mul", ["x", "tiny"], ["h"], name="down"),
        helper.make_node("Mul", ["h", "huge"], ["y"], name="up"),
    ]
    constants = [init("tiny", np.float32(1e-8)), init("huge", np.float32(1e8))]
    m = model(nodes, [value("x", shape=(2, 8))], [value("y", shape=(2, 8))], constants)
    source = tmp_path / "wipe.onnx"
    onnx.save(m, str(source))
    report = tmp_path / "r.json"
    proc = cli(str(source), "--level", "O3", "--input-range", "x=1:2", "-o", str(tmp_path / "o.onnx"), "--report", str(report))
    assert proc.returncode == 1, proc.stderr
    [out] = json.loads(report.read_text())["validation"]["outputs"]
    assert out["cand_nan"] + out["cand_inf"] == 0 and out["max_abs_err"] == out["max_abs_ref"] > 1
    assert not out["passed"] and out["warnings"] == []
    assert "all zeros" not in proc.stdout and "passes only because" not in proc.stdout


def test_new_nan_or_inf_counts_every_change_of_kind():
    stats = ErrorStats("y")
    ref = np.array([np.inf, -np.inf, np.nan, np.inf, 1.0, np.nan], np.float32)
    cand = np.array([np.nan, np.inf, np.inf, np.inf, 1.0, np.nan], np.float32)
    stats.update(ref, cand)
    assert stats.new_nonfinite == 3  # inf->nan, -inf->inf, nan->inf; same inf and same nan are not new
    assert stats.verdict(DEFAULT_TOLERANCES["fp16"])


def test_measuring_infinite_values_warns_nothing():
    """Attention masks hold -inf (float32's lowest added to itself) in fp32
    and fp16 alike: measuring them printed numpy's RuntimeWarning under -q."""
    ref = np.array([-np.inf, 1.0, np.inf], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for detailed in (True, False):
            stats = ErrorStats("mask", detailed=detailed)
            stats.update(ref, ref.astype(np.float16))
            assert stats.new_nonfinite == 0 and stats.relative_rms == 0


def test_a_nan_or_inf_of_the_reference_made_finite_fails_and_is_counted():
    """fp32 overflows to Inf where the candidate saturates at a finite value:
    left out of the error sums (they compare finite pairs), it must still
    be counted and fail, or a candidate that zeroes every Inf would pass."""
    stats = ErrorStats("y")
    stats.update(np.array([np.inf, np.nan, 1.0], np.float32), np.array([65504.0, 0.0, 1.0], np.float32))
    assert stats.lost_nonfinite == 2 and stats.new_nonfinite == 0 and stats.max_abs_err == 0
    assert stats.verdict(DEFAULT_TOLERANCES["fp16"]) == ["2 NaN/Inf values of the reference made finite"]
    d = stats.as_dict(DEFAULT_TOLERANCES["fp16"])
    assert d["lost_nonfinite"] == 2 and not d["passed"] and not d["checks"]["nonfinite"]
    jsonschema.validate(d, {"$defs": report_schema()["$defs"], "$ref": "#/$defs/output_metrics"})
    intermediate = ErrorStats("h", detailed=False)  # (the per-node diff)
    intermediate.update(np.array([np.inf, 2.0], np.float32), np.array([1.0, 2.0], np.float32))
    assert intermediate.lost_nonfinite == 1 and intermediate.relative_rms == math.inf


def test_per_node_error_of_huge_values_is_measured_not_overflowed():
    stats = ErrorStats("t", detailed=False)
    stats.update(np.array([1e20, 1e20], np.float32), np.array([1e20, 1.001e20], np.float32))
    assert 0 < stats.relative_rms < 1e-3


def test_input_shape_fixes_the_symbolic_dims_other_inputs_share():
    """BERT's three inputs share (batch, sequence): one --input-shape sets all."""
    m = onnx.load(str(ZOO["bert"]["path"]))
    source = make_source(m, shapes=["input_ids=2x12"], samples=1)
    [sample] = list(source)
    assert {name: a.shape for name, a in sample.items()} == {
        "input_ids": (2, 12),
        "attention_mask": (2, 12),
        "token_type_ids": (2, 12),
    }


def test_scalar_input_given_an_array_is_named(tmp_path):
    m = model(
        [helper.make_node("Mul", ["x", "s"], ["y"], name="scale")],
        [value("x", shape=(2, 3)), value("s", shape=())],
        [value("y", shape=(2, 3))],
    )
    path = tmp_path / "scalar.onnx"
    onnx.save(m, str(path))
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.ones((2, 3), np.float32), s=np.ones(3, np.float32))
    for args in (["--inputs", str(bad)], ["--input-shape", "s=3"]):
        proc = cli(str(path), "-o", str(tmp_path / "o.onnx"), *args)
        assert proc.returncode == 2, proc.stderr
        assert "'s'" in proc.stderr or "--input-shape s" in proc.stderr
        assert "expects" in proc.stderr and not (tmp_path / "o.onnx").exists()


def test_offenders_are_low_nodes_that_can_round_and_nan_counts_as_infinite():
    from amp_convert.offenders import NodeError
    from amp_convert.validation_result import ValidationResult

    nodes = [
        NodeError(0, "picks_worse_half", "Gather", "low", 1e-4, 5e-4),
        NodeError(1, "kept_fp32", "MatMul", "fp32", 1e-4, 9e-4),
        NodeError(2, "softmax", "Softmax", "low", 1e-4, 3e-4),
        NodeError(3, "exp", "Exp", "low", 1e-4, math.nan),
    ]
    result = ValidationResult("cpu", "", True, "", "fp16", DEFAULT_TOLERANCES["fp16"], 1, [], nodes)
    assert [n.name for n in result.offenders()] == ["exp", "softmax"]
    assert result.offenders()[0].as_dict()["error_added"] == "inf"


def _casts(m: onnx.ModelProto) -> int:
    return sum(n.op_type == "Cast" for n in m.graph.node)


def _outputs(m: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    """Outputs of ``m`` through its emulation twin (ORT's CPU provider has no
    bf16 kernels), fed ``x`` as the twin's float input."""
    from helpers import run

    twin = emulation_twin(m)
    return run(twin, {twin.graph.input[0].name: x})


@pytest.mark.parametrize("io", ["keep", "low"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_reconverting_an_output_with_validation_adds_no_cast_and_changes_no_numerics(dtype, io, tmp_path):
    """Idempotence with validation on: the reference of the second run is the
    first run's low-precision output (bf16 kernels ORT's CPU provider lacks;
    fp16 or bf16 graph inputs under --io-types low). It runs through the
    emulation as the candidate does, each fed the samples in its own input
    dtype, so the two measure identical."""
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    report = tmp_path / "b.json"
    proc = cli(str(ZOO["resnet50"]["path"]), "--level", "O2", "--dtype", dtype, "--io-types", io, "-o", str(first), "-q")
    assert proc.returncode == 0, proc.stderr
    proc = cli(str(first), "--level", "O2", "--dtype", dtype, "-o", str(second), "--report", str(report))
    assert proc.returncode == 0, proc.stderr
    assert "the reference is low precision too: emulated" in proc.stdout
    data = json.loads(report.read_text())
    jsonschema.validate(data, report_schema())
    v = data["validation"]
    assert data["result"]["status"] == "passed" and v["emulated"] and v["reference_emulated"]
    assert v["dtype"] == dtype and v["nodes"]  # per-node diff ran on both emulated models
    assert all(o["max_abs_err"] == 0 and o["passed"] for o in v["outputs"])
    a, b = onnx.load(str(first)), onnx.load(str(second))
    assert _casts(b) <= _casts(a)
    assert [i.type.tensor_type.elem_type for i in b.graph.input] == [i.type.tensor_type.elem_type for i in a.graph.input]
    x = np.random.default_rng(3).uniform(-1, 1, size=(1, 3, 64, 64)).astype(np.float32)
    for out_a, out_b in zip(_outputs(a, x), _outputs(b, x), strict=True):
        assert np.array_equal(out_a, out_b)
    if dtype == "fp16":  # fp16 also runs as is on the CPU provider, fed its declared input dtype
        from helpers import run

        feed = x.astype(np.float16) if io == "low" else x
        for out_a, out_b in zip(run(a, {"input": feed}), run(b, {"input": feed}), strict=True):
            assert np.array_equal(out_a, out_b)


def _nested_fp16_function_model() -> onnx.ModelProto:
    """x -> Cast to fp16 -> k; c -> If(then: Outer(k, alpha=0.002), else:
    k) -> t; Outer(k, alpha=0.001) -> h; y = h, z = t cast to fp32. The
    local function local::Outer calls local::Inner (its input times an fp16
    Constant 1000, named k as the main graph's tensor is) and scales the
    result by its attribute alpha, cast like its input."""
    from onnx import TensorProto, numpy_helper

    f16, opsets = TensorProto.FLOAT16, [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    thousand = numpy_helper.from_array(np.array(1000, np.float16), "thousand")
    inner = helper.make_function(
        "local",
        "Inner",
        ["a"],
        ["o"],
        [helper.make_node("Constant", [], ["k"], value=thousand), helper.make_node("Mul", ["a", "k"], ["o"])],
        opset_imports=opsets[:1],
    )
    alpha = helper.make_attribute_ref("value_float", onnx.AttributeProto.FLOAT)
    alpha.ref_attr_name = "alpha"
    scale = helper.make_node("Constant", [], ["s0"])
    scale.attribute.append(alpha)
    body = [
        helper.make_node("Inner", ["a"], ["i"], domain="local"),
        scale,
        helper.make_node("CastLike", ["s0", "a"], ["s"]),
        helper.make_node("Mul", ["i", "s"], ["o"]),
    ]
    outer = helper.make_function("local", "Outer", ["a"], ["o"], body, opset_imports=opsets, attributes=["alpha"])
    branch_call = helper.make_node("Outer", ["k"], ["bt"], name="branch_call", domain="local", alpha=0.002)
    then_branch = helper.make_graph([branch_call], "then", [], [helper.make_tensor_value_info("bt", f16, [4])])
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["k"], ["be"])], "else", [], [helper.make_tensor_value_info("be", f16, [4])]
    )
    nodes = [
        helper.make_node("Cast", ["x"], ["k"], name="to16", to=f16),
        helper.make_node("Outer", ["k"], ["h"], name="call", domain="local", alpha=0.001),
        helper.make_node("If", ["c"], ["t"], name="if", then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Cast", ["h"], ["y"], name="y32", to=TensorProto.FLOAT),
        helper.make_node("Cast", ["t"], ["z"], name="z32", to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [value("x", shape=(4,)), value("c", onnx.TensorProto.BOOL, ())],
        [value("y", shape=(4,)), value("z", shape=(4,))],
    )
    m = helper.make_model(graph, opset_imports=opsets, functions=[outer, inner])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("branch", [True, False])
def test_an_emulation_twin_rounds_inside_local_functions_as_fp16_does(branch):
    """Local function calls (nested, with an attribute, one in an If branch)
    whose bodies compute in fp16: the twin inlines them and rounds each of
    their fp16 tensors, so y and z are what fp16 arithmetic gives: x * 1000
    overflows to inf for x = 100, which onnxruntime's CPU provider hides
    running the model as written (y about 100). The twin left the bodies
    as written: onnxruntime refused it."""
    from helpers import run

    m = _nested_fp16_function_model()
    x, c = np.array([100, 1, -0.3, 0.07], np.float32), np.array(branch)
    k = x.astype(np.float16)

    def outer(alpha: float) -> np.ndarray:
        with np.errstate(over="ignore"):
            return (k * np.float16(1000)) * np.float16(alpha)

    y, z = run(emulation_twin(m), {"x": x, "c": c})
    assert np.isinf(y[0]) and np.array_equal(y, outer(0.001).astype(np.float32))
    assert np.array_equal(z, (outer(0.002) if branch else k).astype(np.float32), equal_nan=True)
    assert run(m, {"x": x, "c": c})[0][0] == pytest.approx(100, rel=1e-3)


def _calling_function_model(
    outer_opset: int, inner: onnx.NodeProto, inner_imports: list, outer_local: int = 1
) -> onnx.ModelProto:
    """x -> Cast to fp16 -> k; Outer(k) (at ``outer_opset`` and local
    ``outer_local``: Inner, then Identity, whose schema is new at 14 and
    16) + Inner(k) (``inner``, at ``inner_imports``) -> Cast to fp32 -> y;
    the model imports opset 17 and local 1."""
    from onnx import TensorProto

    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    functions = [
        helper.make_function(
            "local",
            "Outer",
            ["a"],
            ["o"],
            [helper.make_node("Inner", ["a"], ["i"], domain="local"), helper.make_node("Identity", ["i"], ["o"])],
            opset_imports=[helper.make_opsetid("", outer_opset), helper.make_opsetid("local", outer_local)],
        ),
        helper.make_function("local", "Inner", ["a"], ["o"], [inner], opset_imports=inner_imports),
    ]
    nodes = [
        helper.make_node("Cast", ["x"], ["k"], to=TensorProto.FLOAT16),
        helper.make_node("Outer", ["k"], ["h"], domain="local"),
        helper.make_node("Inner", ["k"], ["i"], domain="local"),
        helper.make_node("Add", ["h", "i"], ["s"]),
        helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT),
    ]
    m = helper.make_model(
        helper.make_graph(nodes, "g", [value("x", shape=(4,))], [value("y", shape=(4,))]),
        opset_imports=opsets,
        functions=functions,
    )
    m.ir_version = 8
    return m


@pytest.mark.parametrize(("outer_opset", "outer_local", "inlined"), [(16, 1, True), (17, 2, True), (13, 1, False)])
def test_an_emulation_twin_inlines_a_function_at_another_opset_where_its_body_means_the_same(outer_opset, outer_local, inlined):
    """onnx inlines no function importing another version of a domain than
    the model (Outer, at opset 16 or 13, or local 2; the model's are 17 and
    local 1). Outer's body has the same schemas at 16 as at 17, and a call
    of a local function means the same at any local version: the twin
    reads the body at the model's versions and inlines it; at 13 its
    Identity's schema differs (onnx's checker refuses such a model), and it
    stays a call. onnx drops the functions it inlines: the twin declares
    them all again, as Outer, left a call, still calls Inner. A domain only
    a function imports (com.microsoft) is imported by the twin, whose main
    graph now holds that function's nodes."""
    from helpers import run

    x = np.array([1, 2, 3, 60000], np.float32)
    add = helper.make_node("Add", ["a", "a"], ["o"])
    adds = _calling_function_model(outer_opset, add, [helper.make_opsetid("", 17)], outer_local)
    twin = emulation_twin(adds)
    assert [f.name for f in twin.functions] == ["Outer", "Inner"]
    assert ("Outer" not in [n.op_type for n in twin.graph.node]) == inlined
    assert np.array_equal(run(twin, {"x": x})[0], [4, 8, 12, np.inf])  # (2 * 60000 overflows fp16)
    gelu = helper.make_node("Gelu", ["a"], ["o"], domain="com.microsoft")
    imports = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    twin = emulation_twin(_calling_function_model(17, gelu, imports))
    assert ("com.microsoft", 1) in [(o.domain, o.version) for o in twin.opset_import]
    assert run(twin, {"x": x})[0][:2] == pytest.approx([2 * 0.8413447, 2 * 1.9544997], rel=1e-3)


def test_the_low_dtype_of_a_model_counts_the_bodies_of_the_local_functions_it_calls():
    """A model's low dtype counts the types the bodies of the local
    functions it calls compute in, with the attributes each call binds (a
    Cast to the function's attribute dtype, bf16 where the call gives
    none), bf16 over fp16 still; not those of a function no node calls."""
    from onnx import TensorProto

    from amp_convert.emulate import detect_low_dtype

    cast = helper.make_node("Cast", ["a"], ["o"])
    cast.attribute.append(helper.make_attribute_ref("to", onnx.AttributeProto.INT, ref_attr_name="dtype"))
    function = helper.make_function("local", "To", ["a"], ["o"], [cast], opset_imports=[helper.make_opsetid("", 17)])
    function.attribute_proto.append(helper.make_attribute("dtype", TensorProto.BFLOAT16))

    def calling(elem: int, call: bool = True, **dtype: int) -> onnx.ModelProto:
        nodes = [helper.make_node("Cast", ["x"], ["c"], to=elem)]
        nodes += [helper.make_node("To", ["c"], ["t"], domain="local", **dtype)] if call else []
        nodes.append(helper.make_node("Cast", ["t" if call else "c"], ["y"], to=TensorProto.FLOAT))
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
        graph = helper.make_graph(nodes, "g", [value("x", shape=(4,))], [value("y", shape=(4,))])
        return helper.make_model(graph, opset_imports=opsets, functions=[function])

    assert detect_low_dtype(calling(TensorProto.FLOAT, dtype=TensorProto.FLOAT)) is None
    assert detect_low_dtype(calling(TensorProto.FLOAT, dtype=TensorProto.FLOAT16)) == TensorProto.FLOAT16
    assert detect_low_dtype(calling(TensorProto.FLOAT)) == TensorProto.BFLOAT16
    assert detect_low_dtype(calling(TensorProto.FLOAT16)) == TensorProto.BFLOAT16
    assert detect_low_dtype(calling(TensorProto.FLOAT, call=False)) is None


@pytest.mark.parametrize("holder", ["sequence", "optional", "optional sequence"])
def test_the_low_dtype_of_a_model_counts_the_elements_of_the_containers_a_called_body_declares(holder):
    """A called body's only fp16 values may be sequences or optionals of
    fp16 tensors (empty ones here, made by a SequenceEmpty or an Optional
    of float16, whose attributes the search reads no type from): the
    element type its value_info declares counts, at any depth. It was read
    as no tensor's, and the model taken for fp32. (Each model passes onnx's
    full check and runs.)"""
    from onnx import TensorProto

    from amp_convert.emulate import detect_low_dtype

    def calling(elem: int) -> onnx.ModelProto:
        held = helper.make_tensor_type_proto(elem, None)
        if holder == "sequence":
            made, asked = helper.make_node("SequenceEmpty", [], ["s"], dtype=elem), "SequenceLength"
            held = helper.make_sequence_type_proto(held)
        else:
            held = helper.make_sequence_type_proto(held) if holder == "optional sequence" else held
            made, asked = helper.make_node("Optional", [], ["s"], type=held), "OptionalHasElement"
            held = helper.make_optional_type_proto(held)
        body = [made, helper.make_node(asked, ["s"], ["o"])]
        function = helper.make_function("local", "Held", [], ["o"], body, opset_imports=[helper.make_opsetid("", 18)])
        function.value_info.append(helper.make_value_info("s", held))
        nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Held", [], ["n"], domain="local")]
        answer = TensorProto.INT64 if holder == "sequence" else TensorProto.BOOL
        graph = helper.make_graph(nodes, "g", [value("x", shape=(4,))], [value("y", shape=(4,)), value("n", answer, ())])
        opsets = [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)]
        return helper.make_model(graph, opset_imports=opsets, functions=[function], ir_version=8)

    assert detect_low_dtype(calling(TensorProto.FLOAT16)) == TensorProto.FLOAT16
    assert detect_low_dtype(calling(TensorProto.FLOAT)) is None


def _relu(x: str = "x", elem: int = onnx.TensorProto.FLOAT, shape=("N", 4)) -> onnx.ModelProto:
    """x -> Cast(float) -> Relu -> y."""
    nodes = [helper.make_node("Cast", [x], ["f"], to=onnx.TensorProto.FLOAT), helper.make_node("Relu", ["f"], ["y"])]
    return model(nodes, [value(x, elem, shape)], [value("y", shape=shape)])


@pytest.mark.parametrize(
    ("candidate", "fragment"),
    [
        (_relu(x="z"), "the models' inputs differ: ['x'] (reference) vs ['z'] (candidate)"),
        (
            _relu(elem=onnx.TensorProto.INT32),
            "the models' inputs differ: 'x' is float32 in the reference, int32 in the candidate",
        ),
        (
            _relu(shape=(3, 4)),
            "the models' inputs differ: 'x' is [N, 4] in the reference, [3, 4] in the candidate, which does not take a "
            "sample of shape [1, 4] (give --inputs or --input-shape that fit both)",
        ),
    ],
    ids=["renamed", "int32", "fixed-batch"],
)
def test_compare_says_how_the_models_inputs_differ(tmp_path, candidate, fragment):
    """As for outputs: one line naming what differs, not onnxruntime's first line."""
    onnx.save(_relu(), str(tmp_path / "ref.onnx"))
    onnx.save(candidate, str(tmp_path / "cand.onnx"))
    proc = cli("compare", str(tmp_path / "ref.onnx"), str(tmp_path / "cand.onnx"))
    assert proc.returncode == 2 and proc.stderr == f"amp-convert: error: {fragment}\n"


def test_compare_takes_inputs_that_differ_only_where_the_samples_fit_both(tmp_path):
    """A sample of a shape both models take compares; so does a float input of
    another float dtype (the samples are cast to it)."""
    onnx.save(_relu(), str(tmp_path / "ref.onnx"))
    for name, candidate in (("fixed", _relu(shape=(3, 4))), ("half", _relu(elem=onnx.TensorProto.FLOAT16))):
        onnx.save(candidate, str(tmp_path / f"{name}.onnx"))
        proc = cli("compare", str(tmp_path / "ref.onnx"), str(tmp_path / f"{name}.onnx"), "--input-shape", "x=3x4", "-q")
        assert proc.returncode == 0, proc.stderr


def test_compare_with_a_bf16_reference_emulates_it(tmp_path):
    """`compare REF CAND` where REF computes in bf16: the reference cannot run
    on ORT's CPU provider as is, so it runs through its emulation twin."""
    paths = {}
    for name, dtype in (("bf16", "bf16"), ("fp16", "fp16")):
        paths[name] = tmp_path / f"{name}.onnx"
        proc = cli(str(ZOO["vit"]["path"]), "--dtype", dtype, "-o", str(paths[name]), "--no-validate", "-q")
        assert proc.returncode == 0, proc.stderr
    report = tmp_path / "cmp.json"
    proc = cli("compare", str(paths["bf16"]), str(paths["bf16"]), "--report", str(report), "--samples", "1", "-q")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(report.read_text())
    jsonschema.validate(data, report_schema())
    v = data["validation"]
    assert data["command"] == "compare" and v["reference_emulated"] and v["emulated"]
    assert "bfloat16" in v["reference_emulation_note"]
    assert all(o["max_abs_err"] == 0 for o in v["outputs"]) and v["nodes"]
    # An fp16 candidate against the bf16 reference: measured, not refused.
    proc = cli("compare", str(paths["bf16"]), str(paths["fp16"]), "--json", "--samples", "1", "--rtol", "0.1")
    assert proc.returncode in (0, 1), proc.stderr
    v = json.loads(proc.stdout)["validation"]
    assert v["reference_emulated"] and v["dtype"] == "fp16" and 0 < v["outputs"][0]["max_abs_err"] < math.inf
    # --emulate never: the bf16 reference cannot run on the CPU provider; said before anything runs.
    proc = cli("compare", str(paths["bf16"]), str(paths["fp16"]), "--emulate", "never", "--provider", "cpu")
    assert proc.returncode == 2 and "the reference computes in bfloat16" in proc.stderr


def test_fp32_reference_is_not_emulated_and_bf16_outputs_compare_as_floats():
    import ml_dtypes

    entry = ZOO["resnet50"]
    reference = onnx.load(entry["path"])
    low = convert(reference, level="O2", dtype="bf16").model
    v = validate(reference, low, make_source(reference, samples=1), ValidationConfig(provider="cpu"))
    assert not v.reference_emulated and v.reference_emulation_note == "the reference has no fp16/bf16 tensors"
    stats = ErrorStats("y")
    ref = np.array([1.0, -2.0, 3.0], np.float32)
    stats.update(ref, ref.astype(ml_dtypes.bfloat16))
    assert stats.kind == "float" and stats.max_abs_err == 0
    stats.update(ref.astype(ml_dtypes.bfloat16), np.array([1.0, -2.0, 3.5], np.float32))
    assert stats.kind == "float" and stats.max_abs_err == 0.5


def test_a_real_run_exposes_bf16_tensors_as_float32():
    """onnxruntime's Python API returns no bfloat16 arrays: a real (not
    emulated) run, as on CUDA, reads an exposed bf16 tensor through a Cast
    to float32 under its own name. (The CPU provider has bf16 Cast kernels:
    the run is real here too.)"""
    import ml_dtypes

    from amp_convert.runner import runnable

    m = model(
        [
            helper.make_node("Cast", ["x"], ["h"], to=onnx.TensorProto.BFLOAT16, name="narrow"),
            helper.make_node("Cast", ["h"], ["y"], to=onnx.TensorProto.FLOAT, name="widen"),
        ],
        [value("x", shape=(3,))],
        [value("y", shape=(3,))],
    )
    # low_elem None: taken as a model with nothing to emulate, so it runs as is.
    ran = runnable(m, None, "cpu", "auto", [("h", onnx.TensorProto.BFLOAT16)])
    assert not ran.emulated
    x = np.array([1.0, 1.00390625, 3.14159], np.float32)
    values = ran.run({"x": x})
    assert set(values) == {"y", "h"} and values["h"].dtype == np.float32
    assert np.array_equal(values["h"], x.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_bf16_inputs_or_outputs_always_run_through_the_emulation():
    """Even where bf16 kernels exist (CUDA), a model with bf16 graph inputs or
    outputs cannot be fed or read from Python: emulated, or refused under never."""
    from amp_convert.emulate import decide_emulation
    from amp_convert.errors import AmpError

    bf16, fp16 = onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT16
    assert decide_emulation("auto", "cuda", bf16, {})[0] is False
    for role in ("candidate", "reference"):
        emulated, note = decide_emulation("auto", "cuda", bf16, {"logits": bf16}, role)
        assert emulated and f"the {role} has bfloat16 inputs or outputs" in note
        with pytest.raises(AmpError, match=f"the {role} has bfloat16"):
            decide_emulation("never", "cuda", bf16, {"logits": bf16}, role)
    assert decide_emulation("never", "cuda", fp16, {"logits": fp16}) == (False, "requested (`emulate` never)")


def test_generated_inputs_follow_ranges_and_seed():
    reference = onnx.load(ZOO["bert"]["path"])
    shapes = ["input_ids=2x12", "attention_mask=2x12", "token_type_ids=2x12"]

    def samples(seed: int) -> list[dict[str, np.ndarray]]:
        ranges = ["input_ids=5:1000", "attention_mask=1:2"]
        return list(make_source(reference, shapes=shapes, ranges=ranges, samples=3, seed=seed))

    first, again, other = samples(0), samples(0), samples(1)
    assert len(first) == 3
    for feeds in first:
        ids = feeds["input_ids"]
        assert ids.dtype == np.int64 and ids.shape == (2, 12) and ids.min() >= 5 and ids.max() < 1000
        assert (feeds["attention_mask"] == 1).all()
        assert set(np.unique(feeds["token_type_ids"])) <= {0, 1}  # integers default to [0, 2)
    for a, b in zip(first, again, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(first[0]["input_ids"], other[0]["input_ids"])


@pytest.mark.parametrize("name", ["vit", "detector"])
def test_validation_reuses_the_calibration_session_and_gets_the_same_result(name):
    """The CLI calibrates on the validation samples first; validation then
    reads the reference from that run's session (every float tensor
    exposed) instead of starting another, and from its outputs. The
    detector's pinned choices (int64, not exposed by calibration) need a
    session of their own. Either way the result is the same."""
    from amp_convert.calibrate import calibrate
    from amp_convert.validation import Validator

    reference = onnx.load(ZOO[name]["path"])
    source = manifest_source(ZOO[name], reference)
    low = convert(reference, level="O2").model
    config = ValidationConfig(provider="cpu", per_node=True)
    calibration = calibrate(reference, source, "cpu")
    shared = validate(reference, low, source, config, calibration=calibration).as_dict()
    fresh = validate(reference, low, source, config).as_dict()
    assert {**shared, "seconds": 0} == {**fresh, "seconds": 0}
    validator = Validator(reference, source, config, calibration=calibration)
    float_tensor = (sorted(calibration.exposed)[0], onnx.TensorProto.FLOAT)
    needed = [float_tensor, *validator._extras]  # (the detector's: its pinned choices, int64)
    assert (validator._reference_session(needed) is calibration.session) == (name == "vit")


def test_a_shared_calibration_session_caches_outputs_only_and_outlives_its_release():
    """Calibrated on other samples (--calibration), validation runs the
    reference itself through the calibration's session, which outputs every
    tensor: only the graph outputs are kept between candidates. The session
    is held by the validator: the caller dropping it (as the CLI does after
    validating) does not break a later check."""
    from amp_convert.calibrate import calibrate
    from amp_convert.validation import Validator

    reference = onnx.load(ZOO["vit"]["path"])
    calibration = calibrate(reference, manifest_source(ZOO["vit"], reference, samples=1), "cpu")
    source = manifest_source(ZOO["vit"], reference)
    low = convert(reference, level="O2").model
    validator = Validator(reference, source, ValidationConfig(provider="cpu", per_node=False), calibration=calibration)
    first = validator.check(low)
    assert [sorted(values) for _, values in validator._outputs_cache] == [["logits"], ["logits"]]
    calibration.session = None
    again = validator.check(low, per_node=True)
    assert again.passed == first.passed and again.nodes


def test_equal_outputs_have_a_cosine_of_exactly_one():
    """The quotient of a dot product by two norms rounds to just below 1 on
    many equal vectors: equal outputs pass --min-cosine 1 all the same."""
    values = np.random.default_rng(0).standard_normal(3)  # (its dot product over its squared norm: 0.9999999999999999)
    stats = ErrorStats("y")
    stats.update(values, values.copy())
    assert stats.cosine == 1.0
    assert stats.verdict(Tolerance(atol=0.0, rtol=0.0, min_cosine=1.0, min_equal=1.0)) == []
    close = ErrorStats("y")
    close.update(values, values * (1 + 1e-6))
    assert -1.0 <= close.cosine <= 1.0


def test_an_infinite_snr_is_shown_with_its_sign():
    """JSON holds an infinite SNR as null; shown, a reference of zeros
    against a candidate that is not is -inf, not the +inf of equal outputs."""
    from amp_convert.report_cells import snr

    zeros, tiny = np.zeros(8, np.float32), np.full(8, 1e-4, np.float32)
    apart, equal = ErrorStats("y"), ErrorStats("y")
    apart.update(zeros, tiny)
    equal.update(tiny, tiny.copy())
    assert apart.as_dict()["snr_db"] is None and equal.as_dict()["snr_db"] is None
    assert snr(apart.as_dict()) == "-inf" and snr(equal.as_dict()) == "inf"


def test_an_integer_output_of_another_shape_is_reported_as_exact():
    """NonZero's indices differ in shape: the output is judged on its shape
    and reported as the integer output it is, with no float metrics."""
    stats = ErrorStats("idx")
    stats.update(np.zeros((2, 5), np.int64), np.zeros((2, 3), np.int64))
    d = stats.as_dict(DEFAULT_TOLERANCES["fp16"])
    assert d["kind"] == "exact" and "cosine" not in d and d["passed"] is False and d["shape_mismatch"] == 1


def test_the_note_on_dynamic_dimensions_names_only_those_left_to_defaults():
    """BERT's three inputs share batch and sequence: --input-shape for one
    settles them for all, and no input is said to have dimensions set by
    default; without it they get a batch of 1 and the longest sequence its
    64-row position table takes (128 fails: the note says so)."""
    m = onnx.load(str(Path(__file__).resolve().parent.parent / "models" / "zoo" / "bert.onnx"))
    given = make_source(m, shapes=["input_ids=2x8"])
    assert not [n for n in given.notes if " set to " in n]
    assert {s.shape for s in next(iter(given)).values()} == {(2, 8)}
    bare = make_source(m)
    assert [n for n in bare.notes if " set to " in n] == [
        "dynamic dimensions of input_ids, attention_mask, token_type_ids set to batch=1, sequence=64 (use `input_shape`)"
    ]
    assert [n for n in bare.notes if "sequence=128 fails on the fp32 model" in n]


def test_a_conversion_is_judged_by_the_tolerance_of_the_dtype_it_converts_to(tmp_path):
    """The model already holds a bfloat16 tensor (a Cast round trip to the
    side): its fp16 conversion is judged with fp16's tolerance, not the
    five times looser bf16 one that tensor made validation pick."""
    nodes = [
        helper.make_node("Add", ["x", "c"], ["a"], name="add"),
        helper.make_node("Sub", ["a", "c"], ["y"], name="sub"),
        helper.make_node("Cast", ["x"], ["xb"], name="tobf", to=onnx.TensorProto.BFLOAT16),
        helper.make_node("Cast", ["xb"], ["z"], name="back", to=onnx.TensorProto.FLOAT),
    ]
    m = model(
        nodes, [value("x", shape=(4, 64))], [value("y", shape=(4, 64)), value("z", shape=(4, 64))], [init("c", np.float32(100.0))]
    )
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    proc = cli(str(path), "--level", "O3", "-o", str(tmp_path / "o.onnx"), "--report", str(tmp_path / "r.json"), "-q")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["validation"]["tolerance"] == DEFAULT_TOLERANCES["fp16"].as_dict()
    assert proc.returncode == 1  # (y = (x + 100) - 100 loses about 0.03 in fp16: over fp16's 0.011, within bf16's 0.06)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_low_graph_input_that_is_also_an_output_is_measured_rounded(dtype):
    """Under --io-types low the model reads x in the low dtype and hands it
    back as an output: that output is x rounded. The emulation must round
    it too (no node of the twin makes it), or its error reads 0."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    m = model(
        nodes,
        [value("x", shape=(2, 8))],
        [value("y", shape=(2, 8)), value("x", shape=(2, 8))],
        [init("W", np.eye(8, dtype=np.float32))],
    )
    low = convert(m, level="O2", dtype=dtype, io_types="low").model
    assert [v.type.tensor_type.elem_type for v in low.graph.output][1] != onnx.TensorProto.FLOAT
    source = make_source(m, samples=1)
    [feeds] = list(source)
    x = feeds["x"]
    result = validate(m, low, source, ValidationConfig(provider="cpu", dtype=dtype))
    assert result.emulated
    y_stats, x_stats = result.outputs
    rounded = x.astype(np.float16 if dtype == "fp16" else ml_dtypes.bfloat16).astype(np.float32)
    assert x_stats.max_abs_err == pytest.approx(float(np.abs(rounded - x).max())) and x_stats.max_abs_err > 0
    assert y_stats.max_abs_err >= x_stats.max_abs_err  # (y = x @ I reads the rounded x too)


def test_the_twin_reads_low_sparse_initializers_and_constants_as_float32():
    """A low-precision reference may hold its weights sparse: the twin,
    float32 throughout, must hold them float32 too (onnxruntime refuses a
    float Add of an fp16 sparse weight)."""
    from helpers import run

    def sparse(name: str) -> onnx.SparseTensorProto:
        values = onnx.numpy_helper.from_array(np.array([1.5, 2.25], np.float16), name)
        return helper.make_sparse_tensor(values, onnx.numpy_helper.from_array(np.array([0, 3], np.int64)), [2, 2])

    nodes = [
        helper.make_node("Constant", [], ["c"], name="const", sparse_value=sparse("c")),
        helper.make_node("Add", ["x", "W"], ["h"], name="add"),
        helper.make_node("Add", ["h", "c"], ["y"], name="add2"),
    ]
    f16 = onnx.TensorProto.FLOAT16
    graph = helper.make_graph(
        nodes, "g", [value("x", shape=(2, 2), elem=f16)], [value("y", shape=(2, 2), elem=f16)], sparse_initializer=[sparse("W")]
    )
    low = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = np.ones((2, 2), np.float16)
    twin = emulation_twin(low)
    assert (
        run(twin, {"x": x.astype(np.float32)})[0].tolist()
        == run(low, {"x": x})[0].astype(np.float32).tolist()
        == [[4, 1], [1, 5.5]]
    )


def _loop_gathering_low_rows() -> onnx.ModelProto:
    """A model holding fp16 whose Loop gathers x * 0.5 in fp16 three times
    into a sequence of fp16 tensors (begun by SequenceEmpty(dtype=fp16),
    its state in the body), concatenated and cast back: y is 6x4."""
    f16 = onnx.TensorProto.FLOAT16
    rows = [helper.make_tensor_sequence_value_info(n, f16, None) for n in ("rows_in", "rows_out")]
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["x16", "k16"], ["row"], name="body_mul"),
            helper.make_node("SequenceInsert", ["rows_in", "row"], ["rows_out"], name="insert"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"),
        ],
        "body",
        [value("i", onnx.TensorProto.INT64, shape=()), value("cond_in", onnx.TensorProto.BOOL, shape=()), rows[0]],
        [value("cond_out", onnx.TensorProto.BOOL, shape=()), rows[1]],
    )
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], name="to16", to=f16),
        helper.make_node("SequenceEmpty", [], ["rows0"], name="empty", dtype=f16),
        helper.make_node("Loop", ["trips", "", "rows0"], ["rows"], name="loop", body=body),
        helper.make_node("ConcatFromSequence", ["rows"], ["cat16"], name="cat", axis=0),
        helper.make_node("Cast", ["cat16"], ["y"], name="to32", to=onnx.TensorProto.FLOAT),
    ]
    inits = [init("trips", np.array(3, np.int64)), init("k16", np.array(0.5, np.float16))]
    return model(nodes, [value("x", shape=(2, 4))], [value("y", shape=(6, 4))], inits)


def _if_giving_a_low_optional() -> onnx.ModelProto:
    """A model holding fp16 whose If gives an optional fp16 tensor: none
    (Optional's type attribute says fp16) or x in fp16; y is x through fp16."""
    f16 = onnx.TensorProto.FLOAT16
    optional = helper.make_optional_type_proto(helper.make_tensor_type_proto(f16, None))
    none = helper.make_node("Optional", [], ["none"], name="none", type=helper.make_tensor_type_proto(f16, None))
    then_g = helper.make_graph([none], "then", [], [helper.make_value_info("none", optional)])
    some = helper.make_node("Optional", ["x16"], ["some"], name="some")
    else_g = helper.make_graph([some], "else", [], [helper.make_value_info("some", optional)])
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], name="to16", to=f16),
        helper.make_node("If", ["skip"], ["maybe"], name="if", then_branch=then_g, else_branch=else_g),
        helper.make_node("OptionalHasElement", ["maybe"], ["has"], name="has"),
        helper.make_node("Cast", ["x16"], ["y"], name="to32", to=onnx.TensorProto.FLOAT),
    ]
    inputs = [value("x", shape=(2, 4)), value("skip", onnx.TensorProto.BOOL, shape=())]
    return model(nodes, inputs, [value("y", shape=(2, 4)), value("has", onnx.TensorProto.BOOL, shape=())], opset=18)


@pytest.mark.parametrize("build", [_loop_gathering_low_rows, _if_giving_a_low_optional], ids=["sequence", "optional"])
def test_the_twin_holds_sequences_and_optionals_of_low_tensors_as_float32(build, tmp_path):
    """The twin's values are float32 whatever holds them. A sequence or an
    optional of fp16 tensors left declared fp16 (a Loop's state, an If's
    outputs, SequenceEmpty's dtype, Optional's type) refused the twin
    ("Sequence=10 Tensor=1"): converting such a model, whose twin validation
    runs on the CPU, failed with "the input model cannot be loaded by
    onnxruntime" (exit 2) though onnxruntime runs it."""
    from helpers import run

    m = build()
    feeds = {"x": np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4), "skip": np.array(False)}
    feeds = {v.name: feeds[v.name] for v in m.graph.input}
    twin = emulation_twin(m)
    assert [a.tolist() for a in run(twin, feeds)] == [a.tolist() for a in run(m, feeds)]
    path = tmp_path / "low.onnx"
    onnx.save(m, str(path))
    proc = cli(str(path), "--level", "O2", "-o", str(tmp_path / "o.onnx"), "-q")
    assert proc.returncode == 0, proc.stderr


def _boxes_and_scores() -> onnx.ModelProto:
    """A detector head's way: box coordinates (x * 320) beside scores
    ((x + 1000) - 1000, which fp16 rounds to steps of 0.5) in one output."""
    ints = [init(n, np.array(v, np.int64)) for n, v in (("s0", [0]), ("e4", [4]), ("s4", [4]), ("e8", [8]), ("ax", [1]))]
    nodes = [
        helper.make_node("Slice", ["x", "s0", "e4", "ax"], ["xb"], name="boxes_in"),
        helper.make_node("Slice", ["x", "s4", "e8", "ax"], ["xs"], name="scores_in"),
        helper.make_node("Mul", ["xb", "k320"], ["boxes"], name="boxes"),
        helper.make_node("Add", ["xs", "k1000"], ["shifted"], name="shift"),
        helper.make_node("Sub", ["shifted", "k1000"], ["scores"], name="unshift"),
        helper.make_node("Concat", ["boxes", "scores"], ["y"], axis=1, name="head"),
    ]
    constants = [init("k320", np.float32(320)), init("k1000", np.float32(1000))]
    return model(nodes, [value("x", shape=(4, 8))], [value("y", shape=(4, 8))], [*ints, *constants])


def test_an_output_mixing_scales_passes_with_a_warning_naming_the_part_that_is_off(tmp_path):
    """The tolerance is at the scale of the output's largest values (the
    boxes): scores off by a quarter of their range pass it, and the report
    says where and by how much of their own range; a tighter --rtol fails
    them. The same model without the rounding scores has no warning."""
    m = _boxes_and_scores()
    out = convert(m, level="O3").model
    result = validate(m, out, make_source(m, samples=2), ValidationConfig())
    [metrics] = result.outputs
    assert result.passed
    [warning] = metrics.warnings(result.tolerance)
    assert warning.kind == "mixed_scales"
    assert warning.text.startswith("along axis 1, 4 of its 8 indices (4-7) reach at most 0.")
    share = float(warning.text.split("% of their own range")[0].rsplit(" ", 1)[1])
    assert 10 < share <= 50  # (fp16 steps of 0.5 near 1000: up to 0.25 off values below 1)
    d = metrics.as_dict(result.tolerance)
    assert d["warnings"] == [warning.text] and d["warning_kinds"] == ["mixed_scales"]
    strict = validate(m, out, make_source(m, samples=2), ValidationConfig(tolerance=Tolerance(1e-3, 1e-4, 0.999)))
    assert not strict.passed
    exact = convert(m, level="O3", keep_fp32=["shift", "unshift"]).model
    assert validate(m, exact, make_source(m, samples=2), ValidationConfig()).outputs[0].warnings(result.tolerance) == []
    path = tmp_path / "head.onnx"
    onnx.save(m, str(path))
    report, page = tmp_path / "r.json", tmp_path / "r.html"
    proc = cli(str(path), "--level", "O3", "-o", str(tmp_path / "o.onnx"), "--html", str(page), "--report", str(report))
    assert proc.returncode == 0, proc.stderr
    assert any(line.split() == ["mixed", "scales", "part", "off", "see", "below", "WARN"] for line in proc.stdout.splitlines())
    assert "all zeros" not in proc.stdout
    assert "warning: y: along axis 1, 4 of its 8 indices (4-7)" in proc.stdout
    assert "id='warnings'" in page.read_text() and "<li data-kind='mixed_scales'>y: along axis 1" in page.read_text()
    data = json.loads(report.read_text())
    jsonschema.validate(data, report_schema())
    [out] = data["validation"]["outputs"]
    assert out["warning_kinds"] == ["mixed_scales"] and out["warnings"][0].startswith("along axis 1")
    out["warnings"] = ["every value became 0 along axis 1, in words that once meant all zeros"]  # (the kind decides)
    table = terminal_table(data)
    assert re.search(r"mixed scales +part off", table) and "all zeros" not in table.split("warning:")[0]


@pytest.mark.parametrize("name", ["resnet50", "bert", "detector", "vit"])
def test_zoo_models_at_o2_have_no_mixed_scale_warning(name):
    """No false alarm where no part of an output is small next to the rest
    and off by much of its own range."""
    reference = onnx.load(ZOO[name]["path"])
    converted = convert(reference, level="O2")
    result = validate(reference, converted.model, manifest_source(ZOO[name], reference), ValidationConfig(per_node=False))
    assert result.passed
    assert [w for o in result.outputs for w in o.warnings(result.tolerance)] == []


def test_per_axis_maxima_are_kept_only_while_samples_share_a_shape():
    stats = ErrorStats("y")
    ref = np.tile(np.float32([[300.0, 0.5], [200.0, 0.4]]), (4, 1))  # (8 values per index along axis 1)
    stats.update(ref, ref + np.float32([0.1, 0.3]))
    assert stats.warnings(DEFAULT_TOLERANCES["fp16"]) != []
    stats.update(np.ones((3, 2), np.float32), np.ones((3, 2), np.float32))  # (another shape: nothing per axis is kept)
    assert stats.warnings(DEFAULT_TOLERANCES["fp16"]) == []


def test_a_part_of_one_index_is_named_in_the_singular():
    stats = ErrorStats("y")
    ref = np.tile(np.float32([[300.0, 0.5], [200.0, 0.4]]), (4, 1))
    stats.update(ref, ref + np.float32([0.1, 0.3]))
    [warning] = stats.warnings(DEFAULT_TOLERANCES["fp16"])
    assert warning.kind == "mixed_scales"
    assert warning.text.startswith(
        "along axis 1, index 1 reaches at most 0.5 in fp32 (the output 300, the scale it is judged at)"
    )
    assert warning.text.endswith(
        "and is off by up to 0.3, 60% of its own range: give a lower `rtol` to judge it at its own scale, "
        "or validate it as an output of its own"
    )


def _decoder_step(lm_head: np.ndarray) -> onnx.ModelProto:
    """A decoder's step with past key/values reduced to its head: one
    token's hidden state [1, 1, 32] into logits over 64 tokens."""
    nodes = [helper.make_node("MatMul", ["h", "E"], ["logits"], name="lm_head")]
    return model(nodes, [value("h", shape=(1, 1, 32))], [value("logits", shape=(1, 1, 64))], [init("E", lm_head)])


def test_a_logit_near_zero_in_the_samples_is_no_part_of_another_scale():
    """A decoder step's logits hold one value per token in each sample: a
    token's largest value over two samples is no scale, and one whose
    logits lie near 0 in both (its embedding about orthogonal to the two
    hidden states) is off by the head's ordinary bf16 error, far more than
    a tenth of those values. That is no part of the output at another
    scale: no warning. Over 8 samples its logits reach the others' scale."""
    rng = np.random.default_rng(0)
    lm_head = (4 * rng.standard_normal((32, 64))).astype(np.float32)
    hidden = np.stack([s["h"].reshape(32) for s in make_source(_decoder_step(lm_head), samples=2)], axis=1)
    basis, _ = np.linalg.qr(hidden.astype(np.float64))
    lm_head[:, 7] -= (basis @ (basis.T @ lm_head[:, 7])).astype(np.float32)
    m = _decoder_step(lm_head)
    out = convert(m, level="O2", dtype="bf16").model
    result = validate(m, out, make_source(m, samples=2), ValidationConfig(per_node=False))
    [metrics] = result.outputs
    assert result.passed
    scales, errors = metrics.axis_scales.kept[2]
    assert scales[7] < 1e-4 < 0.01 < errors[7]  # (token 7: about 0 in fp32, off by the head's rounding)
    assert metrics.warnings(result.tolerance) == []
    more = validate(m, out, make_source(m, samples=8), ValidationConfig(per_node=False))
    assert more.passed and more.outputs[0].axis_scales.kept[2][0][7] > 0.1 * more.outputs[0].max_abs_ref
    assert more.outputs[0].warnings(more.tolerance) == []


def _low_gain_over_fp32_scale() -> onnx.ModelProto:
    """An RMSNorm's tail as exported: a gain on x (low at O1, behind a
    MatMul) times 1 / s (fp32: s comes from an Exp), which O1 multiplies in
    fp32 through a Cast of the gained x."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
        helper.make_node("Mul", ["h", "g"], ["hg"], name="gain"),
        helper.make_node("Exp", ["x"], ["e"], name="exp"),
        helper.make_node("Div", ["one", "e"], ["inv"], name="inv"),
        helper.make_node("Mul", ["hg", "inv"], ["y"], name="scale"),
    ]
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    constants = [init("W", w), init("g", np.float32(0.5)), init("one", np.float32(1.0))]
    return model(nodes, [value("x", shape=(2, 4))], [value("y", shape=(2, 4))], constants)


def test_the_twin_of_a_cast_into_a_mul_by_a_reciprocal_loads(tmp_path):
    """In the twin the Cast of the low hg to fp32 reads a float32 tensor:
    onnxruntime's CastElimination removed it while DivMulFusion turned
    hg_fp32 * (1 / e) into a Div reading hg_fp32, and the session refused
    the twin ("Node input 'hg_fp32' is not a graph input ..."): validation
    without the per-node diff (every trial of --level auto) failed, exit 2,
    on a model that converts fine. The twin runs without that elimination."""
    m = _low_gain_over_fp32_scale()
    out = convert(m, level="O1").model
    assert [n.input[0] for n in out.graph.node if n.op_type == "Cast"] == ["x", "hg"]
    result = validate(m, out, make_source(m, samples=2), ValidationConfig(per_node=False))
    assert result.passed and result.emulated
    path = tmp_path / "rms.onnx"
    onnx.save(m, str(path))
    proc = cli(str(path), "--level", "auto", "--auto-from", "O1", "-o", str(tmp_path / "o.onnx"))
    assert proc.returncode == 0, proc.stderr


def _refused_as_written() -> onnx.ModelProto:
    """An fp32 model onnxruntime 1.31 refuses as written: CastElimination
    drops the Cast of hc to float32 (a float32 tensor) while DivMulFusion
    turns hc * (1 / e) into a Div reading it ("Node input 'hc' is not a
    graph input ...")."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
        helper.make_node("Cast", ["h"], ["hc"], name="cast", to=onnx.TensorProto.FLOAT),
        helper.make_node("Exp", ["x"], ["e"], name="exp"),
        helper.make_node("Div", ["one", "e"], ["inv"], name="inv"),
        helper.make_node("Mul", ["hc", "inv"], ["y"], name="scale"),
    ]
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    return model(nodes, [value("x", shape=(2, 4))], [value("y", shape=(2, 4))], [init("W", w), init("one", np.float32(1.0))])


def test_an_fp32_model_onnxruntime_refuses_as_written_runs_without_its_failing_optimization_not_a_twin(monkeypatch):
    """Under --emulate auto a model onnxruntime refused fell back to its
    emulation twin, also one with no fp16/bf16 tensors (whose twin rounds
    nothing), and validation then called the fp32 reference "low precision
    too: emulated (the real fp16 run failed ...)". Such a model runs as
    written, without the optimization onnxruntime fails on (as twins run),
    not emulated, and no twin of it is built."""
    m = _refused_as_written()
    with pytest.raises(LoadFailure, match="Node input 'hc' is not a graph input"):
        runner.session(m, "cpu")  # (as written, with every optimization: refused)
    twins = []
    monkeypatch.setattr(runner, "emulation_twin", lambda *args: twins.append(args[0]) or emulation_twin(*args))
    ran = runnable(m, None, "cpu", "auto", (), None, "reference")
    assert not ran.emulated and twins == [] and "run without CastElimination" in ran.note
    candidate = convert(m, level="O3").model  # (low: validated through its twin)
    result = validate(m, candidate, make_source(m), ValidationConfig(provider="cpu", per_node=False))
    assert result.passed and not result.reference_emulated and all(twin is not m for twin in twins) and twins


def test_an_fp32_model_onnxruntime_cannot_load_at_all_is_its_own_failure_without_a_twin(monkeypatch):
    """Where the model is refused without those optimizations too (an IR
    version newer than onnxruntime reads), the refusal as written is the
    model's failure: no twin is built for it."""
    m = _refused_as_written()
    m.ir_version = 99
    twins = []
    monkeypatch.setattr(runner, "emulation_twin", lambda *args: twins.append(args[0]) or emulation_twin(*args))
    with pytest.raises(LoadFailure, match="IR version") as failure:
        runnable(m, None, "cpu", "auto", (), None, "reference")
    assert type(failure.value) is LoadFailure and failure.value.role == "reference" and twins == []


def test_a_constant_ranks_by_the_error_it_brings_to_its_readers_not_its_own(tmp_path):
    """An RMSNorm's epsilon (1e-6) and a tiny added constant (-2.65e-6) round
    by over 1% of their own values in fp16, far more than any MatMul adds;
    added to values of order 1 that rounding does not reach the outputs, so
    they do not rank as offenders. A scale the data is multiplied by does."""
    rng = np.random.default_rng(0)
    k = 64

    def const(name: str, v) -> onnx.NodeProto:
        return helper.make_node(
            "Constant", [], [name], name=f"{name}_c", value=onnx.numpy_helper.from_array(np.array(v, np.float32))
        )

    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("Mul", ["h", "h"], ["sq"], name="sq"),
        helper.make_node("ReduceMean", ["sq"], ["ms"], name="mean", axes=[-1]),
        const("eps", 1e-6),
        helper.make_node("Add", ["ms", "eps"], ["mse"], name="add_eps"),
        helper.make_node("Sqrt", ["mse"], ["rms"], name="sqrt"),
        helper.make_node("Div", ["h", "rms"], ["n"], name="norm"),
        const("tiny", [-2.65e-6]),
        helper.make_node("Add", ["n", "tiny"], ["nt"], name="add_tiny"),
        const("scale", 0.1234567),
        helper.make_node("Mul", ["nt", "scale"], ["ns"], name="scale_mul"),
        helper.make_node("MatMul", ["ns", "W2"], ["y"], name="mm2"),
    ]
    inits = [init("W1", rng.normal(0, 0.2, (k, k)).astype(np.float32)), init("W2", rng.normal(0, 0.2, (k, k)).astype(np.float32))]
    m = model(nodes, [value("x", shape=(4, k))], [value("y", shape=(4, k))], inits, opset=17)
    path, report = tmp_path / "rms.onnx", tmp_path / "r.json"
    onnx.save(m, str(path))
    proc = cli(str(path), "--level", "O3", "-o", str(tmp_path / "o.onnx"), "--report", str(report), "--write-on-fail")
    assert proc.returncode in (0, 1), proc.stderr
    v = json.loads(report.read_text())["validation"]
    nodes_by_name = {n["name"]: n for n in v["nodes"]}
    matmul = max(nodes_by_name[n]["error_added"] for n in ("mm1", "mm2"))
    for name in ("eps_c", "tiny_c"):
        own = nodes_by_name[name]
        assert own["error_after"] > 10 * matmul  # (its own rounding is large ...)
        assert own["error_added"] < matmul / 10  # (... what reaches its reader is not)
    offenders = [o["name"] for o in v["offenders"]]
    assert "eps_c" not in offenders[:3] and "tiny_c" not in offenders[:3]
    assert nodes_by_name["scale_c"]["error_added"] == nodes_by_name["scale_c"]["error_after"]  # (multiplied by: as it is)


def test_a_failing_output_says_how_many_values_are_over_the_limit_and_its_top1_agreement():
    """Two values far off among 40,000 read differently from all of them."""
    from amp_convert.metrics import ErrorStats
    from amp_convert.tolerance import DEFAULT_TOLERANCES

    tol = DEFAULT_TOLERANCES["fp16"]
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 1, (200, 200)).astype(np.float32)
    few, many = ErrorStats("few"), ErrorStats("many")
    near = ref + np.float32(1e-4)
    far = near.copy()
    far[3, 5] += 1.0
    far[7, 9] -= 1.0
    few.update(ref, far)
    many.update(ref, ref + np.float32(1.0))
    [reason] = few.verdict(tol)
    assert "(2 of 40,000 values over it; top-1 agreement" in reason
    assert few.as_dict(tol)["values_over_limit"] == 2 and many.as_dict(tol)["values_over_limit"] == 40_000
    assert few.top1_agreement >= 0.99 and many.top1_agreement == 1.0  # (a shift keeps every argmax)


def _near_tie_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Logits whose first two classes differ by 1e-5; the candidate adds 2e-5 to class 0: well within
    atol, yet nearly every row changes its argmax."""
    rng = np.random.default_rng(1)
    w = rng.normal(0, 1, (8, 4)).astype(np.float32)
    w[:, 1] = w[:, 0]
    bias = np.array([0, 1e-5, -5, -5], np.float32)
    paths = []
    for name, shift in (("ref", 0.0), ("cand", 2e-5)):
        nodes = [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
            helper.make_node("Add", ["h", "B"], ["y"], name="add"),
        ]
        b = bias + np.array([shift, 0, 0, 0], np.float32)
        m = model(nodes, [value("x", shape=(64, 8))], [value("y", shape=(64, 4))], [init("W", w), init("B", b)])
        path = tmp_path / f"{name}.onnx"
        onnx.save(m, str(path))
        paths.append(path)
    return paths[0], paths[1]


def test_top1_agreement_is_reported_and_gated_by_min_top1(tmp_path):
    ref, cand = _near_tie_pair(tmp_path)
    report = tmp_path / "r.json"
    proc = cli("compare", str(ref), str(cand), "--report", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr  # (reported, not judged, by default)
    [out] = json.loads(report.read_text())["validation"]["outputs"]
    assert out["top1_rows"] == 128 and out["top1_agreement"] < 0.5 and "top1" not in out["checks"]
    assert "top-1 agreement" in proc.stdout
    proc = cli("compare", str(ref), str(cand), "--min-top1", "0.99", "--report", str(report))
    assert proc.returncode == 1
    [out] = json.loads(report.read_text())["validation"]["outputs"]
    assert out["checks"]["top1"] is False and out["checks"]["max_abs_err"] is True
    assert any(f.startswith("top-1 agreement") for f in out["failures"])
    assert json.loads(report.read_text())["validation"]["tolerance"]["min_top1"] == 0.99


def test_an_output_can_have_a_tolerance_of_its_own_on_the_command_line_and_in_a_config(tmp_path):
    ref, cand = _near_tie_pair(tmp_path)
    report = tmp_path / "r.json"
    proc = cli("compare", str(ref), str(cand), "--tolerance", "y:min_top1=0.99,atol=0.5", "--report", str(report))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads(report.read_text())["validation"]
    [out] = data["outputs"]
    assert out["tolerance"]["min_top1"] == 0.99 and out["tolerance"]["atol"] == 0.5 and out["checks"]["top1"] is False
    assert data["tolerance"]["min_top1"] is None  # (the run's own tolerance is unchanged)
    assert out["tolerance"]["rtol"] == data["tolerance"]["rtol"]  # (fields left out keep the run's)
    config = tmp_path / "amp.toml"
    config.write_text('tolerance = ["y:min_top1=0.01"]\n')
    model_path = tmp_path / "m.onnx"
    shutil.copy(ref, model_path)
    proc = cli(str(model_path), "--config", str(config), "-o", str(tmp_path / "o.onnx"), "--report", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(report.read_text())["validation"]["outputs"][0]["tolerance"]["min_top1"] == 0.01
    for bad, says in (("nope:atol=1", "not an output of the model"), ("y:speed=1", "is not one of"), ("y:atol=-1", "finite")):
        proc = cli("compare", str(ref), str(cand), "--tolerance", bad)
        assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
