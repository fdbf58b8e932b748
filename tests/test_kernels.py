"""Kernel availability per execution provider (amp_convert.kernels) and its snapshot generator."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from amp_convert import kernels
from amp_convert.errors import AmpError

BF16, FP16, FLOAT = TensorProto.BFLOAT16, TensorProto.FLOAT16, TensorProto.FLOAT
ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("gen_kernel_table", ROOT / "scripts" / "gen_kernel_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cuda() -> kernels.KernelTable:
    return kernels.snapshot_table("cuda")


@pytest.fixture(scope="module")
def cpu() -> kernels.KernelTable:
    return kernels.snapshot_table("cpu")


def test_snapshot_records_its_source_and_release(cuda, cpu):
    doc = json.loads((ROOT / "amp_convert" / "data" / "ort_kernels.json").read_text())
    assert doc["source"]["repository"] == "microsoft/onnxruntime"
    assert doc["source"]["path"] == "docs/OperatorKernels.md"
    assert re.fullmatch(r"[0-9a-f]{40}", doc["source"]["commit"])
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", doc["onnxruntime_release"])
    for table, name in ((cuda, "CUDAExecutionProvider"), (cpu, "CPUExecutionProvider")):
        assert table.provider == name
        assert table.release == doc["onnxruntime_release"]
        assert f"onnxruntime {table.release}" in table.source and "OperatorKernels.md" in table.source
        # every kept domain is there, with the ops one expects of a real table
        assert {d for d, _ in table.ops()} >= {"ai.onnx", "com.microsoft"}
        assert len(table.ops()) > 150


@pytest.mark.parametrize("op", ["MatMul", "Gemm", "LayerNormalization"])
def test_cuda_has_bf16_kernels_for_gemm_and_layernorm(cuda, op):
    assert cuda.low_kernel("", op, 17, BF16) is True
    assert cuda.low_kernel("", op, 17, FP16) is True


@pytest.mark.parametrize(
    "op", ["GlobalAveragePool", "MaxPool", "LeakyRelu", "LSTM", "GRU", "Log", "LogSoftmax", "InstanceNormalization"]
)
def test_cuda_lacks_bf16_kernels_the_issue_names(cuda, op):
    # the op has CUDA kernels at opset 17 (fp16 among them), just none in bf16
    assert cuda.low_kernel("", op, 17, BF16) is False
    assert cuda.low_kernel("ai.onnx", op, 17, FP16) is True


def test_cuda_bf16_matmul_needs_opset_13(cuda):
    # MatMul's bf16 kernel is the 13+ one: the [9, 12] kernel lists fp16 only
    assert cuda.low_kernel("", "MatMul", 12, BF16) is False
    assert cuda.low_kernel("", "MatMul", 12, FP16) is True


@pytest.mark.parametrize("op", ["Attention", "SkipLayerNormalization", "EmbedLayerNormalization", "FastGelu"])
def test_cuda_has_fp16_kernels_for_fused_ops(cuda, op):
    assert cuda.low_kernel("com.microsoft", op, 1, FP16) is True


def test_cuda_embed_layer_norm_has_no_bf16_kernel(cuda):
    assert cuda.low_kernel("com.microsoft", "EmbedLayerNormalization", 1, BF16) is False
    assert cuda.low_kernel("com.microsoft", "SkipLayerNormalization", 1, BF16) is True


def test_cpu_has_no_fp16_matmul(cpu):
    # the table lists double, float and integer MatMul kernels on CPU, no float16 or bfloat16
    assert cpu.low_kernel("", "MatMul", 17, FP16) is False
    assert cpu.low_kernel("", "MatMul", 17, BF16) is False
    assert cpu.low_kernel("", "MatMul", 17, FLOAT) is True


def test_an_op_the_provider_lacks_gives_none(cuda, cpu):
    assert cpu.low_kernel("", "Det", 17, FLOAT) is True
    assert cuda.low_kernel("", "Det", 17, FLOAT) is None  # onnxruntime would put it on the CPU
    assert cuda.low_kernel("com.microsoft", "NoSuchOp", 1, FP16) is None
    assert cuda.low_kernel("ai.onnx.ml", "TreeEnsembleRegressor", 3, FLOAT) is None


def test_type_vars_restrict_the_constraints_asked(cuda):
    # LayerNormalization-17's T lists bf16; its U (the statistics) is float only
    assert cuda.low_kernel("", "LayerNormalization", 17, BF16, type_vars=["T"]) is True
    assert cuda.low_kernel("", "LayerNormalization", 17, BF16, type_vars=["U"]) is False


def _single_op_model(op: str, elem: int, opset: int, inputs: int = 1) -> bytes:
    """A model of one ``op`` node, passing onnx's full check, on x: [3, 3] ([1, 2, 3] for a global pool)."""
    x, y = ([1, 2, 3], [1, 2, 1]) if op.startswith("Global") else ([3, 3], [3, 3])
    graph = helper.make_graph(
        [helper.make_node(op, ["x"] * inputs, ["y"])],
        "g",
        [helper.make_tensor_value_info("x", elem, x)],
        [helper.make_tensor_value_info("y", elem, y)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def _cpu_loads(model: bytes) -> bool:
    try:
        ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's NotImplemented is not importable by a stable name
        assert "NOT_IMPLEMENTED" in str(e), e
        return False
    return True


def test_open_range_does_not_serve_a_later_schema_version(cpu):
    # CPU's GlobalLpPool kernel is "2+", and onnx has GlobalLpPool-22: onnxruntime matches a kernel
    # by the schema's since_version, so opset 22 finds no kernel while opset 21 does
    assert cpu.low_kernel("", "GlobalLpPool", 21, FLOAT) is True
    assert cpu.low_kernel("", "GlobalLpPool", 22, FLOAT) is None
    assert _cpu_loads(_single_op_model("GlobalLpPool", FLOAT, 21))
    assert not _cpu_loads(_single_op_model("GlobalLpPool", FLOAT, 22))


@pytest.mark.parametrize("op, inputs", [("Relu", 1), ("MatMul", 2), ("Transpose", 1), ("Sigmoid", 1), ("Identity", 1)])
def test_cpu_bf16_verdicts_agree_with_onnxruntime(cpu, op, inputs):
    # onnxruntime's CPU provider has no fallback for a bf16 node it lacks a kernel for: it refuses it
    verdict = cpu.low_kernel("", op, 17, BF16)
    assert verdict is not None
    assert _cpu_loads(_single_op_model(op, BF16, 17, inputs)) is verdict


MD_EXCERPT = """\
## Operators implemented by CPUExecutionProvider

| Op Name | Parameters | OpSet Version | Types Supported |
|---------|------------|---------------|-----------------|
|**Operator Domain:** *ai.onnx*||||
|Abs|*in* X:**T**<br> *out* Y:**T**|13+|**T** = tensor(bfloat16), tensor(double)|
|||[6, 12]|**T** = tensor(double)|
|Upsample|*in* X:**T**<br> *out* Y:**T**|9|**T** = tensor(float), tensor(int32)|
|||[7, 8]|**T** = tensor(float)|
|Where|*in* c:**B**<br> *in* X:**T**|16+|**B** = tensor(bool)<br/> **T** = tensor(float), tensor(uint8)|
| |
| |
|**Operator Domain:** *ai.onnx.ml*||||
|CastMap|*in* X:**T1**|1+|**T1** = map(int64,tensor(float)), map(int64,tensor(string))<br/> **T2** = tensor(float)|
|**Operator Domain:** *com.microsoft.nchwc*||||
|Conv|*in* X:**T**<br> *out* Y:**T**|1+|**T** = tensor(float)|

<a name="cudaexecutionprovider"/>

## Operators implemented by CUDAExecutionProvider

| Op Name | Parameters | OpSet Version | Types Supported |
|---------|------------|---------------|-----------------|
|**Operator Domain:** *com.microsoft*||||
|FastGelu|*in* X:**T**<br> *in* bias:**T**<br> *out* Y:**T**|1+|**T** = tensor(float16), tensor(float)|

## Operators implemented by DmlExecutionProvider

|**Operator Domain:** *ai.onnx*||||
|Abs|*in* X:**T**<br> *out* Y:**T**|13+|**T** = tensor(float)|
"""


def test_generator_parses_the_table_format(tmp_path):
    gen = _generator()
    md = tmp_path / "OperatorKernels.md"
    md.write_text(MD_EXCERPT)
    doc = gen.build(md, "0" * 40, "9.9")
    assert doc["source"]["commit"] == "0" * 40 and doc["onnxruntime_release"] == "9.9"
    assert doc["providers"] == {
        "CPUExecutionProvider": {
            "ai.onnx": {
                "Abs": [
                    {"since": 13, "until": None, "types": {"T": ["tensor(bfloat16)", "tensor(double)"]}},
                    {"since": 6, "until": 12, "types": {"T": ["tensor(double)"]}},
                ],
                "Upsample": [
                    {"since": 9, "until": 9, "types": {"T": ["tensor(float)", "tensor(int32)"]}},
                    {"since": 7, "until": 8, "types": {"T": ["tensor(float)"]}},
                ],
                "Where": [
                    {"since": 16, "until": None, "types": {"B": ["tensor(bool)"], "T": ["tensor(float)", "tensor(uint8)"]}}
                ],
            },
            "ai.onnx.ml": {
                "CastMap": [
                    {
                        "since": 1,
                        "until": None,
                        "types": {"T1": ["map(int64,tensor(float))", "map(int64,tensor(string))"], "T2": ["tensor(float)"]},
                    }
                ]
            },
        },
        "CUDAExecutionProvider": {
            "com.microsoft": {
                "FastGelu": [{"since": 1, "until": None, "types": {"T": ["tensor(float)", "tensor(float16)"]}}],
            }
        },
    }
    # what it writes is what amp_convert reads
    out = tmp_path / "ort_kernels.json"
    out.write_text(gen.dump(doc))
    assert json.loads(out.read_text()) == doc


def test_generator_names_the_line_it_cannot_read(tmp_path):
    gen = _generator()
    md = tmp_path / "OperatorKernels.md"
    md.write_text(MD_EXCERPT.replace("|||[7, 8]|", "|||[7 to 8]|"))
    with pytest.raises(ValueError, match=r"line 9: unreadable opset version '\[7 to 8\]'"):
        gen.build(md, "0" * 40, "9.9")


def test_provider_names():
    assert kernels.provider_name("cuda") == "CUDAExecutionProvider"
    assert kernels.provider_name("CPU") == "CPUExecutionProvider"
    assert kernels.provider_name("CUDAExecutionProvider") == "CUDAExecutionProvider"
    assert kernels.provider_name("none") is None
    assert kernels.PROVIDERS == {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider", "none": None}
    with pytest.raises(AmpError, match=r"unknown target provider 'rocm': use cuda, cpu or none"):
        kernels.provider_name("rocm")
    with pytest.raises(AmpError, match="'none'"):
        kernels.kernel_table("none")


def test_live_query_does_not_crash_this_process(monkeypatch):
    # onnxruntime-gpu without CUDA libraries segfaults inside the registry call: the child takes the crash
    monkeypatch.setenv(kernels.ENV, "live")
    for provider in ("cpu", "cuda"):
        table = kernels.live_table(provider)
        assert table is None or (isinstance(table, kernels.KernelTable) and "live registry" in table.source)
        chosen = kernels.kernel_table(provider)
        assert chosen is (kernels.kernel_table(provider))  # cached
        assert ("live registry" in chosen.source) == (table is not None)


def test_the_snapshot_is_the_default_and_the_env_is_checked(monkeypatch):
    monkeypatch.delenv(kernels.ENV, raising=False)
    assert "snapshot" in kernels.kernel_table("cpu").source
    monkeypatch.setenv(kernels.ENV, "sometimes")
    with pytest.raises(AmpError, match="AMP_CONVERT_KERNELS must be 'snapshot' or 'live'"):
        kernels.kernel_table("cpu")


@pytest.mark.parametrize("provider", ["cpu", "cuda"])
def test_live_registry_agrees_with_snapshot_on_common_ops(provider):
    live = kernels.live_table(provider)
    if live is None:
        pytest.skip(f"no live {provider} registry in this onnxruntime build (the child process crashed or lacks it)")
    snap = kernels.snapshot_table(provider)
    for op, elem in [("Conv", FLOAT), ("Add", FLOAT), ("Relu", FLOAT), ("Gemm", FLOAT), ("Softmax", FLOAT), ("Concat", FP16)]:
        assert live.low_kernel("", op, 17, elem) == snap.low_kernel("", op, 17, elem), op


def test_diff_tables(cuda):
    assert kernels.diff_tables(cuda, cuda) == []
    without = {k: v for k, v in cuda.kernels.items() if k != ("ai.onnx", "MatMul")}
    fewer = kernels.KernelTable(cuda.provider, "edited copy", cuda.release, without)
    [line] = kernels.diff_tables(cuda, fewer)
    assert line.startswith("ai.onnx MatMul: kernels only in snapshot") and "none in edited copy" in line
    no_bf16 = dict(cuda.kernels)
    no_bf16[("ai.onnx", "Gemm")] = tuple(
        kernels.Kernel(k.since, k.until, {n: ts - {"tensor(bfloat16)"} for n, ts in k.types.items()})
        for k in cuda.kernels[("ai.onnx", "Gemm")]
    )
    edited = kernels.KernelTable(cuda.provider, "edited copy", cuda.release, no_bf16)
    assert kernels.diff_tables(edited, cuda) == [f"ai.onnx Gemm tensor(bfloat16): only in {cuda.source}"]
