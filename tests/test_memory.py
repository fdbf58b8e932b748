"""Validation in bounded memory: the emulation twin keeps lowered weights
external, and a model whose weights are large runs in parts
(amp_convert/segments.py) with the same results as run whole. The parts are
forced here on small zoo models by a small ``part_bytes``; the LLM-sized
figures are in BENCHMARKS.md (scripts/bench_memory.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import manifest_source
from onnx import TensorProto, helper, numpy_helper

from amp_convert import convert, segments
from amp_convert.calibrate import calibrate
from amp_convert.emulate import emulation_twin
from amp_convert.external import is_external, read_array, write_with_external_data
from amp_convert.load import read_model
from amp_convert.runner import session, value_bytes
from amp_convert.validation import ValidationConfig, Validator
from models.zoo_inputs import load_manifest

ROOT = Path(__file__).resolve().parents[1]
ZOO = {e["name"]: e for e in load_manifest(str(ROOT / "models" / "zoo" / "manifest.json"))}
SMALL = 64 << 10  # bytes: a few zoo weights per part


def _zoo(name: str) -> onnx.ModelProto:
    return onnx.load(str(ROOT / "models" / "zoo" / f"{name}.onnx"))


def _external_matmul(folder: Path) -> Path:
    """x -> MatMul(W) -> y, W (64 x 64 fp32) in a data file beside the model."""
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) * 3
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [numpy_helper.from_array(w, "W")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "mm.onnx"
    onnx.save(m, str(path), save_as_external_data=True, location="mm.onnx.data", size_threshold=0)
    return path


def test_the_twin_of_a_converted_external_model_keeps_its_weights_external(tmp_path):
    path = _external_matmul(tmp_path)
    loaded = read_model(path, lazy_external=True).model
    w = onnx.numpy_helper.to_array(onnx.load(str(path)).graph.initializer[0])
    converted = convert(loaded, level="O3", external_dir=tmp_path).model
    twin = emulation_twin(converted, tmp_path)
    (weight,) = twin.graph.initializer
    # (no float32 copy in memory: the rounded values are made when read or written)
    assert is_external(weight) and weight.data_type == TensorProto.FLOAT and not weight.raw_data
    expected = w.astype(np.float16).astype(np.float32)
    assert np.array_equal(read_array(weight, tmp_path), expected)
    out = tmp_path / "twin"
    out.mkdir()
    write_with_external_data(twin, out / "twin.onnx", "twin.onnx.data", tmp_path)
    written = onnx.load(str(out / "twin.onnx"))
    assert np.array_equal(onnx.numpy_helper.to_array(written.graph.initializer[0]), expected)


def test_parts_hold_at_most_their_bytes_of_exposed_tensors_and_give_the_whole_runs_values():
    m = _zoo("gpt2")
    samples = list(manifest_source(ZOO["gpt2"], m))
    types = Validator(m, manifest_source(ZOO["gpt2"], m), ValidationConfig(provider="cpu")).ref_ctx.types
    wanted = [o for n in m.graph.node for o in n.output if o and types.get(o) == TensorProto.FLOAT]
    exact = {}  # bytes per sample of every wanted tensor, from one run of the whole model exposing them all

    def record(i: int, values: list[dict]) -> None:
        if i == 0:
            exact.update({k: value_bytes(v) for k, v in values[0].items()})

    order, reach = segments.node_order(m)
    whole = segments.PartModel(m, types, "cpu")
    segments.run_in_parts([whole], wanted, samples, record, order=order, reach=reach, part_bytes=1 << 40)
    seen: dict[str, list] = {}
    per_part: list[int] = []
    parts = segments.PartModel(m, types, "cpu")

    def keep(i: int, values: list[dict]) -> None:
        for k, v in values[0].items():
            seen.setdefault(k, []).append(v)
        if i == 0:
            per_part.append(sum(value_bytes(v) for v in values[0].values()))

    budget = max(exact.values()) * 4
    count = segments.run_in_parts([parts], wanted, samples, keep, order=order, reach=reach, known=exact, part_bytes=budget)
    assert count > 3 and len(per_part) == count
    assert max(per_part) <= budget  # (sizes known: each part's exposed tensors fit)
    assert parts.most_live == 1 and parts.live_sessions == 0  # one session at a time, all released
    assert set(seen) == set(wanted) and all(len(v) == len(samples) for v in seen.values())
    again: dict[str, list] = {}
    segments.run_in_parts(
        [segments.PartModel(m, types, "cpu")],
        wanted,
        samples,
        lambda i, values: [again.setdefault(k, []).append(v) for k, v in values[0].items()],
        order=order,
        reach=reach,
        part_bytes=1 << 40,
    )
    for name in wanted:
        for a, b in zip(seen[name], again[name], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_a_model_validated_in_parts_gets_the_node_errors_of_one_validated_whole(name):
    reference = _zoo(name)
    candidate = convert(reference, level="O2").model
    config = ValidationConfig(provider="cpu", per_node=True)
    whole = Validator(reference, manifest_source(ZOO[name], reference), config).check(candidate)
    assert not segments.worth_splitting(reference)  # (a zoo model runs whole by default)
    split = Validator(reference, manifest_source(ZOO[name], reference), replace(config, part_bytes=SMALL))
    assert segments.worth_splitting(reference, SMALL)
    made: list[segments.PartModel] = []
    original = segments.PartModel.__post_init__

    def counted(self) -> None:
        original(self)
        made.append(self)

    segments.PartModel.__post_init__ = counted
    try:
        parted = split.check(candidate)
    finally:
        segments.PartModel.__post_init__ = original
    assert {m.role for m in made} == {"reference", "candidate"}
    assert all(m.parts > 2 and m.most_live == 1 and m.live_sessions == 0 for m in made)
    assert parted.emulated == whole.emulated and parted.samples == whole.samples
    assert [n.name for n in parted.nodes] == [n.name for n in whole.nodes]
    for a, b in zip(parted.nodes, whole.nodes, strict=True):
        assert a.error_after == pytest.approx(b.error_after, rel=1e-3, abs=1e-9)
    assert [n.name for n in parted.offenders()[:3]] == [n.name for n in whole.offenders()[:3]]
    for a, b in zip(parted.outputs, whole.outputs, strict=True):
        assert a.max_abs_err == pytest.approx(b.max_abs_err, rel=1e-3, abs=1e-9) and a.count == b.count
    assert parted.passed == whole.passed


def test_calibration_in_parts_gets_the_ranges_of_one_run_whole():
    m = _zoo("gpt2")
    whole = calibrate(m, list(manifest_source(ZOO["gpt2"], m)), "cpu")
    parted = calibrate(m, list(manifest_source(ZOO["gpt2"], m)), "cpu", part_bytes=SMALL)
    assert whole.session is not None and parted.session is None  # (no whole-model session is kept)
    assert set(parted.ranges) == set(whole.ranges) and parted.samples == whole.samples
    for name, r in whole.ranges.items():
        p = parted.ranges[name]
        assert (p.size, p.shape) == (r.size, r.shape)
        assert p.low == pytest.approx(r.low, rel=1e-5, abs=1e-6) and p.high == pytest.approx(r.high, rel=1e-5, abs=1e-6)
    assert parted.outputs is not None and len(parted.outputs) == len(whole.outputs)
    for (_, a), (_, b) in zip(parted.outputs, whole.outputs, strict=True):
        np.testing.assert_allclose(a["logits"], b["logits"], rtol=1e-5, atol=1e-6)


def test_parts_are_bounded_by_their_weights_where_only_the_outputs_are_wanted():
    m = _zoo("gpt2")
    samples = list(manifest_source(ZOO["gpt2"], m))
    types = Validator(m, manifest_source(ZOO["gpt2"], m), ValidationConfig(provider="cpu")).ref_ctx.types
    order, reach = segments.node_order(m)
    outputs = [v.name for v in m.graph.output]
    got: dict[str, list] = {}
    parts = segments.PartModel(m, types, "cpu")
    made: list[onnx.ModelProto] = []
    original = parts.part
    parts.part = lambda wanted, fetch: made.append(original(wanted, fetch)) or made[-1]
    count = segments.run_in_parts(
        [parts],
        outputs,
        samples,
        lambda i, values: [got.setdefault(k, []).append(v) for k, v in values[0].items()],
        order=order,
        reach=reach,
        part_bytes=SMALL,
    )
    assert count > 3 and parts.most_live == 1
    held = [segments.weight_bytes(p) for p in made]
    inits = {t.name: t.ByteSize() for t in m.graph.initializer}
    heaviest = max(sum(inits.get(x, 0) for x in n.input) for n in m.graph.node)
    assert max(held) <= SMALL + heaviest  # (a part passes its bytes by at most the node that ends it)
    sess = session(m, "cpu")
    for i, feeds in enumerate(samples):
        (expected,) = sess.run(outputs, feeds)
        np.testing.assert_allclose(got[outputs[0]][i], expected, rtol=1e-5, atol=1e-6)


def _split_heads(wrong_tail: bool) -> onnx.ModelProto:
    """x -> MatMul -> Split into 40 graph outputs; ``wrong_tail``: outputs 32-39 twice what they should be."""
    k = 40
    w = np.random.default_rng(0).random((k, k)).astype(np.float32)
    if wrong_tail:
        w[:, 32:] *= 2.0
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["Y"]),
        helper.make_node("Split", ["Y"], [f"o{j}" for j in range(k)], axis=1, num_outputs=k),
    ]
    outputs = [helper.make_tensor_value_info(f"o{j}", TensorProto.FLOAT, [1, 1]) for j in range(k)]
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, k])
    graph = helper.make_graph(nodes, "g", [x], outputs, [numpy_helper.from_array(w, "W")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    return m


@pytest.mark.parametrize("part_bytes", [1 << 30, 4096])
def test_parts_never_cut_between_the_outputs_of_one_node(part_bytes):
    """A part cut between a Split's outputs ran the Split and lost the
    outputs after the cut: they were never compared, and passed. Every
    output is compared on every sample, in parts as whole, and the wrong
    ones fail."""
    from amp_convert.inputs import make_source
    from amp_convert.validation import validate

    ref, cand = _split_heads(False), _split_heads(True)
    config = ValidationConfig(provider="cpu", per_node=False, part_bytes=part_bytes)
    result = validate(ref, cand, make_source(ref, samples=2), config)
    assert all(o.count == 2 for o in result.outputs)
    failing = {o.name for o in result.outputs if o.verdict(result.tolerance_for(o.name))}
    assert failing == {f"o{j}" for j in range(32, 40)} and not result.passed


def test_a_model_with_an_untyped_value_runs_whole_not_in_parts():
    """A value crossing a cut becomes a graph input of the next part, which
    must declare its type: an op the type inference does not know (a custom
    domain's) leaves its output untyped, so such a model is not cut."""
    from amp_convert.validation import _typed

    w = numpy_helper.from_array(np.random.default_rng(0).random((8, 8)).astype(np.float32), "W")
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["Y"]),
        helper.make_node("MyOp", ["Y"], ["Z"], domain="custom.dom"),
        helper.make_node("MatMul", ["Z", "W"], ["out"]),
    ]
    x, out = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 8]) for n in ("X", "out"))
    graph = helper.make_graph(nodes, "g", [x], [out], [w])
    custom = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("custom.dom", 1)])
    assert not segments.typed_throughout(custom, _typed(custom).types)
    plain = _split_heads(False)
    assert segments.typed_throughout(plain, _typed(plain).types)
