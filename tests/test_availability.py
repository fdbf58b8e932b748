"""Kernel availability in the plan: a node runs low only where the target provider has a kernel for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import init, model, value
from onnx import helper

from amp_convert import AmpError, convert
from amp_convert.plan import Precision

ZOO = Path(__file__).resolve().parents[1] / "models" / "zoo"


def _entries(plan, op: str):
    found = [e for e in plan if e.op_type == op]
    assert found, op
    return found


@pytest.fixture(scope="module")
def resnet() -> onnx.ModelProto:
    return onnx.load(ZOO / "resnet50.onnx")


@pytest.mark.parametrize("op", ["GlobalAveragePool", "MaxPool"])
def test_bf16_cnn_keeps_pools_without_a_cuda_kernel_fp32(resnet, op):
    # at opset 22 the schemas admit bfloat16 for every op here: only the kernels are missing
    plan = convert(resnet, level="O2", dtype="bf16", target_opset=22, check="none").plan
    for entry in _entries(plan, op):
        assert entry.precision == Precision.FP32 and entry.rule == "kernel"
        assert f"no bfloat16 kernel for {op} on CUDAExecutionProvider" in entry.reason
        assert "onnxruntime 1.25" in entry.reason and "(wanted low: follow" in entry.reason
    # the GEMM-bound ops have one, and run low
    assert all(e.precision == Precision.LOW for e in _entries(plan, "Conv"))
    [note] = [n for n in plan.notes if n.startswith("kernels:")]
    assert "for want of a bfloat16 kernel on CUDAExecutionProvider" in note and "snapshot" in note
    assert note.endswith("(`target_provider` none turns this off)")


@pytest.mark.parametrize("op", ["GlobalAveragePool", "MaxPool"])
def test_target_none_turns_the_filter_off(resnet, op):
    plan = convert(resnet, level="O2", dtype="bf16", target_opset=22, target_provider="none", check="none").plan
    assert all(e.precision == Precision.LOW for e in _entries(plan, op))
    assert not [n for n in plan.notes if n.startswith("kernels:")]


def test_fp16_cnn_plan_is_unchanged_by_cuda(resnet):
    # CUDA has an fp16 kernel for every op of a plain CNN: the default target changes nothing there
    for level in ("O1", "O2", "O3"):
        cuda = convert(resnet, level=level, dtype="fp16", check="none").plan
        none = convert(resnet, level=level, dtype="fp16", target_provider="none", check="none").plan
        assert [(e.name, e.precision) for e in cuda] == [(e.name, e.precision) for e in none]


def _clip_model(opset: int) -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Clip", ["h", "lo", "hi"], ["c"], name="clip"),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    inits = [init("W", np.eye(4, dtype=np.float32)), init("lo", np.float32(-1)), init("hi", np.float32(1))]
    return model(nodes, [value("x")], [value("y")], inits, opset=opset)


def test_a_kernel_of_another_opset_does_not_count():
    # onnxruntime's CUDA Clip-11 is float-only; from Clip-12 it has float16 too
    old = convert(_clip_model(11), level="O3", check="none").plan
    clip = old.by_name("clip")
    assert clip.precision == Precision.FP32 and clip.rule == "kernel"
    assert "no float16 kernel for Clip on CUDAExecutionProvider" in clip.reason
    assert old.by_name("mm").precision == Precision.LOW
    new = convert(_clip_model(13), level="O3", check="none").plan
    assert new.by_name("clip").precision == Precision.LOW


def test_the_cpu_target_asks_the_cpu_table():
    # onnxruntime's CPU provider has no float16 MatMul kernel: aimed at CPU, it stays fp32
    plan = convert(_clip_model(13), level="O3", target_provider="cpu", check="none").plan
    mm = plan.by_name("mm")
    assert mm.precision == Precision.FP32 and mm.rule == "kernel"
    assert "no float16 kernel for MatMul on CPUExecutionProvider" in mm.reason


def test_force_low_overrides_the_filter():
    plan = convert(_clip_model(11), level="O3", force_low=("clip",), check="none").plan
    assert plan.by_name("clip").precision == Precision.LOW


def test_unknown_target_provider_is_refused(tmp_path):
    with pytest.raises(AmpError, match="unknown `target_provider` 'rocm'"):
        convert(_clip_model(13), level="O2", target_provider="rocm", check="none")
    src = tmp_path / "m.onnx"
    onnx.save(_clip_model(13), src)
    exe = Path(sys.executable).with_name("amp-convert")
    out = tmp_path / "o.onnx"
    run = subprocess.run(
        [str(exe), str(src), "--target-provider", "rocm", "-o", str(out)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "unknown --target-provider 'rocm'" in run.stderr
    assert "Traceback" not in run.stderr and not out.exists()


def test_target_provider_from_a_config_file(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_clip_model(11), src)
    config = tmp_path / "amp.toml"
    config.write_text('level = "O3"\ntarget_provider = "none"\n')
    exe = Path(sys.executable).with_name("amp-convert")
    plan_json = tmp_path / "plan.json"
    args = [str(src), "--config", str(config), "--no-validate", "--plan-json", str(plan_json), "-o", str(tmp_path / "o.onnx")]
    run = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert '"rule": "kernel"' not in plan_json.read_text()
