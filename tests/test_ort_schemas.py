"""onnxruntime's schemas as a second source of truth: fused com.microsoft ops
and onnxruntime's default-domain extras are typed, checked, listed and
converted like standard ops."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import amp_convert
from amp_convert import Precision, ortschema
from amp_convert.check import check_converted
from amp_convert.errors import ConversionError
from amp_convert.lists import ORT_QUANTIZED_OPS
from amp_convert.op_profiles import ORT_FUSED, builtin_lists
from amp_convert.schema import signature

HIDDEN, HEADS, SEQ, VOCAB = 16, 2, 6, 50


def _w(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.1) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def fused_encoder() -> onnx.ModelProto:
    """A one-layer encoder as onnxruntime's optimizer writes it:
    EmbedLayerNormalization (its int32 mask_index output), Attention,
    SkipLayerNormalization (its float-only mean / inv_std_var outputs),
    MatMul, FastGelu; no value_info for any fused op's output."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node(
            "EmbedLayerNormalization",
            ["input_ids", "segment_ids", "word", "pos", "seg", "g0", "b0", "mask"],
            ["emb", "mask_index"],
            domain="com.microsoft",
            epsilon=1e-12,
        ),
        helper.make_node("Attention", ["emb", "qkv_w", "qkv_b", "mask_index"], ["att"], domain="com.microsoft", num_heads=HEADS),
        helper.make_node(
            "SkipLayerNormalization",
            ["att", "emb", "g1", "b1"],
            ["ln1", "mean", "inv_std"],
            domain="com.microsoft",
            epsilon=1e-12,
        ),
        helper.make_node("MatMul", ["ln1", "ff_w"], ["ff"]),
        helper.make_node("FastGelu", ["ff", "ff_b"], ["act"], domain="com.microsoft"),
        helper.make_node("MatMul", ["act", "out_w"], ["out"]),
        helper.make_node("SkipLayerNormalization", ["out", "ln1", "g2", "b2"], ["hidden"], domain="com.microsoft", epsilon=1e-12),
    ]
    ints = [helper.make_tensor_value_info(n, TensorProto.INT32, [1, SEQ]) for n in ("input_ids", "segment_ids", "mask")]
    inits = [
        _w(rng, "word", VOCAB, HIDDEN),
        _w(rng, "pos", SEQ, HIDDEN),
        _w(rng, "seg", 2, HIDDEN),
        _w(rng, "qkv_w", HIDDEN, 3 * HIDDEN),
        _w(rng, "qkv_b", 3 * HIDDEN),
        _w(rng, "ff_w", HIDDEN, 4 * HIDDEN),
        _w(rng, "ff_b", 4 * HIDDEN),
        _w(rng, "out_w", 4 * HIDDEN, HIDDEN),
        *(numpy_helper.from_array(np.ones(HIDDEN, np.float32), f"g{k}") for k in range(3)),
        *(numpy_helper.from_array(np.zeros(HIDDEN, np.float32), f"b{k}") for k in range(3)),
    ]
    graph = helper.make_graph(
        nodes, "fused", ints, [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, SEQ, HIDDEN])], inits
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)], ir_version=8
    )


def encoder_feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "input_ids": rng.integers(0, VOCAB, (1, SEQ)).astype(np.int32),
        "segment_ids": np.zeros((1, SEQ), np.int32),
        "mask": np.ones((1, SEQ), np.int32),
    }


def rms_decoder() -> onnx.ModelProto:
    """SimplifiedLayerNormalization (onnxruntime's default-domain extra, which
    onnx's checker does not know) and SkipSimplifiedLayerNormalization around a MatMul."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["n"], axis=-1, epsilon=1e-6),
        helper.make_node("MatMul", ["n", "w"], ["y"]),
        helper.make_node("SkipSimplifiedLayerNormalization", ["y", "x", "g"], ["z"], domain="com.microsoft", epsilon=1e-6),
    ]
    graph = helper.make_graph(
        nodes,
        "rms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, HIDDEN])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, SEQ, HIDDEN])],
        [numpy_helper.from_array(np.ones(HIDDEN, np.float32), "g"), _w(rng, "w", HIDDEN, HIDDEN)],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)], ir_version=8
    )


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_the_hand_built_graphs_run_in_onnxruntime():
    assert _session(fused_encoder()).run(None, encoder_feeds())[0].shape == (1, SEQ, HIDDEN)
    assert _session(rms_decoder()).run(None, {"x": np.ones((1, SEQ, HIDDEN), np.float32)})[0].shape == (1, SEQ, HIDDEN)


def test_signatures_of_fused_ops_come_from_onnxruntime():
    embed = signature("EmbedLayerNormalization", "com.microsoft", 1)
    assert embed is not None and embed.source == "onnxruntime"
    assert embed.allowed[embed.output_type(1)] == {TensorProto.INT32}  # mask_index: fixed int32
    assert TensorProto.BFLOAT16 not in embed.allowed[embed.output_type(0)]
    skip = signature("SkipLayerNormalization", "com.microsoft", 1)
    assert skip.allowed[skip.output_type(1)] == {TensorProto.FLOAT}  # mean: float-only statistics
    simplified = signature("SimplifiedLayerNormalization", "", 17)
    assert simplified is not None and simplified.source == "onnxruntime"
    assert signature("MatMul", "", 17).source == "onnx"
    assert not ortschema.is_extra("MatMul", "")  # (a standard op keeps onnx's schema)


def test_fused_encoder_converts_fully_at_o2():
    result = amp_convert.convert(fused_encoder(), level="O2")
    assert all(e.precision is Precision.LOW for e in result.plan), [(e.name, e.reason) for e in result.plan]
    # the int32 mask reaches Attention as it is (taken for float, it would get a Cast to fp16)
    readers = [n.op_type for n in result.model.graph.node if "mask_index" in n.input]
    assert readers == ["Attention"]
    casts = [n for n in result.model.graph.node if n.op_type == "Cast"]
    assert len(casts) == 1  # (the output back to fp32; the embedding reads only int32 inputs and weights)
    reference = _session(fused_encoder()).run(None, encoder_feeds())[0]
    converted = _session(result.model).run(None, encoder_feeds())[0]
    assert np.abs(reference - converted).max() < 0.05


def test_at_o1_the_attention_and_gemm_family_runs_low():
    plan = amp_convert.convert(fused_encoder(), level="O1").plan
    low = {e.op_type for e in plan if e.precision is Precision.LOW}
    assert {"Attention", "MatMul"} <= low


def test_bf16_keeps_what_onnxruntime_admits_only_in_fp16_fp32():
    result = amp_convert.convert(fused_encoder(), level="O2", dtype="bf16")
    embed = next(e for e in result.plan if e.op_type == "EmbedLayerNormalization")
    assert embed.precision is Precision.FP32 and embed.rule == "schema" and "bfloat16" in embed.reason
    attention = next(e for e in result.plan if e.op_type == "Attention")
    assert attention.precision is Precision.LOW  # (onnxruntime's Attention admits bfloat16)
    check_converted(result.model, "full")


def test_the_checker_holds_fused_ops_to_onnxruntime_schemas():
    model = fused_encoder()
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    for t in bad.graph.initializer:
        if t.name == "word":
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), "word"))
    with pytest.raises(ConversionError, match="EmbedLayerNormalization"):
        check_converted(bad, "full")


def test_a_model_with_onnxruntimes_default_domain_extra_converts(tmp_path):
    path = tmp_path / "rms.onnx"
    onnx.save(rms_decoder(), path)
    out = tmp_path / "rms.fp16.onnx"
    done = subprocess.run(
        [sys.executable, "-m", "amp_convert", str(path), "--level", "O2", "-o", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "PASS" in done.stdout + done.stderr
    converted = onnx.load(out)
    lows = {n.op_type for n in converted.graph.node if n.op_type != "Cast"}
    assert lows == {"SimplifiedLayerNormalization", "MatMul", "SkipSimplifiedLayerNormalization"}
    assert any(t.data_type == TensorProto.FLOAT16 for t in converted.graph.initializer)
    _session(converted).run(None, {"x": np.ones((1, SEQ, HIDDEN), np.float32)})


def test_a_default_domain_op_nobody_knows_is_refused_with_one_line(tmp_path):
    model = rms_decoder()
    model.graph.node[0].op_type = "NoSuchNormalization"
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    done = subprocess.run(
        [sys.executable, "-m", "amp_convert", str(path), "-o", str(tmp_path / "o.onnx")], capture_output=True, text=True
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "NoSuchNormalization" in lines[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_ops_of_other_custom_domains_stay_fp32_and_still_convert():
    model = rms_decoder()
    model.graph.node[2].domain = "org.example"
    model.opset_import.append(helper.make_opsetid("org.example", 1))
    plan = amp_convert.convert(model, level="O2", check="none").plan
    custom = next(e for e in plan if e.domain == "org.example")
    assert custom.precision is Precision.FP32 and custom.rule in ("custom-domain", "unknown-type")


@pytest.mark.parametrize("key", sorted({*ORT_FUSED, *ORT_QUANTIZED_OPS}))
def test_every_listed_fused_op_is_one_of_onnxruntimes(key):
    domain, _, op = key.rpartition("::")
    assert ortschema.extra_schema(op, domain, 1) is not None


def test_profiles_reason_about_fused_ops():
    white, black, follow, _ = builtin_lists("default", "O2", "fp16")
    assert "com.microsoft::Attention" in white and "com.microsoft::SkipLayerNormalization" in follow
    assert "com.microsoft::BiasSoftmax" in black
    _, ms_black, _, _ = builtin_lists("mindspore", "O2", "fp16")
    assert "com.microsoft::SkipLayerNormalization" in ms_black  # (as LayerNormalization, on the seed's black list)
    paddle_white, _, _, _ = builtin_lists("paddle", "O1", "fp16")
    assert "com.microsoft::Attention" in paddle_white  # (as MatMul)


def test_lists_command_shows_fused_and_quantized_ops():
    done = subprocess.run([sys.executable, "-m", "amp_convert", "lists", "--level", "O2"], capture_output=True, text=True)
    assert done.returncode == 0
    assert "com.microsoft::GroupQueryAttention" in done.stdout and "com.microsoft::MatMulNBits" in done.stdout


def test_onnxruntime_types_what_no_schema_can():
    """SimplifiedLayerNormalization's inv_std_var is float or double as an
    attribute says: its schema cannot tell, onnxruntime's inference can."""
    model = rms_decoder()
    model.graph.node[0].output.append("inv_std")
    model.graph.node.append(helper.make_node("Mul", ["inv_std", "inv_std"], ["sq"]))
    model.graph.output.append(helper.make_tensor_value_info("sq", TensorProto.FLOAT, [1, SEQ, 1]))
    result = amp_convert.convert(model, level="O2")
    assert any("onnxruntime's own type inference typed 1 tensor(s)" in n and "inv_std" in n for n in result.plan.notes)
    assert all(e.rule != "unknown-type" for e in result.plan)
    assert result.plan.by_name("Mul_3").rule == "follow"  # (typed: it follows its fp32 statistics input)


def test_a_type_nothing_determines_is_reported():
    model = rms_decoder()
    model.graph.node[2].domain = "org.example"  # (onnxruntime cannot load it: nothing types its output)
    model.opset_import.append(helper.make_opsetid("org.example", 1))
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    model.graph.node.append(helper.make_node("Relu", ["z"], ["r"]))
    model.graph.output[0].name = "r"
    plan = amp_convert.convert(model, level="O2", check="none").plan
    assert any("neither onnx's nor onnxruntime's schemas" in n and "'z'" in n for n in plan.notes)
    assert plan.by_name("Relu_3").rule == "unknown-type"
