"""A model onnxruntime refuses is never a PASS (issue 27, item 5).

On the CPU provider a bf16 candidate (and an fp16 one) is validated through
its emulation twin, a float32 copy onnxruntime loads whatever the candidate's
types: the candidate as written is given to onnxruntime too, in a child
process. A type or graph refusal is the model's failure; a kernel the CPU
provider lacks, for a model aimed at CUDA, is expected and said in one line.
Real models on disk, real onnxruntime sessions.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_convert import ConvertOptions, as_written, convert, runner, segments
from amp_convert.auto import auto_convert
from amp_convert.cli import main
from amp_convert.errors import RefusedAsWritten
from amp_convert.inputs import make_source
from amp_convert.report import report_schema
from amp_convert.validation import ValidationConfig, validate
from models.zoo_inputs import load_manifest

ROOT = Path(__file__).resolve().parents[1]
F32, BF16, F16 = TensorProto.FLOAT, TensorProto.BFLOAT16, TensorProto.FLOAT16
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(initializers)), opset_imports=OPSETS)
    m.ir_version = 8
    return m


def _tensor(name: str, array: np.ndarray, elem: int) -> onnx.TensorProto:
    """``array`` stored as ``elem`` (bf16 by onnx's own rounding)."""
    if elem == F32:
        return numpy_helper.from_array(array.astype(np.float32), name)
    return helper.make_tensor(name, elem, array.shape, array.astype(np.float32).ravel().tolist())


def inverse_pair() -> tuple[onnx.ModelProto, onnx.ModelProto, list[str]]:
    """x (4x4) + 4I -> com.microsoft::Inverse -> y, in fp32 and as a bf16
    candidate (Cast in, Add and Inverse in bf16, Cast out): onnxruntime's
    schema of Inverse admits float16, float and double only. With the
    sample ranges that keep the matrix well conditioned."""
    eye = np.eye(4, dtype=np.float32) * 4

    def build(elem: int) -> onnx.ModelProto:
        low = elem != F32
        nodes = [helper.make_node("Cast", ["x"], ["xl"], name="x_cast", to=elem)] if low else []
        nodes += [
            helper.make_node("Add", ["xl" if low else "x", "eye"], ["a"], name="add"),
            helper.make_node("Inverse", ["a"], ["yl" if low else "y"], name="inv", domain="com.microsoft"),
        ]
        nodes += [helper.make_node("Cast", ["yl"], ["y"], name="y_cast", to=F32)] if low else []
        x, y = helper.make_tensor_value_info("x", F32, [4, 4]), helper.make_tensor_value_info("y", F32, [4, 4])
        return _model(nodes, [x], [y], [_tensor("eye", eye, elem)])

    return build(F32), build(BF16), ["x=-1:1"]


def embed_layernorm_pair() -> tuple[onnx.ModelProto, onnx.ModelProto, list[str]]:
    """com.microsoft::EmbedLayerNormalization (what onnxruntime's BERT
    optimizer fuses the embeddings into) in fp32, and as a bf16 candidate
    (its tables, gamma and beta stored bf16, its output Cast back): its
    onnxruntime schema admits float and float16 only."""
    rng = np.random.default_rng(0)
    tables = {
        "word": rng.standard_normal((16, 8)),
        "pos": rng.standard_normal((8, 8)),
        "seg": rng.standard_normal((2, 8)),
        "gamma": 1 + 0.1 * rng.standard_normal(8),
        "beta": 0.1 * rng.standard_normal(8),
    }

    def build(elem: int) -> onnx.ModelProto:
        low = elem != F32
        names = ["ids", "segments", "word", "pos", "seg", "gamma", "beta"]
        nodes = [
            helper.make_node(
                "EmbedLayerNormalization",
                names,
                ["el" if low else "emb", "mask_index"],
                name="embed",
                domain="com.microsoft",
                epsilon=1e-5,
            )
        ]
        nodes += [helper.make_node("Cast", ["el"], ["emb"], name="emb_cast", to=F32)] if low else []
        inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, [1, 8]) for n in ("ids", "segments")]
        output = helper.make_tensor_value_info("emb", F32, [1, 8, 8])
        return _model(nodes, inputs, [output], [_tensor(n, a, elem) for n, a in tables.items()])

    return build(F32), build(BF16), ["ids=0:16", "segments=0:2"]


PAIRS = {"Inverse": inverse_pair, "EmbedLayerNormalization": embed_layernorm_pair}
CPU = ValidationConfig(provider="cpu")


@pytest.fixture
def load_calls(monkeypatch) -> list[str]:
    """The models (their graph names) validation asks onnxruntime to load
    as written in a child process: the real :class:`runner.LoadCheck`, counted."""
    calls: list[str] = []

    class Counted(runner.LoadCheck):
        def __init__(self, model, provider, base_dir=None):
            calls.append(model.graph.name)
            super().__init__(model, provider, base_dir)

    monkeypatch.setattr(as_written, "LoadCheck", Counted)
    return calls


@pytest.mark.parametrize("op", PAIRS)
def test_a_bf16_model_onnxruntime_refuses_is_no_pass(op, load_calls):
    """The emulation twin (float32) loads and matches the reference, so
    validation passed it; onnxruntime refuses the candidate as written
    (INVALID_GRAPH: its schema of the op has no bfloat16): validation
    fails with onnxruntime's reason, the candidate named, after one load."""
    reference, candidate, ranges = PAIRS[op]()
    source = make_source(reference, ranges=ranges)
    assert validate(reference, candidate, source, ValidationConfig(provider="cpu", load_check=False)).passed
    assert load_calls == []
    with pytest.raises(RefusedAsWritten) as refused:
        validate(reference, candidate, source, CPU)
    assert refused.value.role == "candidate" and refused.value.provider == "cpu"
    assert "INVALID_GRAPH" in refused.value.detail and "tensor(bfloat16)" in refused.value.detail
    assert f"({op})" in refused.value.detail
    assert len(load_calls) == 1


IN_PARTS = replace(CPU, part_bytes=1)  # (the child's load waits first: see Validator.check)


@pytest.mark.parametrize("op", PAIRS)
def test_the_refusal_is_the_same_whether_the_load_runs_alongside_or_first(op, load_calls):
    """Validation runs while the child loads the candidate, except in parts
    (weights over ``part_bytes``), where the load comes first: the same
    refusal either way, one load each."""
    reference, candidate, ranges = PAIRS[op]()
    source = make_source(reference, ranges=ranges)
    assert segments.worth_splitting(reference, IN_PARTS.part_bytes)
    said = []
    for config in (CPU, IN_PARTS):
        with pytest.raises(RefusedAsWritten) as refused:
            validate(reference, candidate, source, config)
        said.append((refused.value.detail, refused.value.role, refused.value.provider))
    assert said[0] == said[1] and "INVALID_GRAPH" in said[0][0]
    assert len(load_calls) == 2


def test_a_refusal_is_reported_before_a_failure_validation_finds_meanwhile(load_calls):
    """A refused candidate whose output is also renamed: validation's own
    error (the outputs differ) comes while the child loads, and the refusal,
    which would have been found first, is what is raised."""
    reference, candidate, ranges = inverse_pair()
    candidate.graph.output[0].name = candidate.graph.node[-1].output[0] = "renamed"
    with pytest.raises(RefusedAsWritten) as refused:
        validate(reference, candidate, make_source(reference, ranges=ranges), CPU)
    assert "INVALID_GRAPH" in refused.value.detail and len(load_calls) == 1


def test_an_interrupted_validation_leaves_no_child_and_no_copy(monkeypatch, tmp_path):
    """Interrupted at its first sample, validation stops the child still
    loading the candidate (or reaps it) and removes the candidate's copy."""
    started: list[subprocess.Popen] = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            started.append(self)

    monkeypatch.setattr(runner.subprocess, "Popen", Recorded)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    reference, entry = _resnet50()
    candidate = convert(reference, ConvertOptions(level="O2")).model

    def interrupt(_):
        raise KeyboardInterrupt

    from helpers import manifest_source

    with pytest.raises(KeyboardInterrupt):
        validate(reference, candidate, manifest_source(entry, reference), CPU, progress=interrupt)
    assert len(started) == 1 and started[0].poll() is not None
    assert list(tmp_path.iterdir()) == []


def test_the_kernel_note_is_the_same_whether_the_load_runs_alongside_or_first():
    """ResNet-50 at O2 bf16 on the CPU: the note validation carries, with
    its load alongside or first, is the one loading it on its own gives."""
    from helpers import manifest_source

    reference, entry = _resnet50()
    candidate = convert(reference, ConvertOptions(level="O2", dtype="bf16")).model
    with as_written.PendingAsWritten(candidate, BF16, "cpu", emulated=True) as alone_load:
        alone = alone_load.result().note
    source = manifest_source(entry, reference)
    notes = [validate(reference, candidate, source, config).kernel_note for config in (CPU, IN_PARTS)]
    assert notes == [alone, alone] and "no bfloat16 kernel" in alone


def test_compare_names_onnxruntimes_refusal_of_the_candidate(tmp_path, capsys):
    """compare of a bf16 candidate onnxruntime refuses: exit 2, as for any
    candidate file it cannot load (the candidate is the user's input here),
    one line with onnxruntime's reason; nothing passes."""
    reference, candidate, ranges = embed_layernorm_pair()
    ref, cand = tmp_path / "ref.onnx", tmp_path / "cand.onnx"
    onnx.save(reference, ref)
    onnx.save(candidate, cand)
    report = tmp_path / "r.json"
    args = ["compare", str(ref), str(cand), "--provider", "cpu", "--report", str(report)]
    assert main([*args, *(a for r in ranges for a in ("--input-range", r))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{cand} cannot be loaded by onnxruntime where {ref} runs" in err
    assert "tensor(bfloat16)" in err and "(EmbedLayerNormalization)" in err
    assert not report.exists()


def test_a_conversion_onnxruntime_refuses_in_bf16_exits_3(tmp_path, capsys):
    """At O1 the LayerNorm written out in ops stays fp32 between low
    MatMuls, and onnxruntime 1.31's LayerNormFusion takes the bf16 Cast in
    front of it in: a type error ('bound to different types'). The fp16
    model's load check said so; the bf16 one, validated through the
    emulation on the CPU, passed (exit 0). Exit 3, onnxruntime's reason in
    one line, nothing written."""
    from models.hostile import layernorm_large_sums

    path, out = tmp_path / "ln.onnx", tmp_path / "ln.bf16.onnx"
    onnx.save(layernorm_large_sums(), path)
    args = [str(path), "-o", str(out), "-q", "--provider", "cpu", "--level", "O1", "--dtype", "bf16", "--no-safety"]
    assert main(args) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "cannot load the converted model on cpu" in err and "Type Error" in err and "tensor(bfloat16)" in err
    assert not out.exists()


def _resnet50() -> tuple[onnx.ModelProto, dict]:
    entry = next(e for e in load_manifest(str(ROOT / "models/zoo/manifest.json")) if e["name"] == "resnet50")
    return onnx.load(entry["path"]), entry


def _kernel_node(note: str, candidate: onnx.ModelProto) -> onnx.NodeProto:
    """The candidate's node the note names, which must exist and compute in bf16."""
    found = re.fullmatch(
        r"onnxruntime's CPU provider has no bfloat16 kernel for (\w+)\((\d+)\) \(node (\S+), the first it met\): "
        r"expected for a model aimed at CUDA; validated through the emulation",
        note,
    )
    assert found, note
    op, _, name = found.groups()
    node = next(n for n in candidate.graph.node if n.name == name)
    assert node.op_type == op
    return node


def test_a_bf16_zoo_model_passes_on_the_cpu_saying_which_kernel_is_missing(load_calls):
    """ResNet-50 at O2 bf16: onnxruntime's CPU provider refuses it as
    written for a missing bf16 kernel (NOT_IMPLEMENTED), expected for a
    model aimed at CUDA: validation passes through the emulation, its note
    naming the op and node onnxruntime named, one child load."""
    from helpers import manifest_source

    reference, entry = _resnet50()
    candidate = convert(reference, ConvertOptions(level="O2", dtype="bf16")).model
    said = runner.load_refusal(candidate, "cpu")
    assert said is not None and "NOT_IMPLEMENTED" in said
    load_calls.clear()
    result = validate(reference, candidate, manifest_source(entry, reference), CPU)
    assert result.passed and result.emulated and len(load_calls) == 1
    node = _kernel_node(result.kernel_note, candidate)
    assert f"'{node.name}'" in said and f"{node.op_type}(" in said  # (what onnxruntime itself said)
    assert result.as_dict()["kernel_note"] == result.kernel_note


def test_the_kernel_note_is_in_every_report(tmp_path, capsys):
    """The command's terminal output, JSON report (valid against its
    schema) and HTML page each say it in one line; exit 0."""
    out, report, page = tmp_path / "r.bf16.onnx", tmp_path / "r.json", tmp_path / "r.html"
    args = [str(ROOT / "models/zoo/resnet50.onnx"), "-o", str(out), "--level", "O2", "--dtype", "bf16", "--provider", "cpu"]
    assert main([*args, "--report", str(report), "--html", str(page)]) == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    data = json.loads(report.read_text())
    jsonschema.validate(data, report_schema())
    note = data["validation"]["kernel_note"]
    _kernel_node(note, onnx.load(out))
    assert shown == [f"note: {note}"]
    assert note.replace("'", "&#x27;") in page.read_text()
    assert out.exists()


def test_a_model_that_loads_as_written_has_no_note_and_fp32_candidates_are_not_loaded_again(load_calls):
    """An fp16 ResNet-50 loads on the CPU as written: no note. An fp32
    candidate (O0) runs as written in validation itself: no child load."""
    from helpers import manifest_source

    reference, entry = _resnet50()
    source = manifest_source(entry, reference)
    fp16 = validate(reference, convert(reference, ConvertOptions(level="O2")).model, source, CPU)
    assert fp16.passed and fp16.kernel_note == "" and len(load_calls) == 1
    fp32 = validate(reference, convert(reference, ConvertOptions(level="O0")).model, source, CPU)
    assert fp32.kernel_note == "" and len(load_calls) == 1


def test_the_auto_search_loads_only_its_chosen_model_as_written(load_calls):
    """The search's trials are not loaded as written (one child each): its
    chosen model is, once, and its validation carries the note."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["s"], name="mm2"),
        helper.make_node("Softmax", ["s"], ["y"], name="softmax"),  # (black-listed: a trial runs it low)
    ]
    weights = [numpy_helper.from_array((0.3 * rng.standard_normal((8, 8))).astype(np.float32), n) for n in ("w1", "w2")]
    x, y = helper.make_tensor_value_info("x", F32, [2, 8]), helper.make_tensor_value_info("y", F32, [2, 8])
    reference = _model(nodes, [x], [y], weights)
    searched = auto_convert(reference, ConvertOptions(dtype="bf16"), make_source(reference), CPU, None, 4, "O2")
    assert searched.validation is not None and len(searched.trials) >= 2
    assert len(load_calls) == 1
    assert "no bfloat16 kernel for" in searched.validation.kernel_note


def test_missing_kernel_reads_both_of_onnxruntimes_messages():
    """The default domain's ('Could not find an implementation for Relu(14)
    node with name ...') and a contrib op's ('Failed to find kernel for
    com.microsoft.BiasAdd(1) (node:...)'), as onnxruntime 1.31 words them
    for real models; a type refusal is no missing kernel."""

    def one(op: str, elem: int, n_inputs: int, domain: str = "") -> onnx.ModelProto:
        shapes = [[1, 2, 4], [4], [1, 2, 4]][:n_inputs]
        inputs = [helper.make_tensor_value_info(f"x{i}", elem, s) for i, s in enumerate(shapes)]
        node = helper.make_node(op, [v.name for v in inputs], ["y"], name="the_node", domain=domain)
        return _model([node], inputs, [helper.make_tensor_value_info("y", elem, None)])

    relu = runner.load_refusal(one("Relu", BF16, 1), "cpu")
    assert as_written.missing_kernel(relu) == as_written.MissingKernel("Relu", 14, "the_node"), relu
    bias_add = runner.load_refusal(one("BiasAdd", F16, 3, "com.microsoft"), "cpu")
    assert as_written.missing_kernel(bias_add) == as_written.MissingKernel("com.microsoft.BiasAdd", 1, "the_node"), bias_add
    refused = runner.load_refusal(one("BiasAdd", BF16, 3, "com.microsoft"), "cpu")
    assert "INVALID_GRAPH" in refused and as_written.missing_kernel(refused) is None


def test_a_missing_cpu_kernel_is_the_models_failure_where_it_is_aimed_at_the_cpu():
    """The same bf16 ResNet-50, validated for a conversion aimed at the CPU
    provider: the kernel onnxruntime lacks is where the model is meant to
    run, so the refusal is the model's failure."""
    from helpers import manifest_source

    reference, entry = _resnet50()
    candidate = convert(reference, ConvertOptions(level="O2", dtype="bf16")).model
    config = ValidationConfig(provider="cpu", target_provider="cpu")
    with pytest.raises(RefusedAsWritten) as refused:
        validate(reference, candidate, manifest_source(entry, reference), config)
    assert "NOT_IMPLEMENTED" in refused.value.detail and refused.value.role == "candidate"


def test_aimed_at_the_cpu_a_bf16_conversion_keeps_what_the_cpu_cannot_run_fp32(tmp_path, capsys):
    """Converted for the CPU provider, the plan itself keeps the nodes
    without a CPU bf16 kernel fp32: the model loads as written, no note."""
    out, report = tmp_path / "r.bf16.onnx", tmp_path / "r.json"
    args = [str(ROOT / "models/zoo/resnet50.onnx"), "-o", str(out), "--level", "O2", "--dtype", "bf16", "--provider", "cpu"]
    assert main([*args, "--target-provider", "cpu", "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["validation"]["kernel_note"] == ""
    assert runner.load_refusal(onnx.load(out), "cpu") is None
