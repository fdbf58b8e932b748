"""The Python API: convert() and the seed's names with the seed's errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import init, model, value
from onnx import helper

import amp_convert
from amp_convert import Precision
from amp_convert.op_profiles import ORT_FUSED


def small_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Softmax", ["h"], ["s"], name="sm", axis=-1),
        helper.make_node("Add", ["s", "h"], ["y"], name="add"),
    ]
    return model(nodes, [value("x")], [value("y")], [init("W", np.eye(4, dtype=np.float32))])


def test_convert_returns_model_and_plan_and_stats(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(small_model(), str(path))
    result = amp_convert.convert(path, level="O1")
    model_out, plan = result
    assert isinstance(model_out, onnx.ModelProto)
    assert plan.by_name("mm").precision is Precision.LOW
    assert result.stats.casts_inserted == result.casts_after
    assert set(result.timings) >= {"load", "plan", "rewrite", "cleanup", "check"}
    assert plan.as_dict()["counts"] == {"low": 1, "fp32": 2, "unchanged": 0}
    with pytest.raises(ValueError, match="`check` must be one of full, basic, none"):
        amp_convert.convert(path, level="O1", check="strict")


def test_auto_mixed_precision_levels_and_errors():
    m = small_model()
    assert amp_convert.auto_mixed_precision(m).graph == m.graph  # default O0
    o3 = amp_convert.auto_mixed_precision(m, amp_level="O3", dtype="bf16")
    assert onnx.TensorProto.BFLOAT16 in {t.data_type for t in o3.graph.initializer}
    with pytest.raises(TypeError):
        amp_convert.auto_mixed_precision(42)
    with pytest.raises(ValueError, match="not supported"):
        amp_convert.auto_mixed_precision(m, amp_level="O4")
    with pytest.raises(ValueError, match="dtype"):
        amp_convert.auto_mixed_precision(m, amp_level="O2", dtype="float8")


def test_custom_mixed_precision_semantics_and_errors():
    m = small_model()
    out = amp_convert.custom_mixed_precision(m, white_list=["Softmax"])
    sm = next(n for n in out.graph.node if n.name == "sm")
    mm = next(n for n in out.graph.node if n.name == "mm")
    assert mm.input[0] == "x"  # MatMul not on this white list: stays fp32, no Cast
    assert any(n.op_type == "Cast" and n.output[0] == sm.input[0] for n in out.graph.node)
    out_black = amp_convert.custom_mixed_precision(m, black_list=["MatMul"])
    assert next(n for n in out_black.graph.node if n.name == "mm").input[0] == "x"
    with pytest.raises(ValueError, match="must be provided"):
        amp_convert.custom_mixed_precision(m)
    with pytest.raises(ValueError, match="same time"):
        amp_convert.custom_mixed_precision(m, white_list=["Conv"], black_list=["Softmax"])
    with pytest.raises(TypeError, match="should be list"):
        amp_convert.custom_mixed_precision(m, white_list="Conv")
    with pytest.raises(TypeError):
        amp_convert.custom_mixed_precision(b"not a model", white_list=["Conv"])


def test_get_lists_return_copies():
    white = amp_convert.get_white_list()
    assert "Conv" in white and "BatchNormalization" in amp_convert.get_black_list()
    white.append("Softmax")
    assert "Softmax" not in amp_convert.get_white_list()
    black = amp_convert.get_black_list()
    black.remove("BatchNormalization")
    assert "BatchNormalization" in amp_convert.get_black_list()
    assert set(amp_convert.get_white_list("mindspore")) - set(ORT_FUSED) == {
        "Conv",
        "ConvTranspose",
        "Gemm",
        "MatMul",
        "LSTM",
        "GRU",
        "RNN",
        "PRelu",
        "Relu",
    }
