"""Generated validation inputs that mean something: an integer input's role (mask, positions,
token ids) comes from what the graph does with it (input_roles.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amp_convert.input_roles import input_roles
from amp_convert.inputs import make_source
from models.zoo_inputs import load_manifest

MODELS = {
    e["name"]: e for e in load_manifest(str(Path(__file__).resolve().parents[1] / "models" / "zoo" / "ort" / "manifest.json"))
}


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("amp-convert")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)


def test_integer_inputs_get_their_role_from_what_they_feed():
    """Token ids range over the embedding table, masks are all ones and positions count up."""
    roles = {name: {k: (r.kind, r.rows) for k, r in input_roles(onnx.load(e["path"])).items()} for name, e in MODELS.items()}
    assert roles["llama"] == {"input_ids": ("index", 512), "position_ids": ("positions", 128), "attention_mask": ("mask", None)}
    assert roles["bert"]["attention_mask"] == ("mask", None) and roles["bert"]["token_type_ids"] == ("index", 2)
    assert roles["gpt2_past"]["position_ids"][0] == "positions"


def test_generated_samples_hold_those_values_and_the_command_says_so(tmp_path):
    path, report = MODELS["gpt2_past"]["path"], tmp_path / "r.json"
    proc = _cli(path, "--level", "O2", "-o", str(tmp_path / "o.onnx"), "--report", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("inputs: ")]
    assert "attention_mask int64[1x128] ones" in line and "input_ids int64[1x64] [0, 512)" in line
    generated = {g["name"]: g for g in json.loads(report.read_text())["inputs"]["generated"]}
    assert generated["attention_mask"]["values"] == "ones" and generated["position_ids"]["values"] == "64, 65, 66, ..."
    source = make_source(onnx.load(path), shapes=["input_ids=1x4", "attention_mask=1x16", "position_ids=1x4"])
    sample = next(iter(source))
    # (4 new tokens after 16 - 4 past ones: positions follow the past, the cache holds 12)
    assert (sample["attention_mask"] == 1).all() and sample["position_ids"].tolist() == [[12, 13, 14, 15]]
    assert sample["past_0"].shape == (2, 1, 4, 12, 16)
    assert sample["input_ids"].min() >= 0 and sample["input_ids"].max() < 512
    # a range the user gives wins over the role
    ranged = make_source(onnx.load(path), ranges=["attention_mask=0:2"], seed=3)
    assert [g["why"] for g in ranged.generated() if g["name"] == "attention_mask"] == ["`input_range`"]
    # with input options given, no line
    proc = _cli(path, "--level", "O2", "-o", str(tmp_path / "o2.onnx"), "--input-shape", "input_ids=1x2")
    assert proc.returncode == 0 and not any(x.startswith("inputs: ") for x in proc.stdout.splitlines())


def test_input_roles_hold_when_the_inputs_are_renamed():
    model = onnx.load(MODELS["llama"]["path"])
    renames = {"attention_mask": "m", "position_ids": "p", "input_ids": "t"}
    for v in model.graph.input:
        v.name = renames.get(v.name, v.name)
    for node in model.graph.node:
        node.input[:] = [renames.get(x, x) for x in node.input]
    roles = {k: r.kind for k, r in input_roles(model).items()}
    assert roles == {"m": "mask", "p": "positions", "t": "index"}  # (positions: it reaches RotaryEmbedding)


def test_a_mask_is_followed_through_the_gather_that_picks_it():
    """transformers' BERT export gathers the padding mask by position
    (Flatten -> Gather -> Reshape -> And -> Where) before it is added to
    the scores: it is still a mask, all ones."""
    bert = onnx.load(str(Path(__file__).resolve().parents[1] / "models" / "zoo" / "bert.onnx"))
    roles = {k: (r.kind, r.rows) for k, r in input_roles(bert).items()}
    assert roles == {"input_ids": ("index", 1000), "attention_mask": ("mask", None), "token_type_ids": ("index", 2)}


def _gqa_model(seqlens_from_mask: bool = True) -> onnx.ModelProto:
    """A GroupQueryAttention decoder layer as onnxruntime's builders make it:
    seqlens_k = ReduceSum(attention_mask) - 1, total_sequence_length =
    Shape(attention_mask)[1]; or (``seqlens_from_mask`` false) seqlens_k a
    graph input of its own."""
    rng = np.random.default_rng(0)
    hidden, heads, kv_heads, head = 32, 4, 2, 8
    kv = kv_heads * head
    weights = {"emb": (50, hidden), "Wq": (hidden, heads * head), "Wk": (hidden, kv), "Wv": (hidden, kv)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n) for n, s in weights.items()]
    inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("axes", [1]), ("one", 1), ("at1", 1))]
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["x"]),
        *(helper.make_node("MatMul", ["x", w], [w.lower()]) for w in ("Wq", "Wk", "Wv")),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "at1"], ["total64"]),
        helper.make_node("Cast", ["total64"], ["total"], to=TensorProto.INT32),
    ]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
    ]
    if seqlens_from_mask:
        nodes += [
            helper.make_node("ReduceSum", ["attention_mask", "axes"], ["summed"]),
            helper.make_node("Sub", ["summed", "one"], ["lengths"]),
            helper.make_node("Cast", ["lengths"], ["seqlens_k"], to=TensorProto.INT32),
        ]
    else:
        inputs.append(helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]))
    attrs = {"num_heads": heads, "kv_num_heads": kv_heads}
    gqa = ["wq", "wk", "wv", "", "", "seqlens_k", "total"]
    nodes.append(helper.make_node("GroupQueryAttention", gqa, ["y", "pk", "pv"], domain="com.microsoft", **attrs))
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", heads * head])
    graph = helper.make_graph(nodes, "gqa", inputs, [output], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def test_a_mask_summed_into_group_query_attentions_lengths_is_ones(tmp_path):
    """A random 0/1 mask summed into seqlens_k would cut every sequence
    short (onnxruntime then attends to a few tokens and repeats them): the
    mask is all ones, and the conversion validates on it. A seqlens_k given
    as an input of its own is not a mask."""
    m = _gqa_model()
    roles = input_roles(m)
    assert roles["attention_mask"].kind == "mask" and "GroupQueryAttention (sequence lengths)" in roles["attention_mask"].why
    assert roles["input_ids"].kind == "index" and roles["input_ids"].rows == 50
    assert all((s["attention_mask"] == 1).all() and s["attention_mask"].shape[1] > 1 for s in make_source(m))
    path = tmp_path / "gqa.onnx"
    onnx.save(m, str(path))
    proc = _cli(str(path), "--level", "O2", "-o", str(tmp_path / "o.onnx"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "attention_mask int64[1x128] ones" in proc.stdout
    assert "seqlens_k" not in input_roles(_gqa_model(seqlens_from_mask=False))
