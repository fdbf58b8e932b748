"""scripts/gpu_check.py's CPU path, run as the device check runs it (a subprocess), on two small zoo
models with few iterations; and its full-size model builders, at reduced sizes, in onnxruntime."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from amp_convert import kernels

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"
MODELS = ("vit", "lstm")
ITERATIONS = 2


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict, Path]:
    out = tmp_path_factory.mktemp("gpu_check")
    cmd = [sys.executable, str(SCRIPT), "--cpu", "--only", ",".join(MODELS), "--iterations", str(ITERATIONS), "--warmup", "1"]
    done = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=600, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads((out / "gpu_check.json").read_text()), out


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_says_cpu_path_first_and_writes_what_it_printed(run):
    done, doc, _ = run
    lines = done.stdout.splitlines()
    assert "CPU path" in lines[0]
    assert doc["meta"]["device"] == "cpu"
    assert doc["printed"] == lines
    assert any("providers:" in line and "CPUExecutionProvider" in line for line in lines[:3])
    for section in ("registry", "fidelity", "latency"):
        assert "error" not in doc[section] and not doc[section].get("skipped"), doc[section]


def test_registry_dump_loads_as_a_kernel_table(run):
    _, doc, out = run
    registry = doc["registry"]
    assert registry["wanted"] == [kernels.CPU]
    assert registry["attempts"] and all(a["result"] for a in registry["attempts"])
    if kernels.CPU not in registry["available"]:
        pytest.skip(f"no interpreter here reads the CPU registry: {registry['attempts']}")
    dump = json.loads((out / "ort_kernels_live.json").read_text())
    assert set(dump["providers"]) == {kernels.CPU}
    table = kernels._table(kernels.CPU, "live", dump["onnxruntime_release"], dump["providers"][kernels.CPU])
    assert ("ai.onnx", "MatMul") in table.ops()
    assert table.low_kernel("", "MatMul", 17, TensorProto.FLOAT) is True
    assert table.low_kernel("", "MatMul", 17, TensorProto.FLOAT16) is not None  # a kernel serves MatMul at opset 17
    summary = registry["providers"][kernels.CPU]
    assert summary["ops"] == len(table.ops())
    # the diff it printed is the snapshot's against this very dump
    expected = kernels.diff_tables(kernels.snapshot_table("cpu"), table)
    assert [line.split(":")[0] for line in summary["diff"]] == [line.split(":")[0] for line in expected]
    assert summary["diff_count"] == len(expected)


def _finite_metrics(m: dict) -> None:
    assert m["kind"] == "float" and not m["shape_mismatch"]
    assert m["max_abs_err"] is not None and 0 <= m["max_abs_err"] < 1
    assert m["max_rel_err"] is not None and 0 <= m["max_rel_err"] < 1
    assert m["cosine"] is not None and 0.99 < m["cosine"] <= 1 + 1e-9


def test_fidelity_rows_for_every_level(run):
    _, doc, _ = run
    rows = doc["fidelity"]["rows"]
    assert {r["dtype"] for r in rows} == {"fp16"}  # (CPU path: no bf16 run)
    for model in MODELS:
        for level in ("O1", "O2", "O3"):
            found = [r for r in rows if r["model"] == model and r["level"] == level]
            assert found, (model, level)
            for r in found:
                assert "error" not in r and "device_error" not in r and "emulation_error" not in r, r
                _finite_metrics(r["device"])
                _finite_metrics(r["emulation"])
                ratio = r["ratio"]["max_abs_err"]
                assert ratio is not None and math.isclose(ratio, r["emulation"]["max_abs_err"] / r["device"]["max_abs_err"])


def test_latency_rows_have_positive_medians(run):
    _, doc, _ = run
    latency = doc["latency"]
    assert latency["models"] == "zoo" and latency["notes"]
    rows = latency["rows"]
    for model in MODELS:
        by_variant = {r["variant"]: r for r in rows if r["model"] == model}
        for variant in ("fp32", "amp-convert O1 fp16", "amp-convert O2 fp16", "amp-convert O3 fp16", "onnxruntime float16"):
            r = by_variant[variant]
            assert "error" not in r, r
            assert r["runs"] == ITERATIONS and 0 < r["min_ms"] <= r["median_ms"]
        assert by_variant["fp32"]["vs_fp32"] == 1.0
        assert 0.99 < by_variant["amp-convert O2 fp16"]["cosine_vs_fp32"] <= 1 + 1e-9
        occ = by_variant["onnxconverter-common fp16"]  # timed, or skipped with its reason
        assert ("median_ms" in occ and occ["median_ms"] > 0) or occ["error"].startswith("skipped")


def test_bert_builder_masks_padding(script):
    model = script.build_bert_base(layers=2, hidden=32, heads=4, ffn=64, vocab=50)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = script._bert_feeds(2, 16)
    feeds["input_ids"] %= 50
    hidden, pooled = sess.run(None, feeds)
    assert hidden.shape == (2, 16, 32) and pooled.shape == (2, 32)
    # the masked (padded) tokens do not reach the others
    changed = dict(feeds, input_ids=np.where(feeds["attention_mask"] == 0, 7, feeds["input_ids"]))
    hidden2, pooled2 = sess.run(None, changed)
    kept = feeds["attention_mask"] == 1
    assert not np.array_equal(hidden[~kept], hidden2[~kept])
    np.testing.assert_allclose(hidden[kept], hidden2[kept], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pooled, pooled2, rtol=1e-5, atol=1e-5)


def test_resnet50_builder_is_resnet50(script):
    model = script.build_resnet50()
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    assert 25_000_000 < params < 26_000_000  # ResNet-50's 25.6M
    assert sum(n.op_type == "Conv" for n in model.graph.node) == 53
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (logits,) = sess.run(None, {"input": np.random.default_rng(0).standard_normal((2, 3, 224, 224), dtype=np.float32)})
    assert logits.shape == (2, 1000) and np.isfinite(logits).all() and logits.std() > 0
