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


PYPI = Path(__file__).resolve().parents[1] / "models" / "cache" / "pypi"  # (fetched by `make test`)


def _switch_model(
    compare: str | None, constant: float = 3, left: bool = False, dtype: int = TensorProto.INT64
) -> onnx.ModelProto:
    """y = If(cond) then x * 2 else x * 3, where cond is ``s compare
    constant`` (``left``: the constant on the left; a non-integral one is
    compared with s cast to float), or ``s`` itself (a bool; ``compare``
    None)."""
    branch = {
        name: helper.make_graph(
            [helper.make_node("Mul", ["x", f"k{name}"], [f"y{name}"])],
            name,
            [],
            [helper.make_tensor_value_info(f"y{name}", TensorProto.FLOAT, [4])],
            [numpy_helper.from_array(np.array(k, np.float32), f"k{name}")],
        )
        for name, k in (("then", 2.0), ("else", 3.0))
    }
    nodes = []
    fractional = constant != int(constant)
    c_type = TensorProto.FLOAT if fractional else dtype
    if compare is not None:
        nodes.append(helper.make_node("Squeeze", ["s"], ["s0"]))
        if fractional:
            nodes.append(helper.make_node("Cast", ["s0"], ["s0f"], to=TensorProto.FLOAT))
        ins = [("s0f" if fractional else "s0"), "c"][:: -1 if left else 1]
        nodes += [helper.make_node(compare, ins, ["hit"]), helper.make_node("Not", ["hit"], ["cond"])]
    cond = "cond" if compare is not None else "s"
    nodes.append(helper.make_node("If", [cond], ["y"], then_branch=branch["then"], else_branch=branch["else"]))
    s_type = TensorProto.BOOL if compare is None else dtype
    graph = helper.make_graph(
        nodes,
        "switch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]), helper.make_tensor_value_info("s", s_type, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.array(constant, helper.tensor_dtype_to_np_dtype(c_type)), "c")] if compare else [],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _branches_run(model: onnx.ModelProto, samples: int = 2) -> set[float]:
    """The factor (2: then, 3: else) each generated sample's run multiplied x by."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    factors = set()
    for sample in make_source(model, samples=samples):
        (y,) = session.run(None, sample)
        factors.add(round(float(y[0] / sample["x"][0]), 3))
    return factors


def test_an_input_that_picks_an_if_branch_takes_each_side_in_turn():
    """A comparison with a constant (either side of it, through Squeeze and
    Not) or a bool condition itself decides an If: the generated samples
    take a value on each side, so both branches run, not one that random
    0s and 1s happen to pick."""
    cases = {
        ("Equal", 3, False): (3, 4),
        ("Greater", 3, False): (4, 3),
        ("Less", 3, True): (4, 3),  # (3 < s)
        ("GreaterOrEqual", 2.5, False): (3, 2),
        ("LessOrEqual", 7, False): (7, 8),
    }
    for (op, c, left), values in cases.items():
        m = _switch_model(op, c, left)
        role = input_roles(m)["s"]
        assert (role.kind, role.values) == ("branch", values), op
        assert f"{op} with {c:g} into the condition of If" in role.why
        assert _branches_run(m) == {2.0, 3.0}, op
    flag = _switch_model(None)
    assert input_roles(flag)["s"].values == (1, 0) and _branches_run(flag) == {2.0, 3.0}
    # equal to a value no integer takes, or a value int8 cannot hold: no sides to take
    assert "s" not in input_roles(_switch_model("Equal", 2.5))
    assert input_roles(_switch_model("Equal", 127, dtype=TensorProto.INT8)).get("s") is None
    # one sample runs the first value, and the inputs say so
    source = make_source(m, samples=1)
    [row] = [g for g in source.generated() if g["name"] == "s"]
    assert row["values"] == "7, 8 (one per sample)" and "1 sample(s) run the first 1" in row["why"]


def test_silero_vad_validates_both_sample_rates(tmp_path):
    """Silero VAD (from its PyPI wheel) runs its 16 kHz model where ``sr ==
    16000`` and its 8 kHz one elsewhere: sample 0 is 16000, sample 1 not,
    and the chunk is long enough for the 16 kHz branch (128 samples fail
    it), so the verdict rests on both."""
    path = PYPI / "silero_vad.onnx"
    model = onnx.load(str(path))
    role = input_roles(model)["sr"]
    assert (role.kind, role.values) == ("branch", (16000, 16001))
    source = make_source(model)
    samples = list(source)
    assert [int(s["sr"]) for s in samples] == [16000, 16001]
    assert samples[0]["input"].shape[1] >= 256 and "input[1]=128 fails on the fp32 model" in source.lengths.note
    proc = _cli(str(path), "--level", "O2", "-o", str(tmp_path / "o.onnx"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sr int64[] 16000, 16001 (one per sample)" in proc.stdout and "\nPASS" in proc.stdout


def test_the_verdict_says_which_if_branches_no_sample_ran(tmp_path):
    """Validation reads each If's condition from the reference's runs: the
    result counts the samples per branch, and where a branch ran on none
    (inputs given a range that takes one side) the verdict says it does
    not cover it, in the terminal, the JSON report and the library's result."""
    import jsonschema

    from amp_convert import api
    from amp_convert.report import report_schema

    model = _switch_model("Greater", 3)
    path = tmp_path / "switch.onnx"
    onnx.save(model, str(path))
    converted, _ = api.convert(str(path), level="O2")
    both = api.validate(str(path), converted, samples=2)
    assert [b.as_dict() for b in both.branches] == [{"node": "If_3", "then_branch": 1, "else_branch": 1}]
    assert both.branch_note == ""
    one = api.validate(str(path), converted, samples=3, input_range=["s=0:2"])  # (s <= 3: Not(s > 3) holds)
    assert [(b.then_runs, b.else_runs) for b in one.branches] == [(3, 0)]
    assert one.branch_note == "no sample ran the else_branch of If_3: the verdict does not cover it"
    report = tmp_path / "r.json"
    proc = _cli(str(path), "-o", str(tmp_path / "o.onnx"), "--input-range", "s=0:2", "--report", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "note: no sample ran the else_branch of If_3: the verdict does not cover it" in proc.stdout
    data = json.loads(report.read_text())
    jsonschema.validate(data, report_schema())
    assert data["validation"]["branches"] == [{"node": "If_3", "then_branch": 2, "else_branch": 0}]
