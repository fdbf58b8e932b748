"""Safety rules and --level auto on fp16-hostile models and the zoo."""

from __future__ import annotations

import html
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import init, manifest_source, model, pads_model, value
from onnx import helper

from amp_convert import ConvertOptions, Precision, convert
from amp_convert.auto import auto_convert
from amp_convert.calibrate import calibrate
from amp_convert.constant_stats import chunked_facts, segment_counts, value_stats
from amp_convert.dtypes import BF16, FP16
from amp_convert.inputs import make_source
from amp_convert.lower_values import RewriteStats, lower_small_tensors, lower_tensor
from amp_convert.opset import upgrade_opset
from amp_convert.safety import ConstantRanges
from amp_convert.validation import ValidationConfig, validate
from models.hostile import CULPRITS, HOSTILE
from models.zoo_inputs import load_manifest

ROOT = Path(__file__).resolve().parents[1]
ZOO = {e["name"]: e for e in load_manifest(str(ROOT / "models" / "zoo" / "manifest.json"))}
PYPI = ROOT / "models" / "cache" / "pypi" / "manifest.json"  # (fetched by `make test`)
REAL = {e["name"]: e for e in load_manifest(str(PYPI))} if PYPI.is_file() else {}
CPU = ValidationConfig(provider="cpu")
# Rules that may legitimately keep a culprit fp32.
KEEPING_RULES = {"black-list", "safety-data-range", "safety-initializer-range"}


def cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("amp-convert")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hostile")
    for name, build in HOSTILE.items():
        onnx.save(build(), str(folder / f"{name}.onnx"))
    return folder


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_model_passes_at_o2_with_safety_and_names_the_rule(name, hostile_dir, tmp_path):
    path = hostile_dir / f"{name}.onnx"
    proc = cli(str(path), "--level", "O2", "-o", str(tmp_path / "o2.onnx"), "--plan-json", str(tmp_path / "plan.json"), "-q")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    if any(f["node"] == CULPRITS[name] for f in plan["folded"]):  # (a BatchNormalization kept fp32 is folded, in fp32)
        return
    culprit = next(n for n in plan["nodes"] if n["name"] == CULPRITS[name])
    assert culprit["precision"] == "fp32" and culprit["rule"] in KEEPING_RULES, culprit


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_model_fails_at_o3(name, hostile_dir, tmp_path):
    report = tmp_path / "r.json"
    proc = cli(str(hostile_dir / f"{name}.onnx"), "--level", "O3", "-o", str(tmp_path / "o3.onnx"), "--report", str(report), "-q")
    assert proc.returncode == 1
    validation = json.loads(report.read_text())["validation"]
    assert not validation["passed"]
    assert CULPRITS[name] in [o["name"] for o in validation["offenders"][:3]]


def test_user_force_low_beats_the_safety_rule(hostile_dir, tmp_path):
    plan_path = tmp_path / "plan.json"
    path = hostile_dir / "attention_unscaled.onnx"
    proc = cli(
        str(path), "--level", "O2", "-o", str(tmp_path / "o.onnx"), "--force-low", "^scores$", "--plan-json", str(plan_path), "-q"
    )
    assert proc.returncode == 1  # the user asked for it; validation says what it costs
    scores = next(n for n in json.loads(plan_path.read_text())["nodes"] if n["name"] == "scores")
    assert scores["precision"] == "low" and scores["rule"] == "user-force-low"


@pytest.mark.parametrize(("mode", "precision"), [("reflect", "low"), ("constant", "fp32")])
def test_the_command_judges_a_pad_on_its_constant_value_in_constant_mode_only(mode, precision, tmp_path):
    """A Pad-13 whose constant_value (1e10) is beyond fp16's range, in a
    model on disk converted by the command at O2 and validated: in reflect
    mode it never reads that value and runs low (it stayed fp32, as the one
    in constant mode, the default, does); both pass validation."""
    path, plan_path = tmp_path / "pad.onnx", tmp_path / "plan.json"
    onnx.save(pads_model([mode], 13), str(path))
    proc = cli(str(path), "--level", "O2", "-o", str(tmp_path / "o.onnx"), "--plan-json", str(plan_path), "-q")
    assert proc.returncode == 0, proc.stderr
    pad = next(n for n in json.loads(plan_path.read_text())["nodes"] if n["name"] == "pad0")
    assert pad["precision"] == precision
    assert (pad["rule"] == "safety-initializer-range") is (mode == "constant")


@pytest.mark.parametrize(
    ("mode", "level", "returncode", "precision", "blamed"),
    [
        ("reflect", "O1", 0, "low", False),
        ("reflect", "O2", 0, "low", False),
        ("constant", "O1", 0, "fp32", False),
        ("constant", "O2", 0, "fp32", False),
        ("constant", "O3", 1, "low", True),
    ],
)
def test_a_constant_node_a_pad_does_not_use_neither_keeps_it_fp32_nor_is_blamed(
    mode, level, returncode, precision, blamed, tmp_path
):
    """A Pad-13 whose constant_value (1e10) comes from a Constant node, in
    the command's default run (calibrated and validated): in reflect mode
    the calibrated rule kept it fp32 ("'cv' reaches 1e+10 in the fp32 run"),
    and once it ran low the per-node diff ranked the Constant, stored
    clipped, first (0 -> 1), though nothing uses its value. In constant mode
    the value is used: kept fp32 at O1/O2, clipped and blamed at O3."""
    path, plan_path, report_path = tmp_path / "pad.onnx", tmp_path / "plan.json", tmp_path / "r.json"
    onnx.save(pads_model([mode], 13, constant_node=True), str(path))
    args = ["--level", level, "-o", str(tmp_path / "o.onnx"), "--plan-json", str(plan_path), "--report", str(report_path)]
    proc = cli(str(path), *args)
    assert proc.returncode == returncode, proc.stderr
    pad = next(n for n in json.loads(plan_path.read_text())["nodes"] if n["name"] == "pad0")
    assert pad["precision"] == precision
    validation = json.loads(report_path.read_text())["validation"]
    assert validation["passed"] is not blamed
    assert ("cvc" in [n["name"] for n in validation["offenders"]]) is blamed
    assert ("cvc (Constant, low)" in proc.stdout) is blamed


@pytest.mark.parametrize(
    ("modes", "opset", "level", "clipped"),
    [
        (["reflect"], 13, "O2", {}),
        (["wrap"], 19, "O2", {}),
        (["reflect", "constant"], 13, "O2", {}),  # (cv shared: fp32 for the constant Pad, a low copy for the other)
        (["reflect"], 13, "O3", {}),
        (["constant"], 13, "O3", {"cv": 1}),
        (["reflect", "constant"], 13, "O3", {"cv": 1}),
    ],
    ids=["reflect", "wrap", "reflect-and-constant", "reflect-O3", "constant-O3", "both-O3"],
)
def test_a_constant_value_a_pad_does_not_use_is_stored_low_without_a_clipping_report(modes, opset, level, clipped, tmp_path):
    """A Pad outside constant mode runs low and reads its constant_value
    (1e10) in fp16, as its schema asks: the value is stored clipped, but
    what no node uses is not reported (the command said "constants changed
    to fit fp16: 1 value(s) clipped to fp16's largest value (in cv)", and
    the JSON counted it). A Pad in constant mode that runs low (O3) uses
    the value: its clipping is reported as before."""
    path, report_path = tmp_path / "pad.onnx", tmp_path / "r.json"
    onnx.save(pads_model(modes, opset), str(path))
    out = tmp_path / "o.onnx"
    # (no kernel filtering: CUDA's Pad kernels stop before opset 19)
    proc = cli(
        str(path), "--level", level, "-o", str(out), "--report", str(report_path), "--no-validate", "--target-provider", "none"
    )
    assert proc.returncode == 0, proc.stderr
    rewrite = json.loads(report_path.read_text())["conversion"]["rewrite"]
    assert rewrite["clipped"] == clipped and rewrite["values_clipped"] == sum(clipped.values())
    assert ("1 value(s) clipped to fp16's largest value (in cv)" in proc.stdout) is bool(clipped)
    written = onnx.load(str(out))
    stored = {t.name: t for t in written.graph.initializer}
    pad = next(n for n in written.graph.node if n.name == "pad0")
    value = stored[pad.input[2]]
    assert value.data_type == onnx.TensorProto.FLOAT16 and onnx.numpy_helper.to_array(value) == 65504


@pytest.mark.parametrize("constant_node", [False, True], ids=["initializer", "constant-node"])
def test_a_constant_value_that_reaches_a_reflect_pad_through_an_identity_is_unused_too(constant_node):
    """A reflect Pad's constant_value (1e10) read through an Identity,
    from an initializer or a Constant: as read directly, it reaches no
    value. The Identity was judged on it (kept fp32 at O2 by either safety
    rule, the Constant with it), its clipping at O3 was reported, and the
    per-node diff ranked the Constant, stored clipped, first. Now all run
    low at O2 as the Pad does, nothing is clipped, nothing is blamed."""
    m = pads_model(["reflect"], 13, constant_node=constant_node, identity=True)
    source = make_source(m, samples=2)
    calibration = calibrate(m, source, "cpu")
    for initializer_range in (True, False):  # (with both safety rules; the calibrated one alone)
        out, plan = convert(m, level="O2", calibration=calibration, initializer_range=initializer_range)
        for name in ("idn", "pad0", "mul0", *(["cvc"] if constant_node else [])):
            assert plan.by_name(name).precision is Precision.LOW, plan.by_name(name)
        result = validate(m, out, source, CPU, plan, calibration=calibration)
        assert result.passed and [n.name for n in result.ranked()] == ["mm"]
    o3 = convert(m, level="O3")
    assert o3.stats.clipped == {}
    result = validate(m, o3.model, source, CPU, o3.plan)
    assert result.passed and [n.name for n in result.ranked()] == ["mm"]


def test_a_constant_value_that_an_identity_passes_to_a_pad_that_uses_it_is_used():
    """Conservative: the Identity's output reaches a reflect Pad and a Pad
    in constant mode, which pads with it: the value is used, so that Pad
    stays fp32 at O2 (the Identity with it), and its clipping at O3 is
    reported."""
    m = pads_model(["reflect", "constant"], 13, identity=True)
    _, plan = convert(m, level="O2")
    assert plan.by_name("pad1").rule == "safety-initializer-range" and plan.by_name("idn").precision is Precision.FP32
    assert plan.by_name("pad0").precision is Precision.LOW
    assert convert(m, level="O3").stats.clipped == {"cv": 1}


def test_a_constant_used_in_a_branch_keeps_its_clipping_report_beside_an_unused_one_of_its_name():
    """Clipping counts go by a constant's name, over every graph. The main
    graph's cv (1e10) feeds a reflect-mode Pad, which does not use it; each
    If branch holds a constant of its own named cv, which a constant-mode
    Pad pads with: at O3 all three are stored clipped, and the branches'
    clipping, which reaches their outputs, is reported (forgetting the
    unused one's by name forgot theirs too)."""
    half, cv = init("half", np.float32(0.5)), init("cv", np.float32(1e10))

    def branch(tag: str) -> onnx.GraphProto:
        nodes = [
            helper.make_node("Pad", ["h", "pads", "cv"], [f"p{tag}"], name=f"pad{tag}"),
            helper.make_node("Mul", [f"p{tag}", "half"], [f"o{tag}"], name=f"mul{tag}"),
        ]
        return helper.make_graph(nodes, f"b{tag}", [], [value(f"o{tag}", shape=(1, 6))], [cv])

    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Pad", ["h", "pads", "cv"], ["pr"], name="padr", mode="reflect"),
        helper.make_node("Mul", ["pr", "half"], ["yr"], name="mulr"),
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="rs"),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
        helper.make_node("If", ["c"], ["y"], then_branch=branch("t"), else_branch=branch("e"), name="if"),
    ]
    weights = init("W", np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4))
    initializers = [weights, init("pads", np.int64([0, 1, 0, 1])), cv, half, init("zero", np.float32(0))]
    m = model(nodes, [value("x", shape=(1, 4))], [value("yr", shape=(1, 6)), value("y", shape=(1, 6))], initializers)
    result = convert(m, level="O3")
    assert result.stats.clipped == {"cv": 3}
    # Without the branches, the main graph's unused cv is not reported.
    alone = model(nodes[:3], [value("x", shape=(1, 4))], [value("yr", shape=(1, 6))], initializers[:4])
    assert convert(alone, level="O3").stats.clipped == {}


def test_calibrated_rule_needs_reference_data():
    m = HOSTILE["softmax_large_logits"]()
    _, plan = convert(m, level="O2")
    assert plan.by_name("logits").precision is Precision.LOW
    assert "calibrated range rule inactive: no reference data" in plan.notes
    calibration = calibrate(m, make_source(m, samples=3), "cpu")
    assert calibration.samples == 3 and calibration.abs_max("logits") > 65504
    assert set(calibration.ranges) >= {"h", "hr", "logits", "y"}  # only ranges are kept, per tensor
    _, plan = convert(m, level="O2", calibration=calibration)
    assert plan.by_name("logits").rule == "safety-data-range"
    _, plan = convert(m, level="O2", calibration=calibration, data_max=1e6)
    assert plan.by_name("logits").precision is Precision.LOW


def test_batched_constant_statistics_match_the_per_tensor_ones():
    """The vectorised pass over small weights must count exactly what the
    per-tensor statistics count: maxima, zeros, values that flush to zero."""
    rng = np.random.default_rng(0)
    arrays = {
        "first": np.array([3e-8, 1.0], np.float32),  # (a tiny value in the first and in the last tensor of a pass)
        "plain": rng.standard_normal(7).astype(np.float32),
        "zeros": np.zeros(5, np.float32),
        "tiny": np.array([0.0, 1e-9, -2e-8, 1e-41, 2.0, -7e4], np.float32),
        "one": np.array([1e-30], np.float32),
        "inf": np.array([1.0, np.inf], np.float32),
    }
    arrays |= {f"w{i}": rng.standard_normal(40 + i).astype(np.float32) for i in range(20)}
    arrays["large"] = rng.standard_normal(300).astype(np.float32) * 1e5  # over ``most``: left to stats()
    arrays["last"] = np.array([1.0, -1e-40], np.float32)
    tensors = {name: init(name, a) for name, a in arrays.items()}
    for chunk in (1 << 22, 64):  # all in one pass; a pass every few tensors
        ranges = ConstantRanges()
        ranges.adopt("", chunked_facts(tensors, FP16, most=256, chunk=chunk))
        assert ranges.known("", "large") is None and ranges.known("", "inf") is None  # (left to stats())
        assert ranges.known("", "w3") == value_stats(arrays["w3"])
        for name, tensor in tensors.items():
            assert ranges.stats("", name, tensor) == value_stats(arrays[name]), name
        assert ranges.stats("", "tiny", tensors["tiny"]).underflow_fp16 == 3
        assert ranges.stats("", "last", tensors["last"]).underflow_bf16 == 0


@pytest.mark.parametrize("low", [FP16, BF16], ids=["fp16", "bf16"])
def test_constants_converted_in_the_batched_pass_are_what_converting_each_gives(low):
    """The planner's pass over small constants also converts them for the
    rewrite: each one's bytes and flushed count must be those of converting
    it alone; one to clip, a non-finite one, one too large or of another
    dtype is left to the per-tensor path."""
    rng = np.random.default_rng(3)
    arrays = {f"w{i}": rng.standard_normal(30 + i).astype(np.float32) for i in range(12)}
    arrays["tiny"] = np.array([0.0, 1e-9, -2e-8, 1e-41, 2.0, -3e-39], np.float32)  # (flushed in fp16, one in bf16)
    arrays["big"] = np.array([1.0, -7e4], np.float32)  # (beyond fp16: clipped by the per-tensor path)
    arrays["nan"] = np.array([np.nan, 1.0], np.float32)
    arrays["large"] = rng.standard_normal(300).astype(np.float32)
    tensors = {name: init(name, a) for name, a in arrays.items()}
    tensors["int"] = init("int", np.arange(4, dtype=np.int64))
    for chunk in (1 << 22, 50):
        ranges = ConstantRanges()
        ranges.adopt("g", chunked_facts(tensors, low, most=256, chunk=chunk))
        names = [*arrays, "int"]
        batch = ranges.low_values("g", names, low)
        assert batch == [ranges.low_values("g", [name], low)[0] for name in names]  # (the same, asked one by one)
        for (name, a), found in zip(arrays.items(), batch, strict=False):
            if name in ("nan", "large") or (name == "big" and low is FP16):
                assert found is None, name
                continue
            alone = RewriteStats()
            lower_tensor(init(name, a), low, alone)
            assert found == (a.astype(low.numpy).tobytes(), alone.flushed.get(name, 0)), name
        assert batch[-1] is None and ranges.low_values("other", ["w1"], low) == [None]
        other = BF16 if low is FP16 else FP16
        assert ranges.low_values("g", ["w1"], other) == [None]  # (converted to another dtype: not handed over)
    assert ranges.low_values("g", ["tiny"], low)[0][1] == (4 if low is FP16 else 1)
    ranges.drop_values("g")  # (once the graph is rewritten: the values go, the statistics stay)
    assert ranges.low_values("g", ["w1"], low) == [None] and ranges.known("g", "w1") == value_stats(arrays["w1"])


def test_nodes_resolved_backwards_like_an_earlier_one_still_face_the_safety_rules():
    """The backward pass hands a node fed only by constants and graph inputs
    the decision of the first node of its kind whose consumers needed the
    same types: each node's own constants are still checked."""
    scales = {"a": [0.5, 2.0], "b": [1e6, 2.0], "c": [3.0, 0.25], "d": [1.5, 0.5]}
    nodes, inits, outputs = [], [], []
    for k, values in scales.items():
        nodes.append(helper.make_node("Mul", ["x", f"s_{k}"], [f"m_{k}"], name=f"scale_{k}"))
        nodes.append(helper.make_node("MatMul", [f"m_{k}", "w"], [f"y_{k}"], name=f"mm_{k}"))
        inits.append(init(f"s_{k}", np.array(values, np.float32).reshape(2, 1)))
        outputs.append(value(f"y_{k}"))
    m = model(nodes, [value("x")], outputs, [*inits, init("w", np.eye(4, dtype=np.float32))])
    plan = convert(m, level="O2").plan
    decided = {k: (plan.by_name(f"scale_{k}").precision, plan.by_name(f"scale_{k}").rule) for k in scales}
    assert decided["b"] == (Precision.FP32, "safety-initializer-range")
    assert decided["a"] == decided["c"] == decided["d"] == (Precision.LOW, "follow")
    assert plan.by_name("scale_c").reason == plan.by_name("scale_a").reason


def test_segment_counts_count_each_segment_like_a_sum():
    rng = np.random.default_rng(1)
    marks = rng.random(1000) < 0.01
    marks[0] = marks[-1] = True
    starts = np.array([0, 0, 5, 5, 5, 300, 999])  # (empty segments: at the start and in the middle)
    ends = [*starts[1:], len(marks)]
    expected = {k: int(marks[a:b].sum()) for k, (a, b) in enumerate(zip(starts, ends, strict=True)) if marks[a:b].any()}
    assert segment_counts(marks, starts) == expected
    assert segment_counts(np.zeros(10, bool), np.array([0, 4])) == {}


def test_small_weights_lowered_in_one_pass_count_what_the_per_tensor_path_counts():
    """Flushed values counted per weight, batched or one by one."""
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (3, 1, 8, 5)]
    arrays[0][1] = 1e-9  # flushes in fp16
    arrays[2][[0, 7]] = [-3e-8, 2e-9]
    arrays[3][4] = 1e-41  # flushes in both
    for low in (FP16, BF16):
        batched, alone = RewriteStats(), RewriteStats()
        lower_small_tensors([init(f"w{k}", a) for k, a in enumerate(arrays)], low, batched)
        for k, a in enumerate(arrays):
            lower_tensor(init(f"w{k}", a), low, alone)
        assert batched.flushed == alone.flushed and batched.flushed


def test_clip_initializers_lowers_and_counts_instead_of_keeping_fp32():
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Mul", ["h", "big"], ["y"], name="scale")]
    inits = [init("W", np.eye(4, dtype=np.float32)), init("big", np.array([1e6, 2.0], np.float32).reshape(2, 1))]
    m = model(nodes, [value("x")], [value("y")], inits)
    result = convert(m, level="O2", clip_initializers=True)
    assert result.plan.by_name("scale").precision is Precision.LOW
    assert result.stats.clipped == {"big": 1}


def test_clipped_and_flushed_values_are_told_on_the_terminal_and_the_page(tmp_path):
    """Counted, never silently: not only in the JSON."""
    w = np.full((4, 4), 0.5, np.float32)
    w[0, 0], w[1, 1], w[2, 2] = 1e5, -2e5, 1e-9
    path = tmp_path / "range.onnx"
    onnx.save(
        model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [value("x")], [value("y")], [init("W", w)]), str(path)
    )
    page = tmp_path / "r.html"
    proc = cli(str(path), "--level", "O3", "-o", str(tmp_path / "o.onnx"), "--no-validate", "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    told = "constants changed to fit fp16: 2 value(s) clipped to fp16's largest value (in W); 1 value(s) flushed to zero (in W)"
    assert told in proc.stdout and html.escape(told) in page.read_text()
    quiet = cli(str(path), "--level", "O2", "-o", str(tmp_path / "o2.onnx"), "--no-validate")  # (kept fp32: nothing changed)
    assert quiet.returncode == 0 and "constants changed" not in quiet.stdout


@pytest.mark.parametrize("name", ["resnet50", "mobilenetv3", "vit", "convnext", "lstm", "controlflow"])
def test_safety_rules_keep_nothing_fp32_without_range_problems(name):
    reference = onnx.load(ZOO[name]["path"])
    calibration = calibrate(reference, manifest_source(ZOO[name], reference), "cpu")
    _, plan = convert(reference, level="O2", calibration=calibration)
    assert [e.name for e in plan if e.rule.startswith("safety")] == []


def _auto(name: str, reference: onnx.ModelProto, source, config: ValidationConfig = CPU, **kw):
    calibration = calibrate(reference, source, "cpu")
    return auto_convert(reference, ConvertOptions(), source, config, calibration, max_trials=12, **kw)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_auto_passes_on_hostile_models_keeping_only_what_overflows(name):
    reference = HOSTILE[name]()
    searched = _auto(name, reference, make_source(reference, samples=2))
    assert searched.validation is not None and searched.validation.passed
    assert len(searched.trials) <= 12
    kept = [e for e in searched.conversion.plan if e.precision is Precision.FP32]
    # Every fp32 node is there for a measured reason: a safety rule or the search's own evidence.
    assert all(e.rule in ("safety-data-range", "safety-initializer-range", "auto-keep-fp32") for e in kept), kept
    assert CULPRITS[name] in {e.name for e in kept}


@pytest.mark.parametrize("name", sorted({**ZOO, **REAL}))
def test_auto_passes_on_zoo_models_with_most_compute_low(name):
    """The reduced zoo and the real models from PyPI wheels."""
    entry = {**ZOO, **REAL}[name]
    reference = onnx.load(entry["path"])
    searched = _auto(name, reference, manifest_source(entry, reference))
    assert searched.validation is not None and searched.validation.passed
    assert searched.low_compute >= 0.9
    assert searched.conversion.plan.level == "auto"


def test_auto_hands_back_the_closest_failing_assignment_when_no_trial_passes(tmp_path):
    """Without pinned choices, after NonMaxSuppression any rounding upstream
    may swap boxes: no low-precision assignment meets the default
    tolerance. The result is the failing trial closest to passing, and it
    fails (it once was the fp32 model, handed back as a success)."""
    reference = onnx.load(ZOO["detector"]["path"])
    searched = _auto(
        "detector", reference, manifest_source(ZOO["detector"], reference, samples=1), config=replace(CPU, pin_choices=False)
    )
    assert not searched.validation.passed and len(searched.trials) == 12 and not any(t.passed for t in searched.trials)
    chosen = searched.trials[searched.chosen - 1]
    failing = sum(bool(o.verdict(searched.validation.tolerance)) for o in searched.validation.outputs)
    assert failing >= 1 and chosen.low_compute == searched.low_compute > 0
    assert any(e.precision is Precision.LOW for e in searched.conversion.plan)
    assert any("no assignment met the tolerance" in n and "fails" in n for n in searched.conversion.plan.notes)


def _loop_overflow(*between: onnx.NodeProto) -> onnx.ModelProto:
    """x -> MatMul "first" -> a0 -> ``between`` (a0 -> a; none: a0 is a) ->
    Loop -> MatMul "last" -> y. The Loop body's Exp overflows in fp16 (O2
    keeps it fp32, O3 does not), where the per-node diff does not see it."""
    rng = np.random.default_rng(1)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["ci"], ["co"]),
            helper.make_node("MatMul", ["si", "W"], ["mm"]),
            helper.make_node("Mul", ["mm", "k"], ["big"]),
            helper.make_node("Exp", ["big"], ["e"]),  # (overflows in fp16)
            helper.make_node("ReduceSum", ["e", "ax"], ["s"], keepdims=1),
            helper.make_node("Div", ["e", "s"], ["so"]),
        ],
        "body",
        [value("i", onnx.TensorProto.INT64, ()), value("ci", onnx.TensorProto.BOOL, ()), value("si", shape=(2, 8))],
        [value("co", onnx.TensorProto.BOOL, ()), value("so", shape=(2, 8))],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["a0" if between else "a"], name="first"),
        *between,
        helper.make_node("Loop", ["M", "", "a"], ["l"], name="loop", body=body),
        helper.make_node("MatMul", ["l", "W"], ["y"], name="last"),
    ]
    inits = [
        init("W", (rng.standard_normal((8, 8)) * 0.3).astype(np.float32)),
        init("M", np.array(2, np.int64)),
        init("k", np.array(30.0, np.float32)),
        init("ax", np.array([1], np.int64)),
    ]
    return model(nodes, [value("x", shape=(2, 8))], [value("y", shape=(2, 8))], inits, opset=13)


def test_auto_falling_back_to_o2_gives_back_the_nodes_it_kept_at_o3():
    """The fp16 overflow is inside a Loop body, which the per-node diff does
    not see: O3's error is blamed on a main-graph MatMul, kept fp32. O2
    keeps the body's Exp fp32 and passes without it: the search, falling
    back to O2, ends with no less low compute than plain O2 (it kept the
    MatMul fp32 there too)."""
    reference = _loop_overflow()
    source = make_source(reference, samples=2, ranges=["x=-3:3"])
    searched = _auto("loop", reference, source)
    steps = [t.step for t in searched.trials]
    assert "fall back to O2" in steps and searched.validation is not None and searched.validation.passed
    o2 = next(t for t in searched.trials if t.step == "fall back to O2")
    assert o2.kept_fp32 and searched.low_compute > o2.low_compute
    assert searched.conversion.plan.by_name("first").precision is Precision.LOW


def test_auto_falling_back_to_o2_does_not_give_back_what_its_black_list_keeps_fp32():
    """O3 blames a Softmax (and the nodes around it) for the Loop body's
    overflow and keeps them fp32; O2 passes. The Softmax is on O2's black
    list: giving it back there would convert the same model again. So
    would giving back the Mul that follows it alone (its inputs fp32): a
    step whose model was judged already costs no trial. Every trial after
    the fallback gives back compute that runs low."""
    reference = _loop_overflow(
        helper.make_node("Softmax", ["a0"], ["sm"], name="softmax", axis=-1),
        helper.make_node("Mul", ["sm", "a0"], ["a"], name="mix"),
    )
    searched = _auto("loop", reference, make_source(reference, samples=2, ranges=["x=-3:3"]))
    o2 = next(t for t in searched.trials if t.step == "fall back to O2")
    assert o2.passed and "softmax" in o2.kept_fp32
    after = searched.trials[o2.number :]
    assert [t.step for t in after] == ["give back 1 node(s)"]  # ("first"; "mix" alone: O2's model again)
    assert all(t.low_compute > o2.low_compute for t in after)
    assert searched.conversion.plan.by_name("softmax").rule == "black-list"
    assert searched.conversion.plan.by_name("first").precision is Precision.LOW


def test_auto_from_o2_grows_and_is_deterministic():
    reference = onnx.load(ZOO["vit"]["path"])
    source = manifest_source(ZOO["vit"], reference)
    first = _auto("vit", reference, source, start="O2")
    second = _auto("vit", reference, source, start="O2")
    assert first.trials[0].step.startswith("O2") and first.trials[0].passed
    assert first.low_compute >= first.trials[0].low_compute
    assert [t.as_dict() | {"seconds": 0} for t in first.trials] == [t.as_dict() | {"seconds": 0} for t in second.trials]
    assert first.conversion.model.SerializeToString() == second.conversion.model.SerializeToString()


def test_auto_cli_reports_trials(hostile_dir, tmp_path):
    report = tmp_path / "auto.json"
    proc = cli(
        str(hostile_dir / "exp_pow_large.onnx"), "--level", "auto", "-o", str(tmp_path / "a.onnx"), "--report", str(report)
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(report.read_text())
    assert data["plan"]["level"] == "auto" and data["auto"]["trials"] and data["auto"]["chosen_trial"] >= 1
    assert data["auto"]["kept_fp32"]["exp"].startswith("safety")
    assert "trial 1:" in proc.stderr and "of compute low" in proc.stdout
    assert cli(str(hostile_dir / "exp_pow_large.onnx"), "--level", "auto", "--no-validate").returncode == 2


@pytest.mark.parametrize("opset", [17, 22])
def test_auto_bf16_below_opset_22_says_the_upgrade_that_would_run_the_convs_low(tmp_path, opset):
    """Below opset 22 no Conv, MaxPool or GlobalAveragePool schema admits
    bfloat16: auto's best keeps them fp32, a few percent of the compute low,
    and the report's plan notes name `target_opset` 22. At 22 they run low, and
    there is no such note."""
    reference = onnx.load(ZOO["resnet50"]["path"])
    source = tmp_path / "resnet.onnx"
    onnx.save(upgrade_opset(reference, opset)[0], str(source))
    report = tmp_path / "auto.json"
    proc = cli(str(source), "--level", "auto", "--dtype", "bf16", "-o", str(tmp_path / "a.onnx"), "--report", str(report))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(report.read_text())
    hints = [n for n in data["plan"]["notes"] if "`target_opset`" in n]
    if opset < 22:
        assert data["auto"]["low_compute"] < 0.1
        assert hints == [
            "Conv, GlobalAveragePool, MaxPool stay fp32: the schemas at opset 17 admit no bfloat16 for them; "
            "`target_opset` 22 upgrades the model to one whose schemas do"
        ]
    else:
        assert data["auto"]["low_compute"] > 0.9 and hints == []


def test_auto_cli_fails_when_no_trial_passes_and_writes_the_closest_only_when_asked(tmp_path):
    """No error at all is tolerated: no low-precision trial passes. The
    command exits 1 naming the outputs that fail, writes nothing, and with
    --write-on-fail writes the closest assignment, not an fp32 model."""
    source = tmp_path / "lstm.onnx"
    onnx.save(onnx.load(ZOO["lstm"]["path"]), str(source))
    out, report = tmp_path / "a.onnx", tmp_path / "a.json"
    flags = ["--level", "auto", "--atol", "0", "--rtol", "0", "--max-trials", "3", "-o", str(out), "--report", str(report)]
    proc = cli(str(source), *flags)
    assert proc.returncode == 1, proc.stderr
    assert "no low-precision assignment met the tolerance in 3 trials" in proc.stdout and "FAIL" in proc.stdout
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("auto: no low-precision")]
    assert "fails on logits: max abs error" in line and "> 0 (" in line  # (the output, and the criterion it fails)
    assert not out.exists()
    data = json.loads(report.read_text())
    assert not data["validation"]["passed"] and 1 <= data["auto"]["chosen_trial"] <= 3
    assert [o["name"] for o in data["validation"]["outputs"] if not o["passed"]]
    proc = cli(str(source), *flags, "--write-on-fail")
    assert proc.returncode == 1, proc.stderr
    assert onnx.TensorProto.FLOAT16 in {t.data_type for t in onnx.load(str(out)).graph.initializer}


def test_auto_grows_no_source_whose_readers_need_fp32():
    """A source takes the precision its readers need: growing from O1, the
    search forced the Constant of a Resize's scales (fp32 by the schema)
    low as well, which ran nothing low, stored the scales fp16 with a Cast
    back, and counted its elements as compute run low, so that the trial
    with the pointless Cast won. Forcing the Resize low is what the search
    is for; its scales stay fp32, with no Cast."""
    scales = onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32))
    nodes = [
        helper.make_node("Constant", [], ["scales"], name="scales", value=scales),
        helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="nearest"),
    ]
    reference = model(nodes, [value("x", shape=(1, 1, 4, 4))], [value("y", shape=(1, 1, 8, 8))])
    source = make_source(reference, samples=2)
    searched = _auto("resize", reference, source, start="O1")
    plan = {e.name: e for e in searched.conversion.plan}
    assert plan["up"].precision is Precision.LOW and plan["scales"].precision is Precision.FP32
    assert all(t.forced_low != ("up", "scales") for t in searched.trials)
    casts = [n for n in searched.conversion.model.graph.node if n.op_type == "Cast"]
    assert [n.input[0] for n in casts] == ["x", "y_fp16"]


def test_auto_counts_one_trial_in_the_singular(tmp_path):
    """A model whose first trial passes (a MatMul at O3), and one whose only
    trial (--max-trials 1) fails for want of any error at all."""
    source = tmp_path / "matmul.onnx"
    w = init("W", np.eye(4, dtype=np.float32))
    onnx.save(model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [value("x")], [value("y")], [w]), str(source))
    proc = cli(str(source), "--level", "auto", "-o", str(tmp_path / "a.onnx"))
    assert proc.returncode == 0, proc.stderr
    assert ": auto (1 trial, 100.0% of compute low) fp16," in proc.stdout
    lstm = tmp_path / "lstm.onnx"
    onnx.save(onnx.load(ZOO["lstm"]["path"]), str(lstm))
    plan = tmp_path / "plan.json"
    proc = cli(str(lstm), "--level", "auto", "--atol", "0", "--rtol", "0", "--max-trials", "1", "--plan-json", str(plan))
    assert proc.returncode == 1, proc.stderr
    assert "in 1 trial; the closest, trial 1, fails" in proc.stdout


@pytest.mark.parametrize(
    ("only", "auto_from", "start"),
    [("--only-black-list=LSTM", "O2", "O2"), ("--only-white-list=MatMul", "O1", "O1"), ("--only-white-list=MatMul", None, "O1")],
)
def test_auto_with_an_only_list_searches_at_its_level(tmp_path, only, auto_from, start):
    """An only-list converts as O1 (white) or O2 (black): auto grows from that
    level; no trial passes here, and the closest is written on request."""
    source = tmp_path / "lstm.onnx"
    onnx.save(onnx.load(ZOO["lstm"]["path"]), str(source))
    out, report = tmp_path / "a.onnx", tmp_path / "a.json"
    flags = ["--atol", "0", "--rtol", "0", "--max-trials", "2", "-o", str(out), "--report", str(report), "--write-on-fail"]
    proc = cli(str(source), "--level", "auto", only, *(["--auto-from", auto_from] if auto_from else []), *flags)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(report.read_text())
    assert data["auto"]["start"] == start and data["auto"]["trials"][0]["step"].startswith(start)
    assert data["auto"]["chosen_trial"] in (1, 2) and data["plan"]["counts"]["low"] > 0 and out.is_file()


def test_auto_refuses_an_auto_from_level_the_only_list_does_not_convert_as(tmp_path):
    source = tmp_path / "lstm.onnx"
    onnx.save(onnx.load(ZOO["lstm"]["path"]), str(source))
    proc = cli(str(source), "--level", "auto", "--only-white-list", "MatMul", "--auto-from", "O2", "-o", str(tmp_path / "a.onnx"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--only-white-list converts as O1" in proc.stderr and "--auto-from O2" in proc.stderr
    assert "--level O" not in proc.stderr  # (a level the user did not give)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lstm.onnx"]


def test_auto_without_safety_rules_searches_without_them():
    """--no-safety at auto: no trial keeps a node fp32 by a safety rule; the
    search itself finds what overflows (the BatchNorm of variance 1e8)."""
    reference = HOSTILE["batchnorm_large_variance"]()
    source = make_source(reference, samples=2)
    calibration = calibrate(reference, source, "cpu")
    searched = auto_convert(reference, ConvertOptions(safety=False), source, CPU, calibration, max_trials=12)
    assert searched.trials[0].step == "O3 without safety rules"
    assert not [e for e in searched.conversion.plan if e.rule.startswith("safety")]
    with_rules = auto_convert(reference, ConvertOptions(), source, CPU, calibration, max_trials=12)
    assert with_rules.trials[0].step == "O3 with safety rules"
    assert [e for e in with_rules.conversion.plan if e.rule.startswith("safety")]


def test_auto_reports_the_per_node_diff_of_the_model_it_chose():
    """The passing trials ran without the per-node diff; the chosen model
    gets it, as any conversion's validation does (it was always empty)."""
    reference = onnx.load(ZOO["vit"]["path"])
    searched = _auto("vit", reference, manifest_source(ZOO["vit"], reference))
    assert searched.validation is not None and searched.validation.passed
    low = {e.name for e in searched.conversion.plan if e.precision is Precision.LOW}
    assert low & {n.name for n in searched.validation.nodes}
    off = auto_convert(
        reference, ConvertOptions(), manifest_source(ZOO["vit"], reference), replace(CPU, per_node=False), None, max_trials=4
    )
    assert off.validation is None or off.validation.nodes == []


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_shared_constant_beyond_the_low_range_is_clipped_and_counted_for_its_low_readers(dtype):
    """big feeds a low Mul and an fp32 one: it stays fp32. A Cast for the
    low reader would turn 1e5 into Inf (fp16) at run time and flush 1e-9
    to 0, silently: that reader gets a clipped low copy, and the report
    counts what was clipped and flushed."""
    big = np.array([1e5 if dtype == "fp16" else 3.4e38, 2.0, 3.0, 1e-9 if dtype == "fp16" else 1e-45], np.float32)
    nodes = [
        helper.make_node("Mul", ["x", "big"], ["a"], name="lowmul"),
        helper.make_node("Mul", ["x", "big"], ["b"], name="keepmul"),
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
    ]
    m = model(nodes, [value("x", shape=(4,))], [value("y", shape=(4,))], [init("big", big)])
    result = convert(m, level="O3", dtype=dtype, keep_fp32=("^(keepmul|add)$",))
    assert result.plan.by_name("lowmul").precision is Precision.LOW
    assert result.stats.clipped == {"big": 1} and result.stats.flushed == {"big": 1}
    if dtype == "fp16":
        import onnxruntime as ort

        sess = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
        assert np.isfinite(sess.run(None, {"x": np.ones(4, np.float32)})[0]).all()
