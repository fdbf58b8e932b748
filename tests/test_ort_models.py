"""The graphs people deploy on onnxruntime: BERT, GPT-2 with past key/values
and a Llama-like decoder, exported with torch and fused by onnxruntime's
transformer optimizer (models/zoo/ort, built by `make zoo-ort`), and
hand-built GroupQueryAttention, MultiHeadAttention, RotaryEmbedding and
MatMulNBits graphs (models/fused_graphs.py). Each is converted as a user
would, through the command, and compared with onnxruntime's own fp16
converter on the same graph."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnxruntime.transformers.onnx_model import OnnxModel

from amp_convert import Precision, convert
from amp_convert.check import check_converted
from amp_convert.kernels import kernel_table
from amp_convert.lists import ORT_QUANTIZED_OPS
from amp_convert.load import check_input_model
from amp_convert.op_profiles import ORT_FUSED
from amp_convert.schema import op_key
from models.fused_graphs import GRAPHS
from models.zoo_inputs import load_manifest, make_inputs

ORT_ZOO = Path(__file__).resolve().parents[1] / "models" / "zoo" / "ort"
MODELS = {e["name"]: e for e in load_manifest(str(ORT_ZOO / "manifest.json"))}
FUSED = frozenset(ORT_FUSED)
# The GEMM family whose weights a conversion should store low.
GEMMS = frozenset({"MatMul", "Gemm", *(k.split("::")[1] for k, v in ORT_FUSED.items() if v[0] == "white")})


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("amp-convert")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)


def _casts(model: onnx.ModelProto) -> int:
    return sum(n.op_type == "Cast" for n in model.graph.node)


def _peer(path: Path) -> onnx.ModelProto:
    """onnxruntime's own fp16 conversion of an optimized graph."""
    peer = OnnxModel(onnx.load(str(path)))
    peer.convert_float_to_float16(keep_io_types=True)
    return peer.model


def _low_weight_share(model: onnx.ModelProto) -> float:
    """Of the elements of the float weights the GEMM family reads, the share stored fp16."""
    tensors = {t.name: t for t in model.graph.initializer}
    low = total = 0
    for node in model.graph.node:
        if node.op_type not in GEMMS:
            continue
        for name in node.input[1:]:
            t = tensors.get(name)
            if t is None or t.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16):
                continue
            size = int(np.prod(t.dims))
            total += size
            low += size if t.data_type == TensorProto.FLOAT16 else 0
    return low / total


def _run(model: onnx.ModelProto | str, feeds: dict) -> list[np.ndarray]:
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture(scope="module")
def o2(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, dict, onnx.ModelProto]]:
    """Each optimized model through `amp-convert X --level O2` (validated, as by default): the
    command's output, its JSON report (the plan JSON under "planned") and the model written."""
    folder = tmp_path_factory.mktemp("ort_o2")
    done = {}
    for name, entry in MODELS.items():
        out, plan, report = folder / f"{name}.onnx", folder / f"{name}.plan.json", folder / f"{name}.json"
        proc = _cli(entry["path"], "--level", "O2", "-o", str(out), "--plan-json", str(plan), "--report", str(report))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        done[name] = (proc, {**json.loads(report.read_text()), "planned": json.loads(plan.read_text())}, onnx.load(str(out)))
    return done


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_fused_op_and_gemm_runs_low_at_o2(name, o2):
    _, report, model = o2[name]
    nodes = report["planned"]["nodes"]
    fused = [n for n in nodes if op_key(n["op_type"], n["domain"]) in FUSED]
    assert {n["op_type"] for n in fused} >= {k.split("::")[-1] for k in MODELS[name]["fused_ops"]}
    assert all(n["precision"] == "low" for n in fused), [(n["name"], n["reason"]) for n in fused if n["precision"] != "low"]
    assert all(n["precision"] == "low" for n in nodes if n["op_type"] == "MatMul")
    assert _low_weight_share(model) >= 0.95
    assert report["plan"]["coverage"]["low_share"] >= 0.95 and report["plan"]["coverage"]["warning"] is None


@pytest.mark.parametrize("name", sorted(MODELS))
def test_casts_stay_within_onnxruntimes_converter(name, o2):
    _, _, model = o2[name]
    peer = _casts(_peer(Path(MODELS[name]["path"])))
    # The Llama-like graph builds its causal mask from float32's lowest value (-3.4e38): the safety rule
    # keeps that arithmetic fp32, so one Cast takes the mask into the low graph, where onnxruntime's
    # converter clips the constant instead (see the README).
    allowed = peer * 1.1 + (1 if name == "llama" else 0)
    assert _casts(model) <= allowed


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_converted_model_is_checked_loads_runs_and_passes(name, o2):
    proc, report, model = o2[name]
    assert "PASS" in proc.stdout and report["validation"]["passed"]
    check_converted(model, "full")
    entry = MODELS[name]
    feeds = make_inputs(entry, seed=1)
    reference, converted = _run(entry["path"], feeds), _run(model, feeds)
    for ref, got in zip(reference, converted, strict=True):
        assert got.dtype == ref.dtype and np.isfinite(got).all()
        assert np.abs(got - ref).max() <= 0.05 * max(1.0, float(np.abs(ref).max()))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_at_o1_the_attention_and_gemm_family_runs_low(name):
    plan = convert(MODELS[name]["path"], level="O1").plan
    gemms = [e for e in plan if e.op_type in GEMMS]
    assert gemms and all(e.precision is Precision.LOW for e in gemms), [(e.name, e.reason) for e in gemms]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_low_node_of_a_bf16_conversion_has_a_cuda_bf16_kernel(name, tmp_path):
    out = tmp_path / "bf16.onnx"
    proc = _cli(MODELS[name]["path"], "--level", "O2", "--dtype", "bf16", "-o", str(out), "--plan-json", str(tmp_path / "p.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    model, plan = onnx.load(str(out)), json.loads((tmp_path / "p.json").read_text())
    opsets = {o.domain or "": o.version for o in model.opset_import}
    cuda = kernel_table("cuda")
    for n in plan["nodes"]:
        if n["precision"] == "low" and n["op_type"] not in ("Constant", "Cast"):
            found = cuda.low_kernel(n["domain"], n["op_type"], opsets.get(n["domain"], 1), TensorProto.BFLOAT16)
            assert found is not False, n  # (None: no CUDA kernel at all, so the CPU provider's question)
    embed = [n for n in plan["nodes"] if n["op_type"] == "EmbedLayerNormalization"]
    assert all(n["precision"] == "fp32" and "bfloat16" in n["reason"] for n in embed)
    check_converted(model, "full")


def test_a_model_using_com_microsoft_without_importing_it_converts_as_onnxruntime_loads_it(tmp_path, o2):
    """The optimizer writes the Llama-like graph's RotaryEmbedding without a com.microsoft opset import:
    onnxruntime loads it, onnx's checker alone refuses it."""
    path = MODELS["llama"]["path"]
    given = onnx.load(path)
    assert "com.microsoft" not in {o.domain for o in given.opset_import}
    with pytest.raises(onnx.checker.ValidationError, match="No opset import for domain"):
        onnx.checker.check_model(given)
    check_input_model(path, path)  # (accepted)
    _, report, model = o2["llama"]
    assert ("com.microsoft", 1) in {(o.domain, o.version) for o in model.opset_import}
    assert any(n.startswith("opset import com.microsoft 1 added") for n in report["plan"]["notes"])
    assert onnx.load(path) == given  # (the input is left as it was)


@pytest.mark.parametrize("name", ["gqa", "mha", "rotary"])
def test_hand_built_fused_graphs_run_low_and_close_to_fp32(name):
    build, feeds = GRAPHS[name]
    model = build()
    result = convert(model, level="O2")
    fused = [e for e in result.plan if e.domain == "com.microsoft"]
    assert fused and all(e.precision is Precision.LOW for e in fused), [(e.name, e.reason) for e in fused]
    check_converted(result.model, "full")
    reference, got = _run(model, feeds()), _run(result.model, feeds())
    for ref, out in zip(reference, got, strict=True):
        assert np.abs(out.astype(np.float32) - ref).max() <= 0.05 * max(1.0, float(np.abs(ref).max()))


def test_matmul_nbits_is_left_untouched():
    build, feeds = GRAPHS["matmul_nbits"]
    model = build()
    result = convert(model, level="O3")
    [entry] = [e for e in result.plan if e.op_type == "MatMulNBits"]
    assert entry.precision is Precision.FP32 and entry.rule == "quantized"
    assert op_key("MatMulNBits", "com.microsoft") in ORT_QUANTIZED_OPS
    before = {t.name: t for t in model.graph.initializer}
    node = next(n for n in result.model.graph.node if n.op_type == "MatMulNBits")
    after = {t.name: t for t in result.model.graph.initializer}
    for name in node.input[1:]:  # packed weight, scales, zero points: as they were
        if name in before:
            assert after[name] == before[name]
    assert any(e.precision is Precision.LOW for e in result.plan if e.op_type == "MatMul")
    np.testing.assert_allclose(_run(result.model, feeds())[0], _run(model, feeds())[0], rtol=0.05, atol=0.05)
